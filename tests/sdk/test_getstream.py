"""The Python SDK `getstream` 7.0.0 (the v2 dialect: /api/v2 paths, nanosecond timestamps,
custom fields under `custom`) against Offshoot. The SDK has no fork methods, so the fork
endpoints are called through its generic request helpers (`client.chat.post/get`), which sign
and send the request exactly as the SDK's own methods do."""

from __future__ import annotations

import datetime

import pytest
from getstream import Stream
from getstream.exceptions import StreamApiException
from getstream.models import (
    ChannelInput,
    ChannelMemberRequest,
    MessagePaginationParams,
    MessageRequest,
    SortParamRequest,
    UserRequest,
)

from conftest import copy_id


@pytest.fixture
def client(server) -> Stream:
    return Stream(api_key=server["api_key"], api_secret=server["api_secret"], base_url=server["base_url"])


def make_channel(client: Stream, uid, n_messages: int = 0):
    alice, agent, cid = uid("alice"), uid("agent"), uid("conv")
    client.upsert_users(UserRequest(id=alice, name="Alice"), UserRequest(id=agent, name="Agent"))
    ch = client.chat.channel("agent", cid)
    ch.get_or_create(
        data=ChannelInput(
            created_by_id=alice,
            members=[ChannelMemberRequest(user_id=alice), ChannelMemberRequest(user_id=agent)],
            custom={"title": "a conversation"},
        )
    )
    ids = []
    for i in range(n_messages):
        user = alice if i % 2 == 0 else agent
        r = ch.send_message(MessageRequest(text=f"message {i}", user_id=user))
        ids.append(r.data.message.id)
    return ch, alice, agent, ids


def fork(client: Stream, source_id: str, message_id: str, target_id: str, **extra) -> dict:
    body = {"message_id": message_id, "channel": {"id": target_id}, **extra}
    return client.chat.post(
        "/api/v2/chat/channels/{type}/{id}/fork", path_params={"type": "agent", "id": source_id}, json=body
    ).data


def raw_channel(client: Stream, channel_id: str) -> dict:
    return client.chat.post(
        "/api/v2/chat/channels/{type}/{id}/query", path_params={"type": "agent", "id": channel_id}, json={"state": True}
    ).data


def all_message_ids(ch, max_pages: int = 100) -> list[str]:
    """Every message id of a channel, oldest first, paging backwards with id_lt.

    Bounded: a server that ignored id_lt would return the same page for ever; that fails here
    (a page repeating an id, or more than `max_pages` pages) instead of hanging the suite."""
    ids: list[str] = []
    id_lt = None
    for _ in range(max_pages):
        page = ch.get_or_create(state=True, messages=MessagePaginationParams(limit=50, id_lt=id_lt)).data.messages
        if not page:
            return ids
        new = [m.id for m in page]
        assert not set(new) & set(ids), f"id_lt={id_lt} returned messages already seen: {new}"
        ids = new + ids
        id_lt = page[0].id
    raise AssertionError(f"more than {max_pages} pages of messages: paging does not end")


def test_upserted_users_come_back_with_custom_fields_nested(client, uid):
    u = uid("u")
    r = client.upsert_users(UserRequest(id=u, name="U One", custom={"color": "red"}))
    user = r.data.users[u]
    assert user.id == u
    assert user.name == "U One"
    assert user.custom == {"color": "red"}
    assert isinstance(user.created_at, datetime.datetime)


def test_an_agent_channel_is_created_with_its_members(client, uid):
    ch, alice, agent, _ = make_channel(client, uid)
    r = ch.get_or_create(state=True)
    assert r.data.channel.type == "agent"
    assert r.data.channel.cid == f"agent:{ch.channel_id}"
    assert r.data.channel.created_by.id == alice
    assert r.data.channel.custom.get("title") == "a conversation"
    assert sorted(m.user_id for m in r.data.members) == sorted([alice, agent])
    assert isinstance(r.data.channel.created_at, datetime.datetime)


def test_messages_and_a_reply_are_sent_and_read_back(client, uid):
    ch, alice, agent, _ = make_channel(client, uid)
    first = ch.send_message(MessageRequest(text="hello", user_id=alice, custom={"k": "v"})).data.message
    second = ch.send_message(MessageRequest(text="hi, how can I help?", user_id=agent, custom={"ai_generated": True})).data.message
    reply = ch.send_message(MessageRequest(text="a reply", user_id=alice, parent_id=first.id)).data.message
    assert first.custom == {"k": "v"}
    assert reply.parent_id == first.id

    state = ch.get_or_create(state=True, messages=MessagePaginationParams(limit=25)).data
    assert [m.id for m in state.messages] == [first.id, second.id]
    assert state.messages[1].custom.get("ai_generated") is True

    got = client.chat.get_message(id=first.id).data.message
    assert got.text == "hello"
    assert got.reply_count == 1

    replies = client.chat.get_replies(parent_id=first.id, limit=10).data.messages
    assert [m.id for m in replies] == [reply.id]


def test_query_channels_finds_the_channel_of_a_member(client, uid):
    ch, alice, _, _ = make_channel(client, uid)
    r = client.chat.query_channels(
        filter_conditions={"type": "agent", "members": {"$in": [alice]}},
        sort=[SortParamRequest(field="created_at", direction=-1)],
        limit=10,
    )
    assert [c.channel.cid for c in r.data.channels] == [f"agent:{ch.channel_id}"]


def test_a_missing_message_raises_stream_api_exception_with_code_16(client):
    with pytest.raises(StreamApiException) as err:
        client.chat.get_message(id="no-such-message")
    assert err.value.status_code == 404
    assert err.value.code == 16
    assert err.value.message
    # The deprecated name in getstream.base is the same class.
    import getstream.base

    assert getstream.base.StreamAPIException is StreamApiException


def test_a_short_conversation_is_forked_at_once_with_documented_copy_ids(client, uid):
    ch, alice, _, ids = make_channel(client, uid, n_messages=6)
    target = uid("branch")
    r = fork(client, ch.channel_id, ids[3], target, user_id=alice)
    f = r["fork"]
    assert f["status"] == "completed"
    assert f["channel_cid"] == f"agent:{target}"
    assert f["source_channel_cid"] == f"agent:{ch.channel_id}"
    assert f["source_message_id"] == ids[3]
    assert f["copied_message_count"] == 4
    assert f["message_id_map"] == {i: copy_id(f"agent:{target}", i) for i in ids[:4]}
    assert isinstance(f["created_at"], int)  # v2 dialect: nanoseconds

    # The fork reads like any channel through the typed SDK methods.
    state = client.chat.channel("agent", target).get_or_create(state=True).data
    assert [m.text for m in state.messages] == [f"message {i}" for i in range(4)]
    assert [m.id for m in state.messages] == [copy_id(f"agent:{target}", i) for i in ids[:4]]
    assert state.channel.created_by.id == alice
    assert raw_channel(client, target)["channel"]["fork"]["status"] == "completed"

    lookup = client.chat.post(
        "/api/v2/chat/channels/{type}/{id}/fork/message_ids",
        path_params={"type": "agent", "id": target},
        json={"source_message_ids": [ids[0], ids[5], "unknown"]},
    ).data
    assert lookup["message_id_map"] == {ids[0]: copy_id(f"agent:{target}", ids[0])}

    lineage = client.chat.get(
        "/api/v2/chat/channels/{type}/{id}/forks", path_params={"type": "agent", "id": ch.channel_id}
    ).data
    assert [x["channel_cid"] for x in lineage["forks"]] == [f"agent:{target}"]


def test_a_long_conversation_backfills_and_its_task_completes(client, uid):
    ch, alice, _, ids = make_channel(client, uid, n_messages=130)
    target = uid("branch")
    f = fork(client, ch.channel_id, ids[-1], target)["fork"]
    assert f["status"] == "backfilling"
    assert f["task_id"]

    task = client.get_task(id=f["task_id"]).data
    assert task.task_id == f["task_id"]
    assert task.status in ("pending", "running", "completed")
    done = client.wait_for_task(f["task_id"], poll_interval=0.2, timeout=60).data
    assert done.status == "completed"

    summary = raw_channel(client, target)["channel"]["fork"]
    assert summary["status"] == "completed"
    assert summary["copied_message_count"] == 130
    assert all_message_ids(client.chat.channel("agent", target)) == [copy_id(f"agent:{target}", i) for i in ids]


def test_fork_errors_carry_their_reason_in_exception_fields(client, uid):
    ch, _, _, ids = make_channel(client, uid, n_messages=2)
    other, _, _, _ = make_channel(client, uid)
    with pytest.raises(StreamApiException) as err:
        fork(client, ch.channel_id, ids[0], other.channel_id)
    assert err.value.status_code == 400
    assert err.value.code == 4
    assert err.value.exception_fields.get("reason") == "fork_target_exists"

    with pytest.raises(StreamApiException) as err:
        fork(client, ch.channel_id, "no-such-message", uid("nowhere"))
    assert err.value.status_code == 400
    assert err.value.code == 4


def test_a_member_with_a_user_token_may_look_up_copies_but_not_fork(client, server, uid):
    ch, alice, _, ids = make_channel(client, uid, n_messages=2)
    target = uid("branch")
    fork(client, ch.channel_id, ids[1], target, user_id=alice)
    as_alice = Stream(api_key=server["api_key"], token=client.create_token(alice, expiration=3600), base_url=server["base_url"])

    lookup = as_alice.chat.post(
        "/api/v2/chat/channels/{type}/{id}/fork/message_ids",
        path_params={"type": "agent", "id": target},
        json={"source_message_ids": ids},
    ).data
    assert lookup["message_id_map"] == {i: copy_id(f"agent:{target}", i) for i in ids}

    with pytest.raises(StreamApiException) as err:
        fork(as_alice, ch.channel_id, ids[1], uid("user-branch"))
    assert err.value.status_code == 403
    assert err.value.code == 17
