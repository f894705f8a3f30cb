// Package servicestest tests the scripts behind `make services` and `make run`
// (scripts/services.sh, scripts/run.sh) the way a user meets them: from a fresh clone of
// the repository in a directory other users cannot enter, as a home directory of mode
// 0700 or a `mktemp -d` is. Postgres runs as the `postgres` user when the scripts run as
// root, so such a checkout is where a careless script breaks.
//
// The clone holds the committed tree (HEAD), not uncommitted changes: commit a change
// to the scripts before running this test on it. The package has no code of its own.
package servicestest
