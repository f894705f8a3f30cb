// Package migrations holds space-api's goose SQL migrations, embedded so that the
// binary migrates its own database (`space-api migrate`) with no files beside it.
//
// Numbering: one sequential number per migration, never reused or edited once landed.
package migrations

import "embed"

// FS holds the *.sql migrations.
//
//go:embed *.sql
var FS embed.FS
