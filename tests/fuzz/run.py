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
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import long_values  # noqa: E402
from offshoot_harness import NO_LIMITS, Server, binary_or_exit, each_backend  # noqa: E402

API_KEY = "fuzz-test-key"
API_SECRET = "fuzz-test-secret-" + "y" * 32
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def server_token(secret: str) -> str:
    """An HS256 JWT without user_id: a server-side caller."""

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"server": True}).encode())
    sig = b64(hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path, max_examples: int, seed: int) -> bool:
    server = Server(binary, backend, database_url, workdir, API_KEY, API_SECRET, env=NO_LIMITS)
    base_url = server.base_url
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    print(f"\n--- schemathesis on {backend}: {binary.name} serve at {base_url}", flush=True)
    started = time.monotonic()
    code = 1
    with server:
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
    print(f"--- schemathesis on {backend}: exit {code} in {time.monotonic() - started:.0f}s", flush=True)
    return server.verdict(code == 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    ap.add_argument("--max-examples", type=int, default=int(os.environ.get("OFFSHOOT_FUZZ_MAX_EXAMPLES", "5")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("OFFSHOOT_FUZZ_SEED", "9")))
    args = ap.parse_args()
    binary = binary_or_exit(args.binary)
    return each_backend(
        "schemathesis",
        "offshoot_fuzz",
        args.pg_url,
        lambda backend, url, workdir: run_pass(backend, binary, url, workdir, args.max_examples, args.seed),
    )


if __name__ == "__main__":
    sys.exit(main())
