"""Long values in every field that reaches an indexed column.

PostgreSQL refuses a B-tree index row over about 2.7 KB (and any row over 8 KB once
compressed), so a value that is not length-checked at the edge turns into a 500 there while
SQLite stores it. Each probe below puts a long, incompressible string into one field of one
request and requires a 4xx answer with Stream's error envelope naming the problem (never a
5xx). Run by run.py against the live server of each backend, after schemathesis.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.parse
import urllib.request

# Incompressible (random hex), so neither TOAST compression nor an index can take it.
LONG = secrets.token_hex(50_000)
# For paths and query strings, which the HTTP server bounds before the API sees them (414).
SHORTER = LONG[:6_000]


def _call(base_url: str, api_key: str, token: str, method: str, path: str, body=None, query=None):
    q = {"api_key": api_key, **(query or {})}
    url = f"{base_url}{path}?{urllib.parse.urlencode(q)}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", token)
    req.add_header("stream-auth-type", "jwt")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return e.code, {"raw": raw[:200].decode(errors="replace")}


def probes() -> list[tuple[str, str, str, object, dict | None]]:
    """(name, method, path, body, query): each carries LONG in one field. A name starting with
    `~` is a value that is only read, or kept where no index holds it: it may be accepted, but
    never answered with a 5xx. Every other one reaches an indexed column and must be refused."""
    ch = "/channels/agent/long-values"
    return [
        ("ai_indicator.update message_id", "POST", f"{ch}/event",
         {"event": {"type": "ai_indicator.update", "message_id": LONG, "ai_state": "AI_STATE_THINKING"}}, None),
        ("ai_indicator.clear message_id", "POST", f"{ch}/event",
         {"event": {"type": "ai_indicator.clear", "message_id": LONG}}, None),
        ("~event type", "POST", f"{ch}/event", {"event": {"type": LONG}}, None),
        ("event user_id", "POST", f"{ch}/event", {"event": {"type": "typing.start", "user_id": LONG}}, None),
        ("reaction type", "POST", "/messages/long-values-m1/reaction", {"reaction": {"type": LONG}, "user_id": "alice"}, None),
        ("reaction user_id", "POST", "/messages/long-values-m1/reaction", {"reaction": {"type": "like"}, "user_id": LONG}, None),
        ("message parent_id", "POST", f"{ch}/message", {"message": {"text": "hi", "parent_id": LONG}, "user_id": "alice"}, None),
        ("message quoted_message_id", "POST", f"{ch}/message",
         {"message": {"text": "hi", "quoted_message_id": LONG}, "user_id": "alice"}, None),
        ("message id", "POST", f"{ch}/message", {"message": {"id": LONG, "text": "hi"}, "user_id": "alice"}, None),
        ("message user_id", "POST", f"{ch}/message", {"message": {"text": "hi"}, "user_id": LONG}, None),
        ("~message mentioned_users", "POST", f"{ch}/message",
         {"message": {"text": "hi", "mentioned_users": [LONG]}, "user_id": "alice"}, None),
        ("message restricted_visibility", "POST", f"{ch}/message",
         {"message": {"text": "hi", "restricted_visibility": [LONG]}, "user_id": "alice"}, None),
        ("channel member", "POST", "/channels/agent/long-values-2/query",
         {"data": {"created_by_id": "alice", "members": [LONG]}}, None),
        ("channel created_by_id", "POST", "/channels/agent/long-values-3/query", {"data": {"created_by_id": LONG}}, None),
        ("~channel team", "POST", "/channels/agent/long-values-4/query", {"data": {"created_by_id": "alice", "team": LONG}}, None),
        ("~channel set team", "PATCH", ch, {"set": {"team": LONG}}, None),
        ("add members", "POST", ch, {"add_members": [LONG]}, None),
        ("user id", "POST", "/users", {"users": {LONG: {"id": LONG}}}, None),
        ("~user teams", "POST", "/users", {"users": {"bob": {"id": "bob", "teams": [LONG]}}}, None),
        ("partial user id", "PATCH", "/users", {"users": [{"id": LONG, "set": {"name": "x"}}]}, None),
        ("~mark read message_id", "POST", f"{ch}/read", {"message_id": LONG, "user_id": "alice"}, None),
        ("rewind message_id", "POST", f"{ch}/rewind", {"message_id": LONG}, None),
        ("~truncate message_id", "POST", f"{ch}/truncate", {"message_id": LONG}, None),
        ("fork message_id", "POST", f"{ch}/fork", {"message_id": LONG, "channel": {"id": "long-values-fork"}}, None),
        ("fork channel id", "POST", f"{ch}/fork", {"message_id": "long-values-m1", "channel": {"id": LONG}}, None),
        ("fork user_id", "POST", f"{ch}/fork", {"message_id": "long-values-m1", "channel": {"id": "lv-f2"}, "user_id": LONG}, None),
        ("fork inherit_data", "POST", f"{ch}/fork",
         {"message_id": "long-values-m1", "channel": {"id": "lv-f3"}, "inherit_data": [LONG]}, None),
        ("fork lookup message_ids", "POST", f"{ch}/fork/message_ids", {"source_message_ids": [LONG]}, None),
        ("~dead-letter replay ids", "POST", "/webhooks/dead_letters/replay", {"ids": [LONG]}, None),
        ("ban target", "POST", "/moderation/ban", {"target_user_id": LONG, "user_id": "alice"}, None),
        ("~ban channel", "POST", "/moderation/ban", {"target_user_id": "alice", "type": "agent", "id": LONG}, None),
        ("~unban target", "DELETE", "/moderation/ban", None, {"target_user_id": SHORTER}),
        ("channel type name", "PUT", "/channeltypes/" + SHORTER, {"max_message_length": 5000}, None),
        ("~query channels member", "POST", "/channels", {"filter_conditions": {"members": {"$in": [LONG]}}}, None),
        ("~query channels cid", "POST", "/channels", {"filter_conditions": {"cid": LONG}}, None),
        ("guest id", "POST", "/guest", {"user": {"id": LONG}}, None),
        ("~stop watching", "POST", f"{ch}/stop-watching", {"connection_id": LONG}, None),
        ("delete channels cids", "POST", "/channels/delete", {"cids": [LONG], "hard_delete": True}, None),
        ("~threads user", "POST", "/threads", {"user_id": LONG}, None),
    ]


def run(base_url: str, api_key: str, token: str) -> list[str]:
    """Runs every probe; returns the failures (empty when all answered a 4xx envelope)."""
    setup = [
        ("POST", "/users", {"users": {"alice": {"id": "alice", "role": "admin"}}}),
        ("POST", "/channels/agent/long-values/query", {"data": {"created_by_id": "alice", "members": ["alice"]}}),
        ("POST", "/channels/agent/long-values/message", {"message": {"id": "long-values-m1", "text": "hi"}, "user_id": "alice"}),
    ]
    for method, path, body in setup:
        status, answer = _call(base_url, api_key, token, method, path, body)
        if status != 201 and status != 200:
            return [f"setup {method} {path}: {status} {answer}"]
    failures = []
    for name, method, path, body, query in probes():
        status, answer = _call(base_url, api_key, token, method, path, body, query)
        may_accept = name.startswith("~")
        refused = 400 <= status < 500 and "code" in answer and "message" in answer
        if status >= 500 or not (refused or (may_accept and status in (200, 201))):
            failures.append(f"{name.lstrip('~')}: {method} {path[:60]} answered {status} {str(answer)[:200]}")
    return failures
