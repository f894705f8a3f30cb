package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What every space-api image is, whoever builds it. The Dockerfile at the repository
// root must say the same (dockerfile_test.go checks it), and the Helm chart relies on
// it: podSecurityContext runs as 65532, the containers pass `serve` or `migrate` as
// arguments, and `kubectl exec ... -- space-api keys create` finds the binary on PATH.
const (
	// Repository is the image name `make image` tags, and the chart's default
	// image.repository (a test reads deploy/helm/space-api/values.yaml to check).
	Repository = "space-sandbox/space-api"
	// User is the numeric user:group the process runs as: "nonroot" in /etc/passwd,
	// the same UID as distroless' nonroot images.
	User     = "65532:65532"
	UID, GID = 65532, 65532
	// Binary is where the static space-api binary sits; PathLink puts it on PATH.
	Binary   = "/space-api"
	PathLink = "/usr/local/bin/space-api"
	// Path is the PATH of the image (distroless' value).
	Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// CABundle is where Go's crypto/x509 looks first on Linux, so Postgres and Redis
	// TLS verify against the system roots with no SSL_CERT_FILE.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// LdflagsFormat stamps the version (main.version in cmd/space-api, handed to internal/app) and strips the
	// symbol table and DWARF (-s -w): about a third smaller, and panics still print
	// file:line from the pclntab.
	LdflagsFormat = "-s -w -X main.version=%s"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/space-sandbox/space"
)

// Entrypoint and Cmd: `docker run IMAGE` serves; `docker run IMAGE migrate` migrates.
var (
	Entrypoint = []string{Binary}
	Cmd        = []string{"serve"}
)

// Options say what to build. Build fills every zero field with its default.
type Options struct {
	// Root is the repository root: the product's go.mod and deploy/helm.
	Root string
	// Version is stamped into the binary and is the image tag. Default: the chart's
	// appVersion (deploy/helm/space-api/Chart.yaml), so the chart's default image is
	// exactly what was built.
	Version string
	// Revision is the org.opencontainers.image.revision label. Default: the commit of
	// HEAD, with "-dirty" when the work tree has changes; "unknown" outside git.
	Revision string
	// Created is the image's creation time and every file's mtime. Default:
	// SOURCE_DATE_EPOCH, else the commit time of HEAD, else the Unix epoch: never the
	// clock, so that the same commit builds the same digest.
	Created time.Time
	// Repository names the image; default Repository.
	Repository string
	// Arches are the linux architectures of the OCI layout's index; default amd64
	// and arm64.
	Arches []string
	// LoadArch is the architecture of Archive; default the build machine's (a local
	// kind or Docker runs it). It must be one of Arches.
	LoadArch string
	// CACerts is the CA bundle copied into the image; default CABundle on the build
	// machine (Debian's ca-certificates package).
	CACerts string
	// Archive is the docker-save tarball written, for docker load, kind load
	// image-archive and ctr images import; default <Root>/bin/space-api-image.tar.
	Archive string
	// Layout is the OCI image layout directory written, holding the multi-arch index
	// for crane push; default <Root>/bin/space-api-oci. Replaced on each build.
	Layout string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Result is what Build wrote.
type Result struct {
	Ref string // repository:version
	// Archive and its image: the manifest digest is what `crane push` of the archive
	// gives the registry; ImageID is the config digest `docker images` shows.
	Archive       string
	ArchiveArch   string
	ArchiveDigest v1.Hash
	ImageID       v1.Hash
	ArchiveSize   int64
	// Layout and its index: IndexDigest is what `crane push` of the layout gives the
	// registry, the value for the chart's image.digest.
	Layout      string
	IndexDigest v1.Hash
	Arches      []string
	Digests     map[string]v1.Hash // arch -> manifest digest
}

func (o *Options) defaults() error {
	if o.Root == "" {
		return errors.New("Options.Root (the repository root) is required")
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return fmt.Errorf("repository root: %w", err)
	}
	o.Root = root
	if _, err := os.Stat(filepath.Join(root, "cmd", "space-api")); err != nil {
		return fmt.Errorf("%s is not the space repository root: %w", root, err)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Version == "" {
		if o.Version, err = ChartAppVersion(root); err != nil {
			return err
		}
	}
	if o.Repository == "" {
		o.Repository = Repository
	}
	if _, err := name.NewTag(o.Repository + ":" + o.Version); err != nil {
		return fmt.Errorf("version %q cannot be an image tag (letters, digits, '.', '_', '-'; at most 128): %w", o.Version, err)
	}
	if o.Revision == "" {
		o.Revision = gitRevision(root)
	}
	if o.Created.IsZero() {
		if o.Created, err = sourceDateEpoch(root); err != nil {
			return err
		}
	}
	o.Created = o.Created.UTC().Truncate(time.Second)
	if len(o.Arches) == 0 {
		o.Arches = []string{"amd64", "arm64"}
	}
	for _, a := range o.Arches {
		if _, ok := variants[a]; !ok {
			return fmt.Errorf("architecture %q: want one of amd64, arm64", a)
		}
	}
	if o.LoadArch == "" {
		o.LoadArch = runtime.GOARCH
		if !contains(o.Arches, o.LoadArch) {
			o.LoadArch = o.Arches[0]
		}
	}
	if !contains(o.Arches, o.LoadArch) {
		return fmt.Errorf("the archive's architecture %s is not among those built (%s)", o.LoadArch, strings.Join(o.Arches, ","))
	}
	if o.CACerts == "" {
		o.CACerts = CABundle
	}
	if o.Archive == "" {
		o.Archive = filepath.Join(root, "bin", "space-api-image.tar")
	}
	if o.Layout == "" {
		o.Layout = filepath.Join(root, "bin", "space-api-oci")
	}
	return nil
}

// variants are the OCI platform variants of the supported architectures: arm64 images
// are conventionally v8 (a Go binary for GOARCH=arm64 needs ARMv8.0).
var variants = map[string]string{"amd64": "", "arm64": "v8"}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

var appVersionLine = regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`)

// ChartAppVersion reads appVersion from the chart, the one place the version is
// written: the chart's default image tag is its appVersion.
func ChartAppVersion(root string) (string, error) {
	p := filepath.Join(root, "deploy", "helm", "space-api", "Chart.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read the version from the chart: %w", err)
	}
	m := appVersionLine.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s has no appVersion line", p)
	}
	return string(m[1]), nil
}

func gitRevision(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "-dirty"
	}
	return rev
}

// sourceDateEpoch follows reproducible-builds.org's SOURCE_DATE_EPOCH, then falls back
// to the commit time of HEAD.
func sourceDateEpoch(root string) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want Unix seconds: %w", s, err)
		}
		return time.Unix(n, 0), nil
	}
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output()
	if err != nil {
		return time.Unix(0, 0), nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return time.Unix(0, 0), nil
	}
	return time.Unix(n, 0), nil
}

// Build compiles space-api for each architecture, assembles one image per
// architecture from scratch (no base image is pulled: there may be no registry to pull
// from), and writes the OCI layout with their index and the docker-save archive of
// LoadArch. The same inputs give the same digests.
func Build(ctx context.Context, o Options) (Result, error) {
	if err := o.defaults(); err != nil {
		return Result{}, err
	}
	ref := o.Repository + ":" + o.Version
	tag, err := name.NewTag(ref)
	if err != nil {
		return Result{}, fmt.Errorf("image reference %s: %w", ref, err)
	}
	ca, err := os.ReadFile(o.CACerts)
	if err != nil {
		return Result{}, fmt.Errorf("CA certificates for the image (install Debian's ca-certificates, or pass -ca-certs): %w", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return Result{}, fmt.Errorf("%s holds no PEM certificate", o.CACerts)
	}
	base, err := baseLayer(ca, o.Created)
	if err != nil {
		return Result{}, err
	}

	work, err := os.MkdirTemp("", "space-api-image-")
	if err != nil {
		return Result{}, fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(work)

	res := Result{Ref: ref, Archive: o.Archive, ArchiveArch: o.LoadArch, Layout: o.Layout, Arches: o.Arches, Digests: map[string]v1.Hash{}}
	images := map[string]v1.Image{}
	var adds []mutate.IndexAddendum
	for _, arch := range o.Arches {
		bin := filepath.Join(work, "space-api-"+arch)
		if err := compile(ctx, o, arch, bin); err != nil {
			return Result{}, err
		}
		img, err := assemble(o, arch, base, bin)
		if err != nil {
			return Result{}, fmt.Errorf("assemble the linux/%s image: %w", arch, err)
		}
		d, err := img.Digest()
		if err != nil {
			return Result{}, fmt.Errorf("digest of the linux/%s image: %w", arch, err)
		}
		images[arch], res.Digests[arch] = img, d
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch, Variant: variants[arch]},
		}})
	}

	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.DockerManifestList)
	if res.IndexDigest, err = idx.Digest(); err != nil {
		return Result{}, fmt.Errorf("digest of the index: %w", err)
	}
	if err := writeLayout(o, tag, idx); err != nil {
		return Result{}, err
	}

	img := images[o.LoadArch]
	if err := os.MkdirAll(filepath.Dir(o.Archive), 0o755); err != nil {
		return Result{}, fmt.Errorf("archive directory: %w", err)
	}
	// Written next to its final name and renamed, so a failed build never leaves a
	// truncated archive that a later `kind load` would take.
	tmp := o.Archive + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return Result{}, fmt.Errorf("write %s: %w", o.Archive, err)
	}
	if err := os.Rename(tmp, o.Archive); err != nil {
		return Result{}, fmt.Errorf("write %s: %w", o.Archive, err)
	}
	fi, err := os.Stat(o.Archive)
	if err != nil {
		return Result{}, err
	}
	res.ArchiveSize = fi.Size()
	res.ArchiveDigest = res.Digests[o.LoadArch]
	if res.ImageID, err = img.ConfigName(); err != nil {
		return Result{}, fmt.Errorf("image id: %w", err)
	}
	return res, nil
}

// compile builds the static binary. CGO_ENABLED=0: no libc in the image, and the
// pure-Go DNS resolver; -trimpath: no build machine paths in the binary, and the same
// bytes wherever it is built.
func compile(ctx context.Context, o Options, arch, out string) error {
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", fmt.Sprintf(LdflagsFormat, o.Version), "-o", out, "./cmd/space-api")
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-mod=readonly")
	if arch == "arm64" {
		// The baseline of every 64-bit ARM server; the Go default, said explicitly.
		cmd.Env = append(cmd.Env, "GOARM64=v8.0")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build space-api for linux/%s: %w\n%s", arch, err, b)
	}
	fmt.Fprintf(o.Log, "built space-api %s for linux/%s in %s\n", o.Version, arch, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// assemble puts the base layer and the binary's layer together and writes the config.
// Two layers: the base (users, CA bundle) changes rarely, so registries and nodes keep
// it across releases; only the binary's layer is new.
func assemble(o Options, arch string, base v1.Layer, bin string) (v1.Image, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read the binary: %w", err)
	}
	binLayer, err := layerOf([]entry{
		{name: "usr/", dir: true, mode: 0o755},
		{name: "usr/local/", dir: true, mode: 0o755},
		{name: "usr/local/bin/", dir: true, mode: 0o755},
		{name: strings.TrimPrefix(Binary, "/"), mode: 0o755, body: b},
		{name: strings.TrimPrefix(PathLink, "/"), link: Binary},
	}, o.Created)
	if err != nil {
		return nil, err
	}
	// Docker schema 2 media types throughout: every runtime and registry takes them,
	// and go-containerregistry reads a docker-save archive back with exactly these, so
	// the archive's image has the same manifest digest as the layout's entry for its
	// architecture (a test checks).
	img := mutate.MediaType(empty.Image, types.DockerManifestSchema2)
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	created := v1.Time{Time: o.Created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.DockerLayer, History: v1.History{
			Created: created, CreatedBy: "space image tool: /etc/passwd, /etc/group, " + CABundle + ", /tmp", Comment: "base",
		}},
		mutate.Addendum{Layer: binLayer, MediaType: types.DockerLayer, History: v1.History{
			Created: created, CreatedBy: fmt.Sprintf("go build -trimpath -ldflags %q ./cmd/space-api (CGO_ENABLED=0 GOOS=linux GOARCH=%s)", fmt.Sprintf(LdflagsFormat, o.Version), arch), Comment: "space-api",
		}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", arch, variants[arch]
	cf.Created = created
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: Entrypoint,
		Cmd:        Cmd,
		Env:        []string{"PATH=" + Path},
		WorkingDir: "/",
		Labels:     Labels(o.Version, o.Revision, o.Created),
	}
	return mutate.ConfigFile(img, cf)
}

// Labels are the OCI annotations of the image config (also in the Dockerfile).
func Labels(version, revision string, created time.Time) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "space-api",
		"org.opencontainers.image.description": "space-api, the admission controller of a sandbox control plane",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
	}
}

// writeLayout replaces the OCI layout directory with one holding the index, named the
// way containerd (io.containerd.image.name) and the OCI spec (ref.name: the tag) read.
func writeLayout(o Options, tag name.Tag, idx v1.ImageIndex) error {
	tmp := o.Layout + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clear %s: %w", tmp, err)
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          containerdName(tag),
	})); err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	if err := os.RemoveAll(o.Layout); err != nil {
		return fmt.Errorf("replace %s: %w", o.Layout, err)
	}
	if err := os.Rename(tmp, o.Layout); err != nil {
		return fmt.Errorf("replace %s: %w", o.Layout, err)
	}
	return nil
}

// containerdName is the name containerd and the kubelet use for the image: Docker Hub
// spelt docker.io (go-containerregistry says index.docker.io), so that a pod asking for
// space-sandbox/space-api:<version> finds an imported image.
func containerdName(tag name.Tag) string {
	reg := tag.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + tag.RepositoryStr() + ":" + tag.TagStr()
}

// Passwd and Group: root, nobody and nonroot (65532), as distroless has them. Go's
// os/user and anything that looks the user up (HOME for caches) finds nonroot.
const (
	Passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	Group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
	// nsswitch tells Go's resolver to read /etc/hosts before DNS, as glibc would.
	nsswitch = "hosts: files dns\n"
)

func baseLayer(ca []byte, created time.Time) (v1.Layer, error) {
	return layerOf([]entry{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/group", mode: 0o644, body: []byte(Group)},
		{name: "etc/nsswitch.conf", mode: 0o644, body: []byte(nsswitch)},
		{name: "etc/passwd", mode: 0o644, body: []byte(Passwd)},
		{name: "etc/ssl/", dir: true, mode: 0o755},
		{name: "etc/ssl/certs/", dir: true, mode: 0o755},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, body: ca},
		{name: "home/", dir: true, mode: 0o755},
		{name: "home/nonroot/", dir: true, mode: 0o700, uid: UID, gid: GID},
		// Sticky and world-writable, as /tmp is; the chart mounts an emptyDir here
		// because its root filesystem is read-only.
		{name: "tmp/", dir: true, mode: 0o1777},
	}, created)
}

type entry struct {
	name     string
	dir      bool
	link     string // a symbolic link to this target
	mode     int64
	uid, gid int
	body     []byte
}

// layerOf writes the entries, in the given order, as a tar with fixed owners and
// times, so the layer's bytes (and digest) depend on the content only.
func layerOf(entries []entry, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime,
			Typeflag: tar.TypeReg, Size: int64(len(e.body)), Format: tar.FormatPAX,
		}
		switch {
		case e.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode, h.Size = tar.TypeSymlink, e.link, 0o777, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.DockerLayer))
}
