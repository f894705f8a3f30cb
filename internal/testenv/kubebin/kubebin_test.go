package kubebin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestToolVersion(t *testing.T) {
	t.Parallel()

	t.Run("the tool modules pin the servers the tests run", func(t *testing.T) {
		t.Parallel()
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			tl   tool
			want string
		}{{etcdTool, "v3.7.3"}, {apiserverTool, "v1.37.2"}, {schedulerTool, "v1.37.2"}, {kwokTool, "v0.8.0"}} {
			v, key, err := toolVersion(filepath.Join(root, "tools", c.tl.name), c.tl.module)
			if err != nil || v != c.want || len(key) != 8 {
				t.Errorf("%s: version %q key %q (%v), want %s and an 8-digit key", c.tl.name, v, key, err, c.want)
			}
		}
	})

	t.Run("the cache key changes with the go.sum, not only the version", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		write := func(name, body string) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("go.mod", "module x\n\nrequire example.com/server v1.2.3\n")
		write("go.sum", "a\n")
		v1, k1, err := toolVersion(dir, "example.com/server")
		if err != nil {
			t.Fatal(err)
		}
		write("go.sum", "b\n")
		v2, k2, err := toolVersion(dir, "example.com/server")
		if err != nil || v1 != "v1.2.3" || v2 != v1 || k1 == k2 {
			t.Errorf("versions %s %s keys %s %s (%v): want one version and two keys", v1, v2, k1, k2, err)
		}
		if _, _, err := toolVersion(dir, "example.com/other"); err == nil || !strings.Contains(err.Error(), "does not require example.com/other") {
			t.Errorf("a module the go.mod does not require: %v", err)
		}
	})

	t.Run("a cached binary is used without building", func(t *testing.T) {
		t.Parallel()
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		cache := t.TempDir()
		v, key, err := toolVersion(filepath.Join(root, "tools", "etcd"), etcdTool.module)
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(cache, "etcd-"+v+"-"+key, "etcd")
		if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		built := false
		got, _, err := findOrBuild(ctx, root, cache, etcdTool, func(string, ...any) { built = true })
		if err != nil || got != want || built {
			t.Errorf("findOrBuild = %s (%v), built %v; want the cached %s, unbuilt", got, err, built, want)
		}
	})
}
