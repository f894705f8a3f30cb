package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const root = "../.."

// file is one entry of an image's flattened filesystem.
type file struct {
	hdr  *tar.Header
	body []byte
}

// filesystem flattens the image's layers as a runtime would (later layers win).
func filesystem(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	fs := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read the image's filesystem: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", h.Name, err)
		}
		fs["/"+strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = file{hdr: h, body: b}
	}
	return fs
}

// TestTheImage builds the image once (only this machine's architecture: the arm64
// cross-build of `make image` would double a cold run) and checks what the chart and
// the docs rely on.
func TestTheImage(t *testing.T) {
	dir := t.TempDir()
	const version = "0.0.0-test.1"
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	opts := Options{
		Root:     root,
		Version:  version,
		Revision: "0123456789abcdef",
		Created:  created,
		Arches:   []string{runtime.GOARCH},
		Archive:  filepath.Join(dir, "space-api-image.tar"),
		Layout:   filepath.Join(dir, "oci"),
	}
	start := time.Now()
	res, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %s: %d bytes, manifest %s", res.Ref, time.Since(start).Round(time.Millisecond), res.ArchiveSize, res.ArchiveDigest)

	ref := Repository + ":" + version
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	// ImageFromPath finds the image by its RepoTags entry: a wrong tag fails here.
	img, err := tarball.ImageFromPath(opts.Archive, &tag)
	if err != nil {
		t.Fatalf("the archive holds no image tagged %s: %v", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	fs := filesystem(t, img)

	t.Run("the archive is tagged with the repository and version", func(t *testing.T) {
		if res.Ref != ref {
			t.Errorf("ref = %s, want %s", res.Ref, ref)
		}
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(opts.Archive) })
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{ref}) {
			t.Errorf("manifest.json = %+v, want one image tagged %s", m, ref)
		}
	})

	t.Run("the entrypoint is /space-api and the default command serve", func(t *testing.T) {
		if !slices.Equal(cf.Config.Entrypoint, []string{"/space-api"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) {
			t.Errorf("entrypoint %q cmd %q", cf.Config.Entrypoint, cf.Config.Cmd)
		}
		if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
			t.Errorf("platform = %s/%s", cf.OS, cf.Architecture)
		}
	})

	t.Run("the image runs as user 65532", func(t *testing.T) {
		if cf.Config.User != "65532:65532" {
			t.Errorf("Config.User = %q", cf.Config.User)
		}
		passwd := string(fs["/etc/passwd"].body)
		if !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:[^:]*:/home/nonroot:[^:]*$`).MatchString(passwd) {
			t.Errorf("/etc/passwd has no nonroot 65532:\n%s", passwd)
		}
		if !regexp.MustCompile(`(?m)^nonroot:x:65532:$`).MatchString(string(fs["/etc/group"].body)) {
			t.Errorf("/etc/group has no nonroot 65532:\n%s", fs["/etc/group"].body)
		}
		if h := fs["/home/nonroot"].hdr; h == nil || h.Uid != 65532 || h.Typeflag != tar.TypeDir {
			t.Errorf("/home/nonroot = %+v, want a directory owned by 65532", h)
		}
		// The binary belongs to root and is not writable by the user it runs as.
		if h := fs["/space-api"].hdr; h == nil || h.Uid != 0 || h.Mode&0o022 != 0 || h.Mode&0o111 == 0 {
			t.Errorf("/space-api = %+v, want root-owned, executable, not writable by others", h)
		}
		if h := fs["/tmp"].hdr; h == nil || h.Mode != 0o1777 {
			t.Errorf("/tmp = %+v, want mode 1777", h)
		}
	})

	t.Run("the CA bundle is the build machine's", func(t *testing.T) {
		ca := fs["/etc/ssl/certs/ca-certificates.crt"]
		want, err := os.ReadFile(CABundle)
		if err != nil {
			t.Fatal(err)
		}
		if len(ca.body) == 0 || !bytes.Contains(ca.body, []byte("-----BEGIN CERTIFICATE-----")) || !bytes.Equal(ca.body, want) {
			t.Errorf("CA bundle: %d bytes, want the %d bytes of %s", len(ca.body), len(want), CABundle)
		}
		if ca.hdr.Mode&0o444 != 0o444 {
			t.Errorf("CA bundle mode %o: not readable by everyone", ca.hdr.Mode)
		}
	})

	t.Run("space-api is on PATH for kubectl exec", func(t *testing.T) {
		var path string
		for _, e := range cf.Config.Env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				path = v
			}
		}
		link := fs["/usr/local/bin/space-api"].hdr
		if link == nil || link.Typeflag != tar.TypeSymlink || link.Linkname != "/space-api" {
			t.Errorf("/usr/local/bin/space-api = %+v, want a symlink to /space-api", link)
		}
		if !slices.Contains(strings.Split(path, ":"), "/usr/local/bin") {
			t.Errorf("PATH = %q misses /usr/local/bin", path)
		}
	})

	t.Run("the labels carry the version, revision, source and date", func(t *testing.T) {
		want := map[string]string{
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.revision": "0123456789abcdef",
			"org.opencontainers.image.source":   "https://github.com/space-sandbox/space",
			"org.opencontainers.image.created":  "2026-01-02T03:04:05Z",
			"org.opencontainers.image.title":    "space-api",
		}
		for k, v := range want {
			if got := cf.Config.Labels[k]; got != v {
				t.Errorf("label %s = %q, want %q", k, got, v)
			}
		}
		if !cf.Created.Equal(created) {
			t.Errorf("created = %s, want %s", cf.Created, created)
		}
	})

	t.Run("the binary inside is static and prints the stamped version", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "space-api")
		if err := os.WriteFile(bin, fs["/space-api"].body, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("the binary is not ELF: %v", err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("the binary asks for a dynamic loader: it needs CGO_ENABLED=0")
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("the binary links %v", libs)
		}
		if f.Section(".debug_info") != nil || f.Section(".symtab") != nil {
			t.Errorf("the binary keeps DWARF or its symbol table: -s -w missing")
		}
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("space-api version: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != "space-api "+version {
			t.Errorf("space-api version printed %q, want %q", got, "space-api "+version)
		}
	})

	t.Run("the layout's index names the same image as the archive", func(t *testing.T) {
		ii, err := layout.ImageIndexFromPath(opts.Layout)
		if err != nil {
			t.Fatal(err)
		}
		top, err := ii.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(top.Manifests) != 1 || top.Manifests[0].Digest != res.IndexDigest ||
			top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version ||
			top.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/"+ref {
			t.Fatalf("index.json = %+v, want the index %s named %s", top.Manifests, res.IndexDigest, ref)
		}
		idx, err := ii.ImageIndex(res.IndexDigest)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH || im.Manifests[0].Platform.OS != "linux" {
			t.Fatalf("index = %+v, want linux/%s", im.Manifests, runtime.GOARCH)
		}
		archived, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		// What `crane push` of the archive would give the registry is the manifest of
		// the layout's entry: one digest, however the image travels.
		if im.Manifests[0].Digest != archived || archived != res.ArchiveDigest {
			t.Errorf("layout entry %s, archive %s, reported %s: want one digest", im.Manifests[0].Digest, archived, res.ArchiveDigest)
		}
	})

	t.Run("the same inputs build the same digest", func(t *testing.T) {
		again := opts
		again.Archive = filepath.Join(t.TempDir(), "again.tar")
		again.Layout = filepath.Join(t.TempDir(), "again-oci")
		res2, err := Build(context.Background(), again)
		if err != nil {
			t.Fatal(err)
		}
		if res2.IndexDigest != res.IndexDigest || res2.ArchiveDigest != res.ArchiveDigest {
			t.Errorf("second build: index %s manifest %s, first: %s %s", res2.IndexDigest, res2.ArchiveDigest, res.IndexDigest, res.ArchiveDigest)
		}
	})
}

func TestTheDefaultReferenceIsTheChartsDefaultImage(t *testing.T) {
	o := Options{Root: root}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "space-api", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(chart), "\nappVersion: \""+o.Version+"\"\n") {
		t.Errorf("default version %q is not the chart's appVersion", o.Version)
	}
	values, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "space-api", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// image.repository, and an empty image.tag, which the chart turns into appVersion.
	img := regexp.MustCompile(`(?m)^image:\n(?:  .*\n|\s*#.*\n)*?  repository: (\S+)\n(?:  .*\n|\s*#.*\n)*?  tag: (\S+)`).FindStringSubmatch(string(values))
	if img == nil {
		t.Fatal("values.yaml has no image.repository and image.tag")
	}
	if img[1] != o.Repository || img[2] != `""` {
		t.Errorf("the chart's default image is %s with tag %s, want %s with the appVersion (\"\")", img[1], img[2], o.Repository)
	}
	if o.Created.IsZero() || o.Revision == "" || len(o.Arches) != 2 {
		t.Errorf("defaults = %+v", o)
	}
}

func TestBuildRefusesWhatCannotBeATagOrAnArchitecture(t *testing.T) {
	for name, o := range map[string]Options{
		"a version with a plus":     {Root: root, Version: "1.0.0+build.1"},
		"an unknown arch":           {Root: root, Version: "1.0.0", Arches: []string{"riscv64"}},
		"an archive arch not built": {Root: root, Version: "1.0.0", Arches: []string{"amd64"}, LoadArch: "arm64"},
		"not the repository":        {Root: t.TempDir(), Version: "1.0.0"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Build(context.Background(), o); err == nil {
				t.Errorf("Build(%+v) succeeded", o)
			}
		})
	}
}
