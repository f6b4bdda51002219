# fm: the Firstmate extension host.
#   make build   builds bin/fm
#   make demo    runs the main job end to end on a throwaway home
#   make test    runs every test, as this user and as an unprivileged one, and
#                the SDK's (pkg/adapter) under the race detector
#   make bench   measures against the floor (see docs/performance.md)
#   make crash   2,000 crash-injection points; make soak: the 10-minute serve
#                soak (see docs/reliability.md)
#   make powercut  the power-loss sweep: every durable path cut before each of
#                its operations on a FUSE file system that forgets what was
#                not synced, both models, and the mutation proof
#                (docs/reliability.md, "Power loss"; needs fuse3)
GO ?= go

.PHONY: build demo test test-root test-race test-unprivileged fuzz bench crash soak powercut vet

build:
	$(GO) build -o bin/fm ./cmd/fm

demo: build
	bash scripts/demo.sh

vet:
	$(GO) vet ./...

test: vet test-root test-race fuzz test-unprivileged

test-root:
	$(GO) test -count=1 ./...

# The SDK promises what is safe for concurrent use (pkg/adapter doc): its
# tests run under the race detector, which needs cgo (a C compiler).
test-race:
	CGO_ENABLED=1 $(GO) test -count=1 -race ./pkg/adapter/...

test-unprivileged:
	bash scripts/test-unprivileged.sh

fuzz:
	bash scripts/fuzz-short.sh

bench: build
	bash bench/run.sh

crash:
	bash bench/crash.sh

soak:
	bash bench/soak.sh

powercut:
	bash scripts/powercut.sh
