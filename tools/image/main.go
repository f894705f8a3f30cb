// Command image builds the space-api container image with no Docker engine (`make
// image`, scripts/image.sh). It compiles a static space-api for linux/amd64 and
// linux/arm64 and assembles each image from scratch with go-containerregistry: a base
// layer (/etc/passwd and /etc/group with the nonroot user 65532, the build machine's
// CA bundle, /tmp) and the binary's layer. It writes
//
//   - bin/space-api-image.tar: a docker-save archive of the build machine's
//     architecture, tagged space-sandbox/space-api:<version>, for `docker load`,
//     `kind load image-archive` and `ctr -n k8s.io images import`;
//   - bin/space-api-oci/: an OCI image layout holding the two-architecture index,
//     for `crane push bin/space-api-oci <registry>/space-api:<version>`;
//
// and prints the digests. The version defaults to the chart's appVersion
// (deploy/helm/space-api/Chart.yaml), the one place it is written.
//
// It is a module of its own (tools/image/go.mod) so that the product's go.mod does not
// carry go-containerregistry, which only the build needs.
//
//	go run . -root ../.. [-version 0.2.0] [-arch amd64,arm64] [-load-arch amd64]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	var o Options
	var arches string
	flag.StringVar(&o.Root, "root", ".", "the repository root")
	flag.StringVar(&o.Version, "version", os.Getenv("VERSION"), "version stamped into the binary and the image tag (default $VERSION, else the chart's appVersion)")
	flag.StringVar(&o.Revision, "revision", os.Getenv("REVISION"), "org.opencontainers.image.revision (default $REVISION, else git HEAD)")
	flag.StringVar(&o.Repository, "repository", Repository, "image name")
	flag.StringVar(&arches, "arch", os.Getenv("IMAGE_ARCHES"), "comma-separated linux architectures of the OCI layout (default $IMAGE_ARCHES, else amd64,arm64)")
	flag.StringVar(&o.LoadArch, "load-arch", os.Getenv("IMAGE_LOAD_ARCH"), "architecture of the docker-save archive (default $IMAGE_LOAD_ARCH, else this machine's)")
	flag.StringVar(&o.CACerts, "ca-certs", CABundle, "CA bundle copied into the image")
	flag.StringVar(&o.Archive, "archive", "", "docker-save archive to write (default <root>/bin/space-api-image.tar)")
	flag.StringVar(&o.Layout, "layout", "", "OCI layout directory to write (default <root>/bin/space-api-oci)")
	flag.Parse()
	if arches != "" {
		o.Arches = strings.Split(arches, ",")
	}
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	res, err := Build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s  (built in %s)\n", res.Ref, time.Since(start).Round(100*time.Millisecond))
	fmt.Printf("  archive  %s  linux/%s, %.1f MB\n", res.Archive, res.ArchiveArch, float64(res.ArchiveSize)/1e6)
	fmt.Printf("           manifest %s\n           image id %s\n", res.ArchiveDigest, res.ImageID)
	fmt.Printf("           load it: docker load -i %s, or kind load image-archive %s,\n", res.Archive, res.Archive)
	fmt.Printf("                    or ctr -n k8s.io images import %s\n", res.Archive)
	fmt.Printf("  layout   %s  index %s\n", res.Layout, res.IndexDigest)
	for _, a := range res.Arches {
		fmt.Printf("           linux/%-6s %s\n", a, res.Digests[a])
	}
	fmt.Printf("  push it: crane push %s registry.example.com/space-api:%s  (prints the digest: %s)\n",
		res.Layout, res.Ref[strings.LastIndex(res.Ref, ":")+1:], res.IndexDigest)
}
