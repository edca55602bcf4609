#!/usr/bin/env bash
# JS SDK compatibility tests: the official npm package stream-chat (pinned in package.json and
# package-lock.json) against the real offshoot binary, with Node's built-in test runner.
#
# Builds nothing: it runs the server binary that is already there (scripts/test builds it
# first). For each backend it starts `offshoot serve` on a free loopback port with a fresh
# database and a fixed key pair, waits for GET /healthz, runs `node --test` on *.test.mjs and
# stops the server (it runs the api and ws roles; tests start a worker process when they need one):
#   1. SQLite, a fresh file in a temporary directory;
#   2. PostgreSQL, a fresh database created with psql and dropped afterwards, when a server is
#      reachable (skipped otherwise, unless OFFSHOOT_REQUIRE_PG=1).
#
# Usage: tests/sdk-js/run.sh [--binary PATH] [--pg-url URL] [--no-pg] [-- node --test args]
# Environment:
#   OFFSHOOT_BIN          the server binary (default target/debug/offshoot)
#   OFFSHOOT_TEST_PG_URL  PostgreSQL server (default postgres://postgres@127.0.0.1:5432/postgres)
#   OFFSHOOT_REQUIRE_PG=1 fail instead of skipping when PostgreSQL is not reachable
# `npm ci` runs here when node_modules is missing or the lock file changed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${OFFSHOOT_BIN:-$ROOT/target/debug/offshoot}
PG_URL=${OFFSHOOT_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_PASS=1
NODE_ARGS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --binary) BIN=$2; shift 2 ;;
        --pg-url) PG_URL=$2; shift 2 ;;
        --no-pg) PG_PASS=0; shift ;;
        --) shift; NODE_ARGS=("$@"); break ;;
        *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done

API_KEY=sdk-js-test-key
API_SECRET=sdk-js-test-secret-$(printf 'x%.0s' {1..32})
READY_TIMEOUT_S=60
STOP_TIMEOUT_S=15
# The server runs without the worker role: a test that needs backfills starts a worker process
# of its own on the same database when it is ready for them (helpers.mjs, startWorker), so a
# client can watch a fork that is certainly still backfilling. Small pages: several per fork.
BACKFILL_PAGE_SIZE=25

die() { printf 'tests/sdk-js: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null 2>&1 || die "node is not installed (Node 20 or newer is needed)"
command -v npm >/dev/null 2>&1 || die "npm is not installed"
[[ -x $BIN ]] || die "$BIN does not exist: run 'cargo build -p offshoot' first"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

# The pinned SDK; reinstall only when the lock file changed.
if ! cmp -s "$HERE/package-lock.json" "$HERE/node_modules/.offshoot-lock"; then
    (cd "$HERE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) \
        || die "could not install the JS SDK from npm (tests/sdk-js/package-lock.json)"
    cp "$HERE/package-lock.json" "$HERE/node_modules/.offshoot-lock"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offshoot-sdk-js.XXXXXX")
SERVER_PID=
PG_DB=
PG_ADMIN_URL=

cleanup() {
    stop_server
    drop_pg_db
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port. Not 3030, and no port whose URL contains ":3030": the JS SDK derives
# wsBaseURL with baseURL.replace(':3030', ':8800'), which would also rewrite e.g. :30301.
free_port() {
    node -e '
        const net = require("node:net");
        const pick = () => { const s = net.createServer(); s.listen(0, "127.0.0.1", () => {
            const p = s.address().port; s.close(() => String(p).startsWith("3030") ? pick() : console.log(p)); }); };
        pick();'
}

healthy() {
    node -e '
        const req = require("node:http").get(process.argv[1], { timeout: 2000 }, (r) => { r.resume(); process.exit(r.statusCode === 200 ? 0 : 1); });
        req.on("error", () => process.exit(1)); req.on("timeout", () => { req.destroy(); process.exit(1); });' "$1/healthz"
}

# Stops the server with SIGTERM (bounded wait, then SIGKILL). Returns non-zero, with the reason
# on stderr, unless the server was still running and then exited with status 0: a server that
# died during the tests, hung on shutdown or exited badly fails the pass.
stop_server() {
    [[ -n $SERVER_PID ]] || return 0
    local pid=$SERVER_PID status=0
    SERVER_PID=
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid" 2>/dev/null || status=$?
        echo "tests/sdk-js: the server had already exited (status $status) before the tests ended" >&2
        return 1
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < STOP_TIMEOUT_S * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "tests/sdk-js: the server did not stop within ${STOP_TIMEOUT_S}s of SIGTERM: killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        return 1
    fi
    wait "$pid" 2>/dev/null || status=$?
    if ((status != 0)); then
        echo "tests/sdk-js: the server exited with status $status after SIGTERM (a graceful shutdown exits 0)" >&2
        return 1
    fi
}

# executed_tests TAP_FILE: the number of top-level tests that ran (not skipped, not todo). Fails,
# naming it, when a test file declared no test (node reports such a file as a test of its own).
executed_tests() {
    local tap=$1 empty
    empty=$(grep -E '^(not )?ok [0-9]+ - .*\.test\.mjs$' "$tap" || true)
    if [[ -n $empty ]]; then
        printf 'tests/sdk-js: a test file ran no test:\n%s\n' "$empty" >&2
        return 1
    fi
    grep -E '^ok [0-9]+ - ' "$tap" | grep -cvE '# (SKIP|TODO)' || true
}

drop_pg_db() {
    [[ -n $PG_DB ]] || return 0
    psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
    PG_DB=
}

# run_pass NAME DATABASE_URL: one server, one `node --test` run. Returns the test status.
run_pass() {
    local backend=$1 database_url=$2
    local port base_url log
    port=$(free_port)
    base_url="http://127.0.0.1:$port"
    log="$WORK/server-$backend.log"
    # Uploads in a directory of the pass's own (on PostgreSQL the default is the working
    # directory); the worker a test starts inherits it with the environment.
    export OFFSHOOT_STORAGE="file://$WORK/files-$backend"
    mkdir -p "$WORK/files-$backend"
    printf '\n--- JS SDK tests (stream-chat %s) on %s: %s serve at %s\n' \
        "$(node -p 'require(process.argv[1]).version' "$HERE/node_modules/stream-chat/package.json")" \
        "$backend" "$(basename "$BIN")" "$base_url"
    (
        cd "$WORK"
        exec env OFFSHOOT_LISTEN="127.0.0.1:$port" DATABASE_URL="$database_url" \
            OFFSHOOT_API_KEY="$API_KEY" OFFSHOOT_API_SECRET="$API_SECRET" OFFSHOOT_ROLES=api,ws \
            OFFSHOOT_RATE_LIMITS='*=1000000,user=1000000' OFFSHOOT_WS_CONNECTIONS_PER_USER=100000 \
            OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE=1000000 \
            RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve
    ) >"$log" 2>&1 &
    SERVER_PID=$!

    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until healthy "$base_url"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID" 2>/dev/null || true
            SERVER_PID=
            printf -- '--- server log (%s) ---\n%s\n' "$backend" "$(tail -c 20000 "$log")" >&2
            die "the server exited before it was ready ($backend)"
        fi
        if ((SECONDS >= deadline)); then
            printf -- '--- server log (%s) ---\n%s\n' "$backend" "$(tail -c 20000 "$log")" >&2
            die "the server was not ready within ${READY_TIMEOUT_S}s ($backend)"
        fi
        sleep 0.1
    done

    # --test-force-exit: after connectUser, stream-chat 9.53.0 leaves a 15 s timer behind (the
    # losing side of the Promise.race in StableWSConnection._waitForHealthy), which would keep
    # each test file's process alive for 15 s after its last test. Every test disconnects its
    # users itself (and one test checks the close handshake), so nothing real is cut short.
    # A second reporter writes TAP to stderr, kept in a file to count the tests that ran: stderr
    # is written synchronously, so the forced exit does not cut it short (a file destination
    # loses its end).
    local status=0 tap="$WORK/tests-$backend.tap" executed
    (
        cd "$HERE"
        exec env OFFSHOOT_SDK_BASE_URL="$base_url" OFFSHOOT_SDK_API_KEY="$API_KEY" OFFSHOOT_SDK_API_SECRET="$API_SECRET" \
            OFFSHOOT_SDK_BACKEND="$backend" OFFSHOOT_SDK_BIN="$BIN" OFFSHOOT_SDK_DATABASE_URL="$database_url" \
            OFFSHOOT_SDK_BACKFILL_PAGE_SIZE=$BACKFILL_PAGE_SIZE OFFSHOOT_SDK_WORKER_LOG="$WORK/worker-$backend.log" \
            node --test --test-force-exit --test-reporter=spec --test-reporter-destination=stdout \
            --test-reporter=tap --test-reporter-destination=stderr --test-timeout=120000 "${NODE_ARGS[@]}" ./*.test.mjs
    ) 2>"$tap" || status=$?
    if ((status != 0)); then
        printf -- '\n--- node --test, TAP (%s, last 20 kB) ---\n%s\n' "$backend" "$(tail -c 20000 "$tap")" >&2
    elif ! executed=$(executed_tests "$tap"); then
        status=1
    elif ((executed == 0)); then
        echo "tests/sdk-js: node --test ran no test on $backend (all skipped, filtered out or none found)" >&2
        status=1
    else
        printf 'tests/sdk-js: %s tests ran on %s\n' "$executed" "$backend"
    fi

    stop_server || status=1
    if ((status != 0)); then
        printf -- '\n--- server log (%s, last 20 kB) ---\n%s\n' "$backend" "$(tail -c 20000 "$log")" >&2
        if [[ -f $WORK/worker-$backend.log ]]; then
            printf -- '\n--- worker log (%s, last 20 kB) ---\n%s\n' "$backend" "$(tail -c 20000 "$WORK/worker-$backend.log")" >&2
        fi
    fi
    return "$status"
}

# Host and port of a postgres:// URL.
pg_host_port() {
    local rest=${1#*://}
    rest=${rest#*@}
    rest=${rest%%/*}
    rest=${rest%%\?*}
    local host=${rest%%:*} port=5432
    [[ $rest == *:* ]] && port=${rest##*:}
    printf '%s %s\n' "${host:-127.0.0.1}" "$port"
}

pg_reachable() {
    command -v psql >/dev/null 2>&1 || return 1
    local host port
    read -r host port < <(pg_host_port "$PG_URL")
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -h "$host" -p "$port" -t 5 || return 1
    fi
    psql "$PG_URL" -tAc 'SELECT 1' >/dev/null 2>&1
}

FAILED=()
run_pass sqlite "sqlite://$WORK/offshoot-sdk-js.db?mode=rwc" || FAILED+=(sqlite)

if ((PG_PASS)); then
    read -r PG_HOST PG_PORT < <(pg_host_port "$PG_URL")
    if pg_reachable; then
        PG_DB="offshoot_sdk_js_$$_$RANDOM"
        # The same server, the maintenance database for CREATE/DROP, the fresh one for the test.
        base=${PG_URL%%\?*}
        query=
        [[ $PG_URL == *\?* ]] && query="?${PG_URL#*\?}"
        server_part=${base%/*}
        [[ $base == *://*/* ]] || server_part=$base
        PG_ADMIN_URL="$server_part/postgres$query"
        psql -v ON_ERROR_STOP=1 -q "$PG_ADMIN_URL" -c "CREATE DATABASE $PG_DB" \
            || die "could not create the PostgreSQL database $PG_DB"
        run_pass postgres "$server_part/$PG_DB$query" || FAILED+=(postgres)
        drop_pg_db
    elif [[ ${OFFSHOOT_REQUIRE_PG:-0} == 1 ]]; then
        die "PostgreSQL not reachable at $PG_HOST:$PG_PORT and OFFSHOOT_REQUIRE_PG=1"
    else
        printf '\nPostgreSQL not reachable at %s:%s: the JS SDK PostgreSQL pass was SKIPPED\n' "$PG_HOST" "$PG_PORT"
    fi
fi

if ((${#FAILED[@]})); then
    die "JS SDK tests failed on: ${FAILED[*]}"
fi
printf '\nJS SDK tests passed\n'
