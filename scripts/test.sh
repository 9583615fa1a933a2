#!/usr/bin/env bash
# The test run behind `make test` (and so CI's .ci/run): system packages the tests need when
# they are missing and we may install them (root with apt-get: PostgreSQL for the PostgreSQL
# variants, Chromium for the dashboard test, bubblewrap for the sandbox's second layer), a throw-away PostgreSQL on loopback, then ruff
# and pytest. Without root the PostgreSQL/browser tests skip with their reason.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "test: installing ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "test: missing ${need[*]} and cannot apt-get; those tests will skip" >&2
    fi
fi

if [ -z "${FRENZY_TEST_POSTGRES_URL:-}" ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    FRENZY_TEST_POSTGRES_URL="$(scripts/start_postgres.sh)"
    export FRENZY_TEST_POSTGRES_URL
    echo "test: PostgreSQL at $FRENZY_TEST_POSTGRES_URL" >&2
fi

"$BIN/ruff" check .
"$BIN/python" -m pytest "$@"
