//! Who sees which message: soft-deleted messages show as `deleted`; shadowed ones only to their
//! author and server-side; restricted ones only to the listed users; truncated and rewound ones
//! to nobody.

use crate::helpers::*;
use serde_json::json;

async fn seen_by(app: &TestApp, cid: &str, token: &str) -> Vec<String> {
    ids(&app.post(&format!("{}/query", channel_path(cid)), token, json!({"state": true, "messages": {"limit": 100}})).await.ok()
        ["messages"])
}

#[tokio::test]
async fn a_soft_deleted_message_is_shown_to_everyone_as_type_deleted() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:vdel";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    let m = app.say(cid, "u1", "oops").await;
    app.delete(&format!("/messages/{m}"), &app.server()).await.ok();
    for token in [app.user("u2"), app.user("u1"), app.server()] {
        let st = app.post(&format!("{}/query", channel_path(cid)), &token, json!({"state": true})).await.ok();
        assert_eq!(ids(&st["messages"]), vec![m.clone()]);
        assert_eq!(st["messages"][0]["type"], json!("deleted"), "{st}");
    }
}

#[tokio::test]
async fn a_shadowed_message_is_seen_only_by_its_author_and_server_side() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "ghost"]).await;
    let cid = "agent:vshadow";
    app.channel(cid, "u1", &["u1", "u2", "ghost"]).await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "ghost", "shadow": true})).await.ok();
    let m = app.say(cid, "ghost", "boo").await;
    assert_eq!(seen_by(&app, cid, &app.user("ghost")).await, vec![m.clone()]);
    assert_eq!(seen_by(&app, cid, &app.server()).await, vec![m.clone()]);
    assert!(seen_by(&app, cid, &app.user("u1")).await.is_empty());
    assert!(seen_by(&app, cid, &app.user("u2")).await.is_empty());
    // To anyone else it does not exist, as it does not in the channel's list.
    app.get(&format!("/messages/{m}"), &app.user("u2")).await.err(404, 16);
    app.get(&format!("/messages/{m}"), &app.user("ghost")).await.ok();
}

#[tokio::test]
async fn a_message_with_restricted_visibility_is_seen_only_by_the_listed_users() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "u3"]).await;
    let cid = "agent:vrestrict";
    app.channel(cid, "u1", &["u1", "u2", "u3"]).await;
    let open = app.say(cid, "u1", "for all").await;
    let only_u2 = app.send_message(cid, json!({"text": "for u2", "user_id": "u1", "restricted_visibility": ["u2"]})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(seen_by(&app, cid, &app.user("u2")).await, vec![open.clone(), only_u2.clone()]);
    assert_eq!(seen_by(&app, cid, &app.user("u3")).await, vec![open.clone()]);
    assert_eq!(seen_by(&app, cid, &app.server()).await, vec![open.clone(), only_u2.clone()]);
}

#[tokio::test]
async fn truncated_and_rewound_messages_are_seen_by_nobody() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:vhidden";
    app.channel(cid, "u1", &["u1", "u2"]).await;
    let base = past_ns();
    let m = app.seed(cid, "u1", "h", 5, base, 1).await;
    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"truncated_at": rfc3339(base + 500_000)})).await.ok();
    app.rewind(cid, &m[2], &m[4], false).await.ok();
    for token in [app.user("u1"), app.user("u2"), app.server()] {
        assert_eq!(seen_by(&app, cid, &token).await, m[1..3].to_vec());
        for hidden in [&m[0], &m[3], &m[4]] {
            let r = app.get(&format!("/messages/{hidden}"), &token).await;
            assert_eq!(r.status, 404, "{hidden} is hidden: {}", r.body);
        }
    }
}
