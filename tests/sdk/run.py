#!/usr/bin/env python3
"""Runs the SDK compatibility tests against the real server binary.

For each backend (SQLite always; PostgreSQL when --pg-url is given) this starts
`offshoot serve` (tests/offshoot_harness.py) on a free loopback port with a fresh database, a
fixed key pair and its uploads in a temporary directory, waits for /healthz, runs pytest on
tests/sdk, and stops the server. Exits non-zero if any pass fails or any server's shutdown is
not clean. Used by scripts/test; runnable by hand:

    .venv/bin/python tests/sdk/run.py --binary target/debug/offshoot [--pg-url postgres://...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from offshoot_harness import NO_LIMITS, Server, binary_or_exit, each_backend  # noqa: E402

API_KEY = "sdk-test-key"
API_SECRET = "sdk-test-secret-" + "x" * 32


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path, pytest_args: list[str]) -> bool:
    server = Server(binary, backend, database_url, workdir, API_KEY, API_SECRET, env=NO_LIMITS)
    print(f"\n--- SDK tests on {backend}: {binary.name} serve at {server.base_url}", flush=True)
    code = 1
    with server:
        test_env = dict(os.environ)
        test_env.update(
            OFFSHOOT_SDK_BASE_URL=server.base_url,
            OFFSHOOT_SDK_API_KEY=API_KEY,
            OFFSHOOT_SDK_API_SECRET=API_SECRET,
            OFFSHOOT_SDK_BACKEND=backend,
            # For tests that start a server of their own (the rate-limit tests): the same
            # database and the same storage.
            OFFSHOOT_SDK_BIN=str(binary),
            OFFSHOOT_SDK_DATABASE_URL=database_url,
            OFFSHOOT_STORAGE=server.storage,
        )
        code = subprocess.run(
            [sys.executable, "-m", "pytest", str(HERE), "-q", "-p", "no:cacheprovider", *pytest_args],
            env=test_env,
            cwd=ROOT,
        ).returncode
        if code == 5:
            print(f"pytest collected no SDK tests on {backend}", file=sys.stderr)
            code = 1
    return server.verdict(code == 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = ap.parse_args()
    binary = binary_or_exit(args.binary)
    return each_backend(
        "SDK compatibility tests",
        "offshoot_sdk",
        args.pg_url,
        lambda backend, url, workdir: run_pass(backend, binary, url, workdir, args.pytest_args),
    )


if __name__ == "__main__":
    sys.exit(main())
