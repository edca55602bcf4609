"""The real server binary for the Python test runners (tests/sdk, tests/fuzz, tests/console,
tests/uikit): one `offshoot serve` per backend on a free loopback port, with a fresh database
(a SQLite file, or a PostgreSQL database created for the pass and dropped afterwards), its
uploads in a temporary directory, and a shutdown that must be clean.

    with Server(binary, backend, database_url, workdir, api_key, api_secret, env={...}) as srv:
        ...  # srv.base_url
    if srv.unclean: ...  # the server died early, hung on SIGTERM or exited non-zero

Standard library only (but `ServerApi`, which needs PyJWT): every runner's virtualenv can import it (each runner puts tests/ on
sys.path).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# Far above what the suites send, so the limiting layer runs without refusing; the rate-limit
# tests start servers of their own with low limits.
NO_LIMITS = {
    "OFFSHOOT_RATE_LIMITS": "*=1000000,user=1000000",
    "OFFSHOOT_WS_CONNECTIONS_PER_USER": "100000",
    "OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE": "1000000",
}


def free_port() -> int:
    """A free loopback port. The server binds it itself; another process could take it in
    between, which on a test machine is unlikely enough, and the readiness check would then
    fail loudly. Never one whose URL contains ":3030": the JS SDK derives its WebSocket URL with
    baseURL.replace(':3030', ':8800'), which would also rewrite e.g. :30301."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not str(port).startswith("3030"):
            return port


def wait_ready(base_url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until GET /healthz answers 200 (bounded); raises with the server's log otherwise."""
    deadline = time.monotonic() + timeout_s
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
    raise RuntimeError(f"the server was not ready within {timeout_s:.0f}s\n{log_path.read_text()}")


def stop(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> str | None:
    """SIGTERM, then a bounded wait. Returns why the shutdown was not clean (the server had
    already died, did not stop in time, or exited with a non-zero status), or None."""
    if proc.poll() is not None:
        return f"the server had already exited (status {proc.returncode}) before the tests ended"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return f"the server did not stop within {timeout_s:.0f}s of SIGTERM and was killed"
    if proc.returncode != 0:
        return f"the server exited with status {proc.returncode} after SIGTERM (a graceful shutdown exits 0)"
    return None


@contextmanager
def postgres_database(server_url: str, prefix: str) -> Iterator[str]:
    """A fresh database on the server of `server_url`, dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
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


class Server:
    """`offshoot serve` for one pass, as a context manager.

    The environment: the listen address, `DATABASE_URL`, the key pair, the api, ws and worker
    roles, `RUST_LOG` (warn unless set), `OFFSHOOT_STORAGE` (a directory of the pass's own under
    `workdir`: a server on PostgreSQL would otherwise store uploads in its working directory),
    then `env` on top. The server runs in `workdir`, its output in `workdir/server-BACKEND.log`.
    On leaving, it is stopped and `unclean` says why the shutdown was not clean (or is None).
    """

    def __init__(
        self,
        binary: Path,
        backend: str,
        database_url: str,
        workdir: Path,
        api_key: str,
        api_secret: str,
        env: dict[str, str] | None = None,
    ):
        self.binary = binary
        self.backend = backend
        self.database_url = database_url
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{backend}.log"
        self.storage_dir = workdir / f"files-{backend}"
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self.storage = f"file://{self.storage_dir}"
        self.env = dict(os.environ)
        self.env.update(
            OFFSHOOT_LISTEN=f"127.0.0.1:{self.port}",
            DATABASE_URL=database_url,
            OFFSHOOT_API_KEY=api_key,
            OFFSHOOT_API_SECRET=api_secret,
            OFFSHOOT_ROLES="api,ws,worker",
            OFFSHOOT_STORAGE=self.storage,
            RUST_LOG=os.environ.get("RUST_LOG", "warn"),
        )
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.unclean: str | None = None

    def __enter__(self) -> Server:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve"], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        try:
            wait_ready(self.base_url, self.proc, self.log_path)
        except BaseException:
            self.unclean = stop(self.proc)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.unclean = stop(self.proc)
        elif self.proc is not None and self.unclean is None:
            self.unclean = f"the server had already exited (status {self.proc.returncode}) before the tests ended"

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def log_tail(self, chars: int = 20000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def print_log(self) -> None:
        print(f"\n--- server log ({self.backend}, exit {self.returncode}) ---\n{self.log_tail()}", file=sys.stderr)

    def verdict(self, ok: bool) -> bool:
        """The pass's result after the server stopped: `ok`, unless the shutdown was unclean;
        on failure the server's log is printed."""
        if self.unclean:
            print(f"{self.unclean} ({self.backend})", file=sys.stderr)
            ok = False
        if not ok:
            self.print_log()
        return ok


class ServerApi:
    """Server-side calls the plain-HTTP way (README, "Pointing the official SDKs at Offshoot"),
    for runners that seed data: `call` answers the JSON body and raises `failure` on an
    unexpected status. Needs PyJWT in the runner's virtualenv (imported here only)."""

    failure: type[Exception] = AssertionError

    def __init__(self, base: str, api_key: str, api_secret: str):
        import jwt  # noqa: PLC0415 (the SDK and fuzz runners import this module without PyJWT)

        self.base = base
        self.api_key = api_key
        self.token = jwt.encode({"server": True}, api_secret, algorithm="HS256")

    def call(self, method: str, path: str, body=None, expect: int | None = 200):
        sep = "&" if "?" in path else "?"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base}{path}{sep}api_key={self.api_key}", data=data, method=method)
        req.add_header("Authorization", self.token)
        req.add_header("stream-auth-type", "jwt")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        out = json.loads(text) if text else {}
        if expect is not None and status != expect:
            raise self.failure(f"{method} {path}: {status} {out}")
        return out

    def channel(self, cid: str, name: str, members: list[str]):
        kind, cid_id = cid.split(":", 1)
        body = {"data": {"name": name, "created_by_id": members[0], "members": members}, "state": True}
        return self.call("POST", f"/channels/{kind}/{cid_id}/query", body)


def each_backend(name: str, prefix: str, pg_url: str | None, run_pass: Callable[[str, str, Path], bool]) -> int:
    """Runs `run_pass(backend, database_url, workdir)` on SQLite (a fresh file) and, when
    `pg_url` is given, on PostgreSQL (a fresh database there, dropped afterwards), in one
    temporary working directory. Prints the outcome; returns the process's exit status."""
    failed: list[str] = []

    def one(backend: str, url: str, workdir: Path) -> None:
        try:
            ok = run_pass(backend, url, workdir)
        except Exception:  # noqa: BLE001 (a pass that cannot even start fails, the next still runs)
            traceback.print_exc()
            ok = False
        if not ok:
            failed.append(backend)

    with tempfile.TemporaryDirectory(prefix=f"{prefix.replace('_', '-')}-") as tmp:
        workdir = Path(tmp)
        one("sqlite", f"sqlite://{workdir}/{prefix}.db?mode=rwc", workdir)
        if pg_url:
            with postgres_database(pg_url, prefix) as url:
                one("postgres", url, workdir)
    if failed:
        print(f"\n{name} FAILED on: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\n{name} passed on: " + ("sqlite, postgres" if pg_url else "sqlite (no PostgreSQL given)"))
    return 0


def binary_or_exit(binary: Path) -> Path:
    """The server binary, resolved; exits the runner when it was not built."""
    binary = binary.resolve()
    if not binary.exists():
        print(f"{binary} does not exist: run `cargo build -p offshoot` first", file=sys.stderr)
        sys.exit(1)
    return binary
