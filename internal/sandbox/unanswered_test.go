package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// unanswered makes sandbox id look like a synchronous create nobody was told of.
func (b *bundle) unanswered(t *testing.T, id string) {
	t.Helper()
	if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET answered = false WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
}

// keyFor records a live idempotency key of acme naming sandbox id, as a keyed
// synchronous create claims it.
func (b *bundle) keyFor(t *testing.T, id string, expiresIn time.Duration) {
	t.Helper()
	if _, err := b.db.Exec(b.ctx, `INSERT INTO idempotency_keys (client, key, request_hash, sandbox_id, expires_at)
		VALUES ('acme', 'k-' || $1, 'h', $1::uuid, now() + make_interval(secs => $2))`, id, expiresIn.Seconds()); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) isAnswered(t *testing.T, id string) bool {
	t.Helper()
	var answered bool
	if err := b.db.QueryRow(b.ctx, "SELECT answered FROM sandboxes WHERE id = $1", id).Scan(&answered); err != nil {
		t.Fatal(err)
	}
	return answered
}

func TestUnansweredCreates(t *testing.T) {
	t.Parallel()

	t.Run("an unanswered create without a key is failed and what runs for it is stopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		b.unanswered(t, id)
		ref, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		res := b.round(t, b.reconciler(time.Hour))
		sb := b.get(t, id)
		if res.Settled[space.StateFailed] != 1 || sb.State != space.StateFailed || !strings.Contains(sb.LastError, "not answered") {
			t.Fatalf("round %+v; sandbox %s (%q), want failed because nobody was answered", res, sb.State, sb.LastError)
		}
		if b.sim.IsRunning(ref) || len(b.found(t, id).Resources) != 0 {
			t.Fatal("what ran for the unanswered create still runs")
		}
	})

	t.Run("an answered create left starting with its resource ready is still settled running", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t) // answered: a queued create's 202 named it
		ref, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		b.round(t, b.reconciler(time.Hour))
		if sb := b.get(t, id); sb.State != space.StateRunning || sb.SubstrateRef != ref {
			t.Fatalf("sandbox %s on %q, want running on %s", sb.State, sb.SubstrateRef, ref)
		}
	})

	t.Run("an unanswered create under a live key is kept for its retry and ended when the key expires unclaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		b.unanswered(t, id)
		b.keyFor(t, id, time.Hour)
		ref, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		r := b.reconciler(time.Hour)
		b.round(t, r)
		if sb := b.get(t, id); sb.State != space.StateRunning || !b.sim.IsRunning(ref) {
			t.Fatalf("sandbox %s, want running for the key's retry", sb.State)
		}
		b.round(t, r)
		if sb := b.get(t, id); sb.State != space.StateRunning {
			t.Fatalf("sandbox %s under a live key, want it kept running", sb.State)
		}
		if _, err := b.db.Exec(b.ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE sandbox_id = $1", id); err != nil {
			t.Fatal(err)
		}
		b.round(t, r)
		sb := b.get(t, id)
		if sb.State != space.StateFailed || !strings.Contains(sb.LastError, "expired unclaimed") || b.sim.IsRunning(ref) {
			t.Fatalf("after the key expired: %s (%q), running %v; want failed and stopped", sb.State, sb.LastError, b.sim.IsRunning(ref))
		}
	})

	t.Run("a running sandbox whose key expired after it was answered is kept", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python, IdempotencyKey: "once"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Exec(b.ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		b.round(t, b.reconciler(time.Hour))
		if got := b.get(t, sb.ID); got.State != space.StateRunning || !b.sim.IsRunning(got.SubstrateRef) {
			t.Fatalf("answered sandbox %s, want it kept running", got.State)
		}
	})

	// leaving starts a create whose caller leaves while its cold start is held, and
	// returns the create's error and the sandbox id once the start is released.
	leaving := func(t *testing.T, b *bundle, req sandbox.CreateRequest) (string, error) {
		t.Helper()
		release := b.holdColdStarts()
		ctx, cancel := context.WithCancel(b.ctx)
		id, created := b.createHeld(t, b.svc, ctx, req)
		cancel() // the caller hangs up mid cold start
		close(release)
		err := <-created
		b.setFail(nil)
		return id, err
	}

	t.Run("a create whose caller leaves before its sandbox is ready is stopped and failed at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id, err := leaving(t, b, sandbox.CreateRequest{Shape: python})
		if err == nil {
			t.Fatal("the abandoned create returned a sandbox")
		}
		sb := b.get(t, id)
		if sb.State != space.StateFailed || !strings.Contains(sb.LastError, "not answered") {
			t.Fatalf("sandbox %s (%q), want failed: its caller left", sb.State, sb.LastError)
		}
		if f := b.found(t, id); len(f.Resources) != 0 {
			t.Fatalf("the substrate still holds %+v", f.Resources)
		}
	})

	t.Run("a keyed create whose caller leaves is kept, and its retry gets it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		req := sandbox.CreateRequest{Shape: python, IdempotencyKey: "retry-me"}
		id, lerr := leaving(t, b, req)
		if sb := b.get(t, id); sb.State != space.StateRunning {
			t.Fatalf("keyed sandbox %s (%v), want running for its retry", sb.State, lerr)
		}
		sb, err := create(b.svc, b.ctx, acme(), req)
		if err != nil || sb.ID != id || sb.State != space.StateRunning {
			t.Fatalf("retry = %+v, %v; want sandbox %s running", sb, err, id)
		}
	})

	t.Run("a keyed create answered by nobody is answered by the retry that returns it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		req := sandbox.CreateRequest{Shape: python, IdempotencyKey: "later"}
		sb, err := create(b.svc, b.ctx, acme(), req)
		if err != nil {
			t.Fatal(err)
		}
		b.unanswered(t, sb.ID) // as if its running write had been lost with the 201
		again, err := create(b.svc, b.ctx, acme(), req)
		if err != nil || again.ID != sb.ID || !b.isAnswered(t, sb.ID) {
			t.Fatalf("retry = %+v, %v; answered %v", again, err, b.isAnswered(t, sb.ID))
		}
	})

	t.Run("a queued create is answered from the start", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		release := b.holdColdStarts()
		id := "7d1c2b9e-3f4a-4c5d-8e6f-0a1b2c3d4e5f"
		started, done := b.createHeld(t, b.svc, b.ctx, sandbox.CreateRequest{ID: id, Shape: python, Answered: true})
		if started != id {
			t.Fatalf("sandbox %s is starting, want %s", started, id)
		}
		if !b.isAnswered(t, id) {
			t.Fatal("a queued create's row is unanswered while it starts")
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// holdColdStarts holds every cold start on b's substrate until the channel it returns
// is closed.
func (b *bundle) holdColdStarts() chan struct{} {
	release := make(chan struct{})
	b.setFail(func(c substrate.Call) error {
		if c.Op == substrate.OpStartCold {
			<-release
		}
		return nil
	})
	return release
}

// createHeld sends req on svc as a caller whose context is ctx while cold starts are
// held, and returns the sandbox's id once it is starting, with the channel the
// create's outcome arrives on.
func (b *bundle) createHeld(t *testing.T, svc *sandbox.Service, ctx context.Context, req sandbox.CreateRequest) (string, <-chan error) {
	t.Helper()
	created := make(chan error, 1)
	go func() {
		_, err := create(svc, ctx, acme(), req)
		created <- err
	}()
	var id string
	waitFor(t, "the create to be starting", func() bool {
		select {
		case err := <-created:
			t.Fatalf("create ended before its start was released: %v", err)
		default:
		}
		return b.db.QueryRow(b.ctx, "SELECT id::text FROM sandboxes WHERE state = 'starting'").Scan(&id) == nil
	})
	return id, created
}

// behindProxy returns a Service like b's on one connection to b's database through a
// proxy the test can mute and cut, with the OutcomeWait given; b.svc still reads and
// reconciles it directly. The connection has made a create already, so that the
// statements of the next are prepared on it: a muted proxy would otherwise hold a
// statement's preparation, never sending the statement itself.
func (b *bundle) behindProxy(t *testing.T, outcomeWait time.Duration) (*sandbox.Service, *testenv.Proxy) {
	t.Helper()
	url, proxy := testenv.ProxyDatabaseURL(t, b.db.Config().ConnString())
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	// Nor may it be pinged before use, as one idle for a second is.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	db, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	opts := b.options()
	opts.DB, opts.Pool, opts.OutcomeWait = db, pool.New(pool.Options{DB: db, Substrate: b.sim}), outcomeWait
	svc := sandbox.New(opts)
	if _, err := create(svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
		t.Fatal(err)
	}
	return svc, proxy
}

// lostReply starts a create on svc and, while its cold start is held, mutes the proxy
// in front of its Postgres; it releases the start and cuts the proxy once the write
// recording the sandbox running has committed unanswered, restoring it at once when
// restore is true. It returns the sandbox's id, what the substrate runs for it and
// the channel the create's outcome arrives on.
func lostReply(t *testing.T, b *bundle, svc *sandbox.Service, proxy *testenv.Proxy, req sandbox.CreateRequest, restore bool) (string, string, <-chan error) {
	t.Helper()
	starts := func() (n int) {
		for _, e := range b.events.list() {
			if e == string(substrate.OpStartCold) {
				n++
			}
		}
		return n
	}
	before := starts()
	release := b.holdColdStarts()
	id, created := b.createHeld(t, svc, b.ctx, req)
	// The row is visible once its booking committed, which may be before the commit's
	// reply has come back: the proxy is muted only once the create holds its start,
	// past every reply of its booking.
	waitFor(t, "the create to hold its cold start", func() bool { return starts() > before })
	proxy.Mute()
	close(release)
	var ref string
	waitFor(t, "the running write to commit with its reply dropped", func() bool {
		return b.db.QueryRow(b.ctx, "SELECT substrate_ref FROM sandboxes WHERE id = $1 AND state = 'running' AND answered", id).Scan(&ref) == nil
	})
	proxy.Cut()
	if restore {
		proxy.Restore()
	}
	return id, ref, created
}

func TestAWriteWhoseReplyIsLost(t *testing.T) {
	t.Parallel()

	t.Run("a create whose running write committed with its reply lost is answered with its sandbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		svc, proxy := b.behindProxy(t, time.Minute)
		id, ref, created := lostReply(t, b, svc, proxy, sandbox.CreateRequest{Shape: python}, true)
		if err := <-created; err != nil {
			t.Fatalf("create = %v; want sandbox %s, which Postgres holds running and answered", err, id)
		}
		if sb := b.get(t, id); sb.State != space.StateRunning || !b.isAnswered(t, id) || !b.sim.IsRunning(ref) {
			t.Fatalf("sandbox %s, answered %v, running on the substrate %v", sb.State, b.isAnswered(t, id), b.sim.IsRunning(ref))
		}
	})

	t.Run("a create without a key whose running write stays unknown is told 503, and its sandbox is ended rather than left answered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		svc, proxy := b.behindProxy(t, 300*time.Millisecond)
		id, ref, created := lostReply(t, b, svc, proxy, sandbox.CreateRequest{Shape: python}, false)
		if err := <-created; space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("create with postgres gone = %v, want unavailable", err)
		}
		proxy.Restore()
		waitFor(t, "the sandbox nobody was told of to be marked unanswered", func() bool {
			return !b.isAnswered(t, id)
		})
		res := b.round(t, b.reconciler(time.Hour))
		sb := b.get(t, id)
		if res.Settled[space.StateFailed] != 1 || sb.State != space.StateFailed || !strings.Contains(sb.LastError, "not answered") {
			t.Fatalf("round %+v; sandbox %s (%q), want failed because nobody was answered", res, sb.State, sb.LastError)
		}
		if b.sim.IsRunning(ref) {
			t.Fatal("what ran for the create nobody was told of still runs")
		}
	})

	t.Run("a keyed create whose running write stays unknown is kept answered for its retry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		svc, proxy := b.behindProxy(t, 300*time.Millisecond)
		req := sandbox.CreateRequest{Shape: python, IdempotencyKey: "unknown-outcome"}
		id, ref, created := lostReply(t, b, svc, proxy, req, false)
		if err := <-created; space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("create with postgres gone = %v, want unavailable", err)
		}
		proxy.Restore()
		sb, err := create(b.svc, b.ctx, acme(), req)
		if err != nil || sb.ID != id || sb.State != space.StateRunning || !b.sim.IsRunning(ref) {
			t.Fatalf("retry = %+v, %v; want sandbox %s running", sb, err, id)
		}
		if res := b.round(t, b.reconciler(time.Hour)); res.Settled[space.StateFailed] != 0 || !b.isAnswered(t, id) {
			t.Fatalf("round %+v, answered %v; the retry was answered with the sandbox", res, b.isAnswered(t, id))
		}
	})
}
