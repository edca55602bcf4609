"""The Python SDK `stream-chat` 4.33.0 (the legacy dialect: unprefixed paths, RFC 3339
timestamps, custom fields flat on the object) against Offshoot. Fork calls go through the
SDK's generic `client.post/get`, which sign and send them like every other SDK call."""

from __future__ import annotations

import time

import pytest
from stream_chat import StreamChat
from stream_chat.base.exceptions import StreamAPIException

from conftest import copy_id


@pytest.fixture
def client(server) -> StreamChat:
    return StreamChat(api_key=server["api_key"], api_secret=server["api_secret"], base_url=server["base_url"], timeout=20)


def make_channel(client: StreamChat, uid, n_messages: int = 0):
    alice, agent, cid = uid("alice"), uid("agent"), uid("conv")
    client.upsert_users([{"id": alice, "name": "Alice"}, {"id": agent, "name": "Agent", "color": "blue"}])
    ch = client.channel("agent", cid, {"title": "a conversation", "members": [alice, agent]})
    ch.create(alice)
    ids = []
    for i in range(n_messages):
        r = ch.send_message({"text": f"message {i}"}, alice if i % 2 == 0 else agent)
        ids.append(r["message"]["id"])
    return ch, alice, agent, ids


def all_message_ids(ch, max_pages: int = 100) -> list[str]:
    """Every message id of a channel, oldest first, paging backwards with id_lt.

    Bounded: a server that ignored id_lt would return the same page for ever; that fails here
    (a page repeating an id, or more than `max_pages` pages) instead of hanging the suite."""
    ids: list[str] = []
    pagination: dict = {"limit": 50}
    for _ in range(max_pages):
        page = ch.query(messages=pagination)["messages"]
        if not page:
            return ids
        new = [m["id"] for m in page]
        assert not set(new) & set(ids), f"{pagination} returned messages already seen: {new}"
        ids = new + ids
        pagination = {"limit": 50, "id_lt": page[0]["id"]}
    raise AssertionError(f"more than {max_pages} pages of messages: paging does not end")


def is_rfc3339(value) -> bool:
    return isinstance(value, str) and "T" in value and (value.endswith("Z") or "+" in value)


def test_upserted_users_come_back_with_custom_fields_flat(client, uid):
    u = uid("u")
    r = client.upsert_users([{"id": u, "name": "U", "color": "red"}])
    user = r["users"][u]
    assert user["color"] == "red"
    assert "custom" not in user
    assert is_rfc3339(user["created_at"])


def test_an_agent_channel_is_created_with_members_and_custom_data(client, uid):
    ch, alice, agent, _ = make_channel(client, uid)
    state = ch.query()
    assert state["channel"]["cid"] == f"agent:{ch.id}"
    assert state["channel"]["title"] == "a conversation"
    assert state["channel"]["created_by"]["id"] == alice
    assert is_rfc3339(state["channel"]["created_at"])
    assert sorted(m["user_id"] for m in state["members"]) == sorted([alice, agent])
    assert "duration" in state


def test_messages_and_a_reply_are_sent_and_read_back(client, uid):
    ch, alice, agent, _ = make_channel(client, uid)
    first = ch.send_message({"text": "hello", "generating": True}, alice)["message"]
    second = ch.send_message({"text": "answer"}, agent)["message"]
    reply = ch.send_message({"text": "a reply", "parent_id": first["id"]}, alice)["message"]
    assert first["generating"] is True
    assert reply["parent_id"] == first["id"]

    state = ch.query(messages={"limit": 25})
    assert [m["id"] for m in state["messages"]] == [first["id"], second["id"]]
    assert client.get_message(first["id"])["message"]["reply_count"] == 1
    assert [m["id"] for m in ch.get_replies(first["id"], limit=10)["messages"]] == [reply["id"]]


def test_query_channels_finds_the_channel_of_a_member(client, uid):
    ch, alice, _, _ = make_channel(client, uid)
    r = client.query_channels({"type": "agent", "members": {"$in": [alice]}}, {"created_at": -1}, limit=10)
    assert [c["channel"]["cid"] for c in r["channels"]] == [f"agent:{ch.id}"]


def test_a_missing_message_raises_stream_api_exception(client):
    with pytest.raises(StreamAPIException) as err:
        client.get_message("no-such-message")
    assert err.value.status_code == 404
    assert err.value.error_code == 16
    assert err.value.error_message


def test_a_fork_is_read_back_in_the_legacy_dialect(client, uid):
    ch, alice, _, ids = make_channel(client, uid, n_messages=130)
    target = uid("branch")
    r = client.post(f"channels/agent/{ch.id}/fork", data={"message_id": ids[-1], "channel": {"id": target}, "user_id": alice})
    f = r["fork"]
    assert f["status"] == "backfilling"
    assert is_rfc3339(f["created_at"])
    newest = ids[-1]
    assert f["message_id_map"][newest] == copy_id(f"agent:{target}", newest)

    deadline = time.monotonic() + 60
    while True:
        task = client.get_task(f["task_id"])
        if task["status"] in ("completed", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert task["status"] == "completed"

    fork_channel = client.channel("agent", target)
    summary = fork_channel.query()["channel"]["fork"]
    assert summary["status"] == "completed"
    assert summary["copied_message_count"] == 130
    assert all_message_ids(fork_channel) == [copy_id(f"agent:{target}", i) for i in ids]

    lookup = client.post(f"channels/agent/{target}/fork/message_ids", data={"source_message_ids": ids[:3]})
    assert lookup["message_id_map"] == {i: copy_id(f"agent:{target}", i) for i in ids[:3]}


def test_fork_target_conflict_is_a_stream_api_exception_with_code_129(client, uid):
    ch, _, _, ids = make_channel(client, uid, n_messages=3)
    target = uid("branch")
    client.post(f"channels/agent/{ch.id}/fork", data={"message_id": ids[0], "channel": {"id": target}})
    with pytest.raises(StreamAPIException) as err:
        client.post(f"channels/agent/{ch.id}/fork", data={"message_id": ids[2], "channel": {"id": target}})
    assert err.value.status_code == 409
    assert err.value.error_code == 129
