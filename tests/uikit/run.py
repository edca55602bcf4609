#!/usr/bin/env python3
"""The official React UI kit in a browser against the real server binary.

`npm ci` installs the pinned kit (stream-chat-react on stream-chat 9.53.0, React, esbuild) when
the lock file changed; build.mjs bundles app/ (Chat, Channel, Window, ChannelHeader,
MessageList, MessageComposer, Thread and the kit's Search with Chat's own search controller) into
tests/uikit/dist/ (git-ignored), which a static server of this process serves on its own
loopback port, so every API call the page makes is a cross-origin one, as in production. For
each backend (SQLite always; PostgreSQL when --pg-url is given, on a fresh database) this starts
`offshoot serve` (tests/offshoot_harness.py), seeds two channels through the API, opens the app
in Debian's Chromium driven by Playwright as a user (a user token) and checks:

- uploads: the composer's attachment button, "Upload file", a PNG and a PDF chosen in the file
  chooser, a text, send. Before the uploads the kit asks GET /app for the upload configs with
  the user's token; each file goes up through channel.sendImage / channel.sendFile; the message
  shows the image loaded (naturalWidth > 0) and the PDF as a link; the links download the same
  bytes;
- search: a word typed into the search box (the channels and users sources query as well), its
  Messages filter; the kit sends GET /search with the Messages source's payload, lists the matching message of the other channel, and a click on it opens
  that channel with the message in view; the Users source finds a member by name and a click
  opens a direct channel with them; the Channels source finds a channel by name;
- the page reported no script error and no API call failed.

Screenshots go to tests/uikit/screenshots/ (git-ignored). Exits non-zero when any check fails
on any backend. Used by scripts/test (with the console test's virtualenv: Playwright and PyJWT):

    .venv-console/bin/python tests/uikit/run.py --binary target/debug/offshoot [--pg-url postgres://...]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zlib
from contextlib import contextmanager
from pathlib import Path

import jwt
from playwright.sync_api import Page, sync_playwright

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from offshoot_harness import NO_LIMITS, Server, ServerApi, binary_or_exit, each_backend  # noqa: E402

DIST = HERE / "dist"
SHOTS = HERE / "screenshots"
API_KEY = "uikit-test-key"
API_SECRET = "uikit-test-secret-" + "z" * 32
CHROMIUM = os.environ.get("OFFSHOOT_CHROMIUM", "/usr/bin/chromium")
# Bounds of the waits below (conditions, never sleeps standing for "it happened").
UI_TIMEOUT_MS = 20_000
SEARCH_WORD = "marquee"


class Failure(AssertionError):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


def step(what: str) -> None:
    print(f"  - {what}", flush=True)


# ---------------------------------------------------------------------------- the files


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid PNG of one colour (8-bit RGB, no filter)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def pdf(text: str) -> bytes:
    """A one-page PDF with its cross-reference table."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


# ---------------------------------------------------------------------------- the API


class Api(ServerApi):
    """Server-side calls (offshoot_harness.ServerApi) and the ones this test seeds with."""

    failure = Failure

    def __init__(self, base: str):
        super().__init__(base, API_KEY, API_SECRET)

    def message(self, cid: str, user: str, text: str):
        kind, cid_id = cid.split(":", 1)
        return self.call("POST", f"/channels/{kind}/{cid_id}/message", {"message": {"text": text, "user_id": user}})["message"]

    def messages(self, cid: str) -> list[dict]:
        kind, cid_id = cid.split(":", 1)
        return self.call("GET", f"/channels/{kind}/{cid_id}?messages_limit=50")["messages"]


def seed(api: Api, tag: str) -> dict:
    users = {"alice": "Alice Moreau", "bob": "Bob Okafor"}
    ids = {u: f"{u}-{tag}" for u in users}
    api.call("POST", "/users", {"users": {ids[u]: {"id": ids[u], "name": n} for u, n in users.items()}})
    repair, party = f"messaging:repair-{tag}", f"messaging:party-{tag}"
    api.channel(repair, "Lamp repair", [ids["alice"], ids["bob"]])
    api.message(repair, ids["bob"], "Could you send a photo of the cracked base and the invoice?")
    api.channel(party, "Garden party", [ids["alice"], ids["bob"]])
    target = api.message(party, ids["bob"], f"The {SEARCH_WORD} arrives at noon, tables at one.")
    for i in range(30):
        api.message(party, ids["alice" if i % 2 else "bob"], f"Party planning, item {i + 1}: chairs, lights, music.")
    return {"users": ids, "repair": repair, "party": party, "target": target}


# ---------------------------------------------------------------------------- the page


@contextmanager
def static_server(folder: Path):
    """The bundled app on a loopback port of its own (another origin than the API's)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Watch:
    """Every API request and response of the page, and its script errors."""

    def __init__(self, page: Page, api_base: str):
        self.api_base = api_base
        self.requests: list[tuple[str, str, dict]] = []
        self.responses: list[tuple[str, str, int]] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append((r.method, r.url, r.headers)) if r.url.startswith(api_base) else None)
        page.on("response", lambda r: self.responses.append((r.request.method, r.url, r.status)) if r.url.startswith(api_base) else None)
        page.on("requestfailed", lambda r: self.failed.append(f"{r.method} {r.url}: {r.failure}"))
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text} ({m.location.get('url')})") if m.type == "error" else None)

    def calls(self, method: str, path: str) -> list[tuple[str, int]]:
        return [(u, s) for (m, u, s) in self.responses if m == method and urllib.parse.urlsplit(u).path == path]

    def clean(self):
        bad = [f"{m} {u}: {s}" for (m, u, s) in self.responses if s >= 400]
        check(not bad, "API calls of the page failed:\n" + "\n".join(bad))
        check(not self.failed, "requests of the page failed:\n" + "\n".join(self.failed))
        check(not self.errors, "the page reported errors:\n" + "\n".join(self.errors))


@contextmanager
def shot_on_failure(page: Page, name: str):
    """A screenshot of the page as it stood when a check failed."""
    try:
        yield
    except Exception:
        page.screenshot(path=str(SHOTS / f"failed-{name}.png"))
        raise


def open_app(browser, app_base: str, api_base: str, user: str, cid: str):
    token = jwt.encode({"user_id": user, "exp": int(time.time()) + 3600}, API_SECRET, algorithm="HS256")
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    watch = Watch(page, api_base)
    fragment = urllib.parse.urlencode({"base": api_base, "key": API_KEY, "user": user, "token": token, "cid": cid})
    page.goto(f"{app_base}/index.html#{fragment}")
    return ctx, page, watch


def wait_channel(page: Page, name: str):
    page.wait_for_function(
        """(name) => { if (window.__appError) throw new Error(window.__appError);
            const h = document.querySelector('.str-chat__channel-header');
            return h && h.innerText.includes(name); }""",
        arg=name,
        timeout=UI_TIMEOUT_MS,
    )


def check_uploads(browser, app_base: str, api: Api, data: dict, backend: str, workdir: Path):
    alice = data["users"]["alice"]
    ctx, page, watch = open_app(browser, app_base, api.base, alice, data["repair"])
    with shot_on_failure(page, f"uploads-{backend}"):
        uploads(page, watch, api, data, backend, workdir)
    ctx.close()


def uploads(page: Page, watch: Watch, api: Api, data: dict, backend: str, workdir: Path):
    alice = data["users"]["alice"]
    wait_channel(page, "Lamp repair")
    page.wait_for_selector(".str-chat__message-text:has-text('cracked base')", timeout=UI_TIMEOUT_MS)

    image, document = png(64, 48, (200, 40, 40)), pdf("Invoice 4412")
    (workdir / "lamp.png").write_bytes(image)
    (workdir / "invoice-4412.pdf").write_bytes(document)
    step("the attachment button, Upload file, a PNG and a PDF")
    # With uploads the only attachment action the button opens the file chooser itself; with
    # more (polls, commands, locations) it opens a menu whose "Upload file" does.
    choosers = []
    page.on("filechooser", lambda c: choosers.append(c))
    page.click(".str-chat__attachment-selector__menu-button")
    upload_item = page.locator(".str-chat__attachment-selector-actions-menu__upload-file-button")
    deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
    while not choosers:
        if upload_item.is_visible():
            upload_item.click()
        check(time.monotonic() < deadline, "neither a file chooser nor the attachment menu opened")
        page.wait_for_timeout(100)
    choosers[0].set_files([str(workdir / "lamp.png"), str(workdir / "invoice-4412.pdf")])
    kind, cid_id = data["repair"].split(":", 1)
    for what in ["image", "file"]:
        path = f"/channels/{kind}/{cid_id}/{what}"
        deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
        while not watch.calls("POST", path):
            check(time.monotonic() < deadline, f"the kit did not upload through POST {path}: {watch.responses}")
            page.wait_for_timeout(100)
        check(all(s == 201 or s == 200 for (_, s) in watch.calls("POST", path)), f"POST {path}: {watch.calls('POST', path)}")
    # Before uploading, the attachment manager asked for the upload configs with the user's token.
    apps = [(u, h) for (m, u, h) in watch.requests if m == "GET" and urllib.parse.urlsplit(u).path == "/app"]
    check(apps, "the kit never asked GET /app for the upload configs")
    check(all(jwt.decode(h["authorization"], API_SECRET, algorithms=["HS256"]).get("user_id") == alice for (_, h) in apps), "GET /app went without the user's token")
    check(all(s == 200 for (_, s) in watch.calls("GET", "/app")), f"GET /app: {watch.calls('GET', '/app')}")

    text = "Here are the photo and the invoice."
    page.fill(".str-chat__textarea textarea", text)
    page.click(".str-chat__send-button:not([disabled])", timeout=UI_TIMEOUT_MS)
    step("the message with the image and the file link")
    sent = page.locator(".str-chat__message", has_text=text)
    sent.wait_for(timeout=UI_TIMEOUT_MS)
    img = sent.locator(".str-chat__message-attachment img").first
    img.wait_for(timeout=UI_TIMEOUT_MS)
    page.wait_for_function(
        "(e) => e.complete && e.naturalWidth > 0",
        arg=img.element_handle(),
        timeout=UI_TIMEOUT_MS,
    )
    natural = img.evaluate("(e) => [e.naturalWidth, e.naturalHeight, e.currentSrc]")
    check(natural[0] > 0 and natural[2].startswith(api.base), f"the image as the page loaded it: {natural}")
    # The file's row: its name and size, and its download link.
    row = sent.locator(".str-chat__message-attachment-file--item", has_text="invoice-4412.pdf")
    row.wait_for(timeout=UI_TIMEOUT_MS)
    check(f"{len(document)} B" in row.inner_text(), f"the file's row: {row.inner_text()!r}")
    link = row.locator("a[href]")
    href = link.get_attribute("href") or ""
    check(href.startswith(api.base), f"the file link: {href!r}")
    page.screenshot(path=str(SHOTS / f"uploads-{backend}.png"))

    # The stored message and its links: the bytes that went up come back down.
    stored = [m for m in api.messages(data["repair"]) if m.get("text") == text]
    check(len(stored) == 1, f"the sent message as stored: {stored}")
    attachments = {a.get("type"): a for a in stored[0].get("attachments", [])}
    check(set(attachments) == {"image", "file"}, f"the stored attachments: {stored[0].get('attachments')}")
    for url, want, what in [
        (attachments["image"].get("image_url"), image, "the image"),
        (attachments["file"].get("asset_url"), document, "the PDF"),
        (natural[2], image, "the image as the page loaded it"),
        (href, document, "the PDF as the page links it"),
    ]:
        with urllib.request.urlopen(url, timeout=30) as r:
            got = r.read()
        check(got == want, f"{what} ({url}) downloads {len(got)} bytes, not the {len(want)} uploaded")
    watch.clean()


def check_search(browser, app_base: str, api: Api, data: dict, backend: str):
    alice = data["users"]["alice"]
    ctx, page, watch = open_app(browser, app_base, api.base, alice, data["repair"])
    with shot_on_failure(page, f"search-{backend}"):
        search(page, watch, api, data, backend)
    ctx.close()


def search(page: Page, watch: Watch, api: Api, data: dict, backend: str):
    alice = data["users"]["alice"]
    wait_channel(page, "Lamp repair")
    step(f"the search box: {SEARCH_WORD!r}")
    search_source(page, SEARCH_WORD, "Messages")
    # stream-chat-react 14 lists a message found as its channel's row (the channel's name, its
    # latest message as the preview); the Messages source's items are the messages themselves.
    result = page.locator(".str-chat__search-result", has_text="Garden party")
    result.first.wait_for(timeout=UI_TIMEOUT_MS)
    rows = page.locator(".str-chat__search-result").all_inner_texts()
    check(len(rows) == 1, f"results for {SEARCH_WORD!r}: {rows}")
    found = page.evaluate(
        "() => window.__searchController.sources.filter(s => s.type === 'messages').map(s => s.items.map(m => [m.id, m.cid, m.text]))"
    )
    want = [[[data["target"]["id"], data["party"], data["target"]["text"]]]]
    check(found == want, f"the Messages source holds {found}, want {want}")
    # What the Messages source asked: the user's channels, regular messages with the word.
    searches = [u for (m, u, _) in watch.requests if m == "GET" and urllib.parse.urlsplit(u).path == "/search"]
    check(searches, "the kit did not call GET /search")
    payload = json.loads(urllib.parse.parse_qs(urllib.parse.urlsplit(searches[-1]).query)["payload"][0])
    check(payload.get("filter_conditions") == {"members": {"$in": [alice]}}, f"the search's channel filter: {payload}")
    check(payload.get("message_filter_conditions") == {"type": "regular", "text": SEARCH_WORD}, f"the search's message filter: {payload}")
    check(payload.get("sort") == [{"field": "created_at", "direction": -1}], f"the search's sort: {payload}")
    print("    the page's calls while searching: " + ", ".join(sorted({f"{m} {urllib.parse.urlsplit(u).path} {s}" for (m, u, s) in watch.responses})))
    page.screenshot(path=str(SHOTS / f"search-{backend}.png"))

    step("a click on the result opens its channel at the message")
    result.first.click()
    wait_channel(page, "Garden party")
    target = page.locator(f".str-chat__message-text:has-text('{SEARCH_WORD} arrives at noon')")
    target.wait_for(timeout=UI_TIMEOUT_MS)
    page.wait_for_function(
        """(e) => { const r = e.getBoundingClientRect();
            const list = e.closest('.str-chat__list') || document.documentElement;
            const l = list.getBoundingClientRect();
            return r.bottom > l.top && r.top < l.bottom; }""",
        arg=target.element_handle(),
        timeout=UI_TIMEOUT_MS,
    )
    page.screenshot(path=str(SHOTS / f"search-opened-{backend}.png"))

    step("the Users source: a member by name opens a direct channel; the Channels source by name")
    search_source(page, "Bob", "Users")
    user = page.locator(".str-chat__search-result--user", has_text="Bob Okafor")
    user.first.wait_for(timeout=UI_TIMEOUT_MS)
    rows = page.locator(".str-chat__search-result--user").all_inner_texts()
    check(len(rows) == 1, f"users found for 'Bob': {rows}")
    user.first.click()
    wait_channel(page, "Bob Okafor")
    search_source(page, "Garden", "Channels")
    page.locator(".str-chat__search-result", has_text="Garden party").first.wait_for(timeout=UI_TIMEOUT_MS)
    rows = page.locator(".str-chat__search-result").all_inner_texts()
    check(len(rows) == 1, f"channels found for 'Garden': {rows}")
    page.screenshot(path=str(SHOTS / f"search-sources-{backend}.png"))
    watch.clean()


def search_source(page: Page, text: str, source: str):
    """`text` in the search box, then the filter button of `source` pressed."""
    page.fill(".str-chat__search-bar__input", text)
    page.locator(".str-chat__search-results-header__filter-source-button", has_text=source).click(timeout=UI_TIMEOUT_MS)
    page.wait_for_selector(
        f".str-chat__search-results-header__filter-source-button[aria-pressed=true]:has-text('{source}')", timeout=UI_TIMEOUT_MS
    )


def run_pass(backend: str, binary: Path, database_url: str, workdir: Path) -> bool:
    server = Server(binary, backend, database_url, workdir, API_KEY, API_SECRET, env=NO_LIMITS)
    print(f"\n--- React UI kit on {backend}: {binary.name} serve at {server.base_url}", flush=True)
    ok = False
    try:
        with server, static_server(DIST) as app_base:
            api = Api(server.base_url)
            step("seeding (two users, two channels)")
            data = seed(api, f"{backend[:2]}{uuid.uuid4().hex[:6]}")
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM,
                    headless=True,
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
                )
                try:
                    check_uploads(browser, app_base, api, data, backend, workdir)
                    check_search(browser, app_base, api, data, backend)
                finally:
                    browser.close()
            ok = True
    except Exception:  # noqa: BLE001 (every failure is reported and fails the pass)
        traceback.print_exc()
    return server.verdict(ok)


def install_and_build() -> None:
    """`npm ci` when the lock file changed since the last install; then the bundle."""
    lock, stamp = HERE / "package-lock.json", HERE / "node_modules" / ".offshoot-lock"
    if not stamp.exists() or stamp.read_bytes() != lock.read_bytes():
        subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True)
        shutil.copyfile(lock, stamp)
    if DIST.exists():
        shutil.rmtree(DIST)
    subprocess.run(["node", str(HERE / "build.mjs"), str(DIST)], cwd=HERE, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "offshoot")
    ap.add_argument("--pg-url", help="a PostgreSQL server URL; adds a pass on a fresh database there")
    args = ap.parse_args()
    binary = binary_or_exit(args.binary)
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()):
        print(f"{CHROMIUM} not found: apt-get install -y chromium (or set OFFSHOOT_CHROMIUM)", file=sys.stderr)
        return 1
    for tool in ["node", "npm"]:
        if not shutil.which(tool):
            print(f"{tool} not found: the UI kit is installed with npm and bundled with node", file=sys.stderr)
            return 1
    install_and_build()
    SHOTS.mkdir(exist_ok=True)
    code = each_backend(
        "React UI kit browser test", "offshoot_uikit", args.pg_url, lambda backend, url, workdir: run_pass(backend, binary, url, workdir)
    )
    print(f"(screenshots in {SHOTS})")
    return code


if __name__ == "__main__":
    sys.exit(main())
