#!/usr/bin/env python3
"""Fuzzes the live server with schemathesis, driven by its own /openapi.json.

For each backend (SQLite always; PostgreSQL when --pg-url is given) this starts
`offshoot serve` on a free loopback port with a fresh database and a fixed key pair, waits for
/healthz, and runs `st run` against every operation of the document with a valid server-side
token and a bounded number of examples per operation. What must hold: no 5xx, every response
conforms to its documented schema and status codes (every error is Stream's envelope), and
every answer has the documented content type. Then `long_values.py` puts a long value into each
field that reaches an indexed column and requires a 4xx envelope. Used by scripts/test; by hand:

    .venv-fuzz/bin/python tests/fuzz/run.py --binary target/debug/offshoot [--pg-url postgres://...] [--max-examples N]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_values  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
API_KEY = "fuzz-test-key"
API_SECRET = "fuzz-test-secret-" + "y" * 32
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def server_token(secret: str) -> str:
    """An HS256 JWT without user_id: a server-side caller."""

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"server": True}).encode())
    sig = b64(hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base_url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server was not ready within {READY_TIMEOUT_S:.0f}s\n{log_path.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def postgres_database(server_url: str):
    name = f"offshoot_fuzz_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    parts = urllib.parse.urlsplit(server_url)
    admin_url = urllib.parse.urlunsplit(parts._replace(path="/postgres"))
    subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-q", admin_url, "-c", f"CREATE DATABASE {name}"], check=True)
    try:
        yield urllib.parse.urlunsplit(parts._replace(path="/" + name))
    finally:
        subprocess.run(
            ["psql", "-q", admin_url, "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path, max_examples: int, seed: int) -> int:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = workdir / f"server-{backend}.log"
    env = dict(os.environ)
    env.update(
        OFFSHOOT_LISTEN=f"127.0.0.1:{port}",
        DATABASE_URL=database_url,
        OFFSHOOT_API_KEY=API_KEY,
        OFFSHOOT_API_SECRET=API_SECRET,
        OFFSHOOT_ROLES="api,ws,worker",
        RUST_LOG=os.environ.get("RUST_LOG", "warn"),
        # Far above what the suite sends, so the limiting layer runs without refusing; the
        # rate-limit tests start servers of their own with low limits.
        OFFSHOOT_RATE_LIMITS="*=1000000,user=1000000",
        OFFSHOOT_WS_CONNECTIONS_PER_USER="100000",
        OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE="1000000",
    )
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    print(f"\n--- schemathesis on {backend}: {binary.name} serve at {base_url}", flush=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        wait_ready(base_url, proc, log_path)
        st_env = dict(os.environ, OFFSHOOT_FUZZ_API_KEY=API_KEY, OFFSHOOT_FUZZ_TOKEN=server_token(API_SECRET))
        cmd = [
            st,
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{base_url}/openapi.json",
            "--url",
            base_url,
            "--checks",
            CHECKS,
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            str(max_examples),
            "--seed",
            str(seed),
            # One worker: hypothesis' lambda-description cache is not thread-safe (schemathesis
            # 4.32 with 2 workers ended one operation's coverage phase with a runtime error).
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--suppress-health-check",
            "all",
            "--exclude-path",
            "/metrics",
        ]
        code = subprocess.run(cmd, env=st_env, cwd=workdir).returncode
        failures = long_values.run(base_url, API_KEY, server_token(API_SECRET))
        for f in failures:
            print(f"long value on {backend}: {f}", file=sys.stderr)
        print(f"--- long values on {backend}: {len(failures)} of {len(long_values.probes())} probes failed", flush=True)
        code = code or (1 if failures else 0)
    finally:
        stop(proc)
    print(f"--- schemathesis on {backend}: exit {code} in {time.monotonic() - started:.0f}s", flush=True)
    if code != 0 or proc.returncode not in (0, -signal.SIGTERM):
        print(f"\n--- server log ({backend}, exit {proc.returncode}) ---\n{log_path.read_text()[-20000:]}", file=sys.stderr)
        code = code or 1
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    ap.add_argument("--max-examples", type=int, default=int(os.environ.get("OFFSHOOT_FUZZ_MAX_EXAMPLES", "5")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("OFFSHOOT_FUZZ_SEED", "9")))
    args = ap.parse_args()
    args.binary = args.binary.resolve()
    if not args.binary.exists():
        print(f"{args.binary} does not exist: run `cargo build -p offshoot` first", file=sys.stderr)
        return 1
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="offshoot-fuzz-") as tmp:
        workdir = Path(tmp)
        if run_pass("sqlite", args.binary, f"sqlite://{workdir}/fuzz.db?mode=rwc", workdir, args.max_examples, args.seed):
            failed.append("sqlite")
        if args.pg_url:
            with postgres_database(args.pg_url) as url:
                if run_pass("postgres", args.binary, url, workdir, args.max_examples, args.seed):
                    failed.append("postgres")
    if failed:
        print(f"\nschemathesis FAILED on: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nschemathesis passed on: " + ("sqlite, postgres" if args.pg_url else "sqlite (no PostgreSQL given)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
