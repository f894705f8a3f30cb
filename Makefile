# space-api. `make run` and `make test` are all a fresh Debian machine with Go needs:
# the scripts install and start what is missing (PostgreSQL 15, Redis) on loopback.
SHELL := /usr/bin/env bash

.DEFAULT_GOAL := help
.PHONY: help run test test-stress fuzz services services-down services-clean bench lint build image

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

run: ## serve locally: starts Postgres and Redis if needed, migrates, demo flags, warm pool
	scripts/run.sh

test: ## the whole suite (race detector on) against real Postgres, Redis and Redis Cluster
	scripts/test.sh

test-stress: ## hunt flaky tests: the timing-sensitive packages 5 times under -race, the suite beside them as load
	scripts/stress.sh

fuzz: ## every fuzz target, the costly whole-stack one included (make test fuzzes the cheap ones)
	scripts/fuzz.sh

services: ## start local Postgres, Redis and a 3-node Redis Cluster on loopback
	scripts/services.sh up

services-down: ## stop what `make services` started; their data stays
	scripts/services.sh down

services-clean: ## stop the local servers and delete their data (Postgres's too, wherever it is)
	scripts/services.sh clean

bench: ## benchmarks against the local services; writes docs/benchmarks.md
	scripts/bench.sh

lint: ## go vet and gofmt check
	scripts/lint.sh

build: ## build bin/space-api
	go build -o bin/space-api ./cmd/space-api

image: ## the container image, no Docker needed: bin/space-api-image.tar and bin/space-api-oci/ (VERSION=...)
	VERSION="$(VERSION)" scripts/image.sh
