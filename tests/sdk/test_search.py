"""Message search with both Python SDKs: `stream-chat`'s `client.search` (legacy dialect) and
`getstream`'s `chat.search` (v2 dialect), full text, message filters, sort and `next` pages."""

from __future__ import annotations

import pytest
from getstream import Stream
from getstream.models import ChannelInput, ChannelMemberRequest, MessageRequest, SearchPayload, SortParamRequest, UserRequest
from stream_chat import StreamChat
from stream_chat.base.exceptions import StreamAPIException


@pytest.fixture
def legacy(server) -> StreamChat:
    return StreamChat(api_key=server["api_key"], api_secret=server["api_secret"], base_url=server["base_url"], timeout=20)


@pytest.fixture
def v2(server) -> Stream:
    return Stream(api_key=server["api_key"], api_secret=server["api_secret"], base_url=server["base_url"])


def seed(client: StreamChat, uid, n: int = 5):
    """A channel of `n` messages holding one unique word (with an accent), and one without it."""
    alice, cid = uid("alice"), uid("search")
    word = uid("needle").replace("-", "")
    client.upsert_users([{"id": alice}])
    ch = client.channel("agent", cid, {"members": [alice]})
    ch.create(alice)
    ids = [ch.send_message({"text": f"Crème {word} {i}"}, alice)["message"]["id"] for i in range(n)]
    ch.send_message({"text": "unrelated"}, alice)
    return ch, alice, word, ids


def test_stream_chat_search_finds_words_and_pages_with_next(legacy, uid):
    ch, alice, word, ids = seed(legacy, uid)
    r = legacy.search({"cid": ch.cid}, f"CREME {word}", limit=10)
    assert sorted(x["message"]["id"] for x in r["results"]) == sorted(ids)
    assert all(x["message"]["channel"]["cid"] == ch.cid for x in r["results"])
    first = legacy.search({"members": {"$in": [alice]}}, {"text": {"$autocomplete": word[:8]}}, sort=[{"field": "created_at", "direction": -1}], limit=3)
    assert [x["message"]["id"] for x in first["results"]] == ids[::-1][:3]
    second = legacy.search({"members": {"$in": [alice]}}, {"text": {"$autocomplete": word[:8]}}, limit=3, next=first["next"])
    assert [x["message"]["id"] for x in second["results"]] == ids[::-1][3:]
    assert "next" not in second
    with pytest.raises(StreamAPIException) as e:
        legacy.search({"cid": ch.cid}, word, limit=500)
    assert e.value.error_code == 4


def test_getstream_chat_search_answers_the_typed_response(v2, uid):
    alice, cid = uid("alice"), uid("search")
    word = uid("needle").replace("-", "")
    v2.upsert_users(UserRequest(id=alice))
    ch = v2.chat.channel("agent", cid)
    ch.get_or_create(data=ChannelInput(created_by_id=alice, members=[ChannelMemberRequest(user_id=alice)]))
    ids = [ch.send_message(message=MessageRequest(text=f"{word} number {i}", user_id=alice)).data.message.id for i in range(4)]
    r = v2.chat.search(
        payload=SearchPayload(
            filter_conditions={"cid": f"agent:{cid}"},
            message_filter_conditions={"text": {"$q": word}, "user.id": alice},
            sort=[SortParamRequest(field="created_at", direction=-1)],
            limit=2,
        )
    )
    assert [x.message.id for x in r.data.results] == ids[::-1][:2]
    assert r.data.results[0].message.channel.cid == f"agent:{cid}"
    assert r.data.next
    more = v2.chat.search(payload=SearchPayload(filter_conditions={"cid": f"agent:{cid}"}, query=word, limit=2, next=r.data.next))
    assert [x.message.id for x in more.data.results] == ids[::-1][2:]
