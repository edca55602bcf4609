"""Rate limits as getstream meets them (README, "Rate limits"): a server of this test's own
with low limits (the suite's server has limits far above what the suite sends). A user over
its per-user limit gets getstream's StreamRateLimitException (429, code 9) with Retry-After
and the rate-limit headers parsed; get_rate_limits reads the server-side budget."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from getstream import Stream
from getstream.exceptions import StreamRateLimitException
from getstream.models import ChannelInput, ChannelMemberRequest, MessageRequest, UserRequest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def limited(server):
    """`offshoot serve` (api) with low limits; on SQLite a database file of its own."""
    binary = os.environ.get("OFFSHOOT_SDK_BIN")
    database_url = os.environ.get("OFFSHOOT_SDK_DATABASE_URL")
    if not binary or not database_url:
        pytest.fail("OFFSHOOT_SDK_BIN / OFFSHOOT_SDK_DATABASE_URL are not set: run through tests/sdk/run.py")
    own_file = None
    own_database = None
    if database_url.startswith("sqlite"):
        own_file = f"{tempfile.gettempdir()}/offshoot-sdk-rl-{uuid.uuid4().hex}.db"
        database_url = f"sqlite://{own_file}?mode=rwc"
    else:
        # A database of its own: the app's limits are counted in the database for every process
        # that shares it (README, "Rate limits"), so on the suite's database the suite server's
        # own sends would spend this server's budget.
        own_database = f"offshoot_sdk_rl_{uuid.uuid4().hex}"
        parts = urlsplit(database_url)
        admin_url = urlunsplit(parts._replace(path="/postgres"))
        subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-q", admin_url, "-c", f"CREATE DATABASE {own_database}"], check=True)
        database_url = urlunsplit(parts._replace(path=f"/{own_database}"))
    port = _free_port()
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        OFFSHOOT_LISTEN=f"127.0.0.1:{port}",
        OFFSHOOT_API_KEY=server["api_key"],
        OFFSHOOT_API_SECRET=server["api_secret"],
        OFFSHOOT_ROLES="api",
        OFFSHOOT_RATE_LIMITS="server_side=on,*=100000,SendMessage=10,user=3",
        RUST_LOG="warn",
    )
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"the limited server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the limited server was not healthy within 60 s"
            time.sleep(0.1)
        yield {**server, "base_url": base_url}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for suffix in ("", "-wal", "-shm") if own_file else ():
            if os.path.exists(own_file + suffix):
                os.remove(own_file + suffix)
        if own_database:
            subprocess.run(["psql", "-q", admin_url, "-c", f"DROP DATABASE IF EXISTS {own_database} WITH (FORCE)"], check=False)


def test_a_user_over_its_limit_gets_the_rate_limit_exception_with_its_headers(limited, uid):
    client = Stream(api_key=limited["api_key"], api_secret=limited["api_secret"], base_url=limited["base_url"])
    alice = uid("alice")
    client.upsert_users(UserRequest(id=alice))
    channel_id = uid("rl")
    ch = client.chat.channel("messaging", channel_id)
    ch.get_or_create(data=ChannelInput(created_by_id=alice, members=[ChannelMemberRequest(user_id=alice)]))
    as_alice = Stream(api_key=limited["api_key"], token=client.create_token(alice, expiration=3600), base_url=limited["base_url"])
    mine = as_alice.chat.channel("messaging", channel_id)
    for i in range(3):
        r = mine.send_message(message=MessageRequest(text=f"m{i}", user_id=alice))
        info = r.rate_limit()
        assert (info.limit, info.remaining) == (3, 2 - i)
    with pytest.raises(StreamRateLimitException) as err:
        mine.send_message(message=MessageRequest(text="one too many", user_id=alice))
    assert err.value.status_code == 429
    assert err.value.code == 9
    assert err.value.retry_after is not None and err.value.retry_after.total_seconds() >= 1
    info = err.value.rate_limit_info
    assert (info.limit, info.remaining) == (3, 0)

    # Server-side: the app's web budget (a bucket of 10 refilling one every 6 s) shows the
    # three sends; the refused one spent nothing.
    limits = client.get_rate_limits(web=True, endpoints="SendMessage").data
    assert limits.web["SendMessage"].limit == 10
    assert 7 <= limits.web["SendMessage"].remaining <= 8
    assert limits.server_side is None
