#!/usr/bin/env bash
# `make image`: the space-api container image, built with no Docker engine by the Go
# program in tools/image (a module of its own, with go-containerregistry). It writes
#
#   bin/space-api-image.tar   docker-save archive, this machine's architecture, tagged
#                             space-sandbox/space-api:<version>: docker load -i,
#                             kind load image-archive, ctr -n k8s.io images import
#   bin/space-api-oci/        OCI layout with the linux/amd64 + linux/arm64 index:
#                             crane push bin/space-api-oci <registry>/space-api:<version>
#
# and prints the digests. The same commit builds the same digests (file times and the
# image date come from SOURCE_DATE_EPOCH, else the commit time).
#
#   VERSION=0.2.0 make image         the tag and main.version (default: the chart's
#                                    appVersion in deploy/helm/space-api/Chart.yaml,
#                                    which is the chart's default image tag)
#   IMAGE_ARCHES=amd64 make image    architectures of the layout (default amd64,arm64)
#   IMAGE_LOAD_ARCH=arm64 make image architecture of the archive (default this machine's)
#
# A cold build compiles space-api twice (about 4 minutes for amd64 and 6 for arm64 on 2
# cores); later builds reuse Go's build cache and take seconds.
set -euo pipefail
cd "$(dirname "$0")/../tools/image"
exec go run . -root ../.. "$@"
