# rewind — build, test, demo. Everything a target needs is installed by the
# target itself (pinned), under the ignored bin/ or through apt-get.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export GOBIN := $(BIN)
export PATH := $(BIN):$(PATH)
# Every build but the race detector's is static (nothing here uses cgo):
# the binaries the tests run, the images' FROM-scratch binaries, go vet
# and staticcheck then share one build cache instead of compiling every
# dependency twice. The race detector needs cgo (test-go, stress).
export CGO_ENABLED := 0
RACE := CGO_ENABLED=1 $(GO) test -race

PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION := v0.8.2
# A stamp per version, so that changing STATICCHECK_VERSION installs it again.
STATICCHECK := $(BIN)/staticcheck
STATICCHECK_STAMP := $(BIN)/.staticcheck-$(STATICCHECK_VERSION)

.PHONY: all build demo demo-elastic test test-prep packages test-go lint verify stress staticcheck bench goodput host-pack generate tools clean fuzz help prometheus

include sdk/python/python.mk
include tiers/tiers.mk
include kube.mk
include deploy/compose/chaos.mk

all: build

## build: bin/rewind (the product: agent, coordinator, node, operator commands) and bin/rewind-dev beside it (demo, benchmarks, chaos runner).
build:
	$(GO) build -o $(BIN)/ ./cmd/rewind ./cmd/rewind-dev

## demo: a local cluster and a training job; a node dies, failure detection notices, the job recovers bit-identical.
demo: build
	$(BIN)/rewind-dev demo

## demo-elastic: three nodes of two ranks holding one model; a node dies with no spare left, the job shrinks to four ranks that reshard the state.
demo-elastic: build
	$(BIN)/rewind-dev demo --nodes 3 --ranks 6 --elastic 2

## test: lint, then every test: Go (race detector on), the Python SDK's pytest suite (with torch 1.13, then with torch 2.6 in a trixie root, then its DCP tests with torch 2.14 in a forky root), the Helm chart, the controller against a real API server and mpi-operator, the chaos smoke run (when a Docker engine answers).
# On a fresh machine most of make test is building and fetching what the
# later tests need: MinIO, helm, the trixie root, the control plane
# (kube-bin, the longest), the images. Those are made in that order in
# the background (test-prep, niced, its output in bin/test-prep.log) from
# the start, while the Debian packages are installed (mostly waiting on
# the network and dpkg) and lint, the Go tests and the Python tests run
# in front, which leave a core idle much of the time (tests that wait on
# processes and timeouts, a single-threaded pytest). The front's tests
# take what the background made by then (a build asked for twice waits
# for the first, under a lock: MinIO, helm, the trixie root, the images),
# and test-kube runs once the background is done, its test binary
# compiled there. The background waits for the packages before it needs
# them (bin/.packages-ready): it must not race the front for dpkg's lock.
# An interrupted or failed make test stops the background too.
TEST_FRONT := lint test-go test-python test-python-trixie test-python-forky test-helm chaos-smoke
TEST_AFTER := test-kube
PACKAGES_READY := $(BIN)/.packages-ready
test:
	@mkdir -p $(BIN) && rm -f $(PACKAGES_READY); \
	setsid nice -n 15 $(MAKE) --no-print-directory test-prep > $(BIN)/test-prep.log 2>&1 & prep=$$!; \
	trap 'kill -TERM -- -'$$prep' 2>/dev/null; wait '$$prep' 2>/dev/null' INT TERM; \
	echo "test: building MinIO, helm, the trixie and forky roots, the control plane and the images in the background (bin/test-prep.log)"; \
	if ! $(MAKE) --no-print-directory packages; then kill -TERM -- -$$prep 2>/dev/null; wait $$prep; exit 1; fi; \
	touch $(PACKAGES_READY); \
	echo "test: packages at $$(date -u +%T), $$SECONDS s in"; \
	for t in $(TEST_FRONT); do \
		if ! $(MAKE) --no-print-directory $$t; then kill -TERM -- -$$prep 2>/dev/null; wait $$prep; exit 1; fi; \
		echo "test: $$t done at $$(date -u +%T), $$SECONDS s in"; \
	done; \
	echo "test: waiting for the background builds"; \
	if ! wait $$prep; then tail -n 40 $(BIN)/test-prep.log; echo "test: the background builds failed (bin/test-prep.log)"; exit 1; fi; \
	echo "test: background builds done at $$(date -u +%T), $$SECONDS s in"; \
	$(MAKE) --no-print-directory $(TEST_AFTER) && echo "test: $(TEST_AFTER) done at $$(date -u +%T), $$SECONDS s in"

# test-prep is what make test builds in the background: what the tests
# need, built once and cached under bin/, what the front needs first
# first (MinIO for the Go tests, then helm), what needs the Debian
# packages once they are in, the control plane before the images (the
# chaos smoke run, the front's last test, needs them last).
test-prep:
	@$(MAKE) --no-print-directory minio helm
	@date -u +'test-prep: minio and helm at %T'
	@for i in $$(seq 1800); do [ -e $(PACKAGES_READY) ] && break; sleep 1; done; \
		[ -e $(PACKAGES_READY) ] || { echo "test-prep: the Debian packages were not installed within 30 minutes"; exit 1; }
	@$(MAKE) --no-print-directory python-trixie
	@date -u +'test-prep: the trixie root at %T'
	@$(MAKE) --no-print-directory python-forky
	@date -u +'test-prep: the forky root at %T'
	@$(MAKE) --no-print-directory kube-bin
	@date -u +'test-prep: the control plane at %T'
	@if docker info >/dev/null 2>&1 && command -v docker-compose >/dev/null; then $(MAKE) --no-print-directory images; fi
	@date -u +'test-prep: the images at %T'
	@$(MAKE) --no-print-directory build
	$(GO) test -c -o /dev/null ./kube/e2e
	@date -u +'test-prep: done at %T'

## packages: every Debian package the checks and tests use (etcd, prometheus, protoc, debootstrap, the Python SDK's), installed where missing.
packages: prometheus python-deps python-lint-deps tools kube-debs
	@command -v debootstrap >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap)

# MinIO is built first and required (REWIND_REQUIRE_MINIO=1), and so is
# Prometheus (REWIND_REQUIRE_PROMETHEUS=1): a plain `go test ./...` skips
# the tests that need them, `make test` runs them.
# Every process of the run records the fault points it fired under
# $(FAULT_HITS); the last step fails if a point of faultinject's table was
# fired by no test.
FAULT_HITS := $(BIN)/fault-hits
## test-go: every Go test, race detector on, MinIO required; then every fault point must have fired.
test-go: minio prometheus
	rm -rf $(FAULT_HITS) && mkdir -p $(FAULT_HITS)
	REWIND_REQUIRE_MINIO=1 REWIND_REQUIRE_PROMETHEUS=1 REWIND_FAULT_HITS=$(FAULT_HITS) $(RACE) -count=1 -timeout 15m ./...
	REWIND_FAULT_COVERAGE=$(FAULT_HITS) $(GO) test -count=1 -run TestEveryPointFired ./faultinject

## prometheus: prometheus and promtool from Debian's prometheus package, for the tests of the dashboard and alert rules.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

## lint: gofmt, go vet, staticcheck (pinned, installed into bin/), and pyflakes and mypy on the Python SDK.
lint: $(STATICCHECK_STAMP) lint-python
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## staticcheck: the pinned staticcheck, into bin/.
staticcheck: $(STATICCHECK_STAMP)
$(STATICCHECK_STAMP):
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@rm -f $(BIN)/.staticcheck-* && touch $@

## verify: the checks that are not tests: generated code up to date, go.mod tidy (.ci/run runs it, then make test).
verify: generate
	$(GO) mod tidy
	git diff --exit-code -- api sdk/python/rewind/_pb go.mod go.sum || (echo "generated code or go.mod out of date: run make generate && go mod tidy"; exit 1)

# make stress: each package's tests STRESS_COUNT times under the race
# detector (STRESS_PKGS, default all), each bounded by STRESS_TIMEOUT,
# STRESS_JOBS packages at a time (1: one after another, the quietest;
# 2 on a 2-core machine takes about two thirds of the time, at a load
# near 4). A failed package's output is kept in bin/stress/; the last
# lines list the failures per package, and the target fails if any
# package did.
STRESS_COUNT ?= 20
# The coordinator's 20 rounds are the longest: more than an hour under
# -race beside another package on two cores (load 5 to 7). The bound
# leaves them room; a package that hangs still ends.
STRESS_TIMEOUT ?= 120m
STRESS_PKGS ?= ./...
STRESS_JOBS ?= 1
STRESS_LOGS := $(BIN)/stress

## stress: each package's tests 20 times under -race (STRESS_COUNT, STRESS_PKGS, STRESS_TIMEOUT, STRESS_JOBS); reports the packages that failed.
stress: minio
	@rm -rf $(STRESS_LOGS) && mkdir -p $(STRESS_LOGS); \
	$(GO) list $(STRESS_PKGS) | xargs -P $(STRESS_JOBS) -I{} sh -c '\
		pkg={}; log=$(STRESS_LOGS)/$$(echo $$pkg | tr / _).log; start=$$(date +%s); \
		REWIND_REQUIRE_MINIO=1 $(RACE) -count=$(STRESS_COUNT) -timeout $(STRESS_TIMEOUT) $$pkg > $$log 2>&1; rc=$$?; \
		fails=$$(grep -c -- "^--- FAIL" $$log); took=$$(( $$(date +%s) - start ))s; \
		if [ $$rc -ne 0 ]; then echo "FAIL $$pkg: $$fails failed test runs of $(STRESS_COUNT) rounds, exit $$rc, $$took (log: $$log)"; \
		else rm -f $$log; echo "ok   $$pkg: $(STRESS_COUNT) rounds, $$took"; fi' | tee $(STRESS_LOGS)/report; \
	failed=$$(grep -c '^FAIL' $(STRESS_LOGS)/report); \
	echo; echo "stress: $$failed package(s) failed, load $$(cut -d' ' -f1-3 /proc/loadavg) at the end"; grep '^FAIL' $(STRESS_LOGS)/report; \
	[ $$failed -eq 0 ]

## help: the targets and what they do.
help:
	@grep -hE '^## [a-z][a-z0-9-]*:' $(MAKEFILE_LIST) | sed 's/^## //' | \
		awk '{ i = index($$0, ": "); printf "  %-16s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2) }'

## goodput: a faulted training run with rewind, then with a torch.save-style baseline: goodput and where the rest went (about 22 minutes; GOODPUT_FLAGS=--quick: 2).
GOODPUT_FLAGS ?=
goodput: build minio
	nice $(BIN)/rewind-dev bench goodput $(GOODPUT_FLAGS)

## bench: the performance figures in docs/performance.md.
bench: build minio
	$(BIN)/rewind-dev bench save --sizes 1GiB,4GiB --runs 5
	$(BIN)/rewind-dev bench coordinator --ranks 1024,8192 --steps 200
	$(BIN)/rewind-dev bench tiers --size 1GiB --cpu-size 4GiB --runs 3 --bandwidth 500MB
	$(BIN)/rewind-dev bench recovery --size 1GiB --runs 9
	$(BIN)/rewind-dev bench coordinator --ranks 8192 --steps 200 --tls
	$(BIN)/rewind-dev bench peer --size 1GiB --runs 9

## host-pack: static binaries, stripped and gzipped, in bin/host/, for internal/bench/hostcheck.sh on a host without Go.
host-pack:
	mkdir -p $(BIN)/host
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/host/ ./cmd/rewind ./cmd/rewind-dev ./$(PYTHON_SDK)/tests/testdata/gowriter
	gzip -9f $(BIN)/host/rewind $(BIN)/host/rewind-dev $(BIN)/host/gowriter
	@ls -l $(BIN)/host

# make fuzz: each fuzz target for FUZZTIME (go test -fuzz runs one target
# at a time); a failing input is written under the package's
# testdata/fuzz/ and the target stops.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./shm:FuzzDecodeHeader ./membership:FuzzDecodeMeta ./kube:FuzzParseSpec \
	./coordinator:FuzzCoordinatorRequests ./agent:FuzzAgentRequests ./agent:FuzzPeerDataRequest ./agent:FuzzPeerDataAnswer ./agent:FuzzSegmentRequest

## fuzz: every fuzz target for FUZZTIME each (30s): header and metadata decoders, annotations, every gRPC handler of the coordinator and the agent, the peer data path both ways.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "== $${t#*:} ($${t%%:*}, $(FUZZTIME))"; \
		$(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

## generate: regenerate gRPC code from api/*.proto (protoc from Debian's protobuf-compiler).
generate: tools generate-python
	protoc -I api --go_out=api/agentpb --go_opt=paths=source_relative \
		--go-grpc_out=api/agentpb --go-grpc_opt=paths=source_relative api/agent.proto
	protoc -I api --go_out=api/coordpb --go_opt=paths=source_relative \
		--go-grpc_out=api/coordpb --go-grpc_opt=paths=source_relative api/coordinator.proto

tools: $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	@command -v protoc >/dev/null || (apt-get update -qq && apt-get install -y -qq protobuf-compiler)

$(BIN)/protoc-gen-go:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(BIN)/protoc-gen-go-grpc:
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## clean: remove bin/ (the built and installed tools with it).
clean:
	rm -rf $(BIN)
