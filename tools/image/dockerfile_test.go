package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// No Docker engine runs here, so the Dockerfile is read, not built: it must say what the
// image program does, or the two ways of building would drift apart.
func TestTheDockerfileBuildsTheSameImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Instructions with their continuation lines joined; comments dropped.
	df := regexp.MustCompile(`\\\n\s*`).ReplaceAllString(string(b), " ")
	var lines []string
	for _, l := range strings.Split(df, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	df = strings.Join(lines, "\n")
	has := func(t *testing.T, what, want string) {
		t.Helper()
		if !strings.Contains(df, want) {
			t.Errorf("the Dockerfile lacks %s: %s", what, want)
		}
	}
	instruction := func(t *testing.T, kw string) string {
		t.Helper()
		var found []string
		for _, l := range lines {
			if rest, ok := strings.CutPrefix(l, kw+" "); ok {
				found = append(found, rest)
			}
		}
		if len(found) != 1 {
			t.Fatalf("want one %s in the Dockerfile, found %q", kw, found)
		}
		return found[0]
	}
	jsonOf := func(v []string) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	t.Run("the binary is built with the same flags", func(t *testing.T) {
		has(t, "the ldflags", fmt.Sprintf(`-ldflags "%s"`, fmt.Sprintf(LdflagsFormat, "${VERSION}")))
		has(t, "-trimpath", "go build -trimpath ")
		has(t, "a static build", "CGO_ENABLED=0")
		has(t, "the binary's path", "-o /rootfs"+Binary+" ./cmd/space-api")
		has(t, "the PATH link", "ln -s "+Binary+" /rootfs"+PathLink)
	})
	t.Run("the user is 65532", func(t *testing.T) {
		if u := instruction(t, "USER"); u != User {
			t.Errorf("USER %s, want %s", u, User)
		}
		// distroless' :nonroot tags are the ones whose /etc/passwd has nonroot 65532.
		if !regexp.MustCompile(`(?m)^FROM \S+/distroless/static-debian\d+:nonroot$`).MatchString(df) {
			t.Errorf("the runtime stage is not a distroless static :nonroot image")
		}
	})
	t.Run("the entrypoint, command and PATH are the same", func(t *testing.T) {
		if e := instruction(t, "ENTRYPOINT"); e != jsonOf(Entrypoint) {
			t.Errorf("ENTRYPOINT %s, want %s", e, jsonOf(Entrypoint))
		}
		if c := instruction(t, "CMD"); c != jsonOf(Cmd) {
			t.Errorf("CMD %s, want %s", c, jsonOf(Cmd))
		}
		if p := instruction(t, "ENV"); p != "PATH="+Path {
			t.Errorf("ENV %s, want PATH=%s", p, Path)
		}
	})
	t.Run("the labels are the same", func(t *testing.T) {
		labels := instruction(t, "LABEL")
		for k, v := range Labels("${VERSION}", "${REVISION}", time.Time{}) {
			if k == "org.opencontainers.image.created" {
				continue // BuildKit dates the image itself; a label would need one more build-arg
			}
			if want := fmt.Sprintf("%s=%q", k, v); !strings.Contains(labels, want) {
				t.Errorf("LABEL lacks %s", want)
			}
		}
	})
	t.Run("the Go version is go.mod's", func(t *testing.T) {
		mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
		if m == nil {
			t.Fatal("go.mod has no go directive")
		}
		has(t, "go.mod's Go", "ARG GO_VERSION="+string(m[1])+"\n")
	})
}
