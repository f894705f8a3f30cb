// Package openapi checks that api/openapi.yaml generates a Go client that compiles. It is
// a module of its own so that oapi-codegen and what it pulls in stay out of space-api's
// module.
package openapi

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oapi-codegen/oapi-codegen/v2/pkg/codegen"
	"github.com/oapi-codegen/oapi-codegen/v2/pkg/util"

	// The generated client's one dependency: required here so that this module's
	// go.sum holds it for the build of the generated code.
	_ "github.com/oapi-codegen/runtime"
)

// usage compiles against the generated client: the types a caller relies on must come
// out as it needs them (a nullable field as a pointer, a problem's status as an integer,
// each answer of an operation as a typed field), not only compile.
const usage = `package client

import "context"

var (
	_ *int     = Limits{}.Concurrency
	_ *float64 = TokenBucket{}.Remaining
	_ float64  = TokenBucket{}.RefillRps
	_ *float64 = ClientBucket{}.Remaining
	_ Bucket   = LimitedProblem{}.Bucket
	_ int      = int(LimitedProblem{}.Status)
	_ string   = string(InvalidProblem{}.Type)
	_ string   = Sandbox{}.TemplateVersion
	_ ClientID = Sandbox{}.Client
	_ *int     = Lifecycle{}.MaxLifetimeSeconds
	_ *int     = Lifecycle{}.PausedSandboxes
	_ Lifecycle = Limits{}.Lifecycle
	_ Lifecycle = Tier{}.Lifecycle
)

func use(ctx context.Context) error {
	c, err := NewClientWithResponses("http://localhost:8080")
	if err != nil {
		return err
	}
	key := IdempotencyKey("build-7")
	r, err := c.CreateSandboxWithResponse(ctx, &CreateSandboxParams{IdempotencyKey: &key},
		CreateSandboxJSONRequestBody{Template: "python-3.12", CpuMillis: 1000, MemoryMib: 2048, DiskGib: 10})
	if err != nil {
		return err
	}
	var _ *Sandbox = r.JSON201
	var _ *Operation = r.JSON202
	var _ *LimitedProblem = r.ApplicationproblemJSON429
	var _ *UnprocessableProblem = r.ApplicationproblemJSON422
	limit := 10
	if _, err = c.ListSandboxesWithResponse(ctx, &ListSandboxesParams{Limit: &limit}); err != nil {
		return err
	}
	timeout := 600
	k, err := c.KeepaliveSandboxWithResponse(ctx, SandboxID(r.JSON201.Id), nil, KeepaliveSandboxJSONRequestBody{TimeoutSeconds: &timeout})
	if err != nil {
		return err
	}
	var _ *Sandbox = k.JSON200
	var _ *ConflictProblem = k.ApplicationproblemJSON409
	return nil
}
`

func TestTheDocumentGeneratesAGoClientThatCompiles(t *testing.T) {
	start := time.Now()
	// oapi-codegen reads OpenAPI 3.1 as it is (type arrays with "null", const), so the
	// document is not converted to 3.0 first.
	spec, err := util.LoadSwagger("../../api/openapi.yaml")
	if err != nil {
		t.Fatalf("load api/openapi.yaml: %v", err)
	}
	code, err := codegen.Generate(spec, codegen.Configuration{
		PackageName: "client",
		Generate:    codegen.GenerateOptions{Client: true, Models: true},
	})
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	generated := time.Since(start)

	// A module of the generated code, with this module's requirements and sums, so that
	// it builds from the module cache like this module does.
	dir := t.TempDir()
	gomod := read(t, "go.mod")
	write(t, filepath.Join(dir, "go.mod"), strings.Replace(gomod, "module github.com/space-sandbox/space/tools/openapi", "module client", 1))
	write(t, filepath.Join(dir, "go.sum"), read(t, "go.sum"))
	write(t, filepath.Join(dir, "client.gen.go"), code)
	write(t, filepath.Join(dir, "usage.go"), usage)
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go vet of the generated client: %v\n%s", err, out)
	}
	t.Logf("generated in %v, compiled and vetted in %v", generated.Round(time.Millisecond), (time.Since(start) - generated).Round(time.Millisecond))
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
