#!/usr/bin/env bash
# make demo: run the whole system end to end on a local PostgreSQL.
#
# Uses DATABASE_URL's server (default postgres://postgres@127.0.0.1:5432/postgres)
# and creates a database of its own there, with a unique name
# (fleet_demo_<time>_<pid>); it drops that database, and only that one, when it
# ends (KEEP_DEMO_DB=1 keeps it for a look). If no server answers and initdb and
# pg_ctl are installed, starts a throwaway cluster under .dev/pg on port 55432.
# Then: migrate, generate a sample Fleet folder under .dev/sample (file://),
# start a worker, enqueue the folder, wait until the batch Succeeded, and print
# the batch, some of its records and its publication. Needs psql; curl is
# optional (it shows a few of the worker's metrics when present).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p .dev

base_url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if ! psql "$base_url" -XAtqc 'select 1' >/dev/null 2>&1; then
	initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n1 || true)
	initdb=${initdb:-$(command -v initdb || true)}
	if [ -z "$initdb" ]; then
		echo "No PostgreSQL answers at $base_url and initdb is not installed." >&2
		echo "Start PostgreSQL or set DATABASE_URL, then run make demo again." >&2
		exit 1
	fi
	pgbin=$(dirname "$initdb")
	say "No PostgreSQL at $base_url: starting a throwaway cluster in .dev/pg on port 55432"
	as_pg=()
	if [ "$(id -u)" = 0 ]; then
		as_pg=(runuser -u postgres --) # initdb refuses to run as root
		chown postgres .dev
	fi
	if [ ! -f .dev/pg/PG_VERSION ]; then
		"${as_pg[@]}" "$pgbin/initdb" -D "$root/.dev/pg" -U postgres -A trust >/dev/null
	fi
	"${as_pg[@]}" "$pgbin/pg_ctl" -D "$root/.dev/pg" -o "-p 55432 -k /tmp -c listen_addresses=127.0.0.1" -l "$root/.dev/pg.log" -w start >/dev/null || true
	base_url="postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable"
fi

demo_db="fleet_demo_$(date +%s)_$$"
# The same server and options, the demo's database: replace the URL's path,
# or add one when it has none.
demo_url=$(printf '%s' "$base_url" | sed -E "s#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\\1/$demo_db#")
say "Fresh demo database: $demo_db (dropped at the end; KEEP_DEMO_DB=1 keeps it)"
psql "$base_url" -XAtqc "CREATE DATABASE $demo_db"
cleanup_db() {
	if [ "${KEEP_DEMO_DB:-}" = 1 ]; then
		echo "Kept demo database $demo_db"
		return
	fi
	# Only the database this run created.
	psql "$base_url" -XAtqc "DROP DATABASE IF EXISTS $demo_db WITH (FORCE)" >/dev/null || true
}
trap cleanup_db EXIT
# The demo works only in the database it made: refuse a DATABASE_URL this
# script cannot point at it (a key=value DSN).
if [ "$(psql "$demo_url" -XAtqc 'SELECT current_database()' 2>/dev/null)" != "$demo_db" ]; then
	echo "make demo: cannot point DATABASE_URL ($(printf '%s' "$base_url" | sed -E 's#//([^:@/]*):[^@/]*@#//\1:***@#; s#(password=)[^ ]*#\1***#')) at its own database $demo_db;" >&2
	echo "give it as postgres://user@host:port/dbname?… (the database name is replaced)" >&2
	exit 2
fi
export DATABASE_URL=$demo_url

say "Building bin/worker and bin/enqueue"
go build -o bin/ ./cmd/worker ./cmd/enqueue

say "worker migrate"
bin/worker migrate --log-level warn

say "Generating a sample Fleet folder"
folder="$root/.dev/sample/fleet/tenant-demo/2026-11-30/upload-1"
rm -rf "$root/.dev/sample" && mkdir -p "$folder/telemetry"
{
	echo "vehicle_id,recorded_at,latitude,longitude,speed_kmh"
	for i in $(seq 1 500); do
		printf 'VH-%03d,2026-11-30T08:%02d:%02dZ,52.%04d,13.%04d,%d\n' $((i % 20)) $((i / 60 % 60)) $((i % 60)) $((i * 7 % 10000)) $((i * 13 % 10000)) $((i % 120))
	done
} >"$folder/trips.csv"
for i in $(seq 1 20); do
	printf '{"vehicle_id":"VH-%03d","event":"ignition_on","odometer_km":%d}\n' "$i" $((10000 + i * 37))
done >"$folder/telemetry/events.ndjson"
echo '{"files":["trips.csv","telemetry/events.ndjson"]}' >"$folder/manifest.json"
touch "$folder/_SUCCESS"
find "$folder" -type f | sed "s#$root/##" | sort

say "Starting a worker"
bin/worker --metrics-addr 127.0.0.1:0 --log-format text --name demo-worker --dev-allow-local-folders >.dev/worker.log 2>&1 &
worker_pid=$!
trap 'kill -TERM $worker_pid 2>/dev/null || true; wait $worker_pid 2>/dev/null || true; cleanup_db' EXIT
addr=""
for _ in $(seq 1 100); do
	addr=$(sed -nE 's/.*msg="metrics listener started".*addr=([^ ]+).*/\1/p' .dev/worker.log | head -n1)
	[ -n "$addr" ] && grep -q 'msg="worker started"' .dev/worker.log && break
	sleep 0.1
done
[ -n "$addr" ] || { cat .dev/worker.log; echo "worker did not start" >&2; exit 1; }
echo "worker ready; metrics at http://$addr/metrics"

say "enqueue import"
out=$(bin/enqueue import --tenant-id tenant-demo --tenant-database fleet_tenant_demo --company-id company-42 --folder "file://$folder" --log-level warn)
echo "$out"
batch_id=$(printf '%s' "$out" | sed -nE 's/.*"batch_id":([0-9]+).*/\1/p')

say "Waiting for batch $batch_id"
for _ in $(seq 1 120); do
	status=$(bin/enqueue status --batch-id "$batch_id" --json --log-level warn | sed -nE 's/.*"status":"([A-Za-z]+)".*/\1/p')
	[ "$status" = Succeeded ] || [ "$status" = Failed ] && break
	sleep 0.5
done
bin/enqueue status --batch-id "$batch_id" --log-level warn
[ "$status" = Succeeded ] || { echo "batch ended $status" >&2; cat .dev/worker.log; exit 1; }

say "Records in the warehouse slice (curated.fleet_records)"
psql "$DATABASE_URL" -Xq -c "SELECT count(*) AS records, count(DISTINCT object_key) AS objects, min(batch_id) AS batch_id FROM curated.fleet_records" \
	-c "SELECT regexp_replace(object_key, '^.*/upload-1/', '') AS object, line_number AS line, record FROM curated.fleet_records ORDER BY object_key, line_number LIMIT 5"

say "enqueue status --objects: the load ledger, the objects the slice came from (curated.fleet_load_objects)"
bin/enqueue status --batch-id "$batch_id" --objects --log-level warn

say "Slice stamp and publication (curated.fleet_slices, curated.fleet_publications)"
psql "$DATABASE_URL" -Xq -c "SELECT batch_id, record_count, committed_at, published_at FROM curated.fleet_slices" \
	-c "SELECT id, tenant_id, batch_id, record_count, published_at FROM curated.fleet_publications"

if command -v curl >/dev/null 2>&1; then
	say "A few of the worker's metrics"
	curl -sf "http://$addr/metrics" | grep -E '^ingest_(deliveries_total\{outcome="worked"\}|lease_acquisitions_total\{outcome="acquired"\}|lease_renewals_total|records_loaded_total|build_info)' || true
fi

say "Stopping the worker (SIGTERM)"
kill -TERM $worker_pid
wait $worker_pid && echo "worker exited cleanly"
trap cleanup_db EXIT
echo
echo "Done. Worker log: .dev/worker.log. Demo database: $(printf '%s' "$DATABASE_URL" | sed -E 's#//([^:@]*):[^@]*@#//\1:xxxxx@#') (dropped now unless KEEP_DEMO_DB=1)"
