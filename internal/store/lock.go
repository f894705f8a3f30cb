package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Advisory lock ids of the work one replica at a time does.
const (
	// ReplenishLockID is held by the replica replenishing the warm pool.
	ReplenishLockID = 0x5ace_0002
	// ReconcileLockID is held by the replica settling what crashes and outages left
	// behind.
	ReconcileLockID = 0x5ace_0003
	// LifecycleLockID is held by the replica taking the lifecycle's due actions.
	LifecycleLockID = 0x5ace_0004
)

// WhileLocked runs fn if this replica can take the session advisory lock id now, and
// reports whether it did: a replica that cannot take it skips its turn rather than
// queueing behind the holder. The lock lives on a connection of its own for fn's
// duration, and goes with that connection if the unlock fails, so a replica that dies
// mid-round never keeps it.
func WhileLocked(ctx context.Context, db *pgxpool.Pool, id int64, fn func(ctx context.Context) error) (bool, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire a connection for lock %#x: %w", id, err)
	}
	defer conn.Release()
	var leader bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&leader); err != nil {
		return false, fmt.Errorf("lock %#x: %w", id, err)
	}
	if !leader {
		return false, nil
	}
	defer func() {
		// Unlock on a context that outlives a cancelled round; if even that fails, the
		// lock goes with the connection.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", id); err != nil {
			conn.Conn().Close(uctx)
		}
	}()
	return true, fn(ctx)
}
