#!/usr/bin/env python3
"""Runs the SDK compatibility tests against the real server binary.

For each backend (SQLite always; PostgreSQL when --pg-url is given) this starts
`offshoot serve` on a free loopback port with a fresh database and a fixed key pair, waits
for /healthz, runs pytest on tests/sdk, and stops the server. Exits non-zero if any pass
fails. Used by scripts/test; runnable by hand:

    .venv/bin/python tests/sdk/run.py --binary target/debug/offshoot [--pg-url postgres://...]
"""

from __future__ import annotations

import argparse
import os
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
API_KEY = "sdk-test-key"
API_SECRET = "sdk-test-secret-" + "x" * 32
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    # The server binds the port itself; another process could take it in between, which on a
    # test machine is unlikely enough, and the readiness check would then fail loudly.
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


def stop(proc: subprocess.Popen) -> str | None:
    """SIGTERM, then a bounded wait. Returns why the shutdown was not clean (the server had
    already died, did not stop in time, or exited with a non-zero status), or None."""
    if proc.poll() is not None:
        return f"the server had already exited (status {proc.returncode}) before the tests ended"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return f"the server did not stop within {STOP_TIMEOUT_S:.0f}s of SIGTERM and was killed"
    if proc.returncode != 0:
        return f"the server exited with status {proc.returncode} after SIGTERM (a graceful shutdown exits 0)"
    return None


@contextmanager
def postgres_database(server_url: str):
    """A fresh database on the server of `server_url`, dropped afterwards."""
    name = f"offshoot_sdk_{os.getpid()}_{uuid.uuid4().hex[:8]}"
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


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path, pytest_args: list[str]) -> int:
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
    print(f"\n--- SDK tests on {backend}: {binary.name} serve at {base_url}", flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    code = 1
    try:
        wait_ready(base_url, proc, log_path)
        test_env = dict(os.environ)
        test_env.update(
            OFFSHOOT_SDK_BASE_URL=base_url,
            OFFSHOOT_SDK_API_KEY=API_KEY,
            OFFSHOOT_SDK_API_SECRET=API_SECRET,
            OFFSHOOT_SDK_BACKEND=backend,
            # For tests that start a server of their own (the rate-limit tests).
            OFFSHOOT_SDK_BIN=str(binary),
            OFFSHOOT_SDK_DATABASE_URL=database_url,
        )
        code = subprocess.run(
            [sys.executable, "-m", "pytest", str(HERE), "-q", "-p", "no:cacheprovider", *pytest_args],
            env=test_env,
            cwd=ROOT,
        ).returncode
        if code == 5:
            print(f"pytest collected no SDK tests on {backend}", file=sys.stderr)
            code = 1
    finally:
        unclean = stop(proc)
    if unclean:
        print(f"{unclean} ({backend})", file=sys.stderr)
        code = code or 1
    if code != 0:
        print(f"\n--- server log ({backend}, exit {proc.returncode}) ---\n{log_path.read_text()[-20000:]}", file=sys.stderr)
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = ap.parse_args()
    args.binary = args.binary.resolve()
    if not args.binary.exists():
        print(f"{args.binary} does not exist: run `cargo build -p offshoot` first", file=sys.stderr)
        return 1

    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="offshoot-sdk-") as tmp:
        workdir = Path(tmp)
        if run_pass("sqlite", args.binary, f"sqlite://{workdir}/sdk.db?mode=rwc", workdir, args.pytest_args):
            failed.append("sqlite")
        if args.pg_url:
            with postgres_database(args.pg_url) as url:
                if run_pass("postgres", args.binary, url, workdir, args.pytest_args):
                    failed.append("postgres")
    if failed:
        print(f"\nSDK compatibility tests FAILED on: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nSDK compatibility tests passed on: " + ("sqlite, postgres" if args.pg_url else "sqlite (no PostgreSQL given)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
