package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/testenv"
)

// redisEnv is env without SPACE_REDIS_ADDRS, for the tests of SPACE_REDIS_URL.
func redisEnv(overrides map[string]string) func(string) string {
	get := env(overrides)
	return func(k string) string {
		if _, ok := overrides[k]; k == "SPACE_REDIS_ADDRS" && !ok {
			return ""
		}
		return get(k)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRedis(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t).CertFile

	t.Run("the defaults are one address, mode auto, no credentials and no TLS", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(nil))
		if err != nil {
			t.Fatal(err)
		}
		r := c.Redis
		if r.Mode != RedisAuto || r.Username != "" || r.Password != "" || r.DB != 0 || r.TLS || r.TLSRootCAs != nil || r.TLSServerName != "" {
			t.Fatalf("redis = %+v", r)
		}
		if r.From != (RedisSources{Addrs: "SPACE_REDIS_ADDRS"}) {
			t.Fatalf("sources = %+v", r.From)
		}
	})

	t.Run("the separate variables are read", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(map[string]string{
			"SPACE_REDIS_ADDRS":           "r0:6379,r1:6379",
			"SPACE_REDIS_MODE":            "cluster",
			"SPACE_REDIS_USERNAME":        "space",
			"SPACE_REDIS_PASSWORD_FILE":   writeFile(t, "pw", "s3cret\n"),
			"SPACE_REDIS_TLS":             "true",
			"SPACE_REDIS_TLS_CA_FILE":     ca,
			"SPACE_REDIS_TLS_SERVER_NAME": "redis.example.com",
		}))
		if err != nil {
			t.Fatal(err)
		}
		r := c.Redis
		if len(r.Addrs) != 2 || r.Mode != RedisCluster || r.Username != "space" || r.Password.Reveal() != "s3cret" ||
			!r.TLS || r.TLSCAFile != ca || r.TLSRootCAs == nil || r.TLSServerName != "redis.example.com" {
			t.Fatalf("redis = %+v", r)
		}
		want := RedisSources{Addrs: "SPACE_REDIS_ADDRS", Username: "SPACE_REDIS_USERNAME", Password: "SPACE_REDIS_PASSWORD_FILE", TLS: "SPACE_REDIS_TLS"}
		if r.From != want {
			t.Fatalf("sources = %+v, want %+v", r.From, want)
		}
	})

	t.Run("each mode is accepted", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []RedisMode{RedisAuto, RedisStandalone, RedisCluster} {
			c, err := Load(env(map[string]string{"SPACE_REDIS_MODE": string(mode)}))
			if err != nil || c.Redis.Mode != mode {
				t.Errorf("SPACE_REDIS_MODE=%s: %v, %v", mode, c.Redis.Mode, err)
			}
		}
	})

	t.Run("the password file loses one trailing newline and nothing else", func(t *testing.T) {
		t.Parallel()
		for content, want := range map[string]string{
			"pw":        "pw",
			"pw\n":      "pw",
			"pw\r\n":    "pw",
			"pw\n\n":    "pw\n",
			" p w \n":   " p w ",
			"line1\nl2": "line1\nl2",
		} {
			c, err := Load(env(map[string]string{"SPACE_REDIS_PASSWORD_FILE": writeFile(t, "pw", content)}))
			if err != nil || c.Redis.Password.Reveal() != want {
				t.Errorf("file %q: password %q, %v; want %q", content, c.Redis.Password.Reveal(), err, want)
			}
		}
	})

	t.Run("SPACE_REDIS_PASSWORD is taken as it is", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(map[string]string{"SPACE_REDIS_PASSWORD": " pw "}))
		if err != nil || c.Redis.Password.Reveal() != " pw " || c.Redis.From.Password != "SPACE_REDIS_PASSWORD" {
			t.Fatalf("password %q from %s, %v", c.Redis.Password.Reveal(), c.Redis.From.Password, err)
		}
	})

	t.Run("a URL gives the address, credentials, database and TLS", func(t *testing.T) {
		t.Parallel()
		c, err := Load(redisEnv(map[string]string{"SPACE_REDIS_URL": "rediss://alice:pa%3Ass@redis.example.com:6380/2"}))
		if err != nil {
			t.Fatal(err)
		}
		r := c.Redis
		if len(r.Addrs) != 1 || r.Addrs[0] != "redis.example.com:6380" || r.Username != "alice" || r.Password.Reveal() != "pa:ss" || r.DB != 2 || !r.TLS {
			t.Fatalf("redis = %+v", r)
		}
		want := RedisSources{Addrs: "SPACE_REDIS_URL", Username: "SPACE_REDIS_URL", Password: "SPACE_REDIS_URL", TLS: "SPACE_REDIS_URL"}
		if r.From != want {
			t.Fatalf("sources = %+v, want %+v", r.From, want)
		}
		c, err = Load(redisEnv(map[string]string{"SPACE_REDIS_URL": "redis://10.0.0.1"}))
		if err != nil || c.Redis.Addrs[0] != "10.0.0.1:6379" || c.Redis.TLS || c.Redis.Password != "" {
			t.Fatalf("redis://10.0.0.1 = %+v, %v; want port 6379, no TLS, no password", c.Redis, err)
		}
	})

	t.Run("the separate variables override the URL's parts, and TLS only upwards", func(t *testing.T) {
		t.Parallel()
		c, err := Load(redisEnv(map[string]string{
			"SPACE_REDIS_URL":           "redis://alice:old@h:6379",
			"SPACE_REDIS_USERNAME":      "bob",
			"SPACE_REDIS_PASSWORD_FILE": writeFile(t, "pw", "new\n"),
			"SPACE_REDIS_TLS":           "true",
			"SPACE_REDIS_TLS_CA_FILE":   ca,
		}))
		if err != nil {
			t.Fatal(err)
		}
		if r := c.Redis; r.Username != "bob" || r.Password.Reveal() != "new" || !r.TLS || r.From.Username != "SPACE_REDIS_USERNAME" || r.From.Password != "SPACE_REDIS_PASSWORD_FILE" || r.From.TLS != "SPACE_REDIS_TLS" {
			t.Fatalf("redis = %+v", r)
		}
		c, err = Load(redisEnv(map[string]string{"SPACE_REDIS_URL": "rediss://h:6379", "SPACE_REDIS_TLS": "false", "SPACE_REDIS_TLS_SERVER_NAME": "h.example.com"}))
		if err != nil || !c.Redis.TLS || c.Redis.TLSServerName != "h.example.com" {
			t.Fatalf("rediss:// with SPACE_REDIS_TLS=false = %+v, %v; want TLS still on", c.Redis, err)
		}
	})

	t.Run("a URL for database 3 in standalone mode is accepted", func(t *testing.T) {
		t.Parallel()
		c, err := Load(redisEnv(map[string]string{"SPACE_REDIS_URL": "redis://h:6379/3", "SPACE_REDIS_MODE": "standalone"}))
		if err != nil || c.Redis.DB != 3 {
			t.Fatalf("redis = %+v, %v", c.Redis, err)
		}
	})

	const pw = "hunter2-secret"
	missing := filepath.Join(t.TempDir(), "missing")
	notPEM := writeFile(t, "ca.crt", "not a certificate "+pw)
	badPEM := writeFile(t, "bad.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	keyPEM := writeFile(t, "key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	empty := writeFile(t, "empty", "\n")
	for _, tc := range []struct {
		name, variable, accepts string
		env                     map[string]string
	}{
		{"a URL beside addresses", "SPACE_REDIS_URL", "SPACE_REDIS_ADDRS are both set", map[string]string{"SPACE_REDIS_URL": "redis://u:" + pw + "@h:6379", "SPACE_REDIS_ADDRS": "h:6379"}},
		{"neither a URL nor addresses", "SPACE_REDIS_ADDRS", "SPACE_REDIS_URL", map[string]string{"SPACE_REDIS_ADDRS": ""}},
		{"a URL of another scheme", "SPACE_REDIS_URL", "rediss://", map[string]string{"SPACE_REDIS_URL": "http://u:" + pw + "@h:6379"}},
		{"a URL that does not parse", "SPACE_REDIS_URL", "redis://", map[string]string{"SPACE_REDIS_URL": "redis://u:" + pw + "@h:6379\x7f/%zz"}},
		{"a URL with query options", "SPACE_REDIS_URL", "without query options", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@h:6379?dial_timeout=1s"}},
		{"a URL without a host", "SPACE_REDIS_URL", "with a host", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@/0"}},
		{"a URL with a database that is not a number", "SPACE_REDIS_URL", "invalid database number", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@h:6379/zero"}},
		{"a URL with a negative database", "SPACE_REDIS_URL", ">= 0", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@h:6379/-1"}},
		{"a URL with a word for a port", "SPACE_REDIS_URL", "redis://", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@h:http"}},
		{"a URL with a port too large", "SPACE_REDIS_URL", "up to 65535", map[string]string{"SPACE_REDIS_URL": "redis://:" + pw + "@h:99999"}},
		{"a password and a password file", "SPACE_REDIS_PASSWORD", "SPACE_REDIS_PASSWORD_FILE are both set", map[string]string{"SPACE_REDIS_PASSWORD": pw, "SPACE_REDIS_PASSWORD_FILE": writeFile(t, "pw", pw)}},
		{"a password file that is missing", "SPACE_REDIS_PASSWORD_FILE", "no such file", map[string]string{"SPACE_REDIS_PASSWORD_FILE": missing}},
		{"a password file that is empty", "SPACE_REDIS_PASSWORD_FILE", "empty", map[string]string{"SPACE_REDIS_PASSWORD_FILE": empty}},
		{"an unknown mode", "SPACE_REDIS_MODE", "auto, standalone, cluster", map[string]string{"SPACE_REDIS_MODE": "sentinel"}},
		{"standalone mode with several addresses", "SPACE_REDIS_MODE", "a standalone server has one", map[string]string{"SPACE_REDIS_MODE": "standalone", "SPACE_REDIS_ADDRS": "a:1,b:2"}},
		{"cluster mode with a database other than 0", "SPACE_REDIS_MODE", "database 0 only", map[string]string{"SPACE_REDIS_MODE": "cluster", "SPACE_REDIS_ADDRS": "", "SPACE_REDIS_URL": "redis://:" + pw + "@h:6379/1"}},
		{"a TLS switch that is not a boolean", "SPACE_REDIS_TLS", "true or false", map[string]string{"SPACE_REDIS_TLS": "yes please"}},
		{"a CA file without TLS", "SPACE_REDIS_TLS_CA_FILE", "set SPACE_REDIS_TLS=true", map[string]string{"SPACE_REDIS_TLS_CA_FILE": ca}},
		{"a server name without TLS", "SPACE_REDIS_TLS_SERVER_NAME", "set SPACE_REDIS_TLS=true", map[string]string{"SPACE_REDIS_TLS_SERVER_NAME": "h"}},
		{"a CA file that is missing", "SPACE_REDIS_TLS_CA_FILE", "no such file", map[string]string{"SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": missing}},
		{"a CA file that is not PEM", "SPACE_REDIS_TLS_CA_FILE", "no PEM certificate", map[string]string{"SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": notPEM}},
		{"a CA file with a broken certificate", "SPACE_REDIS_TLS_CA_FILE", "certificate 1", map[string]string{"SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": badPEM}},
		{"a CA file holding a key", "SPACE_REDIS_TLS_CA_FILE", "PRIVATE KEY block", map[string]string{"SPACE_REDIS_TLS": "true", "SPACE_REDIS_TLS_CA_FILE": keyPEM}},
	} {
		t.Run(tc.name+" is refused naming "+tc.variable+" and never the password", func(t *testing.T) {
			t.Parallel()
			getenv := env(tc.env)
			if _, ok := tc.env["SPACE_REDIS_URL"]; ok {
				getenv = redisEnv(tc.env)
			}
			_, err := Load(getenv)
			var ve *VarError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a *VarError", err)
			}
			msg := err.Error()
			if ve.Var != tc.variable || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, tc.variable) || !strings.Contains(msg, tc.accepts) {
				t.Errorf("error %q: want one line starting with %s and saying %q", msg, tc.variable, tc.accepts)
			}
			if strings.Contains(msg, pw) {
				t.Errorf("error %q shows the password", msg)
			}
		})
	}

	t.Run("a URL's user and password are redacted in its error", func(t *testing.T) {
		t.Parallel()
		_, err := Load(redisEnv(map[string]string{"SPACE_REDIS_URL": "redis://alice:" + pw + "@h:6379?db=1"}))
		if err == nil || !strings.Contains(err.Error(), `"redis://REDACTED@h:6379?db=1"`) || strings.Contains(err.Error(), "alice") {
			t.Fatalf("err = %v, want the URL with its user info redacted", err)
		}
	})

	t.Run("the password never shows when the configuration is printed or logged", func(t *testing.T) {
		t.Parallel()
		c, err := Load(env(map[string]string{"SPACE_REDIS_USERNAME": "alice", "SPACE_REDIS_PASSWORD_FILE": writeFile(t, "pw", pw+"\n")}))
		if err != nil {
			t.Fatal(err)
		}
		var logged bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logged, nil))
		logger.Info("config", "redis", c.Redis, "password", c.Redis.Password)
		slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "config", c)
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		printed := fmt.Sprintf("%v %+v %#v %s %q %x", c, c, c, c.Redis.Password, c.Redis.Password, c.Redis.Password)
		for name, out := range map[string]string{"slog": logged.String(), "json": string(js), "fmt": printed} {
			if strings.Contains(out, pw) {
				t.Errorf("%s shows the password: %s", name, out)
			}
			if !strings.Contains(out, "[redacted]") && !strings.Contains(out, `"password_set":true`) {
				t.Errorf("%s does not say a password is set: %s", name, out)
			}
		}
		if !strings.Contains(logged.String(), `"password_set":true`) || !strings.Contains(logged.String(), `"username":"alice"`) {
			t.Errorf("the logged Redis settings: %s", logged.String())
		}
	})
}
