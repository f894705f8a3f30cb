package app

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
)

func TestRiverUI(t *testing.T) {
	t.Parallel()

	t.Run("with SPACE_RIVER_UI the internal listener serves River UI over the operations' queue", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) { c.Dispatcher.UI = true }})
		op := s.accepted(s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Prefer", async), "/v1/operations/")
		if done := s.poll(s.m.PublicURL(), "/v1/operations/"+op.ID, "acme"); done.State != space.OperationSucceeded {
			t.Fatalf("operation %+v", done)
		}

		page := s.internal("GET", "/riverui/", "")
		if page.StatusCode != http.StatusOK || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET /riverui/ = %d %q", page.StatusCode, page.Header.Get("Content-Type"))
		}
		jobs := s.internal("GET", "/riverui/api/jobs?state=completed&kinds=space.create", "")
		if jobs.StatusCode != http.StatusOK || !strings.Contains(string(jobs.body), op.ID) {
			t.Fatalf("GET /riverui/api/jobs = %d %s, want the completed job of operation %s", jobs.StatusCode, jobs.body, op.ID)
		}
		redirect, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Get(s.m.InternalURL() + "/riverui")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, redirect.Body)
		redirect.Body.Close()
		if redirect.StatusCode != http.StatusMovedPermanently || redirect.Header.Get("Location") != "/riverui/" {
			t.Fatalf("GET /riverui = %d %q, want a redirect to /riverui/", redirect.StatusCode, redirect.Header.Get("Location"))
		}
		if r := s.do("GET", "/riverui/", "acme", ""); r.StatusCode != http.StatusNotFound {
			t.Fatalf("the public listener answers /riverui/ with %d, want 404", r.StatusCode)
		}
	})

	t.Run("off by default", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		if r := s.internal("GET", "/riverui/", ""); r.StatusCode != http.StatusNotFound {
			t.Fatalf("GET /riverui/ without SPACE_RIVER_UI = %d, want 404", r.StatusCode)
		}
	})
}
