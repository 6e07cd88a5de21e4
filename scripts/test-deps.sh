#!/usr/bin/env bash
# test-deps.sh: install what the tests need, then print the environment that
# points them at it. make test and .ci/run both run it:
#
#   deps=$(bash scripts/test-deps.sh) && eval "$deps"
#
# What the tests need besides Go and PostgreSQL:
#   promtool    Debian package prometheus  (PROMTOOL)       alert rule tests (deploy)
#   pgbouncer   Debian package pgbouncer   (PGBOUNCER_BIN)  PgBouncer tests (e2e, lease, chaos)
#   chromium    Debian package chromium    (CHROMIUM_BIN)   River UI tests (e2e)
#   openssl     Debian package openssl                      the notification guide's openssl line (deploy)
#   node, npm   Debian packages nodejs npm                  to run local-aws-sqs
#   local-aws-sqs 2.0.2, npm, into LOCAL_AWS_SQS_DIR        SQS tests
#   goaws v0.4.5, go install, at GOAWS_BIN                  SNS tests (internal/notify)
#   helm v3.16.4, go install, at HELM_BIN                   helm lint of the chart (deploy/helm)
#   minio (pinned pseudo-version), go install, at MINIO_BIN  S3-compatible store tests (e2e)
#
# An environment variable already set names the tool to use (PROMTOOL may
# be a name on PATH or a path); unset, the defaults above apply
# (LOCAL_AWS_SQS_DIR=$HOME/.cache/fleet-ingest/local-aws-sqs,
# GOAWS_BIN=$HOME/.cache/fleet-ingest/goaws/goaws,
# HELM_BIN=$HOME/.cache/fleet-ingest/helm/helm,
# MINIO_BIN=$HOME/.cache/fleet-ingest/minio/minio; the first build of Helm
# takes about 6 minutes and that of MinIO about 10, later runs find them).
#
# Debian packages: as root, the missing ones are installed with apt-get
# (apt-get update only when something is missing). Not root and something
# is missing, it installs nothing, names the command to run (sudo make
# test-deps) and exits 1. local-aws-sqs and goaws go to the user's cache
# and need no root (under sudo with the user's HOME, they are installed as
# that user).
#
# When everything is present it prints only the exports (on stdout; what it
# does goes to stderr) and takes well under a second.
set -euo pipefail

log() { echo "test-deps: $*" >&2; }

# resolve NAME: the path of an executable NAME (a path or a name on PATH).
resolve() {
	local p
	p=$(command -v -- "$1" 2>/dev/null) || return 1
	[ -x "$p" ] || return 1
	printf '%s\n' "$p"
}

find_promtool() { resolve "${PROMTOOL:-promtool}"; }

find_pgbouncer() {
	if [ -n "${PGBOUNCER_BIN:-}" ] && [ "$PGBOUNCER_BIN" != pgbouncer ]; then
		resolve "$PGBOUNCER_BIN"
		return
	fi
	# Debian installs it in /usr/sbin, outside most users' PATH.
	resolve pgbouncer || resolve /usr/sbin/pgbouncer
}

find_chromium() {
	if [ -n "${CHROMIUM_BIN:-}" ]; then
		resolve "$CHROMIUM_BIN"
		return
	fi
	resolve chromium || resolve chromium-browser || resolve google-chrome
}

# Debian packages to install for what is missing.
missing_packages() {
	local pkgs=()
	find_promtool >/dev/null || pkgs+=(prometheus)
	find_pgbouncer >/dev/null || pkgs+=(pgbouncer)
	find_chromium >/dev/null || pkgs+=(chromium)
	resolve openssl >/dev/null || pkgs+=(openssl)
	if ! resolve node >/dev/null; then
		pkgs+=(nodejs)
		resolve npm >/dev/null || pkgs+=(npm)
	elif ! resolve npm >/dev/null; then
		pkgs+=(npm)
	fi
	echo "${pkgs[*]}"
}

pkgs=$(missing_packages)
if [ -n "$pkgs" ]; then
	if [ "$(id -u)" != 0 ]; then
		log "missing Debian packages: $pkgs"
		log "run: sudo make test-deps   (it installs them; then make test again)"
		log "or install them yourself and set PROMTOOL, PGBOUNCER_BIN or CHROMIUM_BIN if they are not on PATH;"
		log "go test -short ./... skips the tests that need them"
		exit 1
	fi
	if ! command -v apt-get >/dev/null; then
		log "missing: $pkgs, and this is not a Debian system (no apt-get): install them, or set PROMTOOL, PGBOUNCER_BIN or CHROMIUM_BIN"
		exit 1
	fi
	log "installing $pkgs (apt-get)"
	apt-get update -qq >&2
	# shellcheck disable=SC2086 # one word per package
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
	pkgs=$(missing_packages)
	if [ -n "$pkgs" ]; then
		log "still missing after apt-get install: $pkgs (if set, PROMTOOL, PGBOUNCER_BIN or CHROMIUM_BIN must name the installed binary)"
		exit 1
	fi
fi

LOCAL_AWS_SQS_DIR=${LOCAL_AWS_SQS_DIR:-$HOME/.cache/fleet-ingest/local-aws-sqs}
GOAWS_BIN=${GOAWS_BIN:-$HOME/.cache/fleet-ingest/goaws/goaws}
HELM_BIN=${HELM_BIN:-$HOME/.cache/fleet-ingest/helm/helm}
MINIO_BIN=${MINIO_BIN:-$HOME/.cache/fleet-ingest/minio/minio}
# The MinIO the S3-compatible tests run (internal/testkit/miniotest.Version):
# MinIO publishes no module versions, so a pseudo-version pins its commit.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

# Under sudo with the user's HOME kept (sudo -E), the npm and goaws files go
# to the user's cache: install them as that user, so none becomes root's.
as_user=()
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] &&
	[ "$(stat -c %U "$HOME" 2>/dev/null)" = "$SUDO_USER" ]; then
	as_user=(runuser -m -u "$SUDO_USER" --)
fi

# The SQS tests' server: the npm package local-aws-sqs 2.0.2.
if ! grep -qs '"version": "2.0.2"' "$LOCAL_AWS_SQS_DIR/node_modules/local-aws-sqs/package.json"; then
	log "installing local-aws-sqs 2.0.2 into $LOCAL_AWS_SQS_DIR (npm)"
	${as_user[@]+"${as_user[@]}"} npm install --prefix "$LOCAL_AWS_SQS_DIR" --no-audit --no-fund --loglevel=error local-aws-sqs@2.0.2 >&2
fi
# The SNS tests' server: goaws v0.4.5. Its main package is app/cmd, so go
# install names the binary cmd.
if [ ! -x "$GOAWS_BIN" ]; then
	log "building goaws v0.4.5 into $GOAWS_BIN (go install)"
	${as_user[@]+"${as_user[@]}"} mkdir -p "$(dirname "$GOAWS_BIN")"
	${as_user[@]+"${as_user[@]}"} env GOBIN="$(dirname "$GOAWS_BIN")" "${GO:-go}" install github.com/Admiral-Piett/goaws/app/cmd@v0.4.5 >&2
	${as_user[@]+"${as_user[@]}"} mv "$(dirname "$GOAWS_BIN")/cmd" "$GOAWS_BIN"
fi

# The chart's helm lint: Helm v3.16.4, built from the Go module proxy.
if [ ! -x "$HELM_BIN" ]; then
	log "building helm v3.16.4 into $HELM_BIN (go install; about 6 minutes the first time)"
	${as_user[@]+"${as_user[@]}"} mkdir -p "$(dirname "$HELM_BIN")"
	${as_user[@]+"${as_user[@]}"} env GOBIN="$(dirname "$HELM_BIN")" "${GO:-go}" install helm.sh/helm/v3/cmd/helm@v3.16.4 >&2
fi

# The S3-compatible tests' store: MinIO, built from the Go module proxy.
if [ ! -x "$MINIO_BIN" ]; then
	log "building minio $MINIO_VERSION into $MINIO_BIN (go install; about 10 minutes the first time)"
	${as_user[@]+"${as_user[@]}"} mkdir -p "$(dirname "$MINIO_BIN")"
	${as_user[@]+"${as_user[@]}"} env GOBIN="$(dirname "$MINIO_BIN")" "${GO:-go}" install "github.com/minio/minio@$MINIO_VERSION" >&2
	if [ "$(basename "$MINIO_BIN")" != minio ]; then
		${as_user[@]+"${as_user[@]}"} mv "$(dirname "$MINIO_BIN")/minio" "$MINIO_BIN"
	fi
fi

printf 'export PROMTOOL=%q\n' "$(find_promtool)"
printf 'export PGBOUNCER_BIN=%q\n' "$(find_pgbouncer)"
printf 'export CHROMIUM_BIN=%q\n' "$(find_chromium)"
printf 'export LOCAL_AWS_SQS_DIR=%q\n' "$LOCAL_AWS_SQS_DIR"
printf 'export GOAWS_BIN=%q\n' "$GOAWS_BIN"
printf 'export HELM_BIN=%q\n' "$HELM_BIN"
printf 'export MINIO_BIN=%q\n' "$MINIO_BIN"
