#!/usr/bin/env python3
"""The web console's browser test: headless Chromium against the real server binary.

For each backend (SQLite always; PostgreSQL when --pg-url is given, on a fresh database) this
starts `offshoot serve` on a free loopback port, seeds data through the API (a 5,000-message
agent conversation with two forks and a fork of a fork, a channel without forks, a
dead-lettered webhook delivery), opens /console in Debian's Chromium driven by Playwright and
checks what a person would see:

- without a token: the sign-in prompt, no data, and no API call that succeeds (also with an
  expired or a forged token);
- with the link `offshoot console` prints: the fragment leaves the address bar, nothing is
  stored, the page carries its Content-Security-Policy; a channel found by member and by cid,
  its four nodes in the right shape with status, counts and fork point, the channel view with
  its fork marks, a node opened by a click, a channel without forks saying so;
- a fork of the 5,000-message conversation started through the API appears by itself and its
  bar (the page's own aria-valuenow) moves to 100 % while the page is never reloaded;
- the queue: job counts, the dead letter, its replay button;
- with a member's token: a fork the member is not in shows its cid and status only, and the
  server-side queue is refused.

The backfill runs in small pages (OFFSHOOT_BACKFILL_PAGE_SIZE, OFFSHOOT_BACKFILL_PAGE_DELAY_MS)
so that a person, and this test, can watch it move. Screenshots go to tests/console/screenshots/
(git-ignored). Exits non-zero when any check fails on any backend. Used by scripts/test:

    .venv-console/bin/python tests/console/run.py --binary target/debug/offshoot [--pg-url postgres://...]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import jwt
from playwright.sync_api import Page, expect, sync_playwright

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from offshoot_harness import Server, ServerApi, binary_or_exit, each_backend  # noqa: E402

SHOTS = HERE / "screenshots"
API_KEY = "console-test-key"
API_SECRET = "console-test-secret-" + "x" * 32
CHROMIUM = os.environ.get("OFFSHOOT_CHROMIUM", "/usr/bin/chromium")
# Bounds of the waits below (conditions, never sleeps standing for "it happened").
UI_TIMEOUT_MS = 15_000
BACKFILL_TIMEOUT_S = 180.0
SOURCE_MESSAGES = 5_000

# Lines of the seeded conversation, cycled.
LINES = [
    ("alice", "Hi, my order #4412 arrived damaged. The lamp's base is cracked."),
    ("agent", "I'm sorry to hear that. Could you send a photo of the damage and the packaging?"),
    ("alice", "Sure, attached both. The box was crushed on one corner."),
    ("agent", "Thanks. I can offer a full refund or a replacement shipped today."),
    ("alice", "A replacement would be great, but I need it before Friday."),
    ("agent", "Express shipping puts it at your door Thursday. Shall I go ahead?"),
    ("bob", "Billing here: the express upgrade is on us for this order."),
    ("alice", "Perfect, thank you both. Please go ahead."),
]


class Failure(AssertionError):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


# ---------------------------------------------------------------------------- the server


@contextmanager
def refusing_receiver():
    """A webhook receiver that answers 400 to everything: the worker dead-letters at once."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the stdlib's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- the API


class Api(ServerApi):
    """Server-side calls (offshoot_harness.ServerApi) and the ones this test seeds with."""

    failure = Failure

    def __init__(self, base: str):
        super().__init__(base, API_KEY, API_SECRET)

    def message(self, cid: str, mid: str, user: str, text: str):
        kind, cid_id = cid.split(":", 1)
        return self.call("POST", f"/channels/{kind}/{cid_id}/message", {"message": {"id": mid, "text": text, "user_id": user}})

    def fork(self, source: str, at: str, to: str, name: str, members: list[str] | None = None):
        kind, source_id = source.split(":", 1)
        body = {"message_id": at, "channel": {"id": to.split(":", 1)[1], "data": {"name": name}}}
        if members:
            body["channel"]["members"] = members
        out = self.call("POST", f"/channels/{kind}/{source_id}/fork", body, expect=None)
        check(out.get("task_id") or out.get("fork"), f"the fork of {source} at {at} was refused: {out}")
        return out

    def wait_forked(self, cid: str, timeout_s: float = BACKFILL_TIMEOUT_S) -> dict:
        """The fork's own summary once it is no longer backfilling (bounded)."""
        kind, cid_id = cid.split(":", 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            source = self.call("GET", f"/channels/{kind}/{cid_id}/forks").get("source") or {}
            if source.get("status") in ("completed", "failed"):
                check(source["status"] == "completed", f"{cid} failed: {source}")
                return source
            time.sleep(0.2)
        raise Failure(f"{cid} still backfilling after {timeout_s:.0f}s")


def seed(api: Api, tag: str, receiver_url: str) -> dict:
    """The data the checks look at; ids carry `tag` so the passes never meet."""
    users = {"alice": "Alice Moreau", "agent": "Support agent", "bob": "Bob (billing)", "carol": "Carol Diaz"}
    ids = {u: f"{u}-{tag}" for u in users}
    api.call("POST", "/users", {"users": {ids[u]: {"id": ids[u], "name": n} for u, n in users.items()}})
    root = f"agent:refund-{tag}"
    api.channel(root, "Refund request #4412", [ids["alice"], ids["agent"], ids["bob"]])
    mids = [f"{tag}-m{i:05d}" for i in range(SOURCE_MESSAGES)]

    def send(i: int):
        who, text = LINES[i % len(LINES)]
        api.message(root, mids[i], ids[who], f"{text} ({i + 1})" if i >= len(LINES) else text)

    # In order first (the fork points' texts), then the rest in parallel.
    for i in range(len(LINES)):
        send(i)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(send, range(len(LINES), SOURCE_MESSAGES)))

    f1, f2, f1a = f"agent:credit-{tag}", f"agent:billing-{tag}", f"agent:credit-ship-{tag}"
    api.fork(root, mids[3], f1, "Try: store credit instead")
    # Billing's fork leaves alice out: in her console it is a node she may not open.
    api.fork(root, mids[5], f2, "Try: escalate to billing", members=[ids["bob"], ids["agent"]])
    api.wait_forked(f1)
    api.message(f1, f"{tag}-f1-extra", ids["agent"], "Alternatively: store credit of 120 % of the order, valid for a year.")
    api.fork(f1, f"{tag}-f1-extra", f1a, "Store credit + free shipping")
    api.wait_forked(f2)
    api.wait_forked(f1a)

    lonely = f"agent:lonely-{tag}"
    api.channel(lonely, "A channel nobody forked", [ids["carol"], ids["agent"]])
    api.message(lonely, f"{tag}-lonely-1", ids["carol"], "Hello, is anyone there?")

    # One dead-lettered webhook delivery: the receiver refuses, the worker gives up at once.
    api.call("PATCH", "/app", {"webhook_url": receiver_url, "webhook_events": ["message.new"]})
    api.message(lonely, f"{tag}-lonely-2", ids["agent"], "Yes, how can I help?")
    deadline = time.monotonic() + 60
    while not api.call("GET", "/webhooks/dead_letters").get("dead_letters"):
        check(time.monotonic() < deadline, "the refused webhook delivery was not dead-lettered within 60 s")
        time.sleep(0.2)
    api.call("PATCH", "/app", {"webhook_url": ""})
    return {"users": ids, "root": root, "f1": f1, "f2": f2, "f1a": f1a, "lonely": lonely, "mids": mids}


# ---------------------------------------------------------------------------- the link


def console_link(binary: Path, base: str, ttl: str = "10m") -> str:
    """The one line `offshoot console --ttl …` prints: a server-side token that expires."""
    env = dict(os.environ, OFFSHOOT_API_KEY=API_KEY, OFFSHOOT_API_SECRET=API_SECRET)
    out = subprocess.run([str(binary), "console", "--url", base, "--ttl", ttl], env=env, capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, f"offshoot console exited {out.returncode}: {out.stderr}")
    lines = out.stdout.splitlines()
    check(len(lines) == 1 and lines[0].startswith(f"{base}/console#api_key={API_KEY}&token="), f"offshoot console printed {out.stdout!r}")
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(lines[0]).fragment)["token"][0]
    claims = jwt.decode(token, API_SECRET, algorithms=["HS256"])
    check("user_id" not in claims, f"the console's token acts as a user: {claims}")
    check(0 < claims.get("exp", 0) - time.time() <= 600, f"the console's token does not expire in 10 min: {claims}")
    return lines[0]


def minted_link(base: str, ttl_s: int) -> str:
    """A console link whose token expires `ttl_s` from now (in the past when negative), which
    `offshoot console` refuses to print."""
    now = int(time.time())
    token = jwt.encode({"server": True, "iat": min(now, now + ttl_s), "exp": now + ttl_s}, API_SECRET, algorithm="HS256")
    return f"{base}/console#api_key={API_KEY}&token={token}"


# ---------------------------------------------------------------------------- the browser


class Watch:
    """Every API response the page gets, and its script errors."""

    def __init__(self, page: Page, base: str):
        self.base = base
        self.responses: list[tuple[str, str, int]] = []
        self.errors: list[str] = []
        page.on("response", lambda r: self.responses.append((r.request.method, r.url, r.status)))
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        # Refused API calls (401, 403) are expected where checked; a CSP violation or a script
        # error is not.
        refused = "Failed to load resource: the server responded with a status of 4"
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" and not m.text.startswith(refused) else None)

    def api_calls(self):
        return [(m, u, s) for (m, u, s) in self.responses if not urllib.parse.urlsplit(u).path.startswith("/console")]

    def clean(self):
        check(not self.errors, "the page reported errors:\n" + "\n".join(self.errors))


def nodes(page: Page) -> dict:
    """The tree as drawn: cid -> (parent cid as nested in the DOM, status, the node's text)."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('#tree .node')].map(n => {
            const li = n.parentElement;
            const up = li.parentElement.closest('li');
            const parent = up ? up.querySelector(':scope > .node').dataset.node : null;
            return [n.dataset.node, [parent, n.dataset.status, n.innerText]];
        }))"""
    )


def wait_nodes(page: Page, n: int):
    # Locator waits, not wait_for_function: the page's CSP forbids evaluating strings.
    expect(page.locator("#tree .node")).to_have_count(n, timeout=UI_TIMEOUT_MS)


def find(page: Page, by: str, q: str):
    page.select_option("#find-by", by)
    page.fill("#find-q", q)
    page.press("#find-q", "Enter")


def check_no_token(browser, base: str):
    forged = jwt.encode({"server": True, "exp": int(time.time()) + 600}, "not-the-secret-" + "y" * 32, algorithm="HS256")
    cases = [
        ("no token", f"{base}/console", ""),
        ("expired token", minted_link(base, -3600), "The token expired"),
        ("forged token", f"{base}/console#api_key={API_KEY}&token={forged}", "refused the token"),
    ]
    for label, url, said in cases:
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        watch = Watch(page, base)
        page.goto(url)
        page.wait_for_selector("#signin:not([hidden])", timeout=UI_TIMEOUT_MS)
        page.wait_for_load_state("networkidle")
        check(page.is_hidden("#app"), f"{label}: the app is shown")
        check(page.locator("#tree .node, #results li, #messages li, .letter").count() == 0, f"{label}: data on the page")
        if said:
            check(said in page.inner_text("#signin-error"), f"{label}: the prompt says {page.inner_text('#signin-error')!r}")
        # A pasted text without a token is refused by the page itself.
        page.fill("#signin-link", "not a link")
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("#signin-error:has-text('No token found')", timeout=UI_TIMEOUT_MS)
        page.wait_for_load_state("networkidle")
        ok = [c for c in watch.api_calls() if c[2] < 400]
        check(not ok, f"{label}: API calls that succeeded: {ok}")
        check(page.evaluate("location.hash") == "", f"{label}: the fragment stayed in the address bar")
        page.screenshot(path=str(SHOTS / f"signin-{label.replace(' ', '-')}.png"))
        watch.clean()
        ctx.close()


def check_console(browser, base: str, link: str, api: Api, data: dict, backend: str):
    ctx = browser.new_context(viewport={"width": 1440, "height": 980})
    page = ctx.new_page()
    watch = Watch(page, base)
    first = page.goto(link)
    headers = first.headers
    csp = headers.get("content-security-policy", "")
    for part in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'"]:
        check(part in csp, f"CSP lacks {part!r}: {csp!r}")
    check("unsafe-inline" not in csp, f"CSP allows inline code: {csp!r}")
    check(headers.get("x-content-type-options") == "nosniff", f"no nosniff: {headers}")
    page.wait_for_selector("#app:not([hidden])", timeout=UI_TIMEOUT_MS)
    check("server-side · expires in 10 min" in page.inner_text("#session-who"), f"the session: {page.inner_text('#session-who')!r}")
    check("#" not in page.url and "token" not in page.url, f"the token stayed in the address bar: {page.url}")
    stored = page.evaluate("[localStorage.length, sessionStorage.length, document.cookie]")
    check(stored == [0, 0, ""], f"the page stored something: {stored}")
    page.evaluate("window.__loadedOnce = true")

    # By member: carol is a member of the lonely channel only.
    find(page, "member", data["users"]["carol"])
    page.wait_for_selector(f".result[data-cid='{data['lonely']}']", timeout=UI_TIMEOUT_MS)
    check(page.locator(".result").count() == 1, "carol's search lists channels she is not in")
    # One result opens by itself: a channel without forks says so.
    page.wait_for_selector("#tree-status:has-text('No forks')", timeout=UI_TIMEOUT_MS)
    wait_nodes(page, 1)

    # By member again: alice is in the root and its forks.
    find(page, "member", data["users"]["alice"])
    page.wait_for_selector(f".result[data-cid='{data['f1a']}']", timeout=UI_TIMEOUT_MS)
    check(page.locator(".result").count() == 3, f"alice's channels: {page.locator('.result').count()}")

    # By cid: the root, its four nodes in the right shape.
    find(page, "cid", data["root"])
    wait_nodes(page, 4)
    tree = nodes(page)
    shape = {cid: parent for cid, (parent, _, _) in tree.items()}
    want = {data["root"]: None, data["f1"]: data["root"], data["f2"]: data["root"], data["f1a"]: data["f1"]}
    check(shape == want, f"tree shape {shape}, want {want}")
    check(tree[data["root"]][1] == "root", f"root status {tree[data['root']][1]}")
    for f in ["f1", "f2", "f1a"]:
        check(tree[data[f]][1] == "completed", f"{f} status {tree[data[f]][1]}")
    check("4 / 4" in tree[data["f1"]][2], f"f1's counts: {tree[data['f1']][2]!r}")
    check("6 / 6" in tree[data["f2"]][2] and "members" in tree[data["f2"]][2], f"f2's counts: {tree[data['f2']][2]!r}")
    check(LINES[3][1][:40] in tree[data["f1"]][2], f"f1's fork point text: {tree[data['f1']][2]!r}")
    check("store credit of 120" in tree[data["f1a"]][2], f"f1a's fork point text: {tree[data['f1a']][2]!r}")
    check(page.get_attribute(f".node-open[data-cid='{data['root']}']", "aria-current") == "true", "the open node is not marked")
    expect(page.locator("#messages li")).to_have_count(30, timeout=UI_TIMEOUT_MS)
    kind, root_id = data["root"].split(":", 1)
    newest = api.call("GET", f"/channels/{kind}/{root_id}?messages_limit=1")["messages"][0]
    last = page.locator("#messages li").first
    check(last.get_attribute("data-id") == newest["id"], f"the newest message: {last.inner_text()!r}, want {newest['text']!r}")
    check(newest["text"] in last.inner_text() and newest["user"]["name"] in last.inner_text(), f"the newest message: {last.inner_text()!r}")
    status = page.inner_text("#channel-status")
    check(data["f1"] in status and data["f2"] in status, f"the forks at older messages are not named: {status!r}")

    # A click on a node opens it: its messages, the message f1a was made at marked with a link.
    page.click(f".node-open[data-cid='{data['f1']}']")
    page.wait_for_selector("#channel-title:has-text('Try: store credit instead')", timeout=UI_TIMEOUT_MS)
    page.wait_for_selector("#messages li:has-text('arrived damaged')", timeout=UI_TIMEOUT_MS)
    marked = page.locator(".message-forked")
    check(marked.count() == 1, f"fork marks in f1: {marked.count()}")
    check(data["f1a"] in marked.inner_text() and "store credit of 120" in marked.inner_text(), f"f1's fork mark: {marked.inner_text()!r}")
    check(page.get_attribute(f".node-open[data-cid='{data['f1']}']", "aria-current") == "true", "f1 is not marked open")
    # By keyboard: focus the mark's link and press Enter.
    page.focus(f".message-forked button.link")
    page.keyboard.press("Enter")
    page.wait_for_selector("#channel-title:has-text('Store credit + free shipping')", timeout=UI_TIMEOUT_MS)

    # The queue: counts per queue, the dead letter, its replay.
    page.wait_for_selector("table.jobs tbody tr", timeout=UI_TIMEOUT_MS)
    queues = page.locator("table.jobs tbody th").all_inner_texts()
    check(queues, "no queue rows")
    page.wait_for_selector(".letter", timeout=UI_TIMEOUT_MS)
    letter = page.locator(".letter").first
    check("message.new" in letter.inner_text(), f"the dead letter: {letter.inner_text()!r}")
    letter.locator("button").click()
    page.wait_for_selector("#queue-status:has-text('Replayed 1 delivery')", timeout=UI_TIMEOUT_MS)

    # Live: the root open, a fork of its 5,000 messages started through the API; the page
    # finds it and its bar moves to 100 % by itself.
    find(page, "cid", data["root"])
    wait_nodes(page, 4)
    live = f"agent:live-{backend}-{uuid.uuid4().hex[:6]}"
    api.fork(data["root"], newest["id"], live, "Replay of the whole conversation")
    bar = f".bar[data-cid='{live}']"
    samples: list[tuple[str, int]] = []
    shot_taken = False
    deadline = time.monotonic() + BACKFILL_TIMEOUT_S
    while True:
        seen = page.evaluate(
            f"""() => {{ const b = document.querySelector("{bar}");
                const n = document.querySelector(".node[data-node='{live}']");
                return b && n ? [n.dataset.status, Number(b.getAttribute('aria-valuenow'))] : null; }}"""
        )
        if seen and (not samples or samples[-1] != tuple(seen)):
            samples.append(tuple(seen))
        if seen and seen[0] == "backfilling" and 20 <= seen[1] < 100 and not shot_taken:
            page.evaluate("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
            page.screenshot(path=str(SHOTS / f"live-{backend}.png"))
            shot_taken = True
        if seen and seen[0] != "backfilling":
            break
        check(time.monotonic() < deadline, f"the live fork's bar did not finish within {BACKFILL_TIMEOUT_S:.0f}s: {samples}")
        page.wait_for_timeout(100)
    print(f"    the live fork as the page showed it (status, aria-valuenow): {samples}")
    check(samples[-1] == ("completed", 100), f"the live fork ended {samples[-1]}")
    moving = [v for (s, v) in samples if s == "backfilling"]
    check(moving, f"the page never showed the fork backfilling: {samples}")
    partial = {v for v in moving if 0 < v < 100}
    check(len(partial) >= 2, f"the bar did not move through partial progress: {samples}")
    check(moving == sorted(moving), f"the bar went backwards: {samples}")
    check(page.evaluate("window.__loadedOnce === true"), "the page was reloaded")
    wait_nodes(page, 5)
    counts = page.locator(f".node[data-node='{live}'] .count").inner_text()
    check(counts == f"{SOURCE_MESSAGES:,} / {SOURCE_MESSAGES:,}", f"the live fork's counts: {counts!r}")
    # The source's newest message, the fork point, is marked with a link to the fork.
    page.wait_for_selector(f".message-forked button:has-text('{live}')", timeout=UI_TIMEOUT_MS)
    page.wait_for_selector("#tree-live", state="hidden", timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / f"done-{backend}.png"))

    # Every API call carried the token in a header, never in its URL.
    calls = watch.api_calls()
    check(calls, "the page made no API calls")
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(link).fragment)["token"][0]
    check(not [u for (_, u, _) in calls if token in u], "the token went into a URL")
    watch.clean()
    ctx.close()


def check_as_member(browser, base: str, data: dict, link: str):
    """A user's token: the tree shows the fork alice is not in by its cid and status only, and
    the server-side queue is refused to her."""
    token = jwt.encode({"user_id": data["users"]["alice"], "exp": int(time.time()) + 600}, API_SECRET, algorithm="HS256")
    ctx = browser.new_context(viewport={"width": 1440, "height": 980})
    page = ctx.new_page()
    watch = Watch(page, base)
    page.goto(f"{base}/console#api_key={API_KEY}&token={token}")
    page.wait_for_selector("#session-who:has-text('as alice')", timeout=UI_TIMEOUT_MS)
    find(page, "cid", data["root"])
    for key in ["root", "f1", "f2", "f1a"]:
        page.wait_for_selector(f".node[data-node='{data[key]}']", timeout=UI_TIMEOUT_MS)
    hidden = page.locator(f".node[data-node='{data['f2']}']")
    check("node-hidden" in (hidden.get_attribute("class") or ""), "the fork alice is not in is not marked")
    check(hidden.locator("button").count() == 0, "the fork alice is not in can be opened")
    check("no access" in hidden.inner_text() and "Try: escalate" not in hidden.inner_text(), f"what alice sees of f2: {hidden.inner_text()!r}")
    check(page.locator(f".node-open[data-cid='{data['f1a']}']").count() == 1, "alice cannot open her own fork")
    page.wait_for_selector("#queue-status.error:has-text('server-side')", timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / "member.png"))
    # Sign out: everything shown goes; a pasted link signs in again.
    page.click("#sign-out")
    page.wait_for_selector("#signin:not([hidden])", timeout=UI_TIMEOUT_MS)
    check(page.locator("#tree .node, #results li, #messages li").count() == 0, "data stayed on the page after signing out")
    page.fill("#signin-link", link)
    page.click("#signin-form button[type=submit]")
    page.wait_for_selector("#session-who:has-text('server-side')", timeout=UI_TIMEOUT_MS)
    check(page.input_value("#signin-link") == "", "the pasted link stayed in the form")
    watch.clean()
    ctx.close()


def check_serving(base: str):
    """The page and its files: public, typed, their errors Stream's envelope."""
    for path, media in [("/console", "text/html"), ("/console/console.js", "text/javascript"), ("/console/console.css", "text/css")]:
        with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
            check(r.status == 200 and r.headers["Content-Type"].startswith(media), f"{path}: {r.status} {r.headers['Content-Type']}")
            check("script-src 'self'" in r.headers["Content-Security-Policy"] and r.headers["X-Content-Type-Options"] == "nosniff", f"{path}: {dict(r.headers)}")
    for method, path, status in [("GET", "/console/secrets.json", 404), ("GET", "/console/../app", 404), ("POST", "/console", 405)]:
        req = urllib.request.Request(f"{base}{path}", method=method, data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                got, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            got, body = e.code, e.read()
        envelope = json.loads(body or b"{}")
        check(got == status and envelope.get("StatusCode") == status and "message" in envelope, f"{method} {path}: {got} {body[:200]!r}")


def run_browser_checks(base: str, api: Api, data: dict, binary: Path, backend: str):
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        try:
            step("without a token, with an expired one, with a forged one")
            check_no_token(browser, base)
            step("with the link of offshoot console")
            link = console_link(binary, base)
            check_console(browser, base, link, api, data, backend)
            step("with a member's token, then signed out and in again with a pasted link")
            check_as_member(browser, base, data, link)
        finally:
            browser.close()


def step(what: str):
    print(f"  - {what}", flush=True)


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path) -> bool:
    server = Server(
        binary,
        backend,
        database_url,
        workdir,
        API_KEY,
        API_SECRET,
        env={
            # Small pages with a pause between them: 5,000 messages take several seconds to copy.
            "OFFSHOOT_BACKFILL_PAGE_SIZE": "200",
            "OFFSHOOT_BACKFILL_PAGE_DELAY_MS": "300",
            "OFFSHOOT_WORKER_POLL_MS": "100",
        },
    )
    base = server.base_url
    print(f"\n--- console browser test on {backend}: {binary.name} serve at {base}", flush=True)
    ok = False
    try:
        with server:
            api = Api(base)
            tag = f"{backend[:2]}{uuid.uuid4().hex[:6]}"
            step(f"seeding ({SOURCE_MESSAGES:,} messages, three forks, a dead letter)")
            with refusing_receiver() as receiver:
                data = seed(api, tag, receiver)
            step("the page's headers and errors")
            check_serving(base)
            run_browser_checks(base, api, data, binary, backend)
            ok = True
    except Exception:  # noqa: BLE001 (every failure is reported and fails the pass)
        traceback.print_exc()
    return server.verdict(ok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    args = ap.parse_args()
    binary = binary_or_exit(args.binary)
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()):
        print(f"{CHROMIUM} not found: apt-get install -y chromium (or set OFFSHOOT_CHROMIUM)", file=sys.stderr)
        return 1
    SHOTS.mkdir(exist_ok=True)
    code = each_backend(
        "console browser test", "offshoot_console", args.pg_url, lambda backend, url, workdir: run_pass(backend, binary, url, workdir)
    )
    print(f"(screenshots in {SHOTS})")
    return code


if __name__ == "__main__":
    sys.exit(main())
