package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier is what a query needs: the DB, or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB is the pool every package queries Postgres through, and the one seam where a
// Postgres outage becomes EUNAVAILABLE (503): every error it returns, from a query, a
// row, an iteration or a transaction, has passed Classify. Code above it therefore
// compares errors by domain code without classifying them itself. Domain errors and
// Postgres's own answers (a unique violation, pgx.ErrNoRows) come out as they went in.
type DB struct {
	pool *pgxpool.Pool
}

// Wrap returns the DB over pool.
func Wrap(pool *pgxpool.Pool) *DB { return &DB{pool: pool} }

// Pool is the pool itself, for what needs a connection of its own (River, LISTEN, a
// session lock), whose errors its user classifies.
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

// Exec implements Querier.
func (db *DB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := db.pool.Exec(ctx, sql, args...)
	return tag, Classify(err)
}

// Query implements Querier.
func (db *DB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := db.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, Classify(err)
	}
	return classifiedRows{rows}, nil
}

// QueryRow implements Querier.
func (db *DB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return classifiedRow{db.pool.QueryRow(ctx, sql, args...)}
}

// Tx runs fn in a transaction, committed when fn returns nil and rolled back
// otherwise; its error, fn's included, is classified.
func (db *DB) Tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return Classify(pgx.BeginFunc(ctx, db.pool, fn))
}

// Batch sends b's statements in one round trip and reads every result (b's callbacks
// run in order); its error is the first of them, classified. With no BEGIN in b, its
// statements run as one transaction (an implicit one, committed at the batch's end):
// one that fails rolls back those before it, and those after it do not run.
func (db *DB) Batch(ctx context.Context, b *pgx.Batch) error {
	return Classify(db.pool.SendBatch(ctx, b).Close())
}

type classifiedRow struct{ pgx.Row }

func (r classifiedRow) Scan(dest ...any) error { return Classify(r.Row.Scan(dest...)) }

type classifiedRows struct{ pgx.Rows }

func (r classifiedRows) Err() error { return Classify(r.Rows.Err()) }

func (r classifiedRows) Scan(dest ...any) error { return Classify(r.Rows.Scan(dest...)) }
