//! Concurrent writers against one object, on both backends: bursts of [`BURST`] requests fired
//! at once (across two servers on one database, each with its own connection pool), each
//! changing a different field or member. Every acknowledged write must be in the final state,
//! no answer may be a 5xx, and moderation must never be undone by a racing upsert.
//!
//! SQLite serialises writers, so these pass there by construction; on PostgreSQL they fail
//! when a write path reads, changes and writes back without a lock (docs: the store's crate
//! doc, "Lock order").

use crate::helpers::*;
use futures_util::future::join_all;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::Barrier;

const BURST: usize = 20;

/// Two servers on one fresh database: requests alternate between them.
async fn two_servers() -> (TestApp, TestApp) {
    let a = TestApp::spawn().await;
    let b = TestApp::spawn_on(a.db.clone(), |_| {}).await;
    (a, b)
}

/// Runs `BURST` requests built by `make(i)` at once (they wait on one barrier), alternating the
/// two servers; returns the responses in order of `i`. No response may be a 5xx.
async fn burst<F, Fut>(a: &TestApp, b: &TestApp, make: F) -> Vec<Resp>
where
    F: Fn(usize, Client) -> Fut,
    Fut: std::future::Future<Output = Resp>,
{
    let barrier = Arc::new(Barrier::new(BURST));
    let futures = (0..BURST).map(|i| {
        let client = if i % 2 == 0 { a.client.clone() } else { b.client.clone() };
        let barrier = barrier.clone();
        let fut = make(i, client);
        async move {
            barrier.wait().await;
            fut.await
        }
    });
    let out = join_all(futures).await;
    for (i, r) in out.iter().enumerate() {
        assert!(r.status < 500, "request {i} of the burst answered {}: {}", r.status, r.body);
    }
    out
}

fn all_ok(responses: &[Resp]) {
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r.status, 200, "request {i} of the burst failed: {}", r.body);
    }
}

#[tokio::test]
async fn concurrent_partial_updates_of_one_channel_keep_every_key() {
    let (a, b) = two_servers().await;
    a.users(&["owner"]).await;
    a.channel("agent:busy-channel", "owner", &["owner"]).await;
    let path = channel_path("agent:busy-channel");
    let out = burst(&a, &b, |i, c| {
        let path = path.clone();
        async move {
            let token = c.server();
            c.patch(&path, &token, json!({"set": {format!("key_{i}"): i}})).await
        }
    })
    .await;
    all_ok(&out);
    let channel = a.state("agent:busy-channel", 1).await["channel"].clone();
    for i in 0..BURST {
        assert_eq!(channel[format!("key_{i}")], json!(i), "key_{i} was acknowledged but lost: {channel}");
    }
}

#[tokio::test]
async fn concurrent_partial_updates_of_one_user_keep_every_key() {
    let (a, b) = two_servers().await;
    a.users(&["popular"]).await;
    let out = burst(&a, &b, |i, c| async move {
        let token = c.server();
        c.patch("/users", &token, json!({"users": [{"id": "popular", "set": {format!("key_{i}"): i}}]})).await
    })
    .await;
    all_ok(&out);
    let users = a.get("/users?payload=%7B%22filter_conditions%22%3A%7B%22id%22%3A%22popular%22%7D%7D", &a.server()).await.ok();
    let user = &users["users"][0];
    for i in 0..BURST {
        assert_eq!(user[format!("key_{i}")], json!(i), "key_{i} was acknowledged but lost: {user}");
    }
}

#[tokio::test]
async fn concurrent_partial_updates_of_one_message_keep_every_key_and_pin() {
    let (a, b) = two_servers().await;
    a.users(&["author"]).await;
    a.channel("agent:edits", "author", &["author"]).await;
    let id = a.say("agent:edits", "author", "edit me").await;
    let path = format!("/messages/{id}");
    let out = burst(&a, &b, |i, c| {
        let path = path.clone();
        async move {
            let token = c.server();
            let set = if i == 0 { json!({"pinned": true}) } else { json!({format!("key_{i}"): i}) };
            c.put(&path, &token, json!({"set": set, "user_id": "author"})).await
        }
    })
    .await;
    all_ok(&out);
    let m = a.get(&path, &a.server()).await.ok()["message"].clone();
    for i in 1..BURST {
        assert_eq!(m[format!("key_{i}")], json!(i), "key_{i} was acknowledged but lost: {m}");
    }
    assert_eq!(m["pinned"], json!(true), "the pin was acknowledged but lost: {m}");
}

#[tokio::test]
async fn concurrent_app_settings_patches_keep_every_key() {
    let (a, b) = two_servers().await;
    let out = burst(&a, &b, |i, c| async move {
        let token = c.server();
        c.patch("/app", &token, json!({format!("setting_{i}"): i})).await
    })
    .await;
    all_ok(&out);
    let app = a.get("/app", &a.server()).await.ok()["app"].clone();
    for i in 0..BURST {
        assert_eq!(app[format!("setting_{i}")], json!(i), "setting_{i} was acknowledged but lost: {app}");
    }
}

#[tokio::test]
async fn a_shadow_ban_survives_racing_upserts_of_the_same_user() {
    let (a, b) = two_servers().await;
    a.users(&["troll"]).await;
    a.channel("agent:moderated", "troll", &["troll"]).await;
    let out = burst(&a, &b, |i, c| async move {
        let token = c.server();
        if i == BURST / 2 {
            c.post("/moderation/ban", &token, json!({"target_user_id": "troll", "shadow": true})).await
        } else {
            c.post("/users", &token, json!({"users": {"troll": {"id": "troll", "name": format!("name {i}")}}})).await
        }
    })
    .await;
    all_ok(&out);
    let m = a.send_message("agent:moderated", json!({"text": "after the ban", "user_id": "troll"})).await;
    assert_eq!(m["shadowed"], json!(true), "the shadow ban was undone by an upsert: {m}");
    // And the upserts did what they said: the user has one of the names.
    let u = &a.get("/users?payload=%7B%22filter_conditions%22%3A%7B%22id%22%3A%22troll%22%7D%7D", &a.server()).await.ok()["users"][0];
    assert!(u["name"].as_str().is_some_and(|n| n.starts_with("name ")), "{u}");
}

#[tokio::test]
async fn a_ban_survives_racing_partial_updates_of_the_same_user() {
    let (a, b) = two_servers().await;
    a.users(&["spammer"]).await;
    let out = burst(&a, &b, |i, c| async move {
        let token = c.server();
        if i == BURST / 2 {
            c.post("/moderation/ban", &token, json!({"target_user_id": "spammer"})).await
        } else {
            c.patch("/users", &token, json!({"users": [{"id": "spammer", "set": {"name": format!("n{i}")}}]})).await
        }
    })
    .await;
    all_ok(&out);
    let r = a.get("/app", &a.user("spammer")).await;
    assert_eq!(r.status, 403, "a banned user is refused: {}", r.body);
}

#[tokio::test]
async fn concurrent_member_additions_and_removals_on_one_channel_all_apply_without_a_5xx() {
    let (a, b) = two_servers().await;
    let leaving: Vec<String> = (0..BURST / 2).map(|i| format!("leaving-{i:02}")).collect();
    let joining: Vec<String> = (0..BURST / 2).map(|i| format!("joining-{i:02}")).collect();
    let everyone: Vec<&str> = leaving.iter().chain(&joining).map(String::as_str).chain(["owner"]).collect();
    a.users(&everyone).await;
    let initial: Vec<&str> = leaving.iter().map(String::as_str).chain(["owner"]).collect();
    a.channel("agent:churn", "owner", &initial).await;
    let path = channel_path("agent:churn");
    let (leaving2, joining2) = (leaving.clone(), joining.clone());
    // Each request adds one member and removes another, in both orders, through the two
    // endpoints Stream has for it (a full update with add/remove, and members in the body).
    let out = burst(&a, &b, |i, c| {
        let path = path.clone();
        let (join, leave) = (joining2[i / 2].clone(), leaving2[i / 2].clone());
        async move {
            let token = c.server();
            if i % 2 == 0 {
                c.post(&path, &token, json!({"add_members": [join]})).await
            } else {
                c.post(&path, &token, json!({"remove_members": [leave]})).await
            }
        }
    })
    .await;
    all_ok(&out);
    let members = member_ids(&a.state("agent:churn", 1).await);
    let mut expected: Vec<String> = joining.iter().cloned().chain(["owner".to_string()]).collect();
    expected.sort();
    assert_eq!(members, expected, "every acknowledged addition and removal applies");
}

/// Every request adds or removes the same six members, half of them listing them in the
/// opposite order. None may fail (a deadlock aborts one of them), and each applies whole: the
/// final member set is the six and the owner (an addition committed last) or the owner alone (a
/// removal committed last), never part of the six, and the channel's `member_count` agrees,
/// seen through either server.
#[tokio::test]
async fn concurrent_multi_member_changes_in_opposite_orders_do_not_deadlock_and_each_applies_whole() {
    let (a, b) = two_servers().await;
    let users: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).chain(["owner"]).collect();
    a.users(&refs).await;
    a.channel("agent:orders", "owner", &["owner"]).await;
    let path = channel_path("agent:orders");
    let users2 = users.clone();
    let out = burst(&a, &b, |i, c| {
        let path = path.clone();
        let mut list = users2.clone();
        if i % 2 == 1 {
            list.reverse();
        }
        async move {
            let token = c.server();
            if i % 3 == 2 {
                c.post(&path, &token, json!({"remove_members": list})).await
            } else {
                c.post(&path, &token, json!({"add_members": list})).await
            }
        }
    })
    .await;
    all_ok(&out);
    let owner_alone = vec!["owner".to_string()];
    let mut all_six: Vec<String> = users.iter().cloned().chain(["owner".to_string()]).collect();
    all_six.sort();
    for (name, server) in [("a", &a), ("b", &b)] {
        let st = server.state("agent:orders", 1).await;
        let members = member_ids(&st);
        assert!(members == all_six || members == owner_alone, "server {name}: each change applies whole, not in part: {members:?}");
        assert_eq!(st["channel"]["member_count"], json!(members.len()), "server {name}: member_count agrees with the members: {st}");
    }
}

#[tokio::test]
async fn concurrent_reactions_replies_and_reads_are_all_counted() {
    let (a, b) = two_servers().await;
    let users: Vec<String> = (0..BURST).map(|i| format!("u{i:02}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).chain(["owner"]).collect();
    a.users(&refs).await;
    a.channel("agent:lively", "owner", &refs).await;
    let parent = a.say("agent:lively", "owner", "react and reply").await;

    let reactions = burst(&a, &b, |i, c| {
        let path = format!("/messages/{parent}/reaction");
        async move {
            let token = c.server();
            c.post(&path, &token, json!({"reaction": {"type": "like", "user_id": format!("u{i:02}")}})).await
        }
    })
    .await;
    all_ok(&reactions);
    let replies = burst(&a, &b, |i, c| {
        let (path, parent) = (format!("{}/message", channel_path("agent:lively")), parent.clone());
        async move {
            let token = c.server();
            c.post(&path, &token, json!({"message": {"text": format!("reply {i}"), "parent_id": parent, "user_id": format!("u{i:02}")}}))
                .await
        }
    })
    .await;
    all_ok(&replies);
    let reads = burst(&a, &b, |i, c| {
        let path = format!("{}/read", channel_path("agent:lively"));
        async move {
            let token = c.user(&format!("u{i:02}"));
            c.post(&path, &token, json!({})).await
        }
    })
    .await;
    all_ok(&reads);

    let m = a.get(&format!("/messages/{parent}"), &a.server()).await.ok()["message"].clone();
    assert_eq!(m["reaction_counts"]["like"], json!(BURST), "every reaction is counted: {m}");
    assert_eq!(m["reply_count"], json!(BURST), "every reply is counted: {m}");
    let state = a.state("agent:lively", 1).await;
    let read: Vec<&Value> =
        state["read"].as_array().expect("read").iter().filter(|r| r["user"]["id"].as_str().is_some_and(|u| u.starts_with('u'))).collect();
    assert_eq!(read.len(), BURST, "a read state for every member: {}", state["read"]);
    for r in read {
        assert_eq!(r["unread_messages"], json!(0), "{r}");
    }
}

#[tokio::test]
async fn one_users_unique_reactions_raced_leave_exactly_one() {
    let (a, b) = two_servers().await;
    a.users(&["fan", "owner"]).await;
    a.channel("agent:unique", "owner", &["fan", "owner"]).await;
    let id = a.say("agent:unique", "owner", "pick one").await;
    let out = burst(&a, &b, |i, c| {
        let path = format!("/messages/{id}/reaction");
        async move {
            let token = c.server();
            c.post(&path, &token, json!({"reaction": {"type": format!("t{i}"), "user_id": "fan"}, "enforce_unique": true})).await
        }
    })
    .await;
    all_ok(&out);
    let m = a.get(&format!("/messages/{id}"), &a.server()).await.ok()["message"].clone();
    let total: i64 = m["reaction_counts"].as_object().expect("counts").values().map(|v| v.as_i64().unwrap_or(0)).sum();
    assert_eq!(total, 1, "enforce_unique keeps one reaction per user: {m}");
}

#[tokio::test]
async fn concurrent_messages_into_one_channel_are_all_counted() {
    let (a, b) = two_servers().await;
    a.users(&["owner"]).await;
    a.channel("agent:counted", "owner", &["owner"]).await;
    let out = burst(&a, &b, |i, c| {
        let path = format!("{}/message", channel_path("agent:counted"));
        async move {
            let token = c.server();
            c.post(&path, &token, json!({"message": {"text": format!("m{i}"), "user_id": "owner"}})).await
        }
    })
    .await;
    all_ok(&out);
    let state = a.state("agent:counted", 100).await;
    assert_eq!(state["messages"].as_array().expect("messages").len(), BURST, "{state}");
}

#[tokio::test]
async fn concurrent_get_or_create_of_one_new_channel_creates_it_once() {
    let (a, b) = two_servers().await;
    a.users(&["maker"]).await;
    let path = format!("{}/query", channel_path("agent:born-once"));
    let out = burst(&a, &b, |_, c| {
        let path = path.clone();
        async move {
            let token = c.server();
            c.post(&path, &token, json!({"data": {"created_by_id": "maker", "members": ["maker"]}})).await
        }
    })
    .await;
    all_ok(&out);
    let created: Vec<&Resp> = out.iter().filter(|r| r.body["channel"]["cid"] == json!("agent:born-once")).collect();
    assert_eq!(created.len(), BURST, "every caller gets the channel");
    assert_eq!(member_ids(&a.state("agent:born-once", 1).await), vec!["maker".to_string()]);
}

#[tokio::test]
async fn reads_and_writes_racing_a_hard_delete_of_their_channel_answer_without_a_5xx() {
    let (a, b) = two_servers().await;
    a.users(&["owner", "amy"]).await;
    a.channel("agent:doomed", "owner", &["owner", "amy"]).await;
    let id = a.say("agent:doomed", "owner", "going away").await;
    let out = burst(&a, &b, |i, c| {
        let id = id.clone();
        async move {
            let token = c.server();
            match i % 5 {
                0 if i == 0 => c.delete(&format!("{}?hard_delete=true", channel_path("agent:doomed")), &token).await,
                0 => c.get(&format!("/messages/{id}/replies"), &token).await,
                1 => c.get(&format!("/messages/{id}"), &token).await,
                2 => c.put(&format!("/messages/{id}"), &token, json!({"set": {"k": i}, "user_id": "owner"})).await,
                3 => c.post(&format!("/messages/{id}/reaction"), &token, json!({"reaction": {"type": "like", "user_id": "amy"}})).await,
                _ => {
                    c.post(
                        &format!("{}/message", channel_path("agent:doomed")),
                        &token,
                        json!({"message": {"text": "late reply", "parent_id": id, "user_id": "amy"}}),
                    )
                    .await
                }
            }
        }
    })
    .await;
    assert_eq!(out[0].status, 200, "the hard delete succeeds: {}", out[0].body);
    for r in &out {
        assert!(r.status == 200 || r.status == 404 || r.status == 400, "{}: {}", r.status, r.body);
        if r.status != 200 {
            assert_error_envelope(&r.body);
        }
    }
    let r = a.get(&format!("/messages/{id}"), &a.server()).await;
    assert_eq!(r.status, 404, "the message went with its channel: {}", r.body);
}

/// The unread messages of `user` by the rule, from what the channel's state shows: messages of
/// others after the user's read mark (deleted ones excepted).
fn unread_by_rule(state: &Value, user: &str) -> i64 {
    let read = state["read"].as_array().expect("read").iter().find(|r| r["user"]["id"] == json!(user)).expect("read row");
    let last_read = ts_of(&read["last_read"]);
    state["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["user"]["id"] != json!(user) && m["type"] == json!("regular") && ts_of(&m["created_at"]) > last_read)
        .count() as i64
}

#[tokio::test]
async fn racing_sends_reads_and_deletes_leave_every_members_unread_counter_by_the_rule() {
    let (a, b) = two_servers().await;
    let users: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).chain(["writer"]).collect();
    a.users(&refs).await;
    let cid = "agent:unread-race";
    a.channel(cid, "writer", &refs).await;
    let mut early = Vec::new();
    for i in 0..5 {
        early.push(a.say(cid, "writer", &format!("early {i}")).await);
    }
    for round in 0..3 {
        let early = early.clone();
        let out = burst(&a, &b, move |i, c| {
            let (cid, early) = (cid.to_string(), early.clone());
            async move {
                let token = c.server();
                match i % 5 {
                    // Reads by each reader in turn.
                    0 => c.post(&format!("{}/read", channel_path(&cid)), &c.user(&format!("r{}", (i / 5) % 4)), json!({})).await,
                    // A delete of an early message (the first wins, the rest find it deleted).
                    1 if round == 0 => c.delete(&format!("/messages/{}", early[i / 5]), &token).await,
                    // Messages from the writer and from the readers.
                    _ => {
                        let from = if i % 3 == 0 { format!("r{}", i % 4) } else { "writer".to_string() };
                        c.post(
                            &format!("{}/message", channel_path(&cid)),
                            &token,
                            json!({"message": {"text": format!("m{round}-{i}"), "user_id": from}}),
                        )
                        .await
                    }
                }
            }
        })
        .await;
        all_ok(&out);
    }
    let state = a.state(cid, 300).await;
    for user in refs {
        let counter = state["read"].as_array().expect("read").iter().find(|r| r["user"]["id"] == json!(user)).expect("read row")
            ["unread_messages"]
            .as_i64()
            .expect("unread_messages");
        assert_eq!(counter, unread_by_rule(&state, user), "{user}'s counter against the rule");
    }
}
