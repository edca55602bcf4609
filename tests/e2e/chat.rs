//! The chat core: users, app settings, channel types, channels, members, messages, replies,
//! reactions, pins, read state, threads, truncate, rewind, bans and membership checks.

use crate::helpers::*;
use serde_json::{json, Value};

// --- users, app, channel types ---------------------------------------------------------------

#[tokio::test]
async fn upserting_users_returns_them_keyed_by_id_and_partial_update_sets_and_unsets_fields() {
    let app = TestApp::spawn().await;
    let r = app.post("/users", &app.server(), json!({"users": {"u1": {"id": "u1", "name": "One", "color": "red", "size": 3}}})).await.ok();
    assert_eq!(r["users"]["u1"]["id"], json!("u1"), "{r}");
    assert_eq!(r["users"]["u1"]["name"], json!("One"));
    assert_eq!(r["users"]["u1"]["role"], json!("user"));
    assert_eq!(r["users"]["u1"]["color"], json!("red"));
    let p = app
        .patch("/users", &app.server(), json!({"users": [{"id": "u1", "set": {"color": "blue", "name": "Uno"}, "unset": ["size"]}]}))
        .await
        .ok();
    let u = &p["users"]["u1"];
    assert_eq!(u["color"], json!("blue"), "{p}");
    assert_eq!(u["name"], json!("Uno"), "{p}");
    assert!(u.get("size").is_none(), "unset removes the field: {p}");
    // A second upsert replaces custom data.
    let r = app.post("/users", &app.server(), json!({"users": {"u1": {"id": "u1", "mood": "ok"}}})).await.ok();
    assert_eq!(r["users"]["u1"]["mood"], json!("ok"));
    assert!(r["users"]["u1"].get("color").is_none(), "{r}");
}

#[tokio::test]
async fn app_settings_are_read_with_get_and_changed_with_patch() {
    let app = TestApp::spawn().await;
    let a = app.get("/app", &app.server()).await.ok();
    assert_eq!(a["app"]["fork_enabled"], json!(true), "fork is on by default: {a}");
    app.patch("/app", &app.server(), json!({"webhook_url": "http://127.0.0.1:9/hook", "fork_enabled": false})).await.ok();
    let a = app.get("/app", &app.server()).await.ok();
    assert_eq!(a["app"]["webhook_url"], json!("http://127.0.0.1:9/hook"), "{a}");
    assert_eq!(a["app"]["fork_enabled"], json!(false), "{a}");
}

#[tokio::test]
async fn the_agent_channel_type_max_message_length_can_be_changed_and_is_enforced() {
    let app = TestApp::spawn().await;
    let ct = app.get("/channeltypes/agent", &app.server()).await.ok();
    assert_eq!(ct["max_message_length"], json!(5000), "{ct}");
    let put = app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 10})).await.ok();
    assert_eq!(put["max_message_length"], json!(10), "{put}");
    assert_eq!(app.get("/channeltypes/agent", &app.server()).await.ok()["max_message_length"], json!(10));
    app.users(&["u1"]).await;
    let st = app.channel("agent:short", "u1", &["u1"]).await;
    assert_eq!(st["channel"]["config"]["max_message_length"], json!(10), "{st}");
    let id = app.say("agent:short", "u1", "0123456789").await;
    // A send is held to it, server-side (checked in the store, under the channel's lock) and
    // client-side, and nothing is stored; a server-side send to a channel that does not exist
    // is a 404 whatever its text.
    app.post("/channels/agent/short/message", &app.server(), json!({"message": {"text": "0123456789x", "user_id": "u1"}}))
        .await
        .err(400, 20);
    app.post("/channels/agent/short/message", &app.user("u1"), json!({"message": {"text": "0123456789x"}})).await.err(400, 20);
    let listed = app.get("/channels/agent/short", &app.server()).await.ok();
    assert_eq!(listed["messages"].as_array().map(Vec::len), Some(1), "only the message that fits: {listed}");
    for text in ["short", "0123456789x"] {
        app.post("/channels/agent/nowhere/message", &app.server(), json!({"message": {"text": text, "user_id": "u1"}})).await.err(404, 16);
    }
    // A partial update is held to it too, server-side (checked in the store) and client-side.
    for token in [app.server(), app.user("u1")] {
        app.put(&format!("/messages/{id}"), &token, json!({"set": {"text": "0123456789x"}})).await.err(400, 20);
        app.post(&format!("/messages/{id}"), &token, json!({"message": {"text": "0123456789x", "user_id": "u1"}})).await.err(400, 20);
    }
    let ok = app.put(&format!("/messages/{id}"), &app.server(), json!({"set": {"text": "9876543210"}})).await.ok();
    assert_eq!(ok["message"]["text"], json!("9876543210"), "{ok}");
}

// --- channels ----------------------------------------------------------------------------------

#[tokio::test]
async fn get_or_create_accepts_members_as_strings_or_objects_and_returns_the_existing_channel_the_second_time() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "u3"]).await;
    let st = app
        .channel_with(
            "agent:c1",
            json!({"created_by_id": "u1", "members": ["u1", {"user_id": "u2", "channel_role": "channel_moderator"}], "title": "t"}),
        )
        .await;
    assert_eq!(st["channel"]["cid"], json!("agent:c1"), "{st}");
    assert_eq!(st["channel"]["type"], json!("agent"));
    assert_eq!(st["channel"]["created_by"]["id"], json!("u1"));
    assert_eq!(st["channel"]["member_count"], json!(2));
    assert_eq!(member_ids(&st), vec!["u1", "u2"]);
    let u2 = st["members"].as_array().unwrap().iter().find(|m| m["user_id"] == json!("u2")).unwrap();
    assert_eq!(u2["channel_role"], json!("channel_moderator"), "{u2}");
    // Get-or-create again: the same channel, not changed by the new data.
    let again = app.channel_with("agent:c1", json!({"created_by_id": "u3", "members": ["u3"], "title": "other"})).await;
    assert_eq!(again["channel"]["title"], json!("t"), "{again}");
    assert_eq!(again["channel"]["created_at"], st["channel"]["created_at"]);
    // The getstream form: created_by object.
    let st = app.channel_with("agent:c2", json!({"created_by": {"id": "u3"}, "members": [{"user_id": "u3"}]})).await;
    assert_eq!(st["channel"]["created_by"]["id"], json!("u3"), "{st}");
}

#[tokio::test]
async fn channel_messages_come_oldest_first_and_paginate_with_limit_and_id_filters() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:pages";
    app.channel(cid, "u1", &["u1"]).await;
    let base = past_ns();
    let m: Vec<String> = app.seed(cid, "u1", "m", 10, base, 1).await;
    let page = |p: Value| {
        let app = &app;
        async move {
            ids(&app.post(&format!("{}/query", channel_path(cid)), &app.server(), json!({"state": true, "messages": p})).await.ok()
                ["messages"])
        }
    };
    assert_eq!(page(json!({"limit": 3})).await, m[7..10].to_vec(), "latest page, oldest first");
    assert_eq!(page(json!({"limit": 2, "id_lt": m[5]})).await, m[3..5].to_vec());
    assert_eq!(page(json!({"limit": 2, "id_lte": m[5]})).await, m[4..6].to_vec());
    assert_eq!(page(json!({"limit": 2, "id_gt": m[5]})).await, m[6..8].to_vec());
    assert_eq!(page(json!({"limit": 2, "id_gte": m[5]})).await, m[5..7].to_vec());
    let around = page(json!({"limit": 3, "id_around": m[5]})).await;
    assert_eq!(around, m[4..7].to_vec(), "id_around centres on the message");
    assert_eq!(page(json!({"limit": 100})).await, m, "all of them");
}

#[tokio::test]
async fn a_full_channel_update_replaces_custom_data_and_a_partial_update_sets_and_unsets() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:upd";
    app.channel_with(cid, json!({"created_by_id": "u1", "members": ["u1"], "a": 1, "b": 2})).await;
    let r = app.post(channel_path(cid).as_str(), &app.server(), json!({"data": {"title": "new"}, "message": null})).await.ok();
    assert_eq!(r["channel"]["title"], json!("new"), "{r}");
    assert!(r["channel"].get("a").is_none(), "a full update replaces custom data: {r}");
    assert!(r["members"].is_array(), "{r}");
    let r = app.patch(channel_path(cid).as_str(), &app.server(), json!({"set": {"color": "red", "n": 5}, "unset": ["title"]})).await.ok();
    assert_eq!(r["channel"]["color"], json!("red"), "{r}");
    assert_eq!(r["channel"]["n"], json!(5));
    assert!(r["channel"].get("title").is_none(), "{r}");
    let st = app.state(cid, 1).await;
    assert_eq!(st["channel"]["color"], json!("red"));
}

#[tokio::test]
async fn members_are_added_and_removed_with_the_channel_update() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "u3"]).await;
    let cid = "agent:mem";
    app.channel(cid, "u1", &["u1"]).await;
    let r = app.post(channel_path(cid).as_str(), &app.server(), json!({"add_members": ["u2", {"user_id": "u3"}]})).await.ok();
    assert_eq!(member_ids(&r), vec!["u1", "u2", "u3"], "{r}");
    let st = app.state(cid, 1).await;
    assert_eq!(st["channel"]["member_count"], json!(3));
    app.post(channel_path(cid).as_str(), &app.server(), json!({"remove_members": ["u2"]})).await.ok();
    assert_eq!(member_ids(&app.state(cid, 1).await), vec!["u1", "u3"]);
}

#[tokio::test]
async fn a_soft_deleted_channel_has_deleted_at_and_leaves_query_channels_and_a_hard_deleted_one_loses_its_messages() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:soft", "u1", &["u1"]).await;
    app.channel("agent:hard", "u1", &["u1"]).await;
    let m = app.say("agent:hard", "u1", "bye").await;
    let r = app.delete("/channels/agent/soft", &app.server()).await.ok();
    assert!(r["channel"]["deleted_at"].is_string(), "{r}");
    let r = app.delete("/channels/agent/hard?hard_delete=true", &app.server()).await.ok();
    assert!(r["channel"]["deleted_at"].is_string(), "{r}");
    let q = app.post("/channels", &app.server(), json!({"filter_conditions": {"type": "agent"}})).await.ok();
    assert_eq!(q["channels"].as_array().unwrap().len(), 0, "{q}");
    app.get(&format!("/messages/{m}"), &app.server()).await.err(404, 16);
}

#[tokio::test]
async fn query_channels_filters_by_type_cid_id_members_and_creator_and_sorts_limits_and_offsets() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "u3"]).await;
    app.channel("agent:q1", "u1", &["u1", "u2"]).await;
    app.channel("agent:q2", "u2", &["u2"]).await;
    app.channel("agent:q3", "u1", &["u3"]).await;
    app.channel("messaging:q4", "u3", &["u1"]).await;
    let q = |filter: Value, extra: Value| {
        let app = &app;
        async move {
            let mut body = json!({"filter_conditions": filter, "sort": [{"field": "created_at", "direction": 1}], "state": true});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let r = app.post("/channels", &app.server(), body).await.ok();
            r["channels"].as_array().unwrap().iter().map(|c| c["channel"]["cid"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(q(json!({"type": "agent"}), json!({})).await, vec!["agent:q1", "agent:q2", "agent:q3"]);
    assert_eq!(q(json!({"cid": {"$in": ["agent:q2", "messaging:q4"]}}), json!({})).await, vec!["agent:q2", "messaging:q4"]);
    assert_eq!(q(json!({"id": "q3"}), json!({})).await, vec!["agent:q3"]);
    assert_eq!(q(json!({"members": {"$in": ["u1"]}}), json!({})).await, vec!["agent:q1", "messaging:q4"]);
    assert_eq!(q(json!({"created_by_id": "u1"}), json!({})).await, vec!["agent:q1", "agent:q3"]);
    assert_eq!(q(json!({"type": "agent", "members": {"$in": ["u2"]}}), json!({})).await, vec!["agent:q1", "agent:q2"]);
    assert_eq!(q(json!({}), json!({"limit": 2, "offset": 1})).await, vec!["agent:q2", "agent:q3"]);
    let desc = app
        .post(
            "/channels",
            &app.server(),
            json!({"filter_conditions": {"type": "agent"}, "sort": [{"field": "created_at", "direction": -1}]}),
        )
        .await
        .ok();
    let cids: Vec<&str> = desc["channels"].as_array().unwrap().iter().map(|c| c["channel"]["cid"].as_str().unwrap()).collect();
    assert_eq!(cids, vec!["agent:q3", "agent:q2", "agent:q1"]);
    // A user sees only the channels they are a member of.
    let mine = app.post("/channels", &app.user("u3"), json!({"filter_conditions": {"type": "agent"}})).await.ok();
    let cids: Vec<&str> = mine["channels"].as_array().unwrap().iter().map(|c| c["channel"]["cid"].as_str().unwrap()).collect();
    assert_eq!(cids, vec!["agent:q3"], "{mine}");
}

// --- messages ------------------------------------------------------------------------------------

#[tokio::test]
async fn a_message_keeps_a_client_chosen_id_and_a_duplicate_id_is_rejected() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:ids", "u1", &["u1"]).await;
    let m = app.send_message("agent:ids", json!({"id": "my-id-1", "text": "hi", "user_id": "u1"})).await;
    assert_eq!(m["id"], json!("my-id-1"));
    assert_eq!(m["type"], json!("regular"));
    assert_eq!(m["cid"], json!("agent:ids"));
    assert_eq!(m["user"]["id"], json!("u1"));
    app.post("/channels/agent/ids/message", &app.server(), json!({"message": {"id": "my-id-1", "text": "again", "user_id": "u1"}}))
        .await
        .err(400, 4);
}

#[tokio::test]
async fn a_system_message_keeps_its_type_and_other_types_are_refused() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:sys", "u1", &["u1"]).await;
    let m = app.send_message("agent:sys", json!({"text": "joined", "user_id": "u1", "type": "system"})).await;
    assert_eq!(m["type"], json!("system"), "{m}");
    app.post("/channels/agent/sys/message", &app.server(), json!({"message": {"text": "x", "user_id": "u1", "type": "deleted"}}))
        .await
        .err(400, 4);
}

#[tokio::test]
async fn the_user_sending_is_taken_from_user_id_or_user_object_or_the_token() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    app.channel("agent:who", "u1", &["u1", "u2"]).await;
    let a = app.send_message("agent:who", json!({"text": "a", "user": {"id": "u2"}})).await;
    assert_eq!(a["user"]["id"], json!("u2"));
    let b = app.post("/channels/agent/who/message", &app.user("u1"), json!({"message": {"text": "b"}})).await.ok();
    assert_eq!(b["message"]["user"]["id"], json!("u1"));
}

#[tokio::test]
async fn replies_take_parent_id_bump_reply_count_and_show_in_the_channel_only_with_show_in_channel() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:thr";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    let p = app.say(cid, "u1", "parent").await;
    let r1 = app.send_message(cid, json!({"text": "r1", "user_id": "u2", "parent_id": p})).await;
    assert_eq!(r1["parent_id"], json!(p), "{r1}");
    assert_eq!(r1["type"], json!("reply"), "{r1}");
    let r2 = app.send_message(cid, json!({"text": "r2", "user_id": "u1", "parent_id": p, "show_in_channel": true})).await;
    assert_eq!(r2["show_in_channel"], json!(true));
    let st = app.state(cid, 100).await;
    let shown = ids(&st["messages"]);
    assert_eq!(shown, vec![p.clone(), r2["id"].as_str().unwrap().to_string()], "a reply without show_in_channel stays in its thread");
    assert_eq!(st["messages"][0]["reply_count"], json!(2), "{st}");
    let parts: Vec<&str> = st["messages"][0]["thread_participants"].as_array().unwrap().iter().map(|u| u["id"].as_str().unwrap()).collect();
    assert!(parts.contains(&"u1") && parts.contains(&"u2"), "{parts:?}");
    // A reply to a reply is refused.
    app.post(
        &format!("{}/message", channel_path(cid)),
        &app.server(),
        json!({"message": {"text": "x", "user_id": "u1", "parent_id": r1["id"]}}),
    )
    .await
    .err(400, 21);
}

#[tokio::test]
async fn replies_are_listed_oldest_first_and_paginate() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:rep";
    app.channel(cid, "u1", &["u1"]).await;
    let base = past_ns();
    let p = app.say_at(cid, "u1", "p", base).await;
    let r: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
    for (i, id) in r.iter().enumerate() {
        app.reply_at(cid, "u1", &p, id, base + (i as i64 + 1) * 1_000_000).await;
    }
    let all = app.get(&format!("/messages/{p}/replies"), &app.server()).await.ok();
    assert_eq!(ids(&all["messages"]), r);
    let last2 = app.get(&format!("/messages/{p}/replies?limit=2"), &app.server()).await.ok();
    assert_eq!(ids(&last2["messages"]), r[4..6].to_vec());
    let before = app.get(&format!("/messages/{p}/replies?limit=2&id_lt=r4"), &app.server()).await.ok();
    assert_eq!(ids(&before["messages"]), r[2..4].to_vec());
    let after = app.get(&format!("/messages/{p}/replies?limit=2&id_gt=r1"), &app.server()).await.ok();
    assert_eq!(ids(&after["messages"]), r[2..4].to_vec());
}

#[tokio::test]
async fn a_quoting_message_carries_the_quoted_message() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:quote";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "original").await;
    let b = app.send_message(cid, json!({"text": "quoting", "user_id": "u1", "quoted_message_id": a})).await;
    assert_eq!(b["quoted_message_id"], json!(a));
    assert_eq!(b["quoted_message"]["id"], json!(a), "{b}");
    assert_eq!(b["quoted_message"]["text"], json!("original"));
}

#[tokio::test]
async fn a_message_round_trips_attachments_mentions_silent_restricted_visibility_i18n_custom_and_created_at() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:rich";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    let at = past_ns();
    let sent = app
        .send_message(
            cid,
            json!({
                "id": "rich-1", "text": "hello @u2", "user_id": "u1",
                "attachments": [{"type": "image", "image_url": "https://example.com/a.png"}],
                "mentioned_users": ["u2"], "silent": true, "restricted_visibility": ["u2"],
                "i18n": {"language": "en", "fr_text": "bonjour"}, "tool_call": {"name": "search"},
                "mml": "<mml></mml>", "created_at": rfc3339(at)
            }),
        )
        .await;
    let got = app.get("/messages/rich-1", &app.server()).await.ok();
    let m = &got["message"];
    for m in [&sent, m] {
        assert_eq!(m["attachments"][0]["image_url"], json!("https://example.com/a.png"), "{m}");
        assert_eq!(m["mentioned_users"][0]["id"], json!("u2"), "mentioned users render as users: {m}");
        assert_eq!(m["silent"], json!(true));
        assert_eq!(m["restricted_visibility"], json!(["u2"]));
        assert_eq!(m["i18n"]["fr_text"], json!("bonjour"));
        assert_eq!(m["tool_call"]["name"], json!("search"));
        assert_eq!(m["mml"], json!("<mml></mml>"));
        assert_eq!(ts_of(&m["created_at"]), at, "a server-side created_at is kept");
    }
    assert_eq!(got["message"]["channel"]["cid"], json!(cid), "GET /messages carries the channel: {got}");
}

#[tokio::test]
async fn a_client_cannot_set_created_at() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:clock", "u1", &["u1"]).await;
    let at = past_ns();
    // Only server-side requests may set it (an import); a client's is refused, not ignored.
    app.post("/channels/agent/clock/message", &app.user("u1"), json!({"message": {"text": "x", "created_at": rfc3339(at)}}))
        .await
        .err(403, 17);
    assert!(app.state("agent:clock", 10).await["messages"].as_array().expect("messages").is_empty(), "nothing was stored");
}

#[tokio::test]
async fn a_full_message_update_replaces_it_and_a_partial_update_sets_and_unsets() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:edit";
    app.channel(cid, "u1", &["u1"]).await;
    let id =
        app.send_message(cid, json!({"text": "v1", "user_id": "u1", "color": "red", "size": 1})).await["id"].as_str().unwrap().to_string();
    let full = app
        .post(&format!("/messages/{id}"), &app.server(), json!({"message": {"text": "v2", "user_id": "u1", "color": "green"}}))
        .await
        .ok();
    assert_eq!(full["message"]["text"], json!("v2"), "{full}");
    assert_eq!(full["message"]["color"], json!("green"));
    assert!(full["message"]["message_text_updated_at"].is_string(), "{full}");
    let part = app
        .put(
            &format!("/messages/{id}"),
            &app.server(),
            json!({"set": {"text": "v3", "generating": false}, "unset": ["color"], "user_id": "u1"}),
        )
        .await
        .ok();
    let m = &part["message"];
    assert_eq!(m["text"], json!("v3"), "{part}");
    assert_eq!(m["generating"], json!(false));
    assert!(m.get("color").is_none(), "{part}");
    let got = app.get(&format!("/messages/{id}"), &app.server()).await.ok();
    assert_eq!(got["message"]["text"], json!("v3"));
    // A server-side change that names no acting user is made as the author: the pin is theirs.
    let anon = app.put(&format!("/messages/{id}"), &app.server(), json!({"set": {"text": "v4", "pinned": true}})).await.ok();
    assert_eq!(anon["message"]["text"], json!("v4"), "{anon}");
    assert_eq!(anon["message"]["user"]["id"], json!("u1"), "{anon}");
    assert_eq!(anon["message"]["pinned_by"]["id"], json!("u1"), "{anon}");
    app.put("/messages/no-such-message", &app.server(), json!({"set": {"text": "x"}})).await.err(404, 16);
    // A deleted message cannot be updated in full, server-side or not.
    let gone = app.say(cid, "u1", "to delete").await;
    app.delete(&format!("/messages/{gone}"), &app.server()).await.ok();
    for token in [app.server(), app.user("u1")] {
        app.post(&format!("/messages/{gone}"), &token, json!({"message": {"text": "back", "user_id": "u1"}})).await.err(400, 4);
    }
    // A message of a deleted channel is gone for a server-side change too.
    app.delete("/channels/agent/edit", &app.server()).await.ok();
    app.put(&format!("/messages/{id}"), &app.server(), json!({"set": {"text": "v5"}, "user_id": "u1"})).await.err(404, 16);
    app.post(&format!("/messages/{id}"), &app.server(), json!({"message": {"text": "v5", "user_id": "u1"}})).await.err(404, 16);
}

#[tokio::test]
async fn a_soft_deleted_message_becomes_type_deleted_and_a_hard_deleted_one_is_gone() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:del";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "a").await;
    let b = app.say(cid, "u1", "b").await;
    let r = app.delete(&format!("/messages/{a}"), &app.server()).await.ok();
    assert_eq!(r["message"]["type"], json!("deleted"), "{r}");
    assert!(r["message"]["deleted_at"].is_string(), "{r}");
    let r = app.delete(&format!("/messages/{b}?hard=true"), &app.server()).await.ok();
    assert!(r["message"].is_object(), "{r}");
    app.get(&format!("/messages/{b}"), &app.server()).await.err(404, 16);
    let st = app.state(cid, 10).await;
    assert_eq!(ids(&st["messages"]), vec![a.clone()]);
    assert_eq!(st["messages"][0]["type"], json!("deleted"));
}

#[tokio::test]
async fn reactions_are_added_and_removed_and_counted() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:react";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    let m = app.say(cid, "u1", "nice").await;
    let r = app.post(&format!("/messages/{m}/reaction"), &app.server(), json!({"reaction": {"type": "like", "user_id": "u1"}})).await.ok();
    assert_eq!(r["message"]["reaction_counts"]["like"], json!(1), "{r}");
    assert_eq!(r["reaction"]["type"], json!("like"));
    app.post(&format!("/messages/{m}/reaction"), &app.user("u2"), json!({"reaction": {"type": "like"}})).await.ok();
    app.post(&format!("/messages/{m}/reaction"), &app.user("u2"), json!({"reaction": {"type": "love"}})).await.ok();
    let got = app.get(&format!("/messages/{m}"), &app.server()).await.ok();
    assert_eq!(got["message"]["reaction_counts"], json!({"like": 2, "love": 1}), "{got}");
    assert_eq!(got["message"]["latest_reactions"].as_array().unwrap().len(), 3);
    let d = app.delete(&format!("/messages/{m}/reaction/like"), &app.user("u2")).await.ok();
    assert_eq!(d["message"]["reaction_counts"]["like"], json!(1), "{d}");
    let own = app.get(&format!("/messages/{m}"), &app.user("u2")).await.ok();
    let own_types: Vec<&str> = own["message"]["own_reactions"].as_array().unwrap().iter().map(|r| r["type"].as_str().unwrap()).collect();
    assert_eq!(own_types, vec!["love"], "{own}");
}

#[tokio::test]
async fn a_message_is_pinned_with_a_partial_update_and_listed_in_pinned_messages() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:pin";
    app.channel(cid, "u1", &["u1"]).await;
    let m = app.say(cid, "u1", "remember this").await;
    let r = app.put(&format!("/messages/{m}"), &app.server(), json!({"set": {"pinned": true}, "user_id": "u1"})).await.ok();
    assert_eq!(r["message"]["pinned"], json!(true), "{r}");
    assert!(r["message"]["pinned_at"].is_string(), "{r}");
    let st = app.state(cid, 10).await;
    assert_eq!(ids(&st["pinned_messages"]), vec![m.clone()], "{st}");
    app.put(&format!("/messages/{m}"), &app.server(), json!({"set": {"pinned": false}, "user_id": "u1"})).await.ok();
    assert_eq!(app.state(cid, 10).await["pinned_messages"], json!([]));
}

#[tokio::test]
async fn marking_a_channel_read_resets_the_members_unread_count() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:read";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    for t in ["a", "b", "c"] {
        app.say(cid, "u2", t).await;
    }
    let unread_of = |st: &Value, uid: &str| {
        st["read"].as_array().expect("read").iter().find(|r| r["user"]["id"] == json!(uid)).map(|r| r["unread_messages"].clone())
    };
    let before = app.post(&format!("{}/query", channel_path(cid)), &app.user("u1"), json!({"state": true})).await.ok();
    assert_eq!(unread_of(&before, "u1"), Some(json!(3)), "{before}");
    app.post(&format!("{}/read", channel_path(cid)), &app.user("u1"), json!({})).await.ok();
    let after = app.post(&format!("{}/query", channel_path(cid)), &app.user("u1"), json!({"state": true})).await.ok();
    assert_eq!(unread_of(&after, "u1"), Some(json!(0)), "{after}");
}

#[tokio::test]
async fn query_threads_lists_threads_with_their_latest_replies() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:threads";
    app.channel(cid, "u1", &["u1"]).await;
    let p = app.say(cid, "u1", "parent").await;
    app.say(cid, "u1", "no replies").await;
    app.send_message(cid, json!({"text": "r", "user_id": "u1", "parent_id": p})).await;
    let r = app.post("/threads", &app.server(), json!({"filter": {"channel_cid": {"$eq": cid}}, "user_id": "u1", "limit": 10})).await.ok();
    let threads = r["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 1, "{r}");
    assert_eq!(threads[0]["parent_message"]["id"], json!(p));
    assert_eq!(threads[0]["channel_cid"], json!(cid));
    assert_eq!(threads[0]["latest_replies"].as_array().unwrap().len(), 1);
    let mine = app.post("/threads", &app.user("u1"), json!({})).await.ok();
    assert_eq!(mine["threads"].as_array().unwrap().len(), 1, "{mine}");
}

// --- truncate and rewind -------------------------------------------------------------------------

#[tokio::test]
async fn truncate_hides_every_message_up_to_truncated_at_and_adds_the_system_message() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:trunc";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "a").await;
    let r = app
        .post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"message": {"text": "truncated", "user_id": "u1"}}))
        .await
        .ok();
    assert!(r["channel"]["truncated_at"].is_string(), "{r}");
    assert_eq!(r["message"]["type"], json!("system"), "{r}");
    let st = app.state(cid, 10).await;
    assert_eq!(ids(&st["messages"]), vec![r["message"]["id"].as_str().unwrap().to_string()], "{st}");
    // Soft truncation keeps the row but hides it from every read.
    app.get(&format!("/messages/{a}"), &app.server()).await.err(404, 16);
    let b = app.say(cid, "u1", "after").await;
    assert!(ids(&app.state(cid, 10).await["messages"]).contains(&b));
}

#[tokio::test]
async fn truncate_at_a_time_hides_only_older_messages_and_hard_delete_removes_them() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:trunc2";
    app.channel(cid, "u1", &["u1"]).await;
    let base = past_ns();
    let m = app.seed(cid, "u1", "t", 4, base, 1).await;
    app.post(
        &format!("{}/truncate", channel_path(cid)),
        &app.server(),
        json!({"truncated_at": rfc3339(base + 1_500_000), "hard_delete": true}),
    )
    .await
    .ok();
    assert_eq!(ids(&app.state(cid, 10).await["messages"]), m[2..4].to_vec());
    app.get(&format!("/messages/{}", m[0]), &app.server()).await.err(404, 16);
}

#[tokio::test]
async fn rewind_hides_everything_after_the_message_and_inclusive_hides_it_too() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:rew";
    app.channel(cid, "u1", &["u1"]).await;
    let base = past_ns();
    let m = app.seed(cid, "u1", "w", 6, base, 1).await;
    app.reply_at(cid, "u1", &m[1], "w-reply-late", base + 4_500_000).await;
    app.reply_at(cid, "u1", &m[1], "w-reply-early", base + 1_500_000).await;
    let r = app.rewind(cid, &m[3], &m[5], false).await.ok();
    assert!(r["channel"].is_object(), "{r}");
    assert_eq!(ids(&app.state(cid, 10).await["messages"]), m[..4].to_vec());
    app.get(&format!("/messages/{}", m[4]), &app.server()).await.err(404, 16);
    let replies = app.get(&format!("/messages/{}/replies", m[1]), &app.server()).await.ok();
    assert_eq!(ids(&replies["messages"]), vec!["w-reply-early"], "a reply created after the point is hidden too");
    app.rewind(cid, &m[2], &m[3], true).await.ok();
    assert_eq!(ids(&app.state(cid, 10).await["messages"]), m[..2].to_vec());
    // New messages after a rewind are visible again.
    let n = app.say(cid, "u1", "new").await;
    assert_eq!(ids(&app.state(cid, 10).await["messages"]), vec![m[0].clone(), m[1].clone(), n]);
}

#[tokio::test]
async fn rewind_with_a_stale_expected_last_message_id_is_a_409_rewind_conflict() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:rewc";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "a").await;
    let b = app.say(cid, "u1", "b").await;
    let _c = app.say(cid, "u1", "c").await;
    let body = app.rewind(cid, &a, &b, false).await.err_reason(409, 4, "rewind_conflict");
    assert!(body["message"].is_string());
    assert_eq!(app.state(cid, 10).await["messages"].as_array().unwrap().len(), 3, "nothing was hidden");
}

#[tokio::test]
async fn rewind_is_server_side_or_admin_only_and_agent_channels_only() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.user_with_role("boss", "admin").await;
    let cid = "agent:rewp";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "a").await;
    let b = app.say(cid, "u1", "b").await;
    let body = json!({"message_id": a, "expected_last_message_id": b});
    app.post(&format!("{}/rewind", channel_path(cid)), &app.user("u1"), body.clone()).await.err(403, 17);
    app.post(&format!("{}/rewind", channel_path(cid)), &app.user("boss"), body).await.ok();
    app.channel("messaging:plain", "u1", &["u1"]).await;
    let x = app.say("messaging:plain", "u1", "x").await;
    let y = app.say("messaging:plain", "u1", "y").await;
    app.rewind("messaging:plain", &x, &y, false).await.err(400, 4);
}

// --- moderation and membership ---------------------------------------------------------------

#[tokio::test]
async fn a_shadow_banned_users_new_messages_are_shadowed() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "troll"]).await;
    let cid = "agent:shadow";
    app.channel(cid, "u1", &["u1", "troll"]).await;
    let before = app.say(cid, "troll", "before").await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "troll", "shadow": true})).await.ok();
    let after = app.say(cid, "troll", "after").await;
    let got = app.get(&format!("/messages/{after}"), &app.server()).await.ok();
    assert_eq!(got["message"]["shadowed"], json!(true), "{got}");
    let seen_by_u1 =
        ids(&app.post(&format!("{}/query", channel_path(cid)), &app.user("u1"), json!({"state": true})).await.ok()["messages"]);
    assert_eq!(seen_by_u1, vec![before.clone()], "others do not see shadowed messages");
    let seen_by_troll =
        ids(&app.post(&format!("{}/query", channel_path(cid)), &app.user("troll"), json!({"state": true})).await.ok()["messages"]);
    assert_eq!(seen_by_troll, vec![before, after], "the author still sees them");
}

#[tokio::test]
async fn a_non_member_gets_403_reading_or_writing_a_channel() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "stranger"]).await;
    let cid = "agent:private";
    app.channel(cid, "u1", &["u1"]).await;
    let m = app.say(cid, "u1", "secret").await;
    let t = app.user("stranger");
    app.post(&format!("{}/query", channel_path(cid)), &t, json!({"state": true})).await.err(403, 17);
    app.post(&format!("{}/message", channel_path(cid)), &t, json!({"message": {"text": "let me in"}})).await.err(403, 17);
    app.get(&format!("/messages/{m}"), &t).await.err(403, 17);
    // A member can.
    app.post(&format!("{}/query", channel_path(cid)), &app.user("u1"), json!({"state": true})).await.ok();
    app.post(&format!("{}/message", channel_path(cid)), &app.user("u1"), json!({"message": {"text": "me"}})).await.ok();
}

#[tokio::test]
async fn a_user_cannot_send_as_someone_else() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    app.channel("agent:imp", "u1", &["u1", "u2"]).await;
    // Refused, not silently rewritten: the client asked for something it may not do.
    app.post("/channels/agent/imp/message", &app.user("u1"), json!({"message": {"text": "x", "user_id": "u2"}})).await.err(403, 17);
    app.post("/channels/agent/imp/message", &app.user("u1"), json!({"message": {"text": "x", "user": {"id": "u2"}}})).await.err(403, 17);
    assert!(app.state("agent:imp", 10).await["messages"].as_array().expect("messages").is_empty(), "nothing was stored");
    // Naming oneself is fine.
    let r = app.post("/channels/agent/imp/message", &app.user("u1"), json!({"message": {"text": "x", "user_id": "u1"}})).await.ok();
    assert_eq!(r["message"]["user"]["id"], json!("u1"), "{r}");
}

#[tokio::test]
async fn query_channels_filters_by_team_and_by_equality_on_custom_fields() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel_with("agent:t1", json!({"created_by_id": "u1", "team": "red", "tenant_id": "acme", "tier": 2})).await;
    app.channel_with("agent:t2", json!({"created_by_id": "u1", "team": "blue", "tenant_id": "acme", "tier": 3})).await;
    app.channel_with("agent:t3", json!({"created_by_id": "u1", "custom": {"tenant_id": "acme_x", "note": {"tenant_id": "other"}}})).await;
    app.channel_with("agent:t4", json!({"created_by_id": "u1", "custom": {"note": {"tenant_id": "acme"}, "tenant_id": "other"}})).await;
    let q = |filter: Value| {
        let app = &app;
        async move {
            let body = json!({"filter_conditions": filter, "sort": [{"field": "cid", "direction": 1}]});
            let r = app.post("/channels", &app.server(), body).await.ok();
            r["channels"].as_array().unwrap().iter().map(|c| c["channel"]["cid"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(q(json!({"team": "red"})).await, vec!["agent:t1"]);
    assert_eq!(q(json!({"team": {"$in": ["red", "blue"]}})).await, vec!["agent:t1", "agent:t2"]);
    assert_eq!(q(json!({"tenant_id": "acme"})).await, vec!["agent:t1", "agent:t2"], "an underscore in the value is not a wildcard");
    assert_eq!(q(json!({"tenant_id": {"$eq": "acme"}, "tier": 3})).await, vec!["agent:t2"]);
    assert_eq!(q(json!({"tier": 2})).await, vec!["agent:t1"]);
    assert_eq!(q(json!({"tenant_id": "nobody"})).await, Vec::<String>::new());
    assert_eq!(q(json!({"tenant_id": {"$gt": "acme"}})).await, vec!["agent:t3", "agent:t4"]);
    let body = app.post("/channels", &app.server(), json!({"filter_conditions": {"tenant_id": {"$regex": "a"}}})).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("tenant_id"), "the error names the field: {body}");
    assert!(body["message"].as_str().unwrap().contains("$regex"), "and the operator: {body}");
    let body = app.post("/channels", &app.server(), json!({"filter_conditions": {"$xor": []}})).await.err(400, 4);
    assert!(body["message"].as_str().unwrap().contains("$xor"), "{body}");
}

#[tokio::test]
async fn query_users_filters_with_streams_operators_and_sorts() {
    let app = TestApp::spawn().await;
    let token = app.server();
    app.post(
        "/users",
        &token,
        json!({"users": {
            "ann": {"id": "ann", "name": "Ann Lee", "role": "admin", "plan": "pro", "seats": 5},
            "bob": {"id": "bob", "name": "Bob Annis", "plan": "free", "seats": 1},
            "cy": {"id": "cy", "name": "Cy", "seats": 3},
        }}),
    )
    .await
    .ok();
    app.post("/moderation/ban", &token, json!({"target_user_id": "cy"})).await.ok();
    let q = |payload: Value| {
        let app = &app;
        async move {
            let url = reqwest::Url::parse_with_params("http://x/users", &[("payload", payload.to_string())]).unwrap();
            let path = format!("/users?{}", url.query().unwrap());
            let r = app.get(&path, &app.server()).await.ok();
            r["users"].as_array().unwrap().iter().map(|u| u["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(q(json!({"filter_conditions": {"id": {"$in": ["ann", "cy"]}}})).await, vec!["ann", "cy"]);
    assert_eq!(q(json!({"filter_conditions": {"role": "admin"}})).await, vec!["ann"]);
    assert_eq!(q(json!({"filter_conditions": {"name": {"$autocomplete": "ann"}}})).await, vec!["ann", "bob"]);
    assert_eq!(q(json!({"filter_conditions": {"banned": true}})).await, vec!["cy"]);
    assert_eq!(q(json!({"filter_conditions": {"plan": {"$exists": false}, "id": {"$in": ["ann", "bob", "cy"]}}})).await, vec!["cy"]);
    assert_eq!(
        q(json!({"filter_conditions": {"seats": {"$gte": 3}}, "sort": [{"field": "seats", "direction": -1}]})).await,
        vec!["ann", "cy"]
    );
    let body =
        app.get("/users?payload=%7B%22filter_conditions%22%3A%7B%22id%22%3A%7B%22%24like%22%3A%22a%22%7D%7D%7D", &token).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("id"), "{body}");
}

#[tokio::test]
async fn replies_accept_the_sort_forms_of_js_and_getstream_and_a_descending_sort_lists_newest_first() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:repsort";
    app.channel(cid, "u1", &["u1"]).await;
    let base = past_ns();
    let p = app.say_at(cid, "u1", "p", base).await;
    let r: Vec<String> = (0..3).map(|i| format!("rs{i}")).collect();
    for (i, id) in r.iter().enumerate() {
        app.reply_at(cid, "u1", &p, id, base + (i as i64 + 1) * 1_000_000).await;
    }
    let mut newest_first = r.clone();
    newest_first.reverse();
    // JS: a URL-encoded JSON array.
    let js = "%5B%7B%22field%22%3A%22created_at%22%2C%22direction%22%3A-1%7D%5D";
    let got = app.get(&format!("/messages/{p}/replies?sort={js}"), &app.server()).await.ok();
    assert_eq!(ids(&got["messages"]), newest_first);
    // getstream: each object percent-encoded on its own, and the whole value encoded again.
    let gs = "%257B%2522direction%2522%253A%25201%252C%2520%2522field%2522%253A%2520%2522created_at%2522%257D";
    let got = app.get(&format!("/messages/{p}/replies?sort={gs}"), &app.server()).await.ok();
    assert_eq!(ids(&got["messages"]), r);
    // Stream sorts replies on created_at only: another field is a 400 that names it.
    let bad = app.get(&format!("/messages/{p}/replies?sort=%5B%7B%22field%22%3A%22text%22%7D%5D"), &app.server()).await.err(400, 4);
    assert_eq!(bad["exception_fields"]["field"], json!("text"), "{bad}");
    assert!(bad["message"].as_str().unwrap_or_default().contains("\"text\""), "{bad}");
    // JS's object form {created_at: -1}.
    let obj = "%5B%7B%22created_at%22%3A-1%7D%5D";
    let got = app.get(&format!("/messages/{p}/replies?sort={obj}"), &app.server()).await.ok();
    assert_eq!(ids(&got["messages"]), newest_first);
}

#[tokio::test]
async fn an_admin_may_send_a_message_as_another_user_and_that_user_is_its_author() {
    let app = TestApp::spawn().await;
    app.users(&["agent-bot", "plain"]).await;
    app.user_with_role("boss", "admin").await;
    app.channel("agent:behalf", "boss", &["boss", "agent-bot", "plain"]).await;
    let path = format!("{}/message", channel_path("agent:behalf"));
    let m = app.post(&path, &app.user("boss"), json!({"message": {"text": "as the bot", "user_id": "agent-bot"}})).await.ok();
    assert_eq!(m["message"]["user"]["id"], json!("agent-bot"), "{m}");
    let stored = app.get(&format!("/messages/{}", m["message"]["id"].as_str().unwrap()), &app.server()).await.ok();
    assert_eq!(stored["message"]["user"]["id"], json!("agent-bot"), "{stored}");
    app.post(&path, &app.user("plain"), json!({"message": {"text": "as the bot", "user_id": "agent-bot"}})).await.err(403, 17);
}
