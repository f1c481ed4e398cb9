# rewind — build, test, demo. Everything a target needs is installed by the
# target itself (pinned), under the ignored bin/ or through apt-get.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export GOBIN := $(BIN)
export PATH := $(BIN):$(PATH)

PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

.PHONY: all build demo test test-go lint verify bench generate tools clean fuzz

include sdk/python/python.mk
include tiers/tiers.mk
include kube.mk
include deploy/compose/chaos.mk

all: build

build:
	$(GO) build -o $(BIN)/rewind ./cmd/rewind

## demo: a local cluster and a training job; a node dies, failure detection notices, the job recovers bit-identical.
demo: build
	$(BIN)/rewind demo

## test: every test: Go (race detector on), the Python SDK's pytest suite, the Helm chart, the chaos smoke run (when a Docker engine answers).
test: lint test-go test-python test-helm chaos-smoke

# Every process of the run records the fault points it fired under
# $(FAULT_HITS); the last step fails if a point of faultinject's table was
# fired by no test.
FAULT_HITS := $(BIN)/fault-hits
test-go: minio
	rm -rf $(FAULT_HITS) && mkdir -p $(FAULT_HITS)
	REWIND_FAULT_HITS=$(FAULT_HITS) $(GO) test -race -count=1 -timeout 15m ./...
	REWIND_FAULT_COVERAGE=$(FAULT_HITS) $(GO) test -count=1 -run TestEveryPointFired ./faultinject

## lint: formatting and go vet.
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

## verify: generated code is up to date, modules tidy, lint, tests.
verify: generate lint
	$(GO) mod tidy
	git diff --exit-code -- api sdk/python/rewind/_pb go.mod go.sum || (echo "generated code or go.mod out of date: run make generate && go mod tidy"; exit 1)
	$(MAKE) test-go

## bench: the performance figures in the README.
bench: build minio
	$(BIN)/rewind bench save --sizes 1GiB,4GiB --runs 5
	$(BIN)/rewind bench coordinator --ranks 1024,8192 --steps 200
	$(BIN)/rewind bench tiers --size 1GiB --cpu-size 4GiB --runs 3 --bandwidth 500MB
	$(BIN)/rewind bench recovery --size 1GiB --runs 3

## fuzz: a short run of every fuzz target.
fuzz:
	$(GO) test ./shm -run '^$$' -fuzz FuzzDecodeHeader -fuzztime 60s

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

clean:
	rm -rf $(BIN)
