# chaos.mk — the compose cluster's images and the chaos suite against it
# (deploy/compose/README.md). Included by the top-level Makefile, which
# defines GO, BIN and MINIO_VERSION (tiers/tiers.mk).
COMPOSE_DIR := deploy/compose
COMPOSE_CONTEXT := $(COMPOSE_DIR)/.build
STATIC := $(BIN)/static
# SEED=N replays a run's random choices; CHAOS_FLAGS adds flags
# (--scenarios node-kill,partition, --keep).
SEED ?=
CHAOS_FLAGS ?=
# CHAOS_REWIND_IMAGE tags the rewind image (the compose file reads it
# too): two checkouts sharing one Docker engine each give their own.
CHAOS_REWIND_IMAGE ?= rewind-chaos/rewind:dev
export CHAOS_REWIND_IMAGE
CHAOS_SEED = $(if $(SEED),--seed $(SEED))

.PHONY: images images-unlocked chaos chaos-smoke

# Statically linked binaries only: the images are FROM scratch. bin/minio
# (tiers/tiers.mk) is built static; one built before that was not is
# rebuilt here.
$(STATIC)/minio: $(BIN)/minio
	mkdir -p $(STATIC)
	if file $(BIN)/minio | grep -q 'statically linked'; then cp $(BIN)/minio $@; \
	else CGO_ENABLED=0 GOBIN=$(STATIC) $(GO) install github.com/minio/minio@$(MINIO_VERSION); fi

## images: the cluster's images (rewind with rewind-dev beside it, MinIO), FROM scratch with static binaries; nothing is pulled.
# Under a lock: make test builds them in the background while the front
# may ask for them; a second build waits, then finds them built (Go's and
# Docker's caches make it quick).
images: $(STATIC)/minio
	flock $(BIN)/.images.lock $(MAKE) --no-print-directory images-unlocked

images-unlocked:
	CGO_ENABLED=0 $(GO) build -o $(STATIC)/ ./cmd/rewind ./cmd/rewind-dev
	@if command -v file >/dev/null; then for b in rewind rewind-dev minio; do \
		file $(STATIC)/$$b | grep -q 'statically linked' || { echo "$(STATIC)/$$b is not statically linked"; exit 1; }; done; fi
	mkdir -p $(COMPOSE_CONTEXT)
	for b in rewind rewind-dev minio; do ln -f $(STATIC)/$$b $(COMPOSE_CONTEXT)/$$b 2>/dev/null || cp $(STATIC)/$$b $(COMPOSE_CONTEXT)/$$b; done
	docker build -q --target rewind -t $(CHAOS_REWIND_IMAGE) -f $(COMPOSE_DIR)/Dockerfile $(COMPOSE_CONTEXT)
	docker build -q --target minio -t rewind-chaos/minio:dev -f $(COMPOSE_DIR)/Dockerfile $(COMPOSE_CONTEXT)

## chaos: every fault scenario against the compose cluster, each checked; prints a table (SEED=N replays); a failed scenario's logs go to bin/chaos-logs.
chaos: images
	$(STATIC)/rewind-dev chaos --logs $(BIN)/chaos-logs $(CHAOS_SEED) $(CHAOS_FLAGS)

## chaos-smoke: a node kill and a MinIO outage (make test runs it); SKIPPED when no Docker engine answers.
chaos-smoke:
	@if ! docker info >/dev/null 2>&1; then echo "chaos-smoke: SKIPPED: no Docker engine answers"; \
	elif ! command -v docker-compose >/dev/null; then echo "chaos-smoke: SKIPPED: docker-compose is not installed"; \
	else $(MAKE) --no-print-directory images && $(STATIC)/rewind-dev chaos --smoke --logs $(BIN)/chaos-logs $(CHAOS_SEED) $(CHAOS_FLAGS); fi
