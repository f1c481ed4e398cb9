# tiers.mk — the pinned MinIO server that the S3 tier's tests and the demo
# run (internal/miniotest starts it from bin/minio). Included by the
# top-level Makefile, which defines GO and BIN. Only the server is built:
# the tests drive it through minio-go, so the mc client is not needed.
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c

.PHONY: minio

## minio: build the pinned MinIO server into bin/ (once; about 3 minutes).
minio: $(BIN)/minio

# A file target: built only when bin/minio is missing. After changing
# MINIO_VERSION, run `rm bin/minio && make minio`. Statically linked
# (CGO_ENABLED=0), so that the chaos cluster's FROM-scratch image takes the
# same binary and a clean machine builds MinIO once, not twice.
# Under a lock: make test builds it in the background, and a test target
# asked for meanwhile waits for that build instead of starting another.
$(BIN)/minio:
	@mkdir -p $(BIN)
	flock $(BIN)/.minio.lock sh -c '[ -f $@ ] || CGO_ENABLED=0 GOBIN=$(BIN) $(GO) install github.com/minio/minio@$(MINIO_VERSION)'
