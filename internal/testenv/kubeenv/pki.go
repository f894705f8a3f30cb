package kubeenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the certificate authority of one test process's servers: it signs etcd's
// and the API server's serving certificates and every client certificate (the API
// server's towards etcd, the administrator's). Keys are ECDSA P-256, certificates
// valid for a day: longer than any test run.
type pki struct {
	dir    string
	caFile string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pem    []byte
}

func newPKI(dir string) (*pki, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: "space kubeenv CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	p := &pki{dir: dir, cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	p.caFile = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(p.caFile, p.pem, 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// keyPair is a signed certificate and its key, as files and as PEM.
type keyPair struct {
	certFile, keyFile string
	certPEM, keyPEM   []byte
}

// server issues a serving certificate for 127.0.0.1 and localhost. Both ends of
// etcd's peer port use it too, hence the client usage.
func (p *pki) server(name string) (keyPair, error) {
	return p.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
}

// client issues a client certificate for user in groups: the API server takes the
// common name as the user name and the organizations as its groups.
func (p *pki) client(name, user string, groups ...string) (keyPair, error) {
	return p.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *pki) issue(name string, tmpl *x509.Certificate) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("%s key: %w", name, err)
	}
	tmpl.SerialNumber = serialNumber()
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("%s certificate: %w", name, err)
	}
	keyPEM, err := keyToPEM(key)
	if err != nil {
		return keyPair{}, err
	}
	kp := keyPair{
		certFile: filepath.Join(p.dir, name+".crt"), keyFile: filepath.Join(p.dir, name+".key"),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM: keyPEM,
	}
	if err := os.WriteFile(kp.certFile, kp.certPEM, 0o600); err != nil {
		return keyPair{}, err
	}
	if err := os.WriteFile(kp.keyFile, kp.keyPEM, 0o600); err != nil {
		return keyPair{}, err
	}
	return kp, nil
}

// serviceAccountKeys writes the key pair the API server signs service account tokens
// with (TokenRequest) and checks them against.
func (p *pki) serviceAccountKeys() (pub, priv string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("service account key: %w", err)
	}
	keyPEM, err := keyToPEM(key)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("service account key: %w", err)
	}
	pub, priv = filepath.Join(p.dir, "sa.pub"), filepath.Join(p.dir, "sa.key")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(priv, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return pub, priv, nil
}

func keyToPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil { // crypto/rand does not fail on Linux
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
