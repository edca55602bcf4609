//! Fork, paragraph by paragraph and error row by error row of the fork document
//! (as `docs/fork.md` and the README record it), and the decisions in `docs/fork.md`.

use crate::helpers::*;
use futures_util::future::join_all;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A source `agent:{id}` created by `u1` with members `u1`, `u2`, and `n` top-level messages
/// one millisecond apart in the past; returns their ids oldest first.
async fn source(app: &Client, id: &str, n: usize) -> Vec<String> {
    app.users(&["u1", "u2"]).await;
    let cid = format!("agent:{id}");
    app.channel(&cid, "u1", &["u1", "u2"]).await;
    app.seed(&cid, "u1", id, n, past_ns(), 8).await
}

fn map_of(pairs: &[(String, String)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<Map<_, _>>())
}

fn copies(fork_cid: &str, source_ids: &[String]) -> Vec<String> {
    source_ids.iter().map(|s| copy_id(fork_cid, s)).collect()
}

/// The finished fork `fork_cid` of `source_cid` at `point` holds exactly the source's messages up
/// to and including `point`, oldest first, each under the copy id of its source message (v5 of
/// the fork cid and the source message's id, which for a fork of a fork is itself a copy id),
/// with the source message's text, author and `created_at`; the lookup endpoint maps each
/// source id to the same copy id.
async fn assert_copies_of(app: &Client, fork_cid: &str, source_cid: &str, point: &str) {
    let source = app.all_messages(source_cid).await;
    let upto = source.iter().position(|m| m["id"] == json!(point)).unwrap_or_else(|| panic!("{point} is not in {source_cid}")) + 1;
    let source = &source[..upto];
    let source_ids = ids(&Value::Array(source.to_vec()));
    let fork = app.all_messages(fork_cid).await;
    assert_eq!(
        ids(&Value::Array(fork.clone())),
        copies(fork_cid, &source_ids),
        "{fork_cid}: one copy per message of {source_cid}, in order"
    );
    for (copy, original) in fork.iter().zip(source) {
        for field in ["text", "created_at"] {
            assert_eq!(copy[field], original[field], "{fork_cid}: {field} of the copy of {}", original["id"]);
        }
        assert_eq!(copy["user"]["id"], original["user"]["id"], "{fork_cid}: author of the copy of {}", original["id"]);
    }
    for chunk in source_ids.chunks(1000) {
        let map = app.lookup(fork_cid, &app.server(), chunk).await.ok()["message_id_map"].clone();
        let expected: Vec<(String, String)> = chunk.iter().map(|s| (s.clone(), copy_id(fork_cid, s))).collect();
        assert_eq!(map, map_of(&expected), "{fork_cid}: the lookup names the copy ids");
    }
}

// --- the response -------------------------------------------------------------------------------

#[tokio::test]
async fn the_fork_response_is_the_fork_channel_state_plus_a_fork_object_with_the_message_id_map() {
    let app = TestApp::spawn().await;
    let m = source(&app, "src", 3).await;
    let r = app.fork("agent:src", &m[2], "branch").await.ok();
    assert_eq!(r["channel"]["cid"], json!("agent:branch"), "{r}");
    assert_eq!(r["channel"]["type"], json!("agent"));
    assert_eq!(ids(&r["messages"]), copies("agent:branch", &m), "the copies, oldest first");
    assert_eq!(member_ids(&r), vec!["u1", "u2"]);
    let f = &r["fork"];
    assert_eq!(f["channel_cid"], json!("agent:branch"), "{f}");
    assert_eq!(f["source_channel_cid"], json!("agent:src"));
    assert_eq!(f["source_message_id"], json!(m[2]));
    assert_eq!(f["status"], json!("completed"), "a short history is copied by the request: {f}");
    assert_eq!(f["copied_message_count"], json!(3));
    assert!(f["created_at"].is_string(), "{f}");
    let expected: Vec<(String, String)> = m.iter().map(|s| (s.clone(), copy_id("agent:branch", s))).collect();
    assert_eq!(f["message_id_map"], map_of(&expected));
    assert!(f.get("truncated").is_none(), "truncated is omitted on a fork that is not truncated: {f}");
    assert!(f.get("oldest_source_message_id").is_none(), "{f}");
    assert!(f.get("failed_reason").is_none(), "{f}");
    // The channel object carries the same summary without the map.
    let summary = &r["channel"]["fork"];
    assert_eq!(summary["status"], json!("completed"), "{summary}");
    assert_eq!(summary["source_message_id"], json!(m[2]));
    assert!(summary.get("message_id_map").is_none(), "{summary}");
    assert!(r["duration"].is_string());
}

#[tokio::test]
async fn copy_ids_are_version_5_uuids_of_the_fork_cid_and_the_source_message_id() {
    let app = TestApp::spawn().await;
    let m = source(&app, "ids", 2).await;
    let r = app.fork("agent:ids", &m[1], "ids-fork").await.ok();
    for s in &m {
        let id = r["fork"]["message_id_map"][s].as_str().expect("mapped").to_string();
        let u = uuid::Uuid::parse_str(&id).expect("a uuid");
        assert_eq!(u.get_version_num(), 5, "{id}");
        assert_eq!(id, uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, format!("offshoot:fork:agent:ids-fork:{s}").as_bytes()).to_string());
        let got = app.get(&format!("/messages/{id}"), &app.server()).await.ok();
        assert_eq!(got["message"]["cid"], json!("agent:ids-fork"));
    }
}

// --- what is copied -----------------------------------------------------------------------------

#[tokio::test]
async fn the_fork_copies_messages_up_to_and_including_the_fork_point_and_the_source_is_not_changed() {
    let app = TestApp::spawn().await;
    let m = source(&app, "upto", 6).await;
    let before = app.all_messages("agent:upto").await;
    let r = app.fork("agent:upto", &m[3], "upto-fork").await.ok();
    assert_eq!(r["fork"]["copied_message_count"], json!(4));
    let fork_msgs = app.all_messages("agent:upto-fork").await;
    assert_eq!(ids(&Value::Array(fork_msgs)), copies("agent:upto-fork", &m[..4]));
    let after = app.all_messages("agent:upto").await;
    assert_eq!(before, after, "the source is not changed");
    let st = app.state("agent:upto", 1).await;
    assert!(st["channel"].get("fork").is_none(), "the source is not a fork: {st}");
    // Both channels continue on their own.
    let s_new = app.say("agent:upto", "u1", "source goes on").await;
    let f_new = app.say("agent:upto-fork", "u1", "fork goes on").await;
    assert!(!ids(&Value::Array(app.all_messages("agent:upto-fork").await)).contains(&s_new));
    assert!(!ids(&Value::Array(app.all_messages("agent:upto").await)).contains(&f_new));
}

#[tokio::test]
async fn deleted_shadowed_rewound_and_truncated_messages_and_replies_of_uncopied_parents_are_left_out() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "troll"]).await;
    let cid = "agent:leftout";
    app.channel(cid, "u1", &["u1", "troll"]).await;
    let t = past_ns();
    let ms = 1_000_000;
    let old = app.say_at(cid, "u1", "old", t).await; // truncated away
    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"truncated_at": rfc3339(t + ms / 2)})).await.ok();
    let keep1 = app.say_at(cid, "u1", "keep1", t + ms).await;
    let deleted = app.say_at(cid, "u1", "deleted", t + 2 * ms).await;
    let deleted_reply = app.reply_at(cid, "u1", &deleted, "reply-of-deleted", t + 3 * ms).await;
    let kept_reply = app.reply_at(cid, "u1", &keep1, "reply-of-keep1", t + 4 * ms).await;
    let deleted_own_reply = app.reply_at(cid, "u1", &keep1, "deleted-reply", t + 5 * ms).await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "troll", "shadow": true})).await.ok();
    let shadowed = app.say_at(cid, "troll", "shadowed", t + 6 * ms).await;
    let point = app.say_at(cid, "u1", "point", t + 7 * ms).await;
    let after_point_reply = app.reply_at(cid, "u1", &keep1, "late-reply", t + 8 * ms).await;
    let hidden = app.say_at(cid, "u1", "hidden", t + 9 * ms).await;
    let last = app.say_at(cid, "u1", "last", t + 10 * ms).await;
    for id in [&deleted, &deleted_own_reply] {
        app.delete(&format!("/messages/{id}"), &app.server()).await.ok();
    }
    app.rewind(cid, &hidden, &last, true).await.ok();
    let r = app.fork(cid, &point, "leftout-fork").await.ok();
    let mut copied: Vec<String> = r["fork"]["message_id_map"].as_object().unwrap().keys().cloned().collect();
    copied.sort();
    let mut expected = vec![keep1.clone(), kept_reply.clone(), point.clone()];
    expected.sort();
    assert_eq!(copied, expected, "only visible messages up to the point, and replies of copied parents");
    assert_eq!(r["fork"]["copied_message_count"], json!(3));
    let lookup = app
        .lookup(
            "agent:leftout-fork",
            &app.server(),
            &[old, deleted, deleted_reply, deleted_own_reply, shadowed, after_point_reply, hidden, last, keep1.clone()],
        )
        .await
        .ok();
    assert_eq!(lookup["message_id_map"].as_object().unwrap().len(), 1, "only keep1 has a copy: {lookup}");
    let k = app.get(&format!("/messages/{}", copy_id("agent:leftout-fork", &keep1)), &app.server()).await.ok();
    assert_eq!(k["message"]["reply_count"], json!(1), "reply_count counts copied replies: {k}");
}

#[tokio::test]
async fn each_copy_keeps_its_fields_and_points_parent_and_quote_at_the_copies() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "agent"]).await;
    let cid = "agent:fields";
    app.channel(cid, "u1", &["u1", "u2", "agent"]).await;
    let t = past_ns();
    let ms = 1_000_000;
    app.send_message(cid, json!({"id": "sys", "type": "system", "text": "started", "user_id": "u1", "created_at": rfc3339(t)})).await;
    app.send_message(
        cid,
        json!({
            "id": "rich", "text": "hello @u2", "user_id": "agent", "created_at": rfc3339(t + ms),
            "attachments": [{"type": "file", "asset_url": "https://files.example/a.pdf"}],
            "mentioned_users": ["u2"], "silent": true, "restricted_visibility": ["u2"],
            "i18n": {"language": "en", "de_text": "hallo"}, "tool": {"name": "search", "args": [1, 2]},
            "mml": "<mml>x</mml>", "command": "giphy", "ai_generated": true
        }),
    )
    .await;
    app.send_message(cid, json!({"id": "parent", "text": "question", "user_id": "u1", "created_at": rfc3339(t + 2 * ms)})).await;
    app.send_message(
        cid,
        json!({"id": "r1", "text": "in thread", "user_id": "agent", "parent_id": "parent", "created_at": rfc3339(t + 3 * ms)}),
    )
    .await;
    app.send_message(cid, json!({"id": "r2", "text": "also shown", "user_id": "u2", "parent_id": "parent", "show_in_channel": true, "created_at": rfc3339(t + 4 * ms)})).await;
    app.send_message(
        cid,
        json!({"id": "quoting", "text": "as I said", "user_id": "u1", "quoted_message_id": "rich", "created_at": rfc3339(t + 5 * ms)}),
    )
    .await;
    let src: Vec<Value> = futures_util::future::join_all(["sys", "rich", "parent", "r1", "r2", "quoting"].map(|id| {
        let app = &app;
        async move { app.get(&format!("/messages/{id}"), &app.server()).await.ok()["message"].clone() }
    }))
    .await;
    // A later edit sets updated_at apart from created_at, and it must be copied as it is.
    app.put("/messages/parent", &app.server(), json!({"set": {"text": "question (edited)"}, "user_id": "u1"})).await.ok();
    let parent_src = app.get("/messages/parent", &app.server()).await.ok()["message"].clone();

    let r = app.fork(cid, "quoting", "fields-fork").await.ok();
    assert_eq!(r["fork"]["copied_message_count"], json!(6), "{r}");
    let fc = "agent:fields-fork";
    let get = |id: &str| {
        let app = &app;
        let id = copy_id(fc, id);
        async move { app.get(&format!("/messages/{id}"), &app.server()).await.ok()["message"].clone() }
    };
    for s in src.iter().filter(|s| s["id"] != json!("parent")).chain(std::iter::once(&parent_src)) {
        let sid = s["id"].as_str().unwrap();
        let c = get(sid).await;
        assert_eq!(c["cid"], json!(fc));
        for key in [
            "text",
            "html",
            "type",
            "silent",
            "restricted_visibility",
            "i18n",
            "mml",
            "command",
            "tool",
            "ai_generated",
            "attachments",
            "show_in_channel",
        ] {
            assert_eq!(c.get(key), s.get(key), "{sid}: {key} is copied\nsource {s}\ncopy {c}");
        }
        assert_eq!(c["user"]["id"], s["user"]["id"], "{sid}: the author is kept");
        assert_eq!(ts_of(&c["created_at"]), ts_of(&s["created_at"]), "{sid}: created_at is kept");
        assert_eq!(ts_of(&c["updated_at"]), ts_of(&s["updated_at"]), "{sid}: updated_at is kept");
        let mentioned = |m: &Value| m["mentioned_users"].as_array().unwrap().iter().map(|u| u["id"].clone()).collect::<Vec<_>>();
        assert_eq!(mentioned(&c), mentioned(s), "{sid}: mentions are kept");
    }
    assert_eq!(get("sys").await["type"], json!("system"));
    assert_eq!(get("r1").await["parent_id"], json!(copy_id(fc, "parent")), "parent_id points to the copy");
    assert_eq!(get("r1").await["type"], json!("reply"));
    let quoting = get("quoting").await;
    assert_eq!(quoting["quoted_message_id"], json!(copy_id(fc, "rich")), "quoted_message_id points to the copy");
    assert_eq!(quoting["quoted_message"]["id"], json!(copy_id(fc, "rich")), "{quoting}");
    let parent = get("parent").await;
    assert_eq!(parent["reply_count"], json!(2), "{parent}");
    assert_eq!(parent["text"], json!("question (edited)"));
    let replies = app.get(&format!("/messages/{}/replies", copy_id(fc, "parent")), &app.server()).await.ok();
    assert_eq!(ids(&replies["messages"]), copies(fc, &["r1".to_string(), "r2".to_string()]));
    // Threads are copied with their replies, so Query Threads lists them in the fork.
    let threads = app.post("/threads", &app.server(), json!({"filter": {"channel_cid": {"$eq": fc}}, "user_id": "u1"})).await.ok();
    let t: Vec<&Value> = threads["threads"].as_array().unwrap().iter().collect();
    assert_eq!(t.len(), 1, "{threads}");
    assert_eq!(t[0]["parent_message"]["id"], json!(copy_id(fc, "parent")));
    assert_eq!(ids(&t[0]["latest_replies"]), copies(fc, &["r1".to_string(), "r2".to_string()]));
    // The main list shows top-level messages and the reply shown in the channel.
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &["sys", "rich", "parent", "r2", "quoting"].map(String::from)));
}

#[tokio::test]
async fn reactions_and_pins_are_not_copied_and_copied_messages_are_not_unread() {
    let app = TestApp::spawn().await;
    let m = source(&app, "react", 3).await;
    app.post(&format!("/messages/{}/reaction", m[0]), &app.server(), json!({"reaction": {"type": "like", "user_id": "u2"}})).await.ok();
    app.put(&format!("/messages/{}", m[1]), &app.server(), json!({"set": {"pinned": true}, "user_id": "u1"})).await.ok();
    app.fork("agent:react", &m[2], "react-fork").await.ok();
    let st = app.post("/channels/agent/react-fork/query", &app.user("u2"), json!({"state": true})).await.ok();
    assert_eq!(ids(&st["messages"]), copies("agent:react-fork", &m), "the fork holds a copy of every message: {st}");
    for msg in st["messages"].as_array().unwrap() {
        assert_eq!(msg["reaction_counts"], json!({}), "reactions are not copied: {msg}");
        assert_eq!(msg["latest_reactions"], json!([]));
        assert_eq!(msg["pinned"], json!(false), "pins are not copied: {msg}");
    }
    assert_eq!(st["pinned_messages"], json!([]));
    let read =
        st["read"].as_array().expect("read state").iter().find(|r| r["user"]["id"] == json!("u2")).cloned().expect("u2's read state");
    assert_eq!(read["unread_messages"], json!(0), "copies keep their created_at, before the members joined: {read}");
}

#[tokio::test]
async fn exclude_attachments_drops_the_attachments_of_every_copy() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:att";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app
        .send_message(cid, json!({"text": "file", "user_id": "u1", "attachments": [{"type": "image", "image_url": "https://x/y.png"}]}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let with = app.fork(cid, &a, "att-with").await.ok();
    assert_eq!(with["messages"][0]["attachments"][0]["image_url"], json!("https://x/y.png"), "attachments are copied as they are: {with}");
    let without = app.fork_with(cid, json!({"message_id": a, "channel": {"id": "att-without"}, "exclude_attachments": true})).await.ok();
    assert_eq!(without["messages"][0]["attachments"], json!([]), "{without}");
    assert_eq!(without["messages"][0]["text"], json!("file"));
}

#[tokio::test]
async fn a_quote_of_a_message_that_was_not_copied_returns_no_quoted_message() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:qnc";
    app.channel(cid, "u1", &["u1"]).await;
    let a = app.say(cid, "u1", "to be deleted").await;
    let b =
        app.send_message(cid, json!({"text": "quote", "user_id": "u1", "quoted_message_id": a})).await["id"].as_str().unwrap().to_string();
    app.delete(&format!("/messages/{a}"), &app.server()).await.ok();
    let r = app.fork(cid, &b, "qnc-fork").await.ok();
    assert_eq!(r["fork"]["copied_message_count"], json!(1));
    let c = app.get(&format!("/messages/{}", copy_id("agent:qnc-fork", &b)), &app.server()).await.ok();
    assert_eq!(c["message"]["quoted_message_id"], json!(copy_id("agent:qnc-fork", &a)), "{c}");
    assert!(c["message"].get("quoted_message").is_none() || c["message"]["quoted_message"].is_null(), "{c}");
}

// --- the newest page and the background copy ----------------------------------------------------

#[tokio::test]
async fn the_request_copies_the_newest_100_top_level_messages_and_100_replies_and_the_rest_is_backfilled() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:long";
    app.channel(cid, "u1", &["u1"]).await;
    let t = past_ns();
    let top: Vec<String> = app.seed(cid, "u1", "top", 130, t, 8).await; // 1 ms apart
    let parent = top[125].clone();
    let replies: Vec<String> = (0..120).map(|j| format!("rep-{j:03}")).collect();
    let bodies = replies
        .iter()
        .enumerate()
        .map(|(j, id)| json!({"id": id, "text": "r", "user_id": "u1", "parent_id": parent, "created_at": rfc3339(t + 125 * 1_000_000 + (j as i64 + 1) * 5_000)}))
        .collect();
    app.send_many(cid, bodies, 8).await;
    let fc = "agent:long-fork";
    let r = app.fork(cid, &top[129], "long-fork").await.ok();
    let f = &r["fork"];
    let map = f["message_id_map"].as_object().unwrap();
    let mut expected: Vec<&String> = top[30..].iter().chain(replies[20..].iter()).collect();
    expected.sort();
    let mut got: Vec<&String> = map.keys().collect();
    got.sort();
    assert_eq!(got, expected, "the newest 100 top-level messages and the newest 100 of their replies");
    assert!(f["status"] == json!("backfilling") || f["status"] == json!("completed"), "{f}");
    if f["status"] == json!("backfilling") {
        assert_eq!(f["copied_message_count"], json!(0), "set once the fork is completed: {f}");
        assert!(f["task_id"].is_string(), "a backfilling fork names its task: {f}");
    }
    // Usable at once: the latest history is there.
    let st = app.state(fc, 100).await;
    assert_eq!(ids(&st["messages"]), copies(fc, &top[30..]));
    let done = app.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(250), "{done}");
    assert!(done.get("truncated").is_none(), "{done}");
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &top));
    let rep = app.get(&format!("/messages/{}/replies?limit=300", copy_id(fc, &parent)), &app.server()).await.ok();
    assert_eq!(ids(&rep["messages"]), copies(fc, &replies));
    let p = app.get(&format!("/messages/{}", copy_id(fc, &parent)), &app.server()).await.ok();
    assert_eq!(p["message"]["reply_count"], json!(120));
}

#[tokio::test]
async fn a_backfilling_fork_reports_its_task_and_completes_with_the_exact_count() {
    let app = TestApp::spawn_without_worker().await;
    let m = source(&app, "task", 105).await;
    let fc = "agent:task-fork";
    let r = app.fork("agent:task", &m[104], "task-fork").await.ok();
    let f = &r["fork"];
    assert_eq!(f["status"], json!("backfilling"), "{f}");
    assert_eq!(f["copied_message_count"], json!(0), "{f}");
    assert_eq!(f["message_id_map"].as_object().unwrap().len(), 100);
    let task_id = f["task_id"].as_str().expect("task_id").to_string();
    assert_eq!(r["channel"]["fork"]["task_id"], json!(task_id));
    let task = app.get(&format!("/tasks/{task_id}"), &app.server()).await.ok();
    assert_eq!(task["task_id"], json!(task_id), "{task}");
    assert!(task["status"] == json!("pending") || task["status"] == json!("running"), "{task}");
    assert!(task["created_at"].is_string(), "{task}");
    let summary = app.fork_summary(fc).await;
    assert_eq!(summary["status"], json!("backfilling"), "{summary}");
    // The older page is not there yet.
    assert_eq!(app.all_messages(fc).await.len(), 100);
    // A retry while backfilling returns the fork as it is, with the first page's map.
    let again = app.fork("agent:task", &m[104], "task-fork").await.ok();
    assert_eq!(again["fork"]["status"], json!("backfilling"));
    assert_eq!(again["fork"]["message_id_map"], f["message_id_map"]);

    let _worker = app.start_worker().await;
    let done = app.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(105), "{done}");
    let task = app.get(&format!("/tasks/{task_id}"), &app.server()).await.ok();
    assert_eq!(task["status"], json!("completed"), "{task}");
    let v2 = app.get(&format!("/api/v2/tasks/{task_id}"), &app.server()).await.ok();
    assert_eq!(v2["status"], json!("completed"), "{v2}");
    assert!(v2["created_at"].is_i64(), "{v2}");
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &m));
    app.get("/tasks/no-such-task", &app.server()).await.err(404, 16);
}

#[tokio::test]
async fn a_fork_of_more_than_10000_messages_holds_the_newest_10000_counting_replies_and_is_marked_truncated() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:huge";
    app.channel(cid, "u1", &["u1"]).await;
    let t = past_ns();
    let m = app.seed(cid, "u1", "h", 10_000, t, 16).await; // 1 ms apart
                                                           // 50 replies in the middle of the history: 10,050 visible messages in all.
    let replies: Vec<String> = (0..50).map(|j| format!("hr-{j:02}")).collect();
    let bodies = replies
        .iter()
        .enumerate()
        .map(|(j, id)| json!({"id": id, "text": "r", "user_id": "u1", "parent_id": m[5000], "created_at": rfc3339(t + 5000 * 1_000_000 + (j as i64 + 1) * 10_000)}))
        .collect();
    app.send_many(cid, bodies, 16).await;
    let fc = "agent:huge-fork";
    let r = app.fork(cid, &m[9_999], "huge-fork").await.ok();
    assert_eq!(r["fork"]["message_id_map"].as_object().unwrap().len(), 100);
    let done = app.wait_fork_finished_within(fc, Duration::from_secs(300)).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["truncated"], json!(true), "{done}");
    assert_eq!(done["oldest_source_message_id"], json!(m[50]), "replies count toward the cap: {done}");
    assert_eq!(done["copied_message_count"], json!(10_000), "{done}");
    let mut mapped = 0;
    for chunk in m.chunks(1000).chain(std::iter::once(&replies[..])) {
        let look = app.lookup(fc, &app.server(), chunk).await.ok();
        let map = look["message_id_map"].as_object().unwrap();
        for (k, v) in map {
            assert_eq!(v, &json!(copy_id(fc, k)));
        }
        mapped += map.len();
    }
    assert_eq!(mapped, 10_000, "exactly the newest 10,000 have copies");
    let look = app.lookup(fc, &app.server(), &m[49..51]).await.ok();
    assert_eq!(
        look["message_id_map"].as_object().unwrap().keys().collect::<Vec<_>>(),
        vec![&m[50]],
        "the older history stays in the source"
    );
    assert_eq!(app.state(fc, 1).await["channel"]["message_count"], json!(10_000));
    let p = app.get(&format!("/messages/{}", copy_id(fc, &m[5000])), &app.server()).await.ok();
    assert_eq!(p["message"]["reply_count"], json!(50), "{p}");
}

// --- the message id lookup ---------------------------------------------------------------------------

#[tokio::test]
async fn a_member_can_look_up_copies_client_side_and_unknown_ids_are_left_out() {
    let app = TestApp::spawn().await;
    let m = source(&app, "look", 3).await;
    app.users(&["outsider"]).await;
    app.fork("agent:look", &m[1], "look-fork").await.ok();
    let asked = vec![m[0].clone(), m[1].clone(), m[2].clone(), "never-existed".to_string()];
    let r = app.lookup("agent:look-fork", &app.user("u2"), &asked).await.ok();
    let expected: Vec<(String, String)> = m[..2].iter().map(|s| (s.clone(), copy_id("agent:look-fork", s))).collect();
    assert_eq!(r["message_id_map"], map_of(&expected), "{r}");
    app.lookup("agent:look-fork", &app.user("outsider"), &asked).await.err(403, 17);
}

#[tokio::test]
async fn the_lookup_takes_up_to_1000_ids_and_refuses_more() {
    let app = TestApp::spawn().await;
    let m = source(&app, "lk", 2).await;
    app.fork("agent:lk", &m[1], "lk-fork").await.ok();
    let mut many: Vec<String> = (0..999).map(|i| format!("x{i}")).collect();
    many.push(m[0].clone());
    let r = app.lookup("agent:lk-fork", &app.server(), &many).await.ok();
    assert_eq!(r["message_id_map"].as_object().unwrap().len(), 1);
    many.push("one-too-many".into());
    app.lookup("agent:lk-fork", &app.server(), &many).await.err(400, 4);
}

// --- retries and limits -------------------------------------------------------------------------------

#[tokio::test]
async fn a_retry_with_the_same_channel_id_and_message_id_returns_the_existing_fork() {
    let app = TestApp::spawn().await;
    let m = source(&app, "retry", 3).await;
    let first = app.fork("agent:retry", &m[2], "retry-fork").await.ok();
    app.say("agent:retry-fork", "u1", "written in the fork").await;
    let second = app.fork("agent:retry", &m[2], "retry-fork").await.ok();
    assert_eq!(second["fork"]["message_id_map"], first["fork"]["message_id_map"]);
    assert_eq!(second["fork"]["created_at"], first["fork"]["created_at"]);
    assert_eq!(second["channel"]["created_at"], first["channel"]["created_at"]);
    assert_eq!(second["fork"]["status"], json!("completed"));
    assert_eq!(app.all_messages("agent:retry-fork").await.len(), 4, "nothing was copied twice");
}

#[tokio::test]
async fn concurrent_identical_fork_requests_make_one_fork() {
    let app = TestApp::spawn().await;
    let m = source(&app, "race", 20).await;
    let results = join_all((0..10).map(|_| app.fork("agent:race", &m[19], "race-fork"))).await;
    let mut maps = HashSet::new();
    for r in results {
        let body = r.ok();
        assert_eq!(body["fork"]["channel_cid"], json!("agent:race-fork"));
        maps.insert(body["fork"]["message_id_map"].to_string());
    }
    assert_eq!(maps.len(), 1, "every answer names the same copies");
    assert_eq!(ids(&Value::Array(app.all_messages("agent:race-fork").await)), copies("agent:race-fork", &m));
    let lineage = app.get("/channels/agent/race/forks", &app.server()).await.ok();
    assert_eq!(lineage["forks"].as_array().expect("forks").len(), 1, "{lineage}");
}

#[tokio::test]
async fn of_150_concurrent_forks_of_one_source_exactly_100_succeed_and_the_rest_are_too_many_forks() {
    let app = TestApp::spawn().await;
    let m = source(&app, "many", 2).await;
    let results = join_all((0..150).map(|i| {
        let app = &app;
        let target = format!("many-{i:03}");
        let point = m[1].clone();
        async move { app.fork("agent:many", &point, &target).await }
    }))
    .await;
    let mut ok = 0;
    for r in results {
        if r.status == 200 {
            ok += 1;
            assert_eq!(r.body["fork"]["status"], json!("completed"));
        } else {
            let body = r.err_reason(400, 130, "too_many_forks");
            assert_eq!(body["exception_fields"]["limit"], json!("100"), "{body}");
        }
    }
    assert_eq!(ok, 100);
}

#[tokio::test]
async fn failed_forks_and_hard_deleted_forks_do_not_count_toward_the_limit_of_100() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:slots";
    app.channel(cid, "u1", &["u1"]).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 8000})).await.ok();
    let small = app.say(cid, "u1", "small").await;
    let big = app.say(cid, "u1", &"x".repeat(6000)).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 5000})).await.ok();
    let failed = app.fork(cid, &big, "slot-failed").await.ok();
    assert_eq!(failed["fork"]["status"], json!("failed"), "{failed}");
    let results = join_all((0..100).map(|i| {
        let app = &app;
        let (target, point) = (format!("slot-{i:03}"), small.clone());
        async move { app.fork(cid, &point, &target).await }
    }))
    .await;
    assert!(results.iter().all(|r| r.status == 200), "a failed fork does not take a slot");
    app.fork(cid, &small, "slot-extra").await.err_reason(400, 130, "too_many_forks");
    app.delete("/channels/agent/slot-042?hard_delete=true", &app.server()).await.ok();
    app.fork(cid, &small, "slot-extra").await.ok();
    app.fork(cid, &small, "slot-extra-2").await.err_reason(400, 130, "too_many_forks");
}

// --- error rows ------------------------------------------------------------------------------------------

#[tokio::test]
async fn forking_into_an_existing_channel_is_fork_target_exists() {
    let app = TestApp::spawn().await;
    let m = source(&app, "tex", 2).await;
    app.channel("agent:occupied", "u1", &["u1"]).await;
    app.fork("agent:tex", &m[1], "occupied").await.err_reason(400, 4, "fork_target_exists");
    assert!(app.state("agent:occupied", 10).await["messages"].as_array().unwrap().is_empty(), "the existing channel is not touched");
}

#[tokio::test]
async fn forking_into_a_fork_of_another_message_is_fork_target_conflict() {
    let app = TestApp::spawn().await;
    let m = source(&app, "tcf", 3).await;
    app.fork("agent:tcf", &m[1], "tcf-fork").await.ok();
    let body = app.fork("agent:tcf", &m[2], "tcf-fork").await.err_reason(409, 129, "fork_target_conflict");
    assert_eq!(body["exception_fields"]["source_channel_cid"], json!("agent:tcf"), "{body}");
    assert_eq!(body["exception_fields"]["source_message_id"], json!(m[1]), "{body}");
    app.channel("agent:tcf2", "u1", &["u1"]).await;
    let other = app.say("agent:tcf2", "u1", "other").await;
    let body = app.fork("agent:tcf2", &other, "tcf-fork").await.err_reason(409, 129, "fork_target_conflict");
    assert_eq!(body["exception_fields"]["source_message_id"], json!(m[1]));
}

#[tokio::test]
async fn forks_of_two_sources_racing_for_one_channel_id_make_one_fork_and_the_others_get_fork_target_conflict() {
    let app = TestApp::spawn().await;
    let a = source(&app, "racea", 3).await;
    let b = source(&app, "raceb", 3).await;
    let results = join_all((0..8).map(|i| {
        let app = &app;
        let (src, point) = if i % 2 == 0 { ("agent:racea", a[2].clone()) } else { ("agent:raceb", b[2].clone()) };
        async move { (src, app.fork(src, &point, "contested").await) }
    }))
    .await;
    let winner = app.fork_summary("agent:contested").await["source_channel_cid"].as_str().expect("a fork").to_string();
    let winning_point = if winner == "agent:racea" { &a[2] } else { &b[2] };
    for (src, r) in results {
        if src == winner {
            assert_eq!(r.body["fork"]["source_channel_cid"], json!(winner), "identical requests all get the one fork: {}", r.body);
            r.ok();
        } else {
            let body = r.err_reason(409, 129, "fork_target_conflict");
            assert_eq!(body["exception_fields"]["source_channel_cid"], json!(winner));
            assert_eq!(body["exception_fields"]["source_message_id"], json!(winning_point));
        }
    }
    assert_eq!(app.all_messages("agent:contested").await.len(), 3);
}

#[tokio::test]
async fn a_fork_point_sharing_created_at_with_another_visible_message_is_fork_point_ambiguous() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:amb";
    app.channel(cid, "u1", &["u1"]).await;
    let t = past_ns();
    let a = app.say_at(cid, "u1", "amb-a", t).await;
    let b = app.say_at(cid, "u1", "amb-b", t).await;
    let c = app.say_at(cid, "u1", "amb-c", t + 1_000_000).await;
    app.fork(cid, &a, "amb-1").await.err_reason(409, 127, "fork_point_ambiguous");
    app.fork(cid, &b, "amb-2").await.err_reason(409, 127, "fork_point_ambiguous");
    let r = app.fork(cid, &c, "amb-3").await.ok();
    assert_eq!(r["fork"]["copied_message_count"], json!(3), "only the fork point must be unambiguous");
}

#[tokio::test]
async fn a_v5_uuid_message_id_is_reserved_while_the_fork_backfills_and_accepted_once_it_is_finished() {
    let app = TestApp::spawn_without_worker().await;
    let m = source(&app, "rsv", 102).await;
    let fc = "agent:rsv-fork";
    let r = app.fork("agent:rsv", &m[101], "rsv-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"));
    let v5 = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, b"chosen-by-a-client").to_string();
    // `as_user`: None sends server-side as u1, Some(u) with u's token.
    let send = |id: String, as_user: Option<&'static str>, extra: Value| {
        let app = &app;
        async move {
            let mut msg = json!({"id": id, "text": "hello"});
            let token = match as_user {
                Some(u) => app.user(u),
                None => {
                    msg["user_id"] = json!("u1");
                    app.server()
                }
            };
            for (k, v) in extra.as_object().unwrap() {
                msg[k] = v.clone();
            }
            app.post(&format!("{}/message", channel_path(fc)), &token, json!({ "message": msg })).await
        }
    };
    send(v5.clone(), None, json!({})).await.err_reason(400, 4, "fork_message_id_reserved");
    send(v5.to_uppercase(), None, json!({})).await.err_reason(400, 4, "fork_message_id_reserved");
    send(v5.clone(), Some("u2"), json!({})).await.err_reason(400, 4, "fork_message_id_reserved");
    send(v5.clone(), None, json!({"parent_id": copy_id(fc, &m[101])})).await.err_reason(400, 4, "fork_message_id_reserved");
    send(uuid::Uuid::new_v4().to_string(), None, json!({})).await.ok();
    send("plain-id".into(), Some("u2"), json!({})).await.ok();
    let _worker = app.start_worker().await;
    assert_eq!(app.wait_fork_finished(fc).await["status"], json!("completed"));
    send(v5, None, json!({})).await.ok();
}

#[tokio::test]
async fn forking_or_rewinding_a_fork_that_is_still_backfilling_is_fork_in_progress() {
    let app = TestApp::spawn_without_worker().await;
    let m = source(&app, "inprog", 101).await;
    let fc = "agent:inprog-fork";
    app.fork("agent:inprog", &m[100], "inprog-fork").await.ok();
    let newest = copy_id(fc, &m[100]);
    let older = copy_id(fc, &m[99]);
    app.fork(fc, &newest, "grandchild").await.err_reason(409, 131, "fork_in_progress");
    app.rewind(fc, &older, &newest, false).await.err_reason(409, 131, "fork_in_progress");
    let _worker = app.start_worker().await;
    app.wait_fork_finished(fc).await;
    assert_copies_of(&app, fc, "agent:inprog", &m[100]).await;
    app.fork(fc, &newest, "grandchild").await.ok();
    // The fork of the finished fork copies the fork's messages (copies of copies).
    assert_eq!(app.wait_fork_finished("agent:grandchild").await["status"], json!("completed"));
    assert_copies_of(&app, "agent:grandchild", fc, &newest).await;
    let grandchild = app.all_messages("agent:grandchild").await;
    app.rewind(fc, &older, &newest, false).await.ok();
    assert_eq!(app.all_messages("agent:grandchild").await, grandchild, "rewinding the fork leaves its own fork as it was");
}

#[tokio::test]
async fn a_source_message_over_the_size_limit_fails_the_fork_with_message_too_large_and_the_failed_fork_stays_usable() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:big";
    app.channel(cid, "u1", &["u1"]).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 10000})).await.ok();
    let t = past_ns();
    app.say_at(cid, "u1", "big-0", t).await;
    app.send_message(cid, json!({"id": "big-1", "text": "y".repeat(7000), "user_id": "u1", "created_at": rfc3339(t + 1_000_000)})).await;
    app.say_at(cid, "u1", "big-2", t + 2_000_000).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 5000})).await.ok();
    let fc = "agent:big-fork";
    let r = app.fork(cid, "big-2", "big-fork").await.ok();
    let f = &r["fork"];
    assert_eq!(f["status"], json!("failed"), "a failed fork is a 200 with the failed summary: {f}");
    assert_eq!(f["failed_reason"], json!("message_too_large"), "{f}");
    assert_eq!(f["copied_message_count"], json!(1), "the number copied before the failure: {f}");
    assert_eq!(f["message_id_map"], json!({"big-2": copy_id(fc, "big-2")}), "the map names what the request copied: {f}");
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), vec![copy_id(fc, "big-2")], "a failed fork keeps what it copied");
    let summary = app.fork_summary(fc).await;
    assert_eq!(summary["status"], json!("failed"));
    assert_eq!(summary["failed_reason"], json!("message_too_large"));
    // A retry returns it as it is.
    let again = app.fork(cid, "big-2", "big-fork").await.ok();
    assert_eq!(again["fork"]["status"], json!("failed"));
    assert_eq!(again["fork"]["failed_reason"], json!("message_too_large"));
    // It is an ordinary agent channel: use it, rewind it, fork it.
    let n1 = app.say(fc, "u1", "still usable").await;
    let n2 = app.say(fc, "u1", "and more").await;
    app.rewind(fc, &n1, &n2, false).await.ok();
    let g = app.fork(fc, &n1, "big-fork-child").await.ok();
    assert_eq!(g["fork"]["status"], json!("completed"));
    assert_eq!(g["fork"]["copied_message_count"], json!(2));
}

#[tokio::test]
async fn a_message_too_large_in_the_older_history_fails_the_fork_in_the_background_and_nothing_more_is_copied() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let cid = "agent:bgfail";
    app.channel(cid, "u1", &["u1"]).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 10000})).await.ok();
    let t = past_ns();
    let mut m = Vec::new();
    for i in 0..105 {
        let id = format!("bg-{i:03}");
        let text = if i == 2 { "z".repeat(6000) } else { format!("message {i}") };
        m.push(json!({"id": id, "text": text, "user_id": "u1", "created_at": rfc3339(t + i as i64 * 1_000_000)}));
    }
    let ids_: Vec<String> = m.iter().map(|b| b["id"].as_str().unwrap().to_string()).collect();
    app.send_many(cid, m, 8).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 5000})).await.ok();
    let fc = "agent:bgfail-fork";
    let r = app.fork(cid, &ids_[104], "bgfail-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "the newest page fits: {r}");
    let task_id = r["fork"]["task_id"].as_str().expect("task_id").to_string();
    let done = app.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("failed"), "{done}");
    assert_eq!(done["failed_reason"], json!("message_too_large"));
    assert_eq!(done["copied_message_count"], json!(102), "the newest 100, then bg-004 and bg-003: {done}");
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &ids_[3..]), "nothing older than the failure is copied");
    let task = app.get(&format!("/tasks/{task_id}"), &app.server()).await.ok();
    assert_eq!(task["status"], json!("failed"), "{task}");
    assert_eq!(task["error"]["type"], json!("message_too_large"), "{task}");
    // A retry returns it as it is.
    let again = app.fork(cid, &ids_[104], "bgfail-fork").await.ok();
    assert_eq!(again["fork"]["status"], json!("failed"));
    assert_eq!(app.all_messages(fc).await.len(), 102);
}

#[tokio::test]
async fn a_copy_id_already_taken_by_another_message_fails_the_fork_with_fork_message_id_taken() {
    let app = TestApp::spawn().await;
    let m = source(&app, "taken", 2).await;
    app.channel("agent:elsewhere", "u1", &["u1"]).await;
    let squatter = copy_id("agent:taken-fork", &m[0]);
    app.send_message("agent:elsewhere", json!({"id": squatter, "text": "I was here first", "user_id": "u1"})).await;
    let r = app.fork("agent:taken", &m[1], "taken-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("failed"), "{r}");
    assert_eq!(r["fork"]["failed_reason"], json!("fork_message_id_taken"));
    assert_eq!(r["fork"]["copied_message_count"], json!(1));
    let other = app.get(&format!("/messages/{squatter}"), &app.server()).await.ok();
    assert_eq!(other["message"]["cid"], json!("agent:elsewhere"), "the other message is untouched");
    // Forking into another channel id gives other copy ids and succeeds.
    let other_fork = app.fork("agent:taken", &m[1], "taken-fork-2").await.ok();
    assert_eq!(other_fork["fork"]["status"], json!("completed"), "{other_fork}");
}

// --- who may fork ---------------------------------------------------------------------------------------

#[tokio::test]
async fn users_and_guests_cannot_fork_but_server_side_requests_and_admins_can() {
    let app = TestApp::spawn().await;
    let m = source(&app, "perm", 2).await;
    app.user_with_role("boss", "admin").await;
    let body = json!({"message_id": m[1], "channel": {"id": "perm-fork"}});
    app.post("/channels/agent/perm/fork", &app.user("u1"), body.clone()).await.err(403, 17);
    let guest = app
        .send(app.http.post(app.url("/guest")).header("stream-auth-type", "anonymous").json(&json!({"user": {"id": "visitor"}})))
        .await
        .ok();
    let guest_token = guest["access_token"].as_str().expect("a guest token").to_string();
    assert_eq!(guest["user"]["role"], json!("guest"), "{guest}");
    app.post("/channels/agent/perm/fork", &guest_token, body.clone()).await.err(403, 17);
    // An anonymous caller is authenticated as nobody in particular and lacks the permission.
    app.send(app.http.post(app.url("/channels/agent/perm/fork")).header("stream-auth-type", "anonymous").json(&body)).await.err(403, 17);
    app.post("/channels/agent/perm/fork", &app.user("boss"), body).await.ok();
    app.fork("agent:perm", &m[1], "perm-fork-2").await.ok();
}

#[tokio::test]
async fn both_fork_endpoints_answer_403_while_fork_is_disabled_for_the_app() {
    let app = TestApp::spawn().await;
    let m = source(&app, "off", 2).await;
    app.fork("agent:off", &m[1], "off-fork").await.ok();
    app.patch("/app", &app.server(), json!({"fork_enabled": false})).await.ok();
    app.fork("agent:off", &m[1], "off-fork-2").await.err(403, 17);
    app.lookup("agent:off-fork", &app.server(), &m).await.err(403, 17);
    app.patch("/app", &app.server(), json!({"fork_enabled": true})).await.ok();
    app.fork("agent:off", &m[1], "off-fork-2").await.ok();
    app.lookup("agent:off-fork", &app.server(), &m).await.ok();
}

#[tokio::test]
async fn a_non_agent_source_or_a_message_id_that_is_not_a_visible_top_level_message_is_a_400() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "troll"]).await;
    app.channel("messaging:chat", "u1", &["u1"]).await;
    let plain = app.say("messaging:chat", "u1", "hi").await;
    app.fork("messaging:chat", &plain, "nope").await.err(400, 4);
    let cid = "agent:bad";
    app.channel(cid, "u1", &["u1", "troll"]).await;
    let t = past_ns();
    let ms = 1_000_000;
    let truncated = app.say_at(cid, "u1", "bad-trunc", t).await;
    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"truncated_at": rfc3339(t + ms / 2)})).await.ok();
    let top = app.say_at(cid, "u1", "bad-top", t + ms).await;
    let reply = app.reply_at(cid, "u1", &top, "bad-reply", t + 2 * ms).await;
    let deleted = app.say_at(cid, "u1", "bad-deleted", t + 3 * ms).await;
    app.delete(&format!("/messages/{deleted}"), &app.server()).await.ok();
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "troll", "shadow": true})).await.ok();
    let shadowed = app.say_at(cid, "troll", "bad-shadowed", t + 4 * ms).await;
    let anchor = app.say_at(cid, "u1", "bad-anchor", t + 5 * ms).await;
    let rewound = app.say_at(cid, "u1", "bad-rewound", t + 6 * ms).await;
    app.rewind(cid, &anchor, &rewound, false).await.ok();
    for (what, id) in [
        ("a reply", reply),
        ("deleted", deleted),
        ("shadowed", shadowed),
        ("rewound", rewound),
        ("truncated", truncated),
        ("unknown", "no-such".into()),
        ("of another channel", plain),
    ] {
        let r = app.fork(cid, &id, &format!("bad-{}", what.replace(' ', "-"))).await;
        assert_eq!(r.status, 400, "forking at a {what} message: {}", r.body);
        r.err(400, 4);
    }
    app.fork_with(cid, json!({"channel": {"id": "no-point"}})).await.err(400, 4);
    app.fork_with(cid, json!({"message_id": anchor})).await.err(400, 4);
    app.fork_with(cid, json!({"message_id": anchor, "channel": {"id": "bad id"}})).await.err(400, 4);
    app.fork("agent:missing", &anchor, "x").await.err(404, 16);
    app.fork_with(cid, json!({"message_id": anchor, "channel": {"id": "data-members", "data": {"members": ["u1"]}}})).await.err(400, 4);
    // The anchor itself is fine, and so is a system message.
    app.fork(cid, &anchor, "bad-ok").await.ok();
    let sys = app.send_message(cid, json!({"type": "system", "text": "note", "user_id": "u1"})).await;
    let r = app.fork(cid, sys["id"].as_str().unwrap(), "sys-ok").await.ok();
    assert_eq!(r["fork"]["status"], json!("completed"), "{r}");
}

// --- the summary and lineage ----------------------------------------------------------------------------

#[tokio::test]
async fn the_fork_summary_is_on_get_query_and_query_channels_and_absent_on_other_channels() {
    let app = TestApp::spawn().await;
    let m = source(&app, "sum", 2).await;
    app.fork("agent:sum", &m[1], "sum-fork").await.ok();
    let check = |f: &Value, what: &str| {
        assert_eq!(f["channel_cid"], json!("agent:sum-fork"), "{what}: {f}");
        assert_eq!(f["source_channel_cid"], json!("agent:sum"), "{what}");
        assert_eq!(f["source_message_id"], json!(m[1]), "{what}");
        assert_eq!(f["status"], json!("completed"), "{what}");
        assert_eq!(f["copied_message_count"], json!(2), "{what}");
        assert!(f.get("message_id_map").is_none(), "{what}: only the fork endpoint returns the map");
    };
    check(&app.state("agent:sum-fork", 1).await["channel"]["fork"], "query");
    check(
        &app.post("/channels/agent/sum-fork/query", &app.user("u2"), json!({"state": true})).await.ok()["channel"]["fork"],
        "query as a member",
    );
    let get = app.get("/api/v2/chat/channels/agent/sum-fork", &app.server()).await.ok();
    let gf = &get["channel"]["fork"];
    assert_eq!(gf["status"], json!("completed"), "get: {get}");
    assert!(gf["created_at"].is_i64(), "{gf}");
    let q = app
        .post(
            "/channels",
            &app.server(),
            json!({"filter_conditions": {"type": "agent"}, "sort": [{"field": "created_at", "direction": 1}]}),
        )
        .await
        .ok();
    let chans = q["channels"].as_array().unwrap();
    assert_eq!(chans.len(), 2, "{q}");
    for c in chans {
        if c["channel"]["cid"] == json!("agent:sum-fork") {
            check(&c["channel"]["fork"], "query channels");
        } else {
            assert!(c["channel"].get("fork").is_none(), "a channel that is not a fork has no fork field: {c}");
        }
    }
    assert!(app.state("agent:sum", 1).await["channel"].get("fork").is_none());
}

#[tokio::test]
async fn the_forks_endpoint_lists_a_channels_forks_and_its_own_source() {
    let app = TestApp::spawn().await;
    let m = source(&app, "tree", 2).await;
    app.fork("agent:tree", &m[1], "tree-a").await.ok();
    app.fork("agent:tree", &m[0], "tree-b").await.ok();
    app.fork("agent:tree-a", &copy_id("agent:tree-a", &m[1]), "tree-a-1").await.ok();
    assert_copies_of(&app, "agent:tree-a", "agent:tree", &m[1]).await;
    assert_copies_of(&app, "agent:tree-a-1", "agent:tree-a", &copy_id("agent:tree-a", &m[1])).await;
    let root = app.get("/channels/agent/tree/forks", &app.server()).await.ok();
    let mut cids: Vec<&str> = root["forks"].as_array().expect("forks").iter().map(|f| f["channel_cid"].as_str().unwrap()).collect();
    cids.sort();
    assert_eq!(cids, vec!["agent:tree-a", "agent:tree-b"], "{root}");
    assert!(root["forks"].as_array().unwrap().iter().all(|f| f["status"] == json!("completed")), "{root}");
    assert!(root.get("source").is_none() || root["source"].is_null(), "the original has no source: {root}");
    let mid = app.get("/channels/agent/tree-a/forks", &app.server()).await.ok();
    let cids: Vec<&str> = mid["forks"].as_array().unwrap().iter().map(|f| f["channel_cid"].as_str().unwrap()).collect();
    assert_eq!(cids, vec!["agent:tree-a-1"], "{mid}");
    assert_eq!(mid["source"]["source_channel_cid"], json!("agent:tree"), "a fork names its own source: {mid}");
    assert_eq!(mid["source"]["source_message_id"], json!(m[1]), "{mid}");
    app.get("/channels/agent/tree-a/forks", &app.user("u2")).await.ok();
}

// --- request fields --------------------------------------------------------------------------------------

#[tokio::test]
async fn members_default_to_the_sources_and_can_be_named_up_to_100() {
    let app = TestApp::spawn().await;
    let m = source(&app, "mem", 2).await;
    let plain = app.fork("agent:mem", &m[1], "mem-default").await.ok();
    assert_eq!(member_ids(&plain), vec!["u1", "u2"]);
    let named = app
        .fork_with("agent:mem", json!({"message_id": m[1], "channel": {"id": "mem-named", "members": ["u3", {"user_id": "u4"}]}}))
        .await
        .ok();
    assert_eq!(member_ids(&named), vec!["u3", "u4"]);
    let too_many: Vec<String> = (0..101).map(|i| format!("m{i:03}")).collect();
    app.fork_with("agent:mem", json!({"message_id": m[1], "channel": {"id": "mem-101", "members": too_many}})).await.err(400, 4);
}

#[tokio::test]
async fn a_source_with_more_than_100_members_must_name_the_forks_members() {
    let app = TestApp::spawn().await;
    let users: Vec<String> = (0..101).map(|i| format!("p{i:03}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    app.users(&refs).await;
    app.channel("agent:crowd", "p000", &refs).await;
    let m = app.say("agent:crowd", "p000", "hello all").await;
    app.fork("agent:crowd", &m, "crowd-fork").await.err(400, 4);
    let r = app.fork_with("agent:crowd", json!({"message_id": m, "channel": {"id": "crowd-fork", "members": ["p000", "p001"]}})).await.ok();
    assert_eq!(member_ids(&r), vec!["p000", "p001"]);
}

#[tokio::test]
async fn the_creator_defaults_to_the_sources_and_user_id_and_channel_data_and_team_apply() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "forker"]).await;
    app.channel_with("agent:own", json!({"created_by_id": "u1", "members": ["u1", "u2"], "team": "blue", "topic": "source topic"})).await;
    let m = app.say("agent:own", "u1", "hi").await;
    let a = app.fork("agent:own", &m, "own-a").await.ok();
    assert_eq!(a["channel"]["created_by"]["id"], json!("u1"), "{a}");
    assert_eq!(a["channel"]["team"], json!("blue"), "the team defaults to the source's: {a}");
    assert!(a["channel"].get("topic").is_none(), "channel data is the request's, not copied: {a}");
    let b = app
        .fork_with(
            "agent:own",
            json!({"message_id": m, "user_id": "forker", "channel": {"id": "own-b", "data": {"name": "Branch", "topic": "new topic"}}}),
        )
        .await
        .ok();
    assert_eq!(b["channel"]["created_by"]["id"], json!("forker"), "{b}");
    assert_eq!(b["channel"]["name"], json!("Branch"), "{b}");
    assert_eq!(b["channel"]["topic"], json!("new topic"));
    let c = app.fork_with("agent:own", json!({"message_id": m, "channel": {"id": "own-c", "data": {"team": "red"}}})).await.ok();
    assert_eq!(c["channel"]["team"], json!("red"), "{c}");
}

// --- beyond the reference (docs/fork.md) ---------------------------------------------------------------------

#[tokio::test]
async fn require_finished_refuses_a_fork_point_the_agent_is_still_writing_with_fork_point_generating() {
    let app = TestApp::spawn().await;
    let m = source(&app, "gen", 2).await;
    let indicator = |kind: &str, state: Option<&str>| {
        let mut ev = json!({"type": kind, "message_id": m[1], "user_id": "u1"});
        if let Some(s) = state {
            ev["ai_state"] = json!(s);
        }
        json!({ "event": ev })
    };
    app.post("/channels/agent/gen/event", &app.server(), indicator("ai_indicator.update", Some("AI_STATE_GENERATING"))).await.ok();
    let body = json!({"message_id": m[1], "channel": {"id": "gen-fork"}, "require_finished": true});
    app.fork_with("agent:gen", body.clone()).await.err_reason(409, 4, "fork_point_generating");
    // Without require_finished the message is copied as it is at that moment.
    app.fork("agent:gen", &m[1], "gen-anyway").await.ok();
    app.post("/channels/agent/gen/event", &app.server(), indicator("ai_indicator.clear", None)).await.ok();
    assert_eq!(app.fork_with("agent:gen", body).await.ok()["fork"]["status"], json!("completed"));
}

#[tokio::test]
async fn inherit_data_keeps_the_named_custom_keys_of_the_source() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel_with("agent:inh", json!({"created_by_id": "u1", "members": ["u1"], "tenant_id": "acme", "secret": "no", "title": "src"}))
        .await;
    let m = app.say("agent:inh", "u1", "hi").await;
    let r = app
        .fork_with(
            "agent:inh",
            json!({"message_id": m, "channel": {"id": "inh-fork", "data": {"title": "mine"}}, "inherit_data": ["tenant_id", "title"]}),
        )
        .await
        .ok();
    assert_eq!(r["channel"]["tenant_id"], json!("acme"), "{r}");
    assert_eq!(r["channel"]["title"], json!("mine"), "the request's data wins over inherited keys");
    assert!(r["channel"].get("secret").is_none(), "keys not named are not inherited: {r}");
}

// --- a copy, not a reference -----------------------------------------------------------------------------

#[tokio::test]
async fn copied_messages_stay_when_the_source_is_later_rewound_truncated_or_deleted() {
    let app = TestApp::spawn().await;
    let m = source(&app, "gone", 3).await;
    let fc = "agent:gone-fork";
    app.fork("agent:gone", &m[2], "gone-fork").await.ok();
    let expected = copies(fc, &m);
    app.rewind("agent:gone", &m[0], &m[2], false).await.ok();
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), expected);
    app.post("/channels/agent/gone/truncate", &app.server(), json!({"hard_delete": true})).await.ok();
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), expected);
    app.delete("/channels/agent/gone?hard_delete=true", &app.server()).await.ok();
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), expected);
    let f = app.fork_summary(fc).await;
    assert_eq!(f["source_channel_cid"], json!("agent:gone"), "{f}");
    assert_eq!(f["status"], json!("completed"));
}

#[tokio::test]
async fn forking_a_rewound_channel_copies_only_the_visible_messages() {
    let app = TestApp::spawn().await;
    let m = source(&app, "rw", 5).await;
    app.rewind("agent:rw", &m[2], &m[4], false).await.ok();
    app.fork("agent:rw", &m[4], "rw-hidden").await.err(400, 4);
    let r = app.fork("agent:rw", &m[2], "rw-fork").await.ok();
    assert_eq!(r["fork"]["copied_message_count"], json!(3));
    let fc = "agent:rw-fork";
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &m[..3]));
    let look = app.lookup(fc, &app.server(), &m).await.ok();
    assert_eq!(look["message_id_map"].as_object().unwrap().len(), 3, "the fork has no hidden messages of its own");
}

#[tokio::test]
async fn rewinding_the_source_while_a_fork_backfills_hides_the_rewound_messages_from_pages_not_copied_yet() {
    let app = TestApp::spawn_without_worker().await;
    let m = source(&app, "rwb", 150).await;
    let fc = "agent:rwb-fork";
    app.fork("agent:rwb", &m[149], "rwb-fork").await.ok();
    app.rewind("agent:rwb", &m[20], &m[149], false).await.ok();
    let _worker = app.start_worker().await;
    let done = app.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    let expected: Vec<String> = copies(fc, &m[..21]).into_iter().chain(copies(fc, &m[50..])).collect();
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), expected, "pages already copied stay; the rest follows the rewind");
    assert_eq!(done["copied_message_count"], json!(121));
}

#[tokio::test]
async fn a_fork_hard_deleted_while_backfilling_frees_its_id_and_a_new_fork_there_is_copied_exactly_once() {
    let app = TestApp::spawn_without_worker().await;
    let m = source(&app, "redo", 120).await;
    let fc = "agent:redo-fork";
    app.fork("agent:redo", &m[119], "redo-fork").await.ok();
    app.delete("/channels/agent/redo-fork?hard_delete=true", &app.server()).await.ok();
    let again = app.fork("agent:redo", &m[110], "redo-fork").await.ok();
    assert_eq!(again["fork"]["source_message_id"], json!(m[110]), "a new fork, not the deleted one: {again}");
    let _worker = app.start_worker().await;
    let done = app.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(111));
    assert_eq!(ids(&Value::Array(app.all_messages(fc).await)), copies(fc, &m[..111]));
    let lineage = app.get("/channels/agent/redo/forks", &app.server()).await.ok();
    assert_eq!(lineage["forks"].as_array().unwrap().len(), 1, "{lineage}");
}

#[tokio::test]
async fn a_source_soft_deleted_during_backfill_is_copied_to_the_end_and_a_hard_deleted_one_ends_the_backfill() {
    let app = TestApp::spawn_without_worker().await;
    let soft = source(&app, "sdel", 130).await;
    let hard = source(&app, "hdel", 130).await;
    app.fork("agent:sdel", &soft[129], "sdel-fork").await.ok();
    app.fork("agent:hdel", &hard[129], "hdel-fork").await.ok();
    app.delete("/channels/agent/sdel", &app.server()).await.ok();
    app.delete("/channels/agent/hdel?hard_delete=true", &app.server()).await.ok();
    let _worker = app.start_worker().await;
    let s = app.wait_fork_finished("agent:sdel-fork").await;
    assert_eq!(s["status"], json!("completed"), "{s}");
    assert_eq!(s["copied_message_count"], json!(130));
    let h = app.wait_fork_finished("agent:hdel-fork").await;
    assert_eq!(h["status"], json!("completed"), "{h}");
    assert_eq!(h["copied_message_count"], json!(100), "what was copied before the source went away: {h}");
    assert_eq!(app.all_messages("agent:hdel-fork").await.len(), 100);
}

// --- crash safety -----------------------------------------------------------------------------------------

#[tokio::test]
async fn a_backfill_killed_mid_way_resumes_after_a_restart_without_loss_or_duplicates() {
    let db = TestDb::create().await;
    let mut first = ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"), ("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "150")]).await;
    let m = source(&first.client, "crash", 400).await;
    let fc = "agent:crash-fork";
    // A gate: copies of the 250 oldest messages fail (and are retried after a back-off) until the
    // gate is removed, so the first process cannot finish the backfill, whenever it is killed.
    let gate = ts_of(&first.get(&format!("/messages/{}", m[250]), &first.server()).await.ok()["message"]["created_at"]);
    crate::worker::inject_copy_fault(&db, fc, gate).await;
    let r = first.fork("agent:crash", &m[399], "crash-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    let task_id = r["fork"]["task_id"].as_str().expect("task_id").to_string();
    // Wait until some pages of the background copy are committed, then pull the plug.
    let deadline = Instant::now() + WAIT;
    loop {
        let t = first.get(&format!("/tasks/{task_id}"), &first.server()).await.ok();
        let copied = t["result"]["copied_message_count"].as_i64().unwrap_or(0);
        if copied >= 130 {
            assert!(copied <= 250, "nothing below the gate is copied: {t}");
            assert_eq!(t["status"], json!("running"), "{t}");
            assert_eq!(t["result"]["total_message_count"], json!(400), "live progress names the total: {t}");
            // Newest first: what is copied so far is always the newest part of the history.
            let look = first.lookup(fc, &first.server(), &m).await.ok();
            let n = look["message_id_map"].as_object().unwrap().len();
            assert!(n >= 130, "{n}");
            let held: Vec<bool> = m.iter().map(|s| look["message_id_map"].get(s).is_some()).collect();
            assert!(
                held[400 - n..].iter().all(|h| *h) && held[..400 - n].iter().all(|h| !*h),
                "the copied part is a suffix of the history"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the backfill made no progress: {t}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    crate::worker::remove_copy_fault(&db).await;
    let second = ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10")]).await;
    assert_eq!(second.fork_summary(fc).await["status"], json!("backfilling"), "the fork was not finished when the process died");
    let done = second.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(400), "{done}");
    let all = ids(&Value::Array(second.all_messages(fc).await));
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len(), "no duplicates");
    assert_eq!(all, copies(fc, &m), "every message exactly once, in order");
    let look = second.lookup(fc, &second.server(), &m).await.ok();
    assert_eq!(look["message_id_map"].as_object().unwrap().len(), 400);
    // The outbox holds exactly one channel.forked per channel and one channel.created for the fork.
    let store = offshoot_store::Store::connect(&db.url).await.expect("open the database");
    let events = store.events_after(0, 100_000).await.expect("read the outbox");
    let count = |kind: &str, cid: &str| events.iter().filter(|e| e.event.kind == kind && e.event.cid.as_deref() == Some(cid)).count();
    assert_eq!(count("channel.forked", fc), 1, "one channel.forked on the fork");
    assert_eq!(count("channel.forked", "agent:crash"), 1, "one channel.forked on the source");
    assert_eq!(count("channel.created", fc), 1, "one channel.created for the fork");
    store.close().await;
    drop(second);
    drop(first);
}

#[tokio::test]
async fn inherited_keys_that_would_make_the_forks_data_too_large_are_refused_and_nothing_is_created() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let half = "y".repeat(3 * 1024);
    app.channel_with("agent:heavy", json!({"created_by_id": "u1", "members": ["u1"], "notes": half})).await;
    let m = app.say("agent:heavy", "u1", "hello").await;
    let body = json!({"message_id": m, "channel": {"id": "heavy-fork", "data": {"more": half}}, "inherit_data": ["notes"]});
    app.fork_with("agent:heavy", body).await.err(400, 4);
    let found = app.post("/channels", &app.server(), json!({"filter_conditions": {"cid": "agent:heavy-fork"}})).await.ok();
    assert_eq!(found["channels"], json!([]), "{found}");
}
