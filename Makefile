# Fleet ingestion coordinator.
#
#   make demo   run the whole system end to end on a local PostgreSQL
#   make test   run every test (needs TEST_DATABASE_URL or a Docker engine)

SHELL := /bin/bash
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
TEST_DATABASE_URL ?= $(DATABASE_URL)
export DATABASE_URL TEST_DATABASE_URL

GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X github.com/fleet/ingest/internal/buildinfo.version=$(VERSION)

.PHONY: all build test local-aws-sqs test-short lint fmt vet staticcheck migrate bench bench-store bench-load chaos demo demo-clean clean

all: lint test

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

demo:
	bash scripts/demo.sh

# The SQS tests run local-aws-sqs (npm, on Node) as their SQS server; make
# test installs it on first use (into LOCAL_AWS_SQS_DIR) so they always run.
LOCAL_AWS_SQS_DIR ?= $(HOME)/.cache/fleet-ingest/local-aws-sqs
export LOCAL_AWS_SQS_DIR

test: local-aws-sqs
	$(GO) test -race -count=1 -timeout 30m ./...

local-aws-sqs:
	@test -f "$(LOCAL_AWS_SQS_DIR)/node_modules/local-aws-sqs/package.json" || \
		npm install --prefix "$(LOCAL_AWS_SQS_DIR)" --no-audit --no-fund local-aws-sqs@2.0.2

test-short:
	$(GO) test -short ./...

lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) tool staticcheck ./...

migrate:
	$(GO) run ./cmd/worker migrate

# The full reliability suite: several scenarios of workers, an enqueue
# driver and injected faults (SIGKILL, SIGSTOP, pg_terminate_backend, proxy
# stalls and cuts, a PostgreSQL restart) against a throwaway cluster, then the
# invariant checker. make test runs the reduced scenario.
chaos:
	$(GO) test -count=1 -run '^TestChaos$$' -v -timeout 60m ./e2e -chaos.full

# The benchmark harness: every figure against a baseline measured in the same
# run on a PostgreSQL cluster of its own. Writes bench/results/latest.{json,md}
# and latency charts. About 7 minutes on 2 cores.
# The SQS scenario needs local-aws-sqs (installed as for make test).
bench: local-aws-sqs
	$(GO) run ./bench -out bench/results

# Store benchmarks (reserve, acquire, renew) next to raw single-row
# INSERT/UPDATE baselines on the same database.
bench-store:
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./internal/batch ./internal/lease

# Warehouse load rows/s next to psql \copy of the same records.
bench-load:
	$(GO) test -run '^$$' -bench . -benchtime 5x ./internal/warehouse

# Stop the throwaway demo cluster (if make demo started one) and remove .dev.
demo-clean:
	@if [ -f .dev/pg/postmaster.pid ]; then \
		pgctl=$$(ls /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n1); pgctl=$${pgctl:-pg_ctl}; \
		if [ "$$(id -u)" = 0 ]; then runuser -u postgres -- $$pgctl -D $$PWD/.dev/pg stop -m fast; else $$pgctl -D .dev/pg stop -m fast; fi; \
	fi
	rm -rf .dev

clean: demo-clean
	rm -rf bin
