# Fleet ingestion coordinator.
#
#   make demo   run the whole system end to end on a local PostgreSQL
#   make test   run every test (needs TEST_DATABASE_URL or a Docker engine); it
#               first runs scripts/test-deps.sh, which installs the tools the
#               tests need (as root; not root, it names the command: sudo make
#               test-deps) and points the tests at them
#   make test-deps   only that set-up (Debian: apt-get prometheus pgbouncer
#               chromium; npm local-aws-sqs; go install goaws)
#   make -s alerts-static RELEASE=prod NAMESPACE=fleet VALUES=values.yaml
#               print the alert rules file of one install, for a Prometheus
#               without the Operator (scripts/alerts-static.sh)
#   make redshift-live   the opt-in test against a real Redshift Serverless
#               workgroup (REDSHIFT_TEST_* settings; it says what is missing)

SHELL := /bin/bash
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
TEST_DATABASE_URL ?= $(DATABASE_URL)
export DATABASE_URL TEST_DATABASE_URL

GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X github.com/fleet/ingest/internal/buildinfo.version=$(VERSION)

.PHONY: alerts-static redshift-live all build test test-deps local-aws-sqs test-short lint fmt vet staticcheck migrate bench bench-store bench-load chaos demo demo-clean clean

all: lint test

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

demo:
	bash scripts/demo.sh

# The SQS tests run local-aws-sqs (npm, on Node) as their SQS server
# (LOCAL_AWS_SQS_DIR), the SNS tests goaws (GOAWS_BIN), the S3-compatible
# store tests MinIO (MINIO_BIN), the alert rules'
# tests promtool (PROMTOOL), the PgBouncer tests pgbouncer (PGBOUNCER_BIN),
# the River UI tests chromium (CHROMIUM_BIN): scripts/test-deps.sh installs
# what is missing and exports those variables (a value set here or in the
# environment names the tool to use). With them set, a test whose tool is
# missing fails; only go test -short skips it.
LOCAL_AWS_SQS_DIR ?= $(HOME)/.cache/fleet-ingest/local-aws-sqs
GOAWS_BIN ?= $(HOME)/.cache/fleet-ingest/goaws/goaws
MINIO_BIN ?= $(HOME)/.cache/fleet-ingest/minio/minio
export LOCAL_AWS_SQS_DIR GOAWS_BIN MINIO_BIN

# After the tests (passed or not), the template databases they cloned are
# dropped unless another test run still uses them (internal/testkit/pgtest,
# DropTemplates); it fails if templates remain although none does.
test:
	@exports=$$(GO="$(GO)" bash scripts/test-deps.sh) || exit 1; eval "$$exports"; \
		status=0; $(GO) test -race -count=1 -timeout 30m ./... || status=$$?; \
		$(GO) run ./internal/testkit/pgtest/droptemplates || status=1; exit $$status

test-deps:
	@GO="$(GO)" bash scripts/test-deps.sh

local-aws-sqs:
	@test -f "$(LOCAL_AWS_SQS_DIR)/node_modules/local-aws-sqs/package.json" || \
		npm install --prefix "$(LOCAL_AWS_SQS_DIR)" --no-audit --no-fund local-aws-sqs@2.0.2

# The Prometheus rules file of one install (scripts/alerts-static.sh: the
# chart's PrometheusRule rendered by helm template for RELEASE in NAMESPACE
# with VALUES, comma-separated files). With the defaults it prints
# deploy/prometheus/alerts.yaml: make -s alerts-static > deploy/prometheus/alerts.yaml
RELEASE ?= fleet-ingest
NAMESPACE ?= fleet
VALUES ?=
alerts-static:
	@RELEASE="$(RELEASE)" NAMESPACE="$(NAMESPACE)" VALUES="$(VALUES)" bash scripts/alerts-static.sh

test-short:
	$(GO) test -short ./...

# REDSHIFT_LIVE_REQUIRED must be set; the optional ones widen what it proves.
REDSHIFT_LIVE_REQUIRED := REDSHIFT_TEST_WORKGROUP REDSHIFT_TEST_DATABASE REDSHIFT_TEST_IAM_ROLE REDSHIFT_TEST_STAGING AWS_REGION
redshift-live:
	@missing=""; for v in $(REDSHIFT_LIVE_REQUIRED); do [ -n "$${!v}" ] || missing="$$missing $$v"; done; \
	if [ -n "$$missing" ]; then \
		echo "make redshift-live: missing:$$missing"; \
		echo "  required: REDSHIFT_TEST_WORKGROUP (a Serverless workgroup), REDSHIFT_TEST_DATABASE, REDSHIFT_TEST_IAM_ROLE (the COPY role's ARN,"; \
		echo "  associated with the workgroup), REDSHIFT_TEST_STAGING (s3://bucket/prefix/ in its region), AWS_REGION, and AWS credentials"; \
		echo "  optional: REDSHIFT_TEST_SECRET_ARN (the schema owner, migrates), REDSHIFT_TEST_LOADER_SECRET_ARN and"; \
		echo "  REDSHIFT_TEST_READER_SECRET_ARN (users granted fleet_loader / fleet_reader), REDSHIFT_TEST_DEFAULT_ROLE=1 (the"; \
		echo "  workgroup has a default IAM role that may read the staging prefix)"; \
		exit 2; \
	fi
	$(GO) test -count=1 -v -timeout 60m -run TestLiveRedshiftServerless ./internal/warehouse/redshift/

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
