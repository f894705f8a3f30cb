// Package apikey issues, looks up and revokes the API keys of SPACE_AUTH_MODE=api_key.
//
// A key is 256 bits from crypto/rand, shown once when it is created and stored only as
// its SHA-256. A plain, unsalted, fast hash is enough here, unlike for passwords: a
// password is low-entropy, so a stolen hash can be brute-forced and must be slowed
// with bcrypt or argon2; a random 256-bit key has nothing to brute-force, so its hash
// is as good as irreversible, and a fast hash keeps the per-request lookup cheap.
//
// Keys are not cached: every request's key is read by hash (an index probe) by a query
// that began after the request arrived, so a revoked key is refused by the very next
// request on every replica. The requests of one key that arrive while its read is on
// its way share the next read (Store.Lookup), so that a flood by one valid key costs
// Postgres one query at a time, not one a request.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/coalesce"
	"github.com/space-sandbox/space/internal/keyed"
	"github.com/space-sandbox/space/internal/store"
)

// Prefix starts every key, so that a leaked key is recognisable by secret scanners.
const Prefix = "spk_"

// keyBytes is the entropy of a key: 256 bits, twice what guessing resistance needs.
const keyBytes = 32

// encodedLen is the length of a key: the prefix and 43 base64url characters.
var encodedLen = len(Prefix) + base64.RawURLEncoding.EncodedLen(keyBytes)

// maxNameLen bounds a key's name: what it is for, not a document.
const maxNameLen = 200

// Key is a stored API key; the key itself is never stored.
type Key struct {
	ID         string     `json:"id"`
	Client     string     `json:"client"`
	Name       string     `json:"name"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// ErrInvalid means the presented key is unknown, malformed or revoked. The three are
// not told apart, to the caller or in the error.
var ErrInvalid = errors.New("invalid API key")

// Store keeps keys in Postgres.
type Store struct {
	db     *store.DB
	logger *slog.Logger

	// touched remembers when last_used_at was last written per key, so that a key used
	// a thousand times a second costs one write a minute, not a thousand.
	// Bounded: a key forgotten costs one write more. A key unused for TouchInterval is
	// forgotten (keyed.Options.IdleFor): its next use writes whether it is known or not.
	touched *keyed.Map[atomic.Int64] // Unix nanoseconds

	// used are the keys whose last use is to be written, for the next write of them
	// all (writeUses); writing says whether a writer goroutine is on its way.
	mu      sync.Mutex
	used    []string
	writing bool
	// writes counts the UPDATE statements writeUses ran, for the tests.
	writes atomic.Int64

	// reads coalesces the lookups of each key (see Lookup); queries counts their
	// queries, and queried, when set, runs as each has read: for the tests.
	reads   coalesce.Reads[[sha256.Size]byte, Key]
	queries atomic.Int64
	queried func()
}

// TouchInterval is how stale last_used_at may be.
const TouchInterval = time.Minute

// useWriteEvery is how long a key's use waits to be written with every other key's
// used meanwhile; useWriteMax bounds the keys one UPDATE names.
const (
	useWriteEvery = time.Second
	useWriteMax   = 1000
)

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{db: store.Wrap(db), logger: logger, touched: keyed.New(keyed.Options[atomic.Int64]{IdleFor: TouchInterval})}
}

// Create issues a key for client, named name (what it is for, e.g. "ci"), and returns
// it with the key itself: the only time the key is ever seen.
func (s *Store) Create(ctx context.Context, client, name string) (Key, string, error) {
	client, name = strings.TrimSpace(client), strings.TrimSpace(name)
	if client == "" {
		return Key{}, "", space.FieldError(space.EINVALID, "client", "is required")
	}
	if err := space.CheckClientID(client); err != nil {
		return Key{}, "", space.FieldError(space.EINVALID, "client", "%v (a client id is %s)", err, space.ClientIDRule)
	}
	switch {
	case name == "":
		return Key{}, "", space.FieldError(space.EINVALID, "name", "is required")
	case len(name) > maxNameLen || !utf8.ValidString(name) || strings.ContainsRune(name, 0):
		return Key{}, "", space.FieldError(space.EINVALID, "name", "must be at most %d bytes of UTF-8 text without NUL", maxNameLen)
	}
	var raw [keyBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Key{}, "", fmt.Errorf("generate key: %w", err)
	}
	secret := Prefix + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(secret))
	k := Key{ID: uuid.NewString(), Client: client, Name: name}
	err := s.db.QueryRow(ctx, `INSERT INTO api_keys (id, client, name, hash) VALUES ($1, $2, $3, $4) RETURNING created_at`,
		k.ID, client, name, sum[:]).Scan(&k.CreatedAt)
	if err != nil {
		return Key{}, "", fmt.Errorf("store key: %w", err)
	}
	return k, secret, nil
}

// List returns every key, newest first.
func (s *Store) List(ctx context.Context) ([]Key, error) {
	rows, err := s.db.Query(ctx, `SELECT id::text, client, name, created_at, last_used_at, revoked_at
		FROM api_keys ORDER BY created_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Key, error) {
		var k Key
		err := row.Scan(&k.ID, &k.Client, &k.Name, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// Revoke revokes key id; revoking a revoked key is not an error.
func (s *Store) Revoke(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return space.FieldError(space.EINVALID, "id", "%q is not a key id", id)
	}
	tag, err := s.db.Exec(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return space.Errorf(space.ENOTFOUND, "no key %s", id)
	}
	return nil
}

// WellFormed reports whether secret has the shape of a key this package issues, so
// that garbage is refused without a database round trip.
func WellFormed(secret string) bool {
	if len(secret) != encodedLen || !strings.HasPrefix(secret, Prefix) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(secret[len(Prefix):])
	return err == nil
}

// Lookup returns the live key whose secret this is, or ErrInvalid. A Postgres outage is
// an EUNAVAILABLE error, not ErrInvalid: a caller is not told its key is bad because
// the database is down.
//
// The answer is always read by a query that began after Lookup was called, so a key
// revoked before is refused. One key's lookups are coalesced (coalesce.Reads): while a
// query of the key is on its way, the lookups of it that arrive wait together for the
// next query, sent as that one comes back. A flood by one valid key then costs
// Postgres one query at a time, each answering every request that arrived during the
// one before, where it cost a query a request: the key's lookup is the one piece of a
// request's work done before the overload gate, which has to know who is asking
// (docs/benchmarks.md, "A flood by one API key"). A lookup whose context ends while
// it waits returns at once.
func (s *Store) Lookup(ctx context.Context, secret string) (Key, error) {
	if !WellFormed(secret) {
		return Key{}, ErrInvalid
	}
	sum := sha256.Sum256([]byte(secret))
	k, err := s.reads.Do(ctx, sum, func(ctx context.Context) (Key, error) { return s.query(ctx, sum) })
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return Key{}, err
		}
		return Key{}, fmt.Errorf("look up key: %w", store.Classify(err))
	}
	s.touch(k.ID)
	return k, nil
}

// query reads the live key whose secret hashes to sum, or ErrInvalid.
func (s *Store) query(ctx context.Context, sum [sha256.Size]byte) (Key, error) {
	s.queries.Add(1)
	var k Key
	var stored []byte
	err := s.db.QueryRow(ctx, `SELECT id::text, client, name, hash, created_at, revoked_at FROM api_keys WHERE hash = $1`,
		sum[:]).Scan(&k.ID, &k.Client, &k.Name, &stored, &k.CreatedAt, &k.RevokedAt)
	if s.queried != nil {
		s.queried()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrInvalid
	}
	if err != nil {
		return Key{}, err
	}
	// The index found the row by hash; compare again in constant time so that no
	// code path compares key material byte by byte with an early exit.
	if subtle.ConstantTimeCompare(stored, sum[:]) != 1 || k.RevokedAt != nil {
		return Key{}, ErrInvalid
	}
	return k, nil
}

// touch records the key's use, at most once a TouchInterval per key and off the
// request path: the keys used within useWriteEvery are written together, in one
// UPDATE (of at most useWriteMax keys), by one goroutine that ends when none is left.
// A write a key, as before, was one statement a request at a platform's size: 100,000
// tenants each creating once a minute are 1,667 writes a second to Postgres, which cost
// a quarter of a replica's refusals measured spread over them (docs/benchmarks.md, "A
// hundred thousand tenants, again"). A write that fails is logged and not retried:
// last_used_at tells an operator which keys are in use, to the minute, and the next
// use a minute on writes it again.
func (s *Store) touch(id string) {
	now := time.Now()
	last := s.touched.LoadOrNew(id, nil)
	prev := last.Load()
	if now.UnixNano()-prev < int64(TouchInterval) || !last.CompareAndSwap(prev, now.UnixNano()) {
		return
	}
	s.mu.Lock()
	s.used = append(s.used, id)
	start := !s.writing
	s.writing = true
	s.mu.Unlock()
	if start {
		go s.writeUses()
	}
}

// writeUses writes the keys used, every useWriteEvery, until a wait finds none.
func (s *Store) writeUses() {
	for {
		time.Sleep(useWriteEvery)
		s.mu.Lock()
		ids := s.used
		s.used = nil
		if len(ids) == 0 {
			s.writing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for len(ids) > 0 {
			n := min(len(ids), useWriteMax)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := s.db.Exec(ctx, `UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1::uuid[])`, ids[:n])
			cancel()
			s.writes.Add(1)
			if err != nil {
				s.logger.Warn("record keys' use", "keys", n, "err", err)
			}
			ids = ids[n:]
		}
	}
}
