package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/store"
)

const sandboxColumns = `id::text, client, budget_key, state, template, template_version, cpu_millis, memory_mib, disk_gib, warm, metadata,
	coalesce(substrate_ref, ''), coalesce(snapshot_ref, ''), coalesce(last_error, ''), answered, soft_breach_at, created_at, updated_at,
	expires_at, idle_at, retain_until, pause_reason, termination_reason`

// scanSandbox scans the sandboxColumns of row, then into extra the columns a query
// selects after them.
func scanSandbox(row pgx.Row, extra ...any) (*space.Sandbox, error) {
	var sb space.Sandbox
	var meta []byte
	err := row.Scan(append([]any{&sb.ID, &sb.Client, &sb.BudgetKey, &sb.State, &sb.Template, &sb.TemplateVersion, &sb.CPUMillis, &sb.MemoryMiB, &sb.DiskGiB,
		&sb.Warm, &meta, &sb.SubstrateRef, &sb.SnapshotRef, &sb.LastError, &sb.Answered, &sb.SoftBreachAt, &sb.CreatedAt, &sb.UpdatedAt,
		&sb.ExpiresAt, &sb.IdleAt, &sb.RetainUntil, &sb.PauseReason, &sb.TerminationReason}, extra...)...)
	if err != nil {
		return nil, err
	}
	sb.SoftBreach = sb.SoftBreachAt != nil
	// What the lifecycle will do, as the sandbox's state has it: a paused sandbox ends
	// at its retention when that comes before its max lifetime; only a running one
	// has an idle deadline, and an ended one has neither deadline nor pause reason.
	switch sb.State {
	case space.StatePaused:
		if sb.RetainUntil != nil && (sb.ExpiresAt == nil || sb.RetainUntil.Before(*sb.ExpiresAt)) {
			sb.ExpiresAt = sb.RetainUntil
		}
	case space.StateTerminated, space.StateFailed:
		sb.ExpiresAt, sb.PauseReason = nil, nil
	}
	if sb.State != space.StateRunning {
		sb.IdleAt = nil
	}
	if len(meta) > 2 {
		if err := json.Unmarshal(meta, &sb.Metadata); err != nil {
			return nil, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
		}
	}
	return &sb, nil
}

// checkLiveCap returns a live_sandbox_cap LimitError when the budget key already holds
// cap live sandboxes. It first takes the key's advisory lock for the rest of tx, so
// that one key's activations run their count and their booking one at a time,
// atomically across replicas. The lock and the count go in one round trip: the count
// is bound and run only once the lock is granted, so it sees every booking
// committed before. With no cap (cap <= 0) there is nothing to count and nothing to
// make atomic: no lock is taken, and one client's creates run side by side.
func checkLiveCap(ctx context.Context, tx pgx.Tx, client space.ClientKey, cap int) error {
	if cap <= 0 {
		return nil
	}
	var live int
	b := &pgx.Batch{}
	queueLiveLock(b, client)
	b.Queue(`SELECT count(*) FROM (`+liveSQL+`) live`, string(client), cap).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&live); err != nil {
			return fmt.Errorf("count live sandboxes: %w", err)
		}
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock client and count live sandboxes: %w", err)
	}
	if live >= cap {
		return liveCapError(client, cap)
	}
	return nil
}

func liveCapError(client space.ClientKey, cap int) error {
	return &space.LimitError{Bucket: space.BucketLiveSandboxCap, Client: client, Cap: cap, RetryAfter: time.Second}
}

// queueLiveLock queues on b the budget key's advisory lock, held to the end of the
// transaction (see checkLiveCap).
func queueLiveLock(b *pgx.Batch, client space.ClientKey) {
	b.Queue("SELECT pg_advisory_xact_lock(hashtextextended('space:live:' || $1, 0))", string(client)).Exec(func(pgconn.CommandTag) error { return nil })
}

// liveSQL is a budget key's ($1) live sandboxes, up to a cap ($2): the LIMIT keeps the
// count cheap for a key far over its cap.
const (
	liveStates = `state IN ('starting', 'running', 'pausing', 'restoring')`
	liveSQL    = `SELECT 1 FROM sandboxes WHERE budget_key = $1 AND ` + liveStates + ` LIMIT $2`
)

// insertSQL makes a sandbox's row, with its lifecycle's deadlines from now ($13 the
// max lifetime and $14 the idle timeout in seconds, 0 for none; $15 the idle action);
// insertUnderCapSQL the same row only while its budget key holds fewer than $16 live
// sandboxes, counted after the key's lock.
const (
	insertColumns = `sandboxes (id, client, budget_key, state, template, template_version, cpu_millis, memory_mib, disk_gib, warm, metadata, answered,
		expires_at, idle_at, idle_action)`
	insertLifecycle = `CASE WHEN $13::float8 > 0 THEN now() + make_interval(secs => $13) END,
		CASE WHEN $14::float8 > 0 THEN now() + make_interval(secs => $14) END, nullif($15::text, '')`
	insertSQL = `INSERT INTO ` + insertColumns + `
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, ` + insertLifecycle + `) RETURNING created_at, updated_at, expires_at, idle_at`
	insertUnderCapSQL = `INSERT INTO ` + insertColumns + `
		SELECT $1::uuid, $2::text, $3::text, $4::text, $5::text, $6::text, $7::integer, $8::integer, $9::integer, $10::boolean, $11::jsonb, $12::boolean,
			` + insertLifecycle + `
		WHERE (SELECT count(*) FROM (SELECT 1 FROM sandboxes WHERE budget_key = $3::text AND ` + liveStates + `
			LIMIT $16::integer) live) < $16::integer
		RETURNING created_at, updated_at, expires_at, idle_at`
)

// insertArgs are insertSQL's arguments for sb, created under lifecycle lc.
func insertArgs(sb *space.Sandbox, lc space.Lifecycle) ([]any, error) {
	meta, err := metadataJSON(sb.Metadata)
	if err != nil {
		return nil, err
	}
	return []any{sb.ID, string(sb.Client), string(sb.BudgetKey), string(sb.State), sb.Template, sb.TemplateVersion,
		sb.CPUMillis, sb.MemoryMiB, sb.DiskGiB, sb.Warm, meta, sb.Answered,
		lc.MaxLifetime.Seconds(), lc.IdleTimeout.Seconds(), string(idleAction(lc))}, nil
}

// idleAction is the action lc takes on an idle sandbox: pause unless it says
// terminate; none without an idle timeout.
func idleAction(lc space.Lifecycle) space.IdleAction {
	switch {
	case lc.IdleTimeout <= 0:
		return ""
	case lc.IdleAction == space.IdleTerminate:
		return space.IdleTerminate
	}
	return space.IdlePause
}

// activity is the stamp of an activity under lc (a restore, a wake, a revived
// create): the idle action due its idle timeout from now.
func activity(lc space.Lifecycle) stamp {
	d := lc.IdleTimeout
	return stamp{Active: &d, Action: idleAction(lc)}
}

// queueInsert queues on b the insert of sb's row, created under lifecycle lc, under
// the live cap when cap > 0 (the budget key's lock, then the insert of a row only
// under the cap: *capped is set when it made none), and fills in sb's times.
func queueInsert(b *pgx.Batch, sb *space.Sandbox, lc space.Lifecycle, cap int, capped *bool) error {
	args, err := insertArgs(sb, lc)
	if err != nil {
		return err
	}
	sql := insertSQL
	if cap > 0 {
		queueLiveLock(b, sb.BudgetKey)
		sql, args = insertUnderCapSQL, append(args, cap)
	}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&sb.CreatedAt, &sb.UpdatedAt, &sb.ExpiresAt, &sb.IdleAt)
		if cap > 0 && errors.Is(err, pgx.ErrNoRows) {
			*capped = true
			return nil
		}
		return err
	})
	return nil
}

// metadataJSON is a sandbox's metadata as stored: an object, never null.
func metadataJSON(m map[string]string) ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return b, nil
}

// reviveSandbox moves sb's failed row back to starting for a retried create, with the
// request's shape and metadata and the substrate's traces cleared, and returns the
// error it had failed with. It must run in the transaction that checked the live cap:
// a failed sandbox holds no live place, a starting one does. ECONFLICT when the row is
// no longer failed.
func reviveSandbox(ctx context.Context, tx pgx.Tx, sb *space.Sandbox, lc space.Lifecycle) (string, error) {
	cur, err := getSandbox(ctx, tx, sb.ID, sb.Client, true)
	if err != nil {
		return "", err
	}
	if cur.State != space.StateFailed {
		return "", conflict(cur, space.StateStarting, []space.SandboxState{space.StateFailed})
	}
	meta, err := metadataJSON(sb.Metadata)
	if err != nil {
		return "", err
	}
	// A retried create starts its lifecycle again: its deadlines run from now, as a
	// new create's do (its created_at stays the first attempt's).
	err = tx.QueryRow(ctx, `UPDATE sandboxes SET state = $2, template = $3, cpu_millis = $4, memory_mib = $5,
			disk_gib = $6, metadata = $7, budget_key = $8, warm = false, substrate_ref = NULL, last_error = NULL,
			expires_at = CASE WHEN $9::float8 > 0 THEN now() + make_interval(secs => $9) END,
			idle_at = CASE WHEN $10::float8 > 0 THEN now() + make_interval(secs => $10) END, idle_action = nullif($11::text, ''),
			retain_until = NULL, pause_reason = NULL, termination_reason = NULL, updated_at = now()
		WHERE id = $1 RETURNING created_at, updated_at, expires_at, idle_at`,
		sb.ID, string(space.StateStarting), sb.Template, sb.CPUMillis, sb.MemoryMiB, sb.DiskGiB, meta, string(sb.BudgetKey),
		lc.MaxLifetime.Seconds(), lc.IdleTimeout.Seconds(), string(idleAction(lc)),
	).Scan(&sb.CreatedAt, &sb.UpdatedAt, &sb.ExpiresAt, &sb.IdleAt)
	if err != nil {
		return "", fmt.Errorf("retry sandbox %s: %w", sb.ID, err)
	}
	return cur.LastError, nil
}

// isUniqueViolation reports whether err is Postgres refusing a duplicate key.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// getSandbox reads one sandbox of client; ENOTFOUND when it does not exist or belongs
// to another client (a caller cannot tell the two apart). An empty client reads any
// sandbox: for the internal wake, which acts for the owner.
func getSandbox(ctx context.Context, q store.Querier, id string, client space.ClientID, forUpdate bool) (*space.Sandbox, error) {
	sql := "SELECT " + sandboxColumns + " FROM sandboxes WHERE id = $1 AND ($2 = '' OR client = $2)"
	if forUpdate {
		sql += " FOR UPDATE"
	}
	sb, err := scanSandbox(q.QueryRow(ctx, sql, id, string(client)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, space.Errorf(space.ENOTFOUND, "no sandbox %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// stamp is what a write records of the sandbox's lifecycle (docs/lifecycle.md). A
// write also keeps the deadlines to its state, whatever the stamp: a running sandbox
// has no retention and no pause reason, a paused one no idle deadline, an ended one
// neither.
type stamp struct {
	// Reason is why the write pauses the sandbox (to pausing or paused) or ends it
	// (to terminated); "" keeps the reason recorded.
	Reason string
	// Active, when not nil, records an activity: the idle action Action is due Active
	// from now; 0 clears it (no idle timeout).
	Active *time.Duration
	Action space.IdleAction
	// Lifetime, when not nil, sets the end of the max lifetime Lifetime after the
	// sandbox's creation; 0 clears it.
	Lifetime *time.Duration
	// Retention, when not nil, sets when a pause's retention ends, Retention from now;
	// 0 clears it.
	Retention *time.Duration
}

// seconds is d as the SQL's seconds; NULL (nil) leaves the column alone.
func seconds(d *time.Duration) any {
	if d == nil {
		return nil
	}
	return d.Seconds()
}

// stampSQL is the SET clauses of a write to state $<st> with stamp's arguments from
// $<at> on (stampArgs, in that order).
func stampSQL(st, at int) string {
	p := func(i int) string { return "$" + strconv.Itoa(at+i) }
	state := "$" + strconv.Itoa(st) + "::text"
	return `idle_at = CASE WHEN ` + state + ` IN ('paused', 'terminated', 'failed') THEN NULL
				WHEN ` + p(1) + `::float8 IS NULL THEN idle_at WHEN ` + p(1) + ` > 0 THEN now() + make_interval(secs => ` + p(1) + `) END,
			idle_action = CASE WHEN ` + p(1) + `::float8 IS NULL THEN idle_action ELSE nullif(` + p(2) + `::text, '') END,
			expires_at = CASE WHEN ` + p(3) + `::float8 IS NULL THEN expires_at WHEN ` + p(3) + ` > 0 THEN created_at + make_interval(secs => ` + p(3) + `) END,
			retain_until = CASE WHEN ` + state + ` IN ('running', 'starting', 'terminated', 'failed') THEN NULL
				WHEN ` + p(4) + `::float8 IS NULL THEN retain_until WHEN ` + p(4) + ` > 0 THEN now() + make_interval(secs => ` + p(4) + `) END,
			pause_reason = CASE WHEN ` + state + ` IN ('running', 'starting') THEN NULL
				WHEN ` + state + ` IN ('pausing', 'paused') AND ` + p(0) + `::text <> '' THEN ` + p(0) + ` ELSE pause_reason END,
			termination_reason = CASE WHEN ` + state + ` = 'terminated' AND ` + p(0) + `::text <> '' THEN ` + p(0) + ` ELSE termination_reason END`
}

// stampArgs are stampSQL's arguments.
func (m stamp) args() []any {
	return []any{m.Reason, seconds(m.Active), string(m.Action), seconds(m.Lifetime), seconds(m.Retention)}
}

// stateChange moves a sandbox to State, recording what the substrate said. Empty refs
// leave the stored ones alone; ClearRef forgets the substrate ref (a paused sandbox
// runs nowhere). With From set, the change applies only while the sandbox is in one of
// those states.
type stateChange struct {
	State        space.SandboxState
	SubstrateRef string
	ClearRef     bool
	SnapshotRef  string
	Warm         *bool
	LastError    *string
	// Answered records that the caller is being told of the sandbox (it never goes
	// back to false).
	Answered bool
	// SoftBreach, when set, records whether the activation was a soft breach (now) or
	// not (cleared).
	SoftBreach *bool
	From       []space.SandboxState
	// Seen, when set, applies the change only if the sandbox was not changed since it
	// was read with this updated_at (the reconciler's optimistic guard).
	Seen time.Time
	// stamp is what the change records of the lifecycle.
	stamp
}

// movedError is setState's answer to a guarded change of a sandbox that has left the
// states it was guarded on: cur is the sandbox as it now is.
type movedError struct{ cur *space.Sandbox }

func (e *movedError) Error() string {
	return fmt.Sprintf("sandbox %s is %s now", e.cur.ID, e.cur.State)
}

// ignoreMoved is err unless it only says the sandbox moved on, which a write that
// records an abandoned attempt's outcome need not care about.
func ignoreMoved(err error) error {
	var moved *movedError
	if errors.As(err, &moved) {
		return nil
	}
	return err
}

func setState(ctx context.Context, q store.Querier, id string, c stateChange) (*space.Sandbox, error) {
	var from []string
	for _, st := range c.From {
		from = append(from, string(st))
	}
	var seen *time.Time
	if !c.Seen.IsZero() {
		seen = &c.Seen
	}
	sb, err := scanSandbox(q.QueryRow(ctx, `UPDATE sandboxes SET
			state = $2,
			substrate_ref = CASE WHEN $4 THEN NULL WHEN $3 <> '' THEN $3 ELSE substrate_ref END,
			snapshot_ref = CASE WHEN $5 <> '' THEN $5 ELSE snapshot_ref END,
			warm = coalesce($6, warm),
			last_error = CASE WHEN $7::text IS NULL THEN last_error ELSE nullif($7, '') END,
			answered = answered OR $10,
			soft_breach_at = CASE WHEN $11::bool IS NULL THEN soft_breach_at WHEN $11 THEN now() ELSE NULL END,
			`+stampSQL(2, 12)+`,
			updated_at = now()
		WHERE id = $1 AND ($8::text[] IS NULL OR state = ANY($8)) AND ($9::timestamptz IS NULL OR updated_at = $9)
		RETURNING `+sandboxColumns,
		append([]any{id, string(c.State), c.SubstrateRef, c.ClearRef, c.SnapshotRef, c.Warm, c.LastError, from, seen, c.Answered, c.SoftBreach}, c.stamp.args()...)...))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := getSandbox(ctx, q, id, "", false)
		if gerr != nil {
			return nil, gerr
		}
		return nil, &movedError{cur: cur}
	}
	if err != nil {
		return nil, fmt.Errorf("set sandbox %s %s: %w", id, c.State, err)
	}
	return sb, nil
}

// transition moves a sandbox of client from one of the states in from to state to,
// atomically. It returns ENOTFOUND when there is no such sandbox of client, and
// ECONFLICT naming the current state when it is not in one of from.
func transition(ctx context.Context, q store.Querier, id string, client space.ClientID, to space.SandboxState, from ...space.SandboxState) (*space.Sandbox, error) {
	return transitionStamped(ctx, q, id, client, to, stamp{}, from...)
}

// transitionStamped is transition recording m of the lifecycle.
func transitionStamped(ctx context.Context, q store.Querier, id string, client space.ClientID, to space.SandboxState, m stamp, from ...space.SandboxState) (*space.Sandbox, error) {
	return transitionDue(ctx, q, id, client, to, m, dueNow, from...)
}

// dueGuard is a lifecycle action's condition that its deadline has come (by the
// database's clock), checked in the write that takes it: a keepalive, a restore or
// a policy that moved the deadline since the round read it wins, and the action is
// not taken. dueNow is no condition.
type dueGuard string

const (
	dueNow     dueGuard = ""
	dueIdle    dueGuard = "idle"    // idle_at has come
	dueExpires dueGuard = "expires" // expires_at has come
	dueRetain  dueGuard = "retain"  // retain_until has come
)

// transitionDue is transitionStamped, only while due holds.
func transitionDue(ctx context.Context, q store.Querier, id string, client space.ClientID, to space.SandboxState, m stamp, due dueGuard, from ...space.SandboxState) (*space.Sandbox, error) {
	states := make([]string, len(from))
	for i, s := range from {
		states[i] = string(s)
	}
	sb, err := scanSandbox(q.QueryRow(ctx, `UPDATE sandboxes SET state = $3, last_error = NULL, `+stampSQL(3, 6)+`, updated_at = now()
		WHERE id = $1 AND ($2 = '' OR client = $2) AND state = ANY($4)
			AND ($5 = '' OR ($5 = 'idle' AND idle_at <= now()) OR ($5 = 'expires' AND expires_at <= now())
				OR ($5 = 'retain' AND retain_until <= now()))
		RETURNING `+sandboxColumns, append([]any{id, string(client), string(to), states, string(due)}, m.args()...)...))
	if err == nil {
		return sb, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s to %s: %w", id, to, err)
	}
	cur, gerr := getSandbox(ctx, q, id, client, false)
	if gerr != nil {
		return nil, gerr
	}
	return nil, conflict(cur, to, from)
}

// checkPausedCap returns a paused_sandbox_cap LimitError when the budget key already
// holds cap paused (or pausing) sandboxes, under the key's lock for the rest of tx,
// the live cap's: two pauses of one key count one after the other.
func checkPausedCap(ctx context.Context, tx pgx.Tx, client space.ClientKey, cap int) error {
	if cap <= 0 {
		return nil
	}
	var paused int
	b := &pgx.Batch{}
	queueLiveLock(b, client)
	b.Queue(`SELECT count(*) FROM (SELECT 1 FROM sandboxes WHERE budget_key = $1 AND state IN ('pausing', 'paused') LIMIT $2) paused`,
		string(client), cap).QueryRow(func(row pgx.Row) error { return row.Scan(&paused) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock client and count paused sandboxes: %w", err)
	}
	if paused >= cap {
		return &space.LimitError{Bucket: space.BucketPausedSandboxCap, Client: client, Cap: cap, RetryAfter: time.Second}
	}
	return nil
}

func conflict(cur *space.Sandbox, to space.SandboxState, from []space.SandboxState) error {
	want := make([]string, len(from))
	for i, s := range from {
		want[i] = string(s)
	}
	return space.Errorf(space.ECONFLICT, "sandbox %s is %s; moving it to %s needs it %s",
		cur.ID, cur.State, to, strings.Join(want, " or "))
}

// markAnswered records that sb's client is being told of it, unless it was already.
func markAnswered(ctx context.Context, q store.Querier, sb *space.Sandbox) error {
	if sb.Answered {
		return nil
	}
	if _, err := q.Exec(ctx, "UPDATE sandboxes SET answered = true WHERE id = $1", sb.ID); err != nil {
		return fmt.Errorf("sandbox %s answered: %w", sb.ID, err)
	}
	sb.Answered = true
	return nil
}

// setActivation records, for an activation of an existing sandbox, the budget key it
// runs under (the live cap counts the sandbox against it while it is live) and the
// template version it runs, when either differs from the row's.
func setActivation(ctx context.Context, q store.Querier, sb *space.Sandbox, key space.ClientKey, version string) error {
	if sb.BudgetKey == key && sb.TemplateVersion == version {
		return nil
	}
	if _, err := q.Exec(ctx, "UPDATE sandboxes SET budget_key = $2, template_version = $3 WHERE id = $1", sb.ID, string(key), version); err != nil {
		return fmt.Errorf("sandbox %s activation: %w", sb.ID, err)
	}
	sb.BudgetKey, sb.TemplateVersion = key, version
	return nil
}

// deleteReservation deletes the row of a create refused before anything was started,
// while it is still starting: a row deleted by its owner meanwhile (now terminated)
// stays, as the record of that delete.
func deleteReservation(ctx context.Context, q store.Querier, id string) error {
	_, err := q.Exec(ctx, "DELETE FROM sandboxes WHERE id = $1 AND state = 'starting'", id)
	if err != nil {
		return fmt.Errorf("delete sandbox booking %s: %w", id, err)
	}
	return nil
}

// Page is one page of a client's sandboxes, newest first.
type Page struct {
	Sandboxes []*space.Sandbox `json:"sandboxes"`
	// NextPageToken, when not empty, fetches the next page.
	NextPageToken string `json:"next_page_token,omitempty"`
}

// pageToken is the keyset position after the last sandbox of a page.
type pageToken struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

func encodePageToken(sb *space.Sandbox) string {
	b, _ := json.Marshal(pageToken{CreatedAt: sb.CreatedAt, ID: sb.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string) (*pageToken, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	var tok pageToken
	if err == nil {
		err = json.Unmarshal(b, &tok)
	}
	if err != nil || !validID(tok.ID) {
		return nil, space.FieldError(space.EINVALID, "page_token", "is not a token this API returned")
	}
	return &tok, nil
}

func listSandboxes(ctx context.Context, q store.Querier, client space.ClientID, limit int, after *pageToken) (*Page, error) {
	args := []any{string(client), limit + 1}
	sql := "SELECT " + sandboxColumns + " FROM sandboxes WHERE client = $1"
	if after != nil {
		sql += " AND (created_at, id) < ($3::timestamptz, $4::uuid)"
		args = append(args, after.CreatedAt, after.ID)
	}
	sql += " ORDER BY created_at DESC, id DESC LIMIT $2"
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	page := &Page{Sandboxes: []*space.Sandbox{}}
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		page.Sandboxes = append(page.Sandboxes, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	if len(page.Sandboxes) > limit {
		page.Sandboxes = page.Sandboxes[:limit]
		page.NextPageToken = encodePageToken(page.Sandboxes[limit-1])
	}
	return page, nil
}

// ownership is what the reconciler's sweep needs of a sandbox row: whether it still
// owns a resource labelled with its id.
type ownership struct {
	state space.SandboxState
	ref   string
}

// sandboxOwnership reads the state and substrate ref of the sandboxes ids, by id.
func sandboxOwnership(ctx context.Context, q store.Querier, ids []string) (map[string]ownership, error) {
	rows, err := q.Query(ctx, "SELECT id::text, state, coalesce(substrate_ref, '') FROM sandboxes WHERE id = ANY($1::uuid[])", ids)
	if err != nil {
		return nil, fmt.Errorf("look up sandboxes: %w", err)
	}
	defer rows.Close()
	out := make(map[string]ownership, len(ids))
	for rows.Next() {
		var id string
		var o ownership
		if err := rows.Scan(&id, &o.state, &o.ref); err != nil {
			return nil, fmt.Errorf("look up sandboxes: %w", err)
		}
		out[id] = o
	}
	return out, rows.Err()
}
