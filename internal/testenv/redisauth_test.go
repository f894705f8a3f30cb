package testenv

import (
	"crypto/tls"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestSecuredRedis(t *testing.T) {
	t.Parallel()

	t.Run("the password server answers its users and refuses everyone else", func(t *testing.T) {
		t.Parallel()
		s := StartAuthRedis(t)
		ctx := Context(t)
		for _, c := range []struct {
			name       string
			opts       redis.Options
			wantAnswer bool
		}{
			{"the default user", redis.Options{Password: s.Password}, true},
			{"the ACL user", redis.Options{Username: s.User, Password: s.UserPassword}, true},
			{"no password", redis.Options{}, false},
			{"a wrong password", redis.Options{Password: "wrong"}, false},
			{"an unknown user", redis.Options{Username: "mallory", Password: s.UserPassword}, false},
		} {
			c.opts.Addr, c.opts.MaxRetries = s.Addr, -1
			client := redis.NewClient(&c.opts)
			err := client.Ping(ctx).Err()
			client.Close()
			if (err == nil) != c.wantAnswer {
				t.Errorf("%s: PING = %v, want an answer: %v", c.name, err, c.wantAnswer)
			}
		}
		if err := s.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("Client: %v", err)
		}
	})

	t.Run("the TLS server answers a client trusting its CA and no one else", func(t *testing.T) {
		t.Parallel()
		s := StartTLSRedis(t)
		ctx := Context(t)
		if err := s.Client(t).Ping(ctx).Err(); err != nil {
			t.Fatalf("TLS client: %v", err)
		}
		byName := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1,
			TLSConfig: &tls.Config{RootCAs: s.CA.Pool, ServerName: s.ServerName, MinVersion: tls.VersionTLS12}})
		defer byName.Close()
		if err := byName.Ping(ctx).Err(); err != nil {
			t.Fatalf("TLS client verifying %s: %v", s.ServerName, err)
		}
		other := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1,
			TLSConfig: &tls.Config{RootCAs: NewCA(t).Pool, MinVersion: tls.VersionTLS12}})
		defer other.Close()
		if err := other.Ping(ctx).Err(); err == nil {
			t.Fatal("a client trusting another CA got an answer")
		}
		plain := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Fatal("a plain client got an answer")
		}
	})
}
