package redisconn

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

func TestCredentials(t *testing.T) {
	t.Parallel()
	auth := testenv.StartAuthRedis(t)
	passwordFile := func(t *testing.T, pw string) string { return testenv.WriteFile(t, "redis-password", pw+"\n") }

	t.Run("the default user's password from SPACE_REDIS_PASSWORD_FILE logs in", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_PASSWORD_FILE": passwordFile(t, auth.Password)}))
	})

	t.Run("an ACL user logs in", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": auth.User, "SPACE_REDIS_PASSWORD": auth.UserPassword}))
	})

	t.Run("the credentials of a redis:// SPACE_REDIS_URL log in", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_URL": "redis://" + auth.User + ":" + auth.UserPassword + "@" + auth.Addr + "/0"}))
	})

	t.Run("a user that may not run INFO is believed in standalone mode", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_MODE": "standalone",
			"SPACE_REDIS_USERNAME": auth.NoInfoUser, "SPACE_REDIS_PASSWORD": auth.UserPassword}))
	})

	t.Run("a wrong password is a setup error naming its variable, without the password", func(t *testing.T) {
		t.Parallel()
		err := openFails(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_PASSWORD_FILE": passwordFile(t, "wrong-password-42")},
			"SPACE_REDIS_PASSWORD_FILE: Redis at "+auth.Addr+" refused the credentials")
		if strings.Contains(err.Error(), "wrong-password-42") {
			t.Errorf("the error shows the password: %v", err)
		}
	})

	t.Run("an unknown user is a setup error naming SPACE_REDIS_USERNAME and the password's variable", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": "mallory", "SPACE_REDIS_PASSWORD": auth.UserPassword},
			"SPACE_REDIS_USERNAME/SPACE_REDIS_PASSWORD: Redis at", "refused the credentials")
	})

	t.Run("no password for a server that wants one is a setup error naming both password variables", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr}, "SPACE_REDIS_PASSWORD_FILE/SPACE_REDIS_PASSWORD", "none is set")
	})

	t.Run("wrong credentials in SPACE_REDIS_URL are a setup error naming it, without the password", func(t *testing.T) {
		t.Parallel()
		err := openFails(t, map[string]string{"SPACE_REDIS_URL": "redis://" + auth.User + ":nope-" + auth.UserPassword + "@" + auth.Addr},
			"SPACE_REDIS_URL: Redis at", "refused the credentials")
		if strings.Contains(err.Error(), auth.UserPassword) {
			t.Errorf("the error shows the password: %v", err)
		}
	})

	t.Run("a user that may not run INFO is a setup error in auto mode naming SPACE_REDIS_USERNAME and SPACE_REDIS_MODE", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": auth.NoInfoUser, "SPACE_REDIS_PASSWORD": auth.UserPassword},
			"SPACE_REDIS_USERNAME/SPACE_REDIS_MODE", "user "+auth.NoInfoUser, "may not run INFO", "+info")
	})

	t.Run("the settings Open logs never show the password", func(t *testing.T) {
		t.Parallel()
		_, logs, err := open(t, map[string]string{"SPACE_REDIS_ADDRS": auth.Addr, "SPACE_REDIS_USERNAME": auth.User,
			"SPACE_REDIS_PASSWORD_FILE": passwordFile(t, auth.UserPassword)})
		if err != nil {
			t.Fatal(err)
		}
		out := logs.String()
		if !strings.Contains(out, `"password_set":true`) || !strings.Contains(out, `"username":"`+auth.User+`"`) {
			t.Errorf("Open does not log the Redis settings:\n%s", out)
		}
		if strings.Contains(out, auth.UserPassword) {
			t.Errorf("the log shows the password:\n%s", out)
		}
	})
}

func TestTLS(t *testing.T) {
	t.Parallel()
	srv := testenv.StartTLSRedis(t)

	t.Run("TLS verified with SPACE_REDIS_TLS_CA_FILE works", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile}))
	})

	t.Run("a rediss:// SPACE_REDIS_URL verifying SPACE_REDIS_TLS_SERVER_NAME works", func(t *testing.T) {
		t.Parallel()
		works(t, opens(t, map[string]string{"SPACE_REDIS_URL": "rediss://" + srv.Addr, "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile,
			"SPACE_REDIS_TLS_SERVER_NAME": srv.ServerName}))
	})

	t.Run("every connection has TLS 1.2 or later, the CAs of the file and the server name; none without TLS", func(t *testing.T) {
		t.Parallel()
		cfg := settings(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile,
			"SPACE_REDIS_TLS_SERVER_NAME": srv.ServerName})
		for name, c := range map[string]*tls.Config{"standalone": options(cfg, srv.Addr).TLSConfig, "cluster": clusterOptions(cfg).TLSConfig} {
			if c == nil || c.MinVersion != tls.VersionTLS12 || c.RootCAs == nil || !c.RootCAs.Equal(cfg.TLSRootCAs) || c.ServerName != srv.ServerName || c.InsecureSkipVerify {
				t.Errorf("%s client: TLS config %+v; want TLS 1.2 or later verifying %s with the CAs of the file", name, c, srv.ServerName)
			}
		}
		plain := settings(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr})
		if c := options(plain, srv.Addr).TLSConfig; c != nil {
			t.Errorf("TLS config %+v without SPACE_REDIS_TLS, want none", c)
		}
	})

	t.Run("a CA that did not sign the server's certificate is a setup error naming SPACE_REDIS_TLS_CA_FILE", func(t *testing.T) {
		t.Parallel()
		other := testenv.NewCA(t)
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": other.CertFile},
			"SPACE_REDIS_TLS_CA_FILE: the TLS handshake with Redis at "+srv.Addr, "not signed by a CA of "+other.CertFile)
	})

	t.Run("the system roots, which did not sign it either, are a setup error saying SPACE_REDIS_TLS_CA_FILE is not set", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_TLS": "true"},
			"SPACE_REDIS_TLS_CA_FILE: the TLS handshake", "the system roots (SPACE_REDIS_TLS_CA_FILE is not set)")
	})

	t.Run("a server name the certificate is not for is a setup error naming SPACE_REDIS_TLS_SERVER_NAME", func(t *testing.T) {
		t.Parallel()
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile,
			"SPACE_REDIS_TLS_SERVER_NAME": "other.space.test"},
			"SPACE_REDIS_TLS_SERVER_NAME: the TLS handshake", "not for other.space.test")
	})

	t.Run("a server that refuses the handshake is a setup error naming the TLS variables", func(t *testing.T) {
		t.Parallel()
		addr := refusingTLSServer(t, srv.CA)
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": addr, "SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile},
			"SPACE_REDIS_TLS/SPACE_REDIS_TLS_CA_FILE/SPACE_REDIS_TLS_SERVER_NAME: Redis at "+addr+" refused the TLS handshake")
	})

	t.Run("TLS asked for by a rediss:// URL is named by SPACE_REDIS_URL", func(t *testing.T) {
		t.Parallel()
		addr := refusingTLSServer(t, srv.CA)
		openFails(t, map[string]string{"SPACE_REDIS_URL": "rediss://" + addr, "SPACE_REDIS_TLS_CA_FILE": srv.CA.CertFile},
			"SPACE_REDIS_URL/SPACE_REDIS_TLS_CA_FILE/SPACE_REDIS_TLS_SERVER_NAME: Redis at "+addr+" refused the TLS handshake")
	})

	t.Run("a TLS client of a server that answers in plain text is a setup error naming SPACE_REDIS_TLS", func(t *testing.T) {
		t.Parallel()
		addr := fakeServer(t, func(c net.Conn) {
			c.Read(make([]byte, 1024)) //nolint:errcheck // the hello, as Redis reads it
			c.Write([]byte("-ERR unknown command\r\n"))
		})
		openFails(t, map[string]string{"SPACE_REDIS_ADDRS": addr, "SPACE_REDIS_TLS": "true"}, "SPACE_REDIS_TLS: Redis at "+addr+" does not speak TLS")
	})

	t.Run("a TLS client of a plain port is told to drop SPACE_REDIS_TLS, whichever way the server answers the hello", func(t *testing.T) {
		t.Parallel()
		// Redis reads a TLS hello as an inline command: if the hello's random bytes hold
		// a newline it answers an error, which the handshake reads as a record that is not
		// TLS (a setup error); otherwise it waits for the line, and the check times out
		// (an outage, with the hint). Both must name the variable.
		_, logs, err := open(t, map[string]string{"SPACE_REDIS_ADDRS": testenv.RedisAddr(t), "SPACE_REDIS_TLS": "true", "SPACE_REDIS_MODE": "standalone"})
		switch {
		case err != nil:
			mustName(t, err, "SPACE_REDIS_TLS")
		case !strings.Contains(logs.String(), "if the server does not speak TLS, SPACE_REDIS_TLS must not ask for it"):
			t.Fatalf("Open went on without telling to drop SPACE_REDIS_TLS:\n%s", logs)
		}
	})

	t.Run("a plain client of a TLS port starts, told that the server may speak TLS", func(t *testing.T) {
		t.Parallel()
		_, logs, err := open(t, map[string]string{"SPACE_REDIS_ADDRS": srv.Addr, "SPACE_REDIS_MODE": "standalone"})
		if err != nil || !strings.Contains(logs.String(), "if it serves TLS, set SPACE_REDIS_TLS=true") {
			t.Fatalf("Open = %v; want it to go on and warn to set SPACE_REDIS_TLS=true:\n%s", err, logs)
		}
	})
}

// refusingTLSServer listens on loopback with a certificate of ca and refuses every
// handshake: it wants a client certificate, which the replica never has. TLS 1.2, so
// that the refusal ends the client's handshake itself.
func refusingTLSServer(t *testing.T, ca *testenv.CA) string {
	t.Helper()
	certFile, keyFile := ca.ServerCertificate(t, "refusing.space.test")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MaxVersion: tls.VersionTLS12}
	return fakeServer(t, func(c net.Conn) { tls.Server(c, cfg).Handshake() }) //nolint:errcheck // refused on purpose
}

// fakeServer listens on loopback and runs serve on every connection, then reads what
// the client still sends until it closes (closing with bytes unread would reset the
// connection, and the client could lose what serve wrote); it stops when the test
// ends.
func fakeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				io.Copy(io.Discard, c) //nolint:errcheck // until the client closes
			}()
		}
	}()
	return ln.Addr().String()
}
