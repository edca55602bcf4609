"""Uploads through the Python SDK `stream-chat` 4.33.0 (server-side, for a user): send_file and
send_image with the multipart form the SDK builds, the links downloaded without headers, and
delete_file / delete_image."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from stream_chat import StreamChat
from stream_chat.base.exceptions import StreamAPIException

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f80f000101010018dd8db40000000049454e44ae426082"
)


@pytest.fixture
def client(server) -> StreamChat:
    return StreamChat(api_key=server["api_key"], api_secret=server["api_secret"], base_url=server["base_url"], timeout=20)


def fetch(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, b"", ""


def test_send_file_and_send_image_store_the_bytes_and_delete_removes_them(client, uid, tmp_path):
    alice = uid("alice")
    client.upsert_users([{"id": alice}])
    ch = client.channel("messaging", uid("files"), {"members": [alice]})
    ch.create(alice)

    doc = tmp_path / "notes.txt"
    doc.write_bytes(b"notes for the agent\n" * 500)
    r = ch.send_file(str(doc), "notes.txt", {"id": alice}, content_type="text/plain")
    status, body, kind = fetch(r["file"])
    assert (status, body) == (200, doc.read_bytes())
    assert kind == "text/plain"

    img = tmp_path / "pixel.png"
    img.write_bytes(PNG)
    r = ch.send_image(str(img), "pixel.png", {"id": alice}, content_type="image/png")
    assert r["thumb_url"] == r["file"]
    status, body, kind = fetch(r["file"])
    assert (status, body, kind) == (200, PNG, "image/png")

    fake = tmp_path / "fake.png"
    fake.write_bytes(b"<html><script>alert(1)</script></html>")
    with pytest.raises(StreamAPIException) as e:
        ch.send_image(str(fake), "fake.png", {"id": alice}, content_type="image/png")
    assert e.value.status_code == 400

    ch.delete_image(r["file"])
    assert fetch(r["file"])[0] == 404
