// Package idempotency keeps the Idempotency-Key of requests, after
// draft-ietf-httpapi-idempotency-key-header: a key names one request of one client
// until it expires. A repeat of that request under the key gets the first one's
// outcome and costs nothing; the key on a different request is refused (422); after
// the key expires (24 hours by default) it names nothing and can be used again.
//
// A key is claimed in Postgres, in the transaction that records what the request made
// where there is one (a queued operation), so a key never names a request that left
// nothing behind, and two concurrent requests under one key cannot both claim it.
package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/store"
)

// Header is the request header a key arrives in.
const Header = "Idempotency-Key"

// MaxLen is the longest key accepted, in bytes.
const MaxLen = 255

// Parse returns the key that an Idempotency-Key header carries, "" when there is none.
// The draft makes the field an RFC 8941 String ("8e03978e-…", quoted); many clients
// send the bare value instead, so both are accepted and name the same key. A key is 1
// to 255 printable ASCII characters; anything else, or the field sent twice, is an
// EINVALID error naming the header.
func Parse(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", space.FieldError(space.EINVALID, Header, "must be sent once")
	}
	v := values[0]
	if len(v) >= 2 && v[0] == '"' {
		key, ok := unquote(v)
		if !ok {
			return "", space.FieldError(space.EINVALID, Header,
				"is not a valid quoted string: a key in quotes escapes only \\\" and \\\\")
		}
		v = key
	}
	if err := Check(v); err != nil {
		return "", err
	}
	return v, nil
}

// unquote decodes an RFC 8941 sf-string: printable ASCII in double quotes, where
// only \" and \\ are escapes.
func unquote(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	out := make([]byte, 0, len(s)-2)
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			out = append(out, s[i])
		case c == '"', c < 0x20, c > 0x7e:
			return "", false
		default:
			out = append(out, c)
		}
	}
	return string(out), true
}

// Check returns an EINVALID error naming the header unless key is 1 to MaxLen
// printable ASCII characters (space included).
func Check(key string) error {
	bad := len(key) < 1 || len(key) > MaxLen
	for i := 0; i < len(key) && !bad; i++ {
		bad = key[i] < 0x20 || key[i] > 0x7e
	}
	if bad {
		return space.FieldError(space.EINVALID, Header, "must be 1 to %d printable ASCII characters", MaxLen)
	}
	return nil
}

// Hash identifies a request, to tell its repeat from a different request under the
// same key: what it does (op: "create", "restore", "wake", or "create (synchronous)"
// for a create answered at once), what it acts on (target: a sandbox id, "" for a
// create) and its validated body, separated by NUL bytes (which none of them holds:
// ops are fixed words, targets UUIDs, bodies JSON), so no two different requests hash
// alike by moving bytes between parts.
//
// It is the hash queued operations have always stored, so the keys carried over from
// them still recognise their repeats.
func Hash(op, target string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(op))
	h.Write([]byte{0})
	h.Write([]byte(target))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Record is a claimed key: the request it names and what that request made.
type Record struct {
	Client space.ClientID
	Key    string
	// RequestHash is the Hash of the request the key names.
	RequestHash string
	// OperationID is the queued operation the request made; "" for a synchronous
	// create.
	OperationID string
	// SandboxID is the sandbox the request acts on or creates.
	SandboxID string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Run runs a request under its key the one way every keyed request runs, the
// synchronous create's and the queued operation's alike:
//
//  1. a repeat, a request whose key already names this very request (rec's
//     RequestHash), returns the Record of the first, and nothing else runs: its answer
//     is what the first made. The key on a different request is EUNPROCESSABLE naming
//     the header (wrapping ErrReused);
//  2. otherwise check, when not nil, runs: what would turn the request away now (a
//     refusal, a shape that cannot be served). Its error is the request's answer and
//     leaves the key free, so that a retry claims it afresh;
//  3. then rec claims the key for ttl, in one transaction with record (alone when
//     record is nil): a key never names a request that left nothing behind. A
//     concurrent twin whose claim committed first makes this request a repeat of it:
//     its Record is returned.
//
// A nil Record and a nil error mean rec now holds the key and record ran. A request
// without a key (rec.Key empty) takes the same path without the lookup and the claim:
// check, then record in its transaction.
func Run(ctx context.Context, db *store.DB, rec *Record, ttl time.Duration, check func() error, record func(ctx context.Context, tx pgx.Tx) error) (*Record, error) {
	if rec.Key == "" {
		if check != nil {
			if err := check(); err != nil {
				return nil, err
			}
		}
		if record == nil {
			return nil, nil
		}
		return nil, db.Tx(ctx, func(tx pgx.Tx) error { return record(ctx, tx) })
	}
	if err := Check(rec.Key); err != nil {
		return nil, err
	}
	first, err := Get(ctx, db, rec.Client, rec.Key)
	if err != nil {
		return nil, err
	}
	if first != nil {
		if err := first.Names(rec.RequestHash); err != nil {
			return nil, err
		}
		return first, nil
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, err
		}
	}
	err = db.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		if first, err = Claim(ctx, tx, rec, ttl); err != nil || first != nil {
			return err
		}
		if record != nil {
			return record(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return first, nil
}

// ErrReused is in the chain of the error of a key sent with a request other than the
// one it names.
var ErrReused = errors.New("idempotency key reused for a different request")

// Claim makes rec's key name rec's request for ttl (SPACE_IDEMPOTENCY_KEY_TTL, 24h by
// default: longer than any client's retry loop), unless an unexpired claim holds the
// key already. It returns nil when rec now holds the key (its CreatedAt and ExpiresAt
// set); the holding Record when it names this same request (a repeat, whose outcome
// the caller answers with); and an EUNPROCESSABLE error naming the header, wrapping
// ErrReused, when it names a different one.
//
// Run inside the transaction that records what the request makes, a claim commits or
// rolls back with it; a concurrent claim of the same key waits for that transaction
// and then sees its outcome.
func Claim(ctx context.Context, q store.Querier, rec *Record, ttl time.Duration) (*Record, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("idempotency: the TTL of a claim must be positive, got %s", ttl)
	}
	// A claim races a purge of the expired key and a concurrent claim of it: if the
	// key is neither claimable nor readable, look again (a few times at most: each
	// retry follows another request's commit).
	for range 3 {
		err := q.QueryRow(ctx, `INSERT INTO idempotency_keys AS k (client, key, request_hash, operation_id, sandbox_id, expires_at)
			VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
			ON CONFLICT (client, key) DO UPDATE SET request_hash = excluded.request_hash,
				operation_id = excluded.operation_id, sandbox_id = excluded.sandbox_id,
				created_at = now(), expires_at = excluded.expires_at
			WHERE k.expires_at <= now()
			RETURNING created_at, expires_at`,
			string(rec.Client), rec.Key, rec.RequestHash, nullUUID(rec.OperationID), nullUUID(rec.SandboxID), ttl.Seconds(),
		).Scan(&rec.CreatedAt, &rec.ExpiresAt)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("claim idempotency key: %w", err)
		}
		prev, err := Get(ctx, q, rec.Client, rec.Key)
		if err != nil {
			return nil, err
		}
		if prev == nil {
			continue
		}
		if err := prev.Names(rec.RequestHash); err != nil {
			return nil, err
		}
		return prev, nil
	}
	return nil, fmt.Errorf("claim idempotency key: it changed hands three times in a row")
}

// Names returns nil when r names the request of hash, and otherwise the
// EUNPROCESSABLE error naming the header (wrapping ErrReused) that the reuse of a key
// answers.
func (r *Record) Names(hash string) error {
	if r.RequestHash == hash {
		return nil
	}
	return &space.Error{Code: space.EUNPROCESSABLE, Field: Header, Err: ErrReused,
		Message: fmt.Sprintf("names a different request of yours until %s; send a new key with a new request",
			r.ExpiresAt.UTC().Format(time.RFC3339))}
}

func nullUUID(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Get returns the unexpired claim of client's key, nil when there is none.
func Get(ctx context.Context, q store.Querier, client space.ClientID, key string) (*Record, error) {
	rec := &Record{Client: client, Key: key}
	var opID, sbID *string
	err := q.QueryRow(ctx, `SELECT request_hash, operation_id::text, sandbox_id::text, created_at, expires_at
		FROM idempotency_keys WHERE client = $1 AND key = $2 AND expires_at > now()`, string(client), key,
	).Scan(&rec.RequestHash, &opID, &sbID, &rec.CreatedAt, &rec.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get idempotency key: %w", err)
	}
	if opID != nil {
		rec.OperationID = *opID
	}
	if sbID != nil {
		rec.SandboxID = *sbID
	}
	return rec, nil
}

// purgeBatch bounds one purge statement, so a backlog of expired keys is deleted in
// short transactions rather than one long one.
const purgeBatch = 5000

// Purge deletes expired keys, at most purgeBatch of them, and returns how many: expired
// keys already name nothing (a claim takes them over), so this only keeps the table to
// the keys in force. The reconciler runs it each round.
func Purge(ctx context.Context, q store.Querier) (int, error) {
	tag, err := q.Exec(ctx, `DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM idempotency_keys WHERE expires_at <= now() LIMIT $1))`, purgeBatch)
	if err != nil {
		return 0, fmt.Errorf("purge expired idempotency keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
