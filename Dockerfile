# syntax=docker/dockerfile:1
# The space-api image for teams that build with Docker (BuildKit). It is the image
# `make image` assembles without Docker (tools/image), and must stay so: same static
# binary flags, user 65532, entrypoint, command, PATH and labels
# (tools/image/dockerfile_test.go compares the two). Build it with the chart's version:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION="$(awk -F'"' '/^appVersion:/ {print $2}' deploy/helm/space-api/Chart.yaml)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     -t space-sandbox/space-api:0.1.0 .

# The Go of go.mod's go directive.
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION
RUN test -n "$VERSION" || { echo 'pass --build-arg VERSION=<the chart appVersion>' >&2; exit 1; }
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Static (CGO_ENABLED=0), no build paths (-trimpath), version stamped, symbols stripped.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /rootfs/space-api ./cmd/space-api
# On PATH, for `kubectl exec ... -- space-api keys create`; copied as a directory below
# so the symlink stays a symlink.
RUN mkdir -p /rootfs/usr/local/bin && ln -s /space-api /rootfs/usr/local/bin/space-api

# distroless static: /etc/passwd and /etc/group with nonroot (65532), the Debian CA
# bundle at /etc/ssl/certs/ca-certificates.crt, /tmp, /home/nonroot; no shell.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION
ARG REVISION=unknown
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
WORKDIR /
LABEL org.opencontainers.image.title="space-api" \
      org.opencontainers.image.description="space-api, the admission controller of a sandbox control plane" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/space-sandbox/space"
ENTRYPOINT ["/space-api"]
CMD ["serve"]
