# Python SDK targets. The top-level Makefile includes this file; it also
# works on its own: make -f Makefile -f sdk/python/python.mk test-python
#
#   python-deps      Debian's torch, grpcio, numpy, protobuf, pytest, xxhash (apt, when missing)
#   test-python      the SDK's pytest suite against a real agent (bin/rewind)
#   python-trixie    a Debian trixie root with torch 2.x, under bin/ (once)
#   test-python-trixie  the whole suite in that root (torch 2.x, numpy 2, Python 3.13)
#   test-python-dcp  rewind.dcp's tests alone (torch 2.x DCP, gloo on the CPU) in that root
#   python-forky     a Debian forky root with the newest torch Debian has (2.14), under bin/ (once)
#   test-python-forky  rewind.dcp's tests in that root
#   bench-dcp        dcp.save through rewind.dcp.Writer against FileSystemWriter
#   bench-python     client.save against torch.save to local disk and /dev/shm
#   generate-python  regenerate sdk/python/rewind/_pb from api/agent.proto
#   lint-python      pyflakes and mypy on the SDK (Debian's; bookworm has no ruff)

PYTHON ?= /usr/bin/python3
GO ?= go
BIN ?= $(CURDIR)/bin
PYTHON_SDK := sdk/python
PYTHON_PB := $(PYTHON_SDK)/rewind/_pb
PYTHON_DEBS := python3-torch python3-grpcio python3-numpy python3-protobuf python3-pytest python3-xxhash
BENCH_PYTHON_FLAGS ?= --sizes 1GiB,4GiB --runs 5

.PHONY: python-deps python-rewind-bin test-python bench-python generate-python lint-python python-lint-deps \
	python-trixie test-python-trixie python-gowriter test-python-dcp bench-dcp python-forky test-python-forky

python-deps:
	@$(PYTHON) -c 'import torch, grpc, numpy, google.protobuf, pytest, xxhash' 2>/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PYTHON_DEBS))

# The agent the tests and the benchmark start (go build is incremental).
python-rewind-bin:
	$(GO) build -o $(BIN)/rewind ./cmd/rewind

## test-python: the Python SDK's tests, each against a real agent.
test-python: python-deps python-rewind-bin
	REWIND_BIN=$(BIN)/rewind $(PYTHON) -m pytest -q $(PYTHON_SDK)/tests

# Bookworm's torch (1.13) has no torch 2.x DCP, DTensor or FSDP2: those
# tests run in a Debian trixie root (python3-torch 2.6) made by
# debootstrap under the ignored bin/, once (a stamp file; about 1.6 GB).
# trixie.sh runs a command in it with the repository at /src, /proc and
# the host's /dev/shm mounted in a private mount namespace, so nothing
# stays mounted after it, however it ends. The agent binary is the one
# built here (bin/ is inside the repository).
TRIXIE_ROOT := $(BIN)/trixie
TRIXIE := sh $(PYTHON_SDK)/trixie.sh
TRIXIE_REWIND := /src/$(patsubst $(CURDIR)/%,%,$(BIN))/rewind
BENCH_DCP_FLAGS ?= --world 2 --mib 256 --runs 5  # one rank per core of the 2-vCPU development machine

## python-trixie: the Debian trixie root (torch 2.x) for the DCP tests, under bin/ (once).
python-trixie:
	$(TRIXIE) build $(TRIXIE_ROOT)

## test-python-trixie: the Python SDK's whole pytest suite with torch 2.x, numpy 2 and Python 3.13 in the trixie root, rewind.dcp's tests among them.
test-python-trixie: python-trixie python-rewind-bin python-gowriter
	$(TRIXIE) run $(TRIXIE_ROOT) $(CURDIR) sh -c 'cd /src && REWIND_BIN=$(TRIXIE_REWIND) REWIND_GOWRITER=$(TRIXIE_GOWRITER) \
		python3 -m pytest -q -p no:cacheprovider $(PYTHON_SDK)/tests'

# The cross-language tests' Go shard writer, built here for the trixie
# root, which has no Go.
TRIXIE_GOWRITER := /src/$(patsubst $(CURDIR)/%,%,$(BIN))/gowriter
python-gowriter:
	$(GO) build -o $(BIN)/gowriter ./$(PYTHON_SDK)/tests/testdata/gowriter

## test-python-dcp: rewind.dcp (PyTorch DCP storage) alone in the trixie root: DTensor state saved at world size 4, loaded at 4, 3, 2; odd state dicts, steps and ids (test_dcp_cases.py); against FileSystemWriter (test_dcp_diff.py); failed and repeated saves (test_dcp_failures.py).
test-python-dcp: python-trixie python-rewind-bin
	$(TRIXIE) run $(TRIXIE_ROOT) $(CURDIR) sh -c 'cd /src && REWIND_BIN=$(TRIXIE_REWIND) \
		python3 -m pytest -q -p no:cacheprovider $(PYTHON_SDK)/tests/test_dcp.py $(PYTHON_SDK)/tests/test_dcp_cases.py \
		$(PYTHON_SDK)/tests/test_dcp_diff.py $(PYTHON_SDK)/tests/test_dcp_failures.py $(PYTHON_SDK)/tests/test_dcp_sharded.py'

# The DCP tests again with the newest torch Debian packages: forky's
# (2.14; the build refuses one older than 2.7, whose async_save has no
# process executor). DCP's interface moves between versions (its
# async_save process executor, its stagers, its gloo's dtypes): trixie's
# 2.6 is the oldest torch 2.x rewind.dcp supports, forky's the newest.
# test_dcp_cases.py (odd state dicts, about 2.5 minutes) runs in trixie
# only, for make test's time.
FORKY_ROOT := $(BIN)/forky
PYTHON_DCP_TESTS := $(addprefix $(PYTHON_SDK)/tests/,test_dcp.py test_dcp_diff.py test_dcp_failures.py \
	test_dcp_sharded.py test_dcp_stage.py)

## python-forky: a Debian forky root (the newest torch Debian has, 2.14) for the DCP tests, under bin/ (once).
python-forky:
	TRIXIE_SUITE=forky TRIXIE_TORCH_MIN=2.7 $(TRIXIE) build $(FORKY_ROOT)

## test-python-forky: rewind.dcp's tests with the newest torch Debian has (the forky root): DCP's process executor among them.
test-python-forky: python-forky python-rewind-bin
	$(TRIXIE) run $(FORKY_ROOT) $(CURDIR) sh -c 'cd /src && REWIND_BIN=$(TRIXIE_REWIND) \
		python3 -m pytest -q -p no:cacheprovider $(PYTHON_DCP_TESTS)'

## bench-dcp: dcp.save through rewind.dcp.Writer against FileSystemWriter (/dev/shm, local disk); figures in docs/performance.md.
bench-dcp: python-trixie python-rewind-bin
	$(TRIXIE) run $(TRIXIE_ROOT) $(CURDIR) sh -c 'cd /src && \
		python3 $(PYTHON_SDK)/bench_dcp.py --rewind-bin $(TRIXIE_REWIND) $(BENCH_DCP_FLAGS)'

## bench-python: client.save against torch.save (local disk, /dev/shm); figures in docs/performance.md.
bench-python: python-deps python-rewind-bin
	$(PYTHON) $(PYTHON_SDK)/bench.py --rewind-bin $(BIN)/rewind $(BENCH_PYTHON_FLAGS)

## generate-python: Python gRPC stubs from api/agent.proto (Debian's protoc and grpc_python_plugin).
generate-python:
	@command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq protobuf-compiler protobuf-compiler-grpc)
	protoc -I api --python_out=$(PYTHON_PB) --pyi_out=$(PYTHON_PB) --grpc_python_out=$(PYTHON_PB) \
		--plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) api/agent.proto
	@# The plugin imports the messages as a top-level module; inside the package they are a sibling.
	sed -i 's/^import agent_pb2 as agent__pb2$$/from . import agent_pb2 as agent__pb2/' $(PYTHON_PB)/agent_pb2_grpc.py

# Debian bookworm packages mypy (1.0) and pyflakes, not ruff: pyflakes
# checks what ruff's default rules (F) do. The generated _pb is left out
# of pyflakes (protoc's code defines names through its builder) and of
# mypy's errors (pyproject.toml).
PYTHON_LINT_FILES = $(shell find $(PYTHON_SDK)/rewind $(PYTHON_SDK)/tests -name '*.py' -not -path '*/_pb/*') $(PYTHON_SDK)/bench.py

python-lint-deps:
	@command -v pyflakes3 >/dev/null && $(PYTHON) -m mypy --version >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pyflakes3 mypy)

## lint-python: pyflakes and mypy (settings in sdk/python/pyproject.toml) on the Python SDK; make lint runs it.
# mypy follows the SDK's imports (torch, numpy, grpc): python-deps first.
lint-python: python-lint-deps python-deps
	pyflakes3 $(PYTHON_LINT_FILES)
	cd $(PYTHON_SDK) && $(PYTHON) -m mypy
