package dispatcher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/sandbox"
)

func TestNewRefusesAMissingOperatorSettingNamingIt(t *testing.T) {
	t.Parallel()
	// A pool connects on first use: New refuses its options before that.
	db, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	defaults := config.Default()
	valid := func() dispatcher.Options {
		return dispatcher.Options{
			DB: db, Sandboxes: sandbox.New(sandbox.Options{}), Callers: &limits{},
			AdmissionDeadline: defaults.Dispatcher.AdmissionDeadline,
			MaxSnooze:         defaults.Dispatcher.MaxSnooze,
			MaxAttempts:       defaults.Dispatcher.MaxAttempts,
			OwnerLanes:        defaults.Dispatcher.OwnerLanes,
			JobTimeout:        time.Minute,
			IdempotencyTTL:    defaults.IdempotencyKeyTTL,
		}
	}
	for field, unset := range map[string]func(*dispatcher.Options){
		"AdmissionDeadline": func(o *dispatcher.Options) { o.AdmissionDeadline = 0 },
		"MaxSnooze":         func(o *dispatcher.Options) { o.MaxSnooze = 0 },
		"MaxAttempts":       func(o *dispatcher.Options) { o.MaxAttempts = 0 },
		"OwnerLanes":        func(o *dispatcher.Options) { o.OwnerLanes = 0 },
		"JobTimeout":        func(o *dispatcher.Options) { o.JobTimeout = -time.Second },
		"IdempotencyTTL":    func(o *dispatcher.Options) { o.IdempotencyTTL = 0 },
	} {
		opts := valid()
		unset(&opts)
		if _, err := dispatcher.New(opts); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("New without %s = %v, want an error naming it", field, err)
		}
	}
}
