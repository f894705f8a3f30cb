package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Private redis-servers that want credentials or speak TLS alone, for tests of how a
// component logs in to Redis: each test gets servers of its own, so that a password or
// a certificate never leaks from one test into another.

// AuthRedis is a private redis-server that refuses every command before AUTH: the
// default user has Password (requirepass), and two ACL users have UserPassword: User
// may run everything, NoInfoUser everything but INFO.
type AuthRedis struct {
	Addr               string
	Password           string
	User, NoInfoUser   string
	UserPassword       string
	t                  testing.TB
	defaultUserOptions redis.Options
}

// StartAuthRedis starts an AuthRedis with random passwords, stopped when the test ends.
func StartAuthRedis(t testing.TB) *AuthRedis {
	t.Helper()
	s := &AuthRedis{
		Password:     "default-" + RandomID(8),
		User:         "alice",
		NoInfoUser:   "carol",
		UserPassword: "alice-" + RandomID(8),
		t:            t,
	}
	p, err := StartRedisServerWith(context.Background(), t.TempDir(), RedisServerOptions{
		// One argument per ACL rule: redis-server quotes an argument with spaces whole.
		Args: []string{
			"--requirepass", s.Password,
			"--user", s.User, "on", ">" + s.UserPassword, "~*", "&*", "+@all",
			"--user", s.NoInfoUser, "on", ">" + s.UserPassword, "~*", "&*", "+@all", "-info",
		},
		Client: redis.Options{Password: s.Password},
	})
	if err != nil {
		t.Fatalf("redis-server with passwords: %v", err)
	}
	t.Cleanup(p.Stop)
	s.Addr = p.Addr
	return s
}

// Client is a client of the server as User, closed when the test ends.
func (s *AuthRedis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: s.User, Password: s.UserPassword})
	t.Cleanup(func() { c.Close() })
	return c
}

// TLSRedis is a private redis-server that speaks TLS alone, with a certificate for
// 127.0.0.1 and ServerName signed by CA. It asks clients for no certificate.
type TLSRedis struct {
	Addr       string
	ServerName string
	CA         *CA
}

// StartTLSRedis starts a TLSRedis with a CA of its own, stopped when the test ends.
func StartTLSRedis(t testing.TB) *TLSRedis {
	t.Helper()
	s := &TLSRedis{ServerName: "redis.space.test", CA: NewCA(t)}
	cert, key := s.CA.ServerCertificate(t, s.ServerName)
	p, err := StartRedisServerWith(context.Background(), t.TempDir(), RedisServerOptions{
		TLS:    &RedisTLSFiles{CertFile: cert, KeyFile: key, CAFile: s.CA.CertFile},
		Client: redis.Options{TLSConfig: &tls.Config{RootCAs: s.CA.Pool, MinVersion: tls.VersionTLS12}},
	})
	if err != nil {
		t.Fatalf("redis-server with TLS: %v", err)
	}
	t.Cleanup(p.Stop)
	s.Addr = p.Addr
	return s
}

// Client is a TLS client of the server, closed when the test ends.
func (s *TLSRedis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: &tls.Config{RootCAs: s.CA.Pool, MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { c.Close() })
	return c
}

// CA is a certificate authority made for one test: an ECDSA P-256 key and a
// self-signed certificate valid for an hour, written as PEM to CertFile.
type CA struct {
	CertFile string
	Pool     *x509.CertPool

	t    testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA in a temporary directory of the test.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "space test CA " + RandomID(4)},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{t: t, dir: t.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.CertFile = ca.write("ca.crt", "CERTIFICATE", der)
	return ca
}

// ServerCertificate issues a server certificate for 127.0.0.1 and dnsName and returns
// the PEM files of the certificate and its key.
func (ca *CA) ServerCertificate(t testing.TB, dnsName string) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: dnsName},
		DNSNames:     []string{dnsName},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	name := RandomID(4)
	return ca.write(name+".crt", "CERTIFICATE", der), ca.write(name+".key", "PRIVATE KEY", keyDER)
}

func (ca *CA) write(name, blockType string, der []byte) string {
	ca.t.Helper()
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
