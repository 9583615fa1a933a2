#!/usr/bin/env bash
# Start a throw-away PostgreSQL for the test suite on 127.0.0.1:55432 and print its URL.
# Idempotent: installs the distribution's postgresql package only if missing, initialises
# the data directory once, and does not restart a running server. fsync is off: this is a
# throw-away server for tests and benchmarks, not a durable one (docs/api_load.md).
# Usage: scripts/start_postgres.sh [DATA_DIR]   (default: /tmp/frenzy-pg)
#   export FRENZY_TEST_POSTGRES_URL=$(scripts/start_postgres.sh)
# Stop:  runuser -u postgres -- "$(pg_config --bindir)/pg_ctl" -D DATA_DIR stop
set -euo pipefail

DATA_DIR="${1:-${FRENZY_PG_DIR:-/tmp/frenzy-pg}}"
PORT="${FRENZY_PG_PORT:-55432}"
DB_USER=app
DB_NAME=frenzy_test

log() { echo "start_postgres: $*" >&2; }

find_bindir() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && { echo "$d"; return 0; }
    done
    return 1
}

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
    log "installing postgresql (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BINDIR="$(find_bindir)"
fi

# PostgreSQL refuses to run as root: run the server as the postgres user.
as_pg() {
    if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "$(id -u)" = "0" ]; then
    mkdir -p "$DATA_DIR"
    chown postgres:postgres "$DATA_DIR"
    chmod 700 "$DATA_DIR"
fi

if [ ! -f "$DATA_DIR/PG_VERSION" ]; then
    log "initdb in $DATA_DIR"
    as_pg "$BINDIR/initdb" -D "$DATA_DIR" -U "$DB_USER" --auth=trust >/dev/null
fi

if ! as_pg "$BINDIR/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1; then
    log "starting on 127.0.0.1:$PORT"
    as_pg "$BINDIR/pg_ctl" -D "$DATA_DIR" -w -l "$DATA_DIR/server.log" start \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA_DIR -c fsync=off" >/dev/null
fi

# Settings a production server would use too (reloadable, so applied to a running server):
# TOAST values (a job's ranked-plans document is ~11 KB) compressed with lz4 instead of
# pglz: ~3x less server CPU per submission (docs/api_load.md), slightly larger on disk.
"$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres -qtA \
    -c "ALTER SYSTEM SET default_toast_compression = 'lz4'" \
    -c "SELECT pg_reload_conf()" >/dev/null

if ! "$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" | grep -q 1; then
    "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" "$DB_NAME"
fi

echo "postgresql+psycopg://$DB_USER@127.0.0.1:$PORT/$DB_NAME"
