//! Message search (`GET /search`, docs/compatibility.md "Search"): full text without case or
//! diacritics, every message filter operator, the visibility of channel reads, pagination by
//! offset and by cursor, `dedupe_copies` across a lineage, the index kept under concurrent sends.

use crate::helpers::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;

async fn search(app: &Client, token: &str, payload: Value) -> Resp {
    app.send(app.request(reqwest::Method::GET, "/search", token).query(&[("payload", payload.to_string())])).await
}

fn hit_ids(body: &Value) -> Vec<String> {
    body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("results: {body}"))
        .iter()
        .map(|r| r["message"]["id"].as_str().expect("id").to_string())
        .collect()
}

fn set(ids: &[&String]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

async fn found(app: &Client, token: &str, payload: Value) -> BTreeSet<String> {
    let body = search(app, token, payload.clone()).await.ok();
    let ids = hit_ids(&body);
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(unique.len(), ids.len(), "no hit twice for {payload}: {ids:?}");
    unique
}

fn id_of(m: &Value) -> String {
    m["id"].as_str().expect("id").to_string()
}

#[tokio::test]
async fn the_ui_kit_s_search_finds_words_without_case_or_diacritics_in_the_caller_s_channels_only() {
    let app = TestApp::spawn().await;
    app.users(&["amy", "ben", "cat"]).await;
    app.channel("agent:s-a", "amy", &["amy", "ben"]).await;
    app.channel("agent:s-b", "amy", &["amy"]).await;
    app.channel("agent:s-c", "ben", &["ben"]).await;
    let m1 = app.say("agent:s-a", "amy", "Le Café est ouvert").await;
    let m2 = app.say("agent:s-a", "ben", "the CAFE is closed").await;
    app.say("agent:s-a", "amy", "nothing to see here").await;
    let m4 = app.say("agent:s-b", "amy", "cafés everywhere").await;
    let m5 = app.say("agent:s-c", "ben", "cafe for ben").await;

    // What the React UI kit's search box sends, as it sends it.
    let ui = |user: &str, text: &str| {
        json!({"filter_conditions": {"members": {"$in": [user]}}, "limit": 10, "sort": [{"field": "created_at", "direction": -1}],
               "message_filter_conditions": {"type": "regular", "text": text}})
    };
    let body = search(&app, &app.user("amy"), ui("amy", "cafe")).await.ok();
    assert_eq!(hit_ids(&body), vec![m2.clone(), m1.clone()], "newest first, amy's channels only: {body}");
    let first = &body["results"][0]["message"];
    assert_eq!(first["channel"]["cid"], json!("agent:s-a"), "each hit carries its channel: {first}");
    assert_eq!(first["user"]["id"], json!("ben"), "and its author: {first}");
    assert_eq!(first["text"], json!("the CAFE is closed"));
    assert!(body.get("next").is_none(), "one page only: {body}");

    assert_eq!(
        found(&app, &app.user("amy"), json!({"filter_conditions": {"members": {"$in": ["amy"]}}, "query": "CAFÉ"})).await,
        set(&[&m1, &m2])
    );
    let prefix =
        json!({"filter_conditions": {"members": {"$in": ["amy"]}}, "message_filter_conditions": {"text": {"$autocomplete": "caf"}}});
    assert_eq!(found(&app, &app.user("amy"), prefix).await, set(&[&m1, &m2, &m4]), "$autocomplete matches word prefixes");
    assert_eq!(found(&app, &app.user("ben"), ui("ben", "cafe")).await, set(&[&m1, &m2, &m5]));
    // A filter naming channels the caller is not a member of finds nothing in them.
    let all = json!({"filter_conditions": {"cid": {"$in": ["agent:s-a", "agent:s-b", "agent:s-c"]}}, "query": "cafe"});
    assert_eq!(found(&app, &app.user("cat"), all.clone()).await, BTreeSet::new(), "cat is a member of none");
    assert_eq!(found(&app, &app.user("amy"), all.clone()).await, set(&[&m1, &m2]));
    assert_eq!(found(&app, &app.server(), all).await, set(&[&m1, &m2, &m5]), "server-side searches every channel");
    // The v2 dialect's path answers the same hits, with nanosecond timestamps.
    let v2 = app
        .send(
            app.request(reqwest::Method::GET, "/api/v2/chat/search", &app.user("amy")).query(&[("payload", ui("amy", "cafe").to_string())]),
        )
        .await
        .ok();
    assert_eq!(hit_ids(&v2), vec![m2, m1]);
    assert!(v2["results"][0]["message"]["created_at"].is_i64(), "{v2}");
}

#[tokio::test]
async fn every_message_filter_operator_selects_what_it_names() {
    let app = TestApp::spawn().await;
    app.users(&["amy", "ben"]).await;
    let cid = "agent:s-ops";
    app.channel(cid, "amy", &["amy", "ben"]).await;
    let p1 = app
        .send_message(cid, json!({"text": "alpha one", "user_id": "amy", "priority": 3, "attachments": [{"type": "image", "image_url": "https://x.test/i.png"}]}))
        .await;
    let p2 =
        app.send_message(cid, json!({"text": "alpha two", "user_id": "ben", "priority": 1, "attachments": [{"type": "file", "asset_url": "https://x.test/f.pdf"}]})).await;
    let p3 = app.send_message(cid, json!({"text": "alpha three", "user_id": "amy", "pinned": true})).await;
    let r1 = app.send_message(cid, json!({"text": "alpha reply", "user_id": "ben", "parent_id": id_of(&p1)})).await;
    let p4 = app.send_message(cid, json!({"text": "beta gamma", "user_id": "amy"})).await;
    let (p1, p2, p3, r1, p4) = (id_of(&p1), id_of(&p2), id_of(&p3), id_of(&r1), id_of(&p4));
    // An edit moves updated_at past every other message's.
    let p4_updated =
        app.state(cid, 10).await["messages"].as_array().unwrap().iter().find(|m| m["id"] == json!(p4)).unwrap()["updated_at"].clone();
    app.put(&format!("/messages/{p2}"), &app.server(), json!({"set": {"text": "alpha two edited"}})).await.ok();
    let p3_created = app.get(&format!("/messages/{p3}"), &app.server()).await.ok()["message"]["created_at"].clone();

    let amy = app.user("amy");
    let cases: Vec<(Value, BTreeSet<String>)> = vec![
        (json!({"text": {"$q": "alpha"}}), set(&[&p1, &p2, &p3, &r1])),
        (json!({"text": "alpha", "user.id": "ben"}), set(&[&p2, &r1])),
        (json!({"user_id": "amy", "text": {"$autocomplete": "gam"}}), set(&[&p4])),
        (json!({"id": {"$in": [p1, p4]}}), set(&[&p1, &p4])),
        (json!({"type": "regular", "parent_id": {"$exists": false}}), set(&[&p1, &p2, &p3, &p4])),
        (json!({"parent_id": p1}), set(&[&r1])),
        (json!({"created_at": {"$gt": p3_created}}), set(&[&r1, &p4])),
        (json!({"updated_at": {"$gt": p4_updated}}), set(&[&p2])),
        (json!({"attachments": {"$exists": true}}), set(&[&p1, &p2])),
        (json!({"attachments": {"$exists": false}}), set(&[&p3, &r1, &p4])),
        (json!({"attachments.type": {"$in": ["image", "video"]}}), set(&[&p1])),
        (json!({"attachments.type": "file"}), set(&[&p2])),
        (json!({"attachments.type": {"$nin": ["image"]}, "text": "alpha"}), set(&[&p2, &p3, &r1])),
        (json!({"pinned": true}), set(&[&p3])),
        (json!({"reply_count": {"$gte": 1}}), set(&[&p1])),
        (json!({"priority": {"$gte": 2}}), set(&[&p1])),
        (json!({"$or": [{"user_id": "ben"}, {"pinned": true}]}), set(&[&p2, &r1, &p3])),
        (json!({"$and": [{"text": "alpha"}, {"user_id": "amy"}]}), set(&[&p1, &p3])),
        (json!({"$nor": [{"text": "alpha"}]}), set(&[&p4])),
        (json!({"text": "alpha", "$nor": [{"user_id": "amy"}]}), set(&[&p2, &r1])),
        (json!({"$or": [{"text": {"$q": "gamma"}}, {"text": {"$autocomplete": "edi"}}]}), set(&[&p4, &p2])),
        (json!({"text": "two"}), set(&[&p2])),
    ];
    for (filter, want) in cases {
        let got = found(&app, &amy, json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": filter.clone()})).await;
        assert_eq!(got, want, "{filter}");
    }
    // The edit replaced the indexed text: its new word is found, and a word it dropped is not.
    assert_eq!(found(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "edited"})).await, set(&[&p2]));
    for bad in [
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"pinned": {"$autocomplete": "x"}}}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"attachments": true}}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"text": {"$gt": "a"}}}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"created_at": {"$gt": "yesterday"}}}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"$xor": []}}),
        json!({"filter_conditions": {}, "query": "alpha"}),
        json!({"filter_conditions": {"cid": cid}}),
        json!({"filter_conditions": {"cid": cid}, "query": "alpha", "limit": 101}),
        json!({"filter_conditions": {"cid": cid}, "query": "alpha", "offset": 1001}),
        json!({"filter_conditions": {"cid": cid}, "query": "alpha", "offset": 10, "sort": [{"field": "created_at"}]}),
        json!({"filter_conditions": {"cid": cid}, "query": "alpha", "sort": [{"field": "text"}]}),
        json!({"filter_conditions": {"cid": cid}, "query": "alpha", "next": "not a cursor"}),
        json!({"filter_conditions": {"cid": cid}, "query": "x".repeat(1001)}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"text": {"$in": [5]}}}),
        json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"attachments.type": {"$gt": "a"}}}),
    ] {
        search(&app, &amy, bad).await.err(400, 4);
    }
    app.send(app.request(reqwest::Method::GET, "/search", &amy).query(&[("payload", "{not json")])).await.err(400, 4);
    app.send(app.request(reqwest::Method::GET, "/search", &amy).query(&[("payload", "[1, 2]")])).await.err(400, 4);
    // Words no index can hold, and queries without a word, find nothing rather than fail.
    for query in ["中".repeat(900), "?!".to_string(), format!("alpha {}", "é".repeat(600))] {
        let body = search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": query})).await.ok();
        assert!(hit_ids(&body).len() <= 4, "{body}");
    }
    let prefix = json!({"filter_conditions": {"cid": cid}, "message_filter_conditions": {"text": {"$autocomplete": "中".repeat(900)}}});
    assert_eq!(hit_ids(&search(&app, &amy, prefix).await.ok()), Vec::<String>::new());
    app.get("/search", &amy).await.err(400, 4);
}

#[tokio::test]
async fn hits_respect_shadow_bans_restricted_visibility_deletes_truncation_rewinds_and_ephemeral_messages() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "ghost"]).await;
    let cid = "agent:s-vis";
    app.channel(cid, "u1", &["u1", "u2", "ghost"]).await;
    let base = past_ns();
    let seeded: Vec<Value> = (0..4)
        .map(|i| json!({"id": format!("sv-old-{i}"), "text": format!("needle old {i}"), "user_id": "u1", "created_at": rfc3339(base + i * 1_000_000)}))
        .collect();
    app.send_many(cid, seeded, 1).await;
    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"truncated_at": rfc3339(base + 1_500_000)})).await.ok();
    // A channel never truncated, with a message as old as the truncated ones.
    let other = "agent:s-vis-other";
    app.channel(other, "u1", &["u1", "u2"]).await;
    app.send_many(
        other,
        vec![json!({"id": "sv-other-0", "text": "needle old elsewhere", "user_id": "u1", "created_at": rfc3339(base)})],
        1,
    )
    .await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "ghost", "shadow": true})).await.ok();
    let shadowed = app.say(cid, "ghost", "needle from a ghost").await;
    let restricted =
        id_of(&app.send_message(cid, json!({"text": "needle for u2", "user_id": "u1", "restricted_visibility": ["u2"]})).await);
    let soft = app.say(cid, "u1", "needle soon deleted").await;
    let hard = app.say(cid, "u1", "needle soon gone").await;
    app.delete(&format!("/messages/{soft}"), &app.server()).await.ok();
    app.delete(&format!("/messages/{hard}?hard=true"), &app.server()).await.ok();
    let open = app.say(cid, "u1", "needle for all").await;
    let path = format!("{}/message", channel_path(cid));
    app.post(&path, &app.server(), json!({"message": {"type": "ephemeral", "text": "needle ephemeral", "user_id": "u1"}})).await.ok();
    app.post(&path, &app.server(), json!({"message": {"type": "error", "text": "needle error", "user_id": "u1"}})).await.ok();
    let rewound = app.say(cid, "u1", "needle after the point").await;
    app.rewind(cid, &open, &rewound, false).await.ok();

    let q = json!({"filter_conditions": {"cid": cid}, "query": "needle"});
    let kept = ["sv-old-2".to_string(), "sv-old-3".to_string()];
    let mut want_u2 = set(&[&kept[0], &kept[1], &restricted, &open]);
    assert_eq!(found(&app, &app.user("u2"), q.clone()).await, want_u2, "u2: the restricted message, not the ghost's");
    let both = json!({"filter_conditions": {"cid": {"$in": [cid, other]}}, "query": "needle"});
    let mut want_both = want_u2.clone();
    want_both.insert("sv-other-0".to_string());
    assert_eq!(found(&app, &app.user("u2"), both).await, want_both, "one channel's truncation hides nothing in another");
    assert_eq!(
        found(&app, &app.user("u1"), q.clone()).await,
        set(&[&kept[0], &kept[1], &restricted, &open]),
        "u1 wrote the restricted one"
    );
    assert_eq!(found(&app, &app.user("ghost"), q.clone()).await, set(&[&kept[0], &kept[1], &shadowed, &open]), "the ghost sees its own");
    want_u2.insert(shadowed.clone());
    assert_eq!(found(&app, &app.server(), q.clone()).await, want_u2, "server-side sees what a server-side read sees");
    // Leaving the channel ends finding its messages.
    app.post(channel_path(cid).as_str(), &app.server(), json!({"remove_members": ["u2"]})).await.ok();
    assert_eq!(found(&app, &app.user("u2"), q).await, BTreeSet::new(), "u2 is no longer a member");
}

#[tokio::test]
async fn pages_by_offset_and_by_next_and_previous_cover_every_hit_once_in_order() {
    let app = TestApp::spawn().await;
    app.users(&["amy"]).await;
    let cid = "agent:s-page";
    app.channel(cid, "amy", &["amy"]).await;
    let base = past_ns();
    let msgs: Vec<Value> = (0..25)
        .map(|i| json!({"id": format!("pg-{i:02}"), "text": format!("page word {i}"), "user_id": "amy", "created_at": rfc3339(base + i * 1_000_000)}))
        .collect();
    app.send_many(cid, msgs, 4).await;
    let amy = app.user("amy");
    let newest_first: Vec<String> = (0..25).rev().map(|i| format!("pg-{i:02}")).collect();

    // Offsets, in relevance order (equal here, then id ascending).
    let mut by_offset = Vec::new();
    for offset in [0, 10, 20] {
        let body =
            search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "word", "limit": 10, "offset": offset})).await.ok();
        by_offset.extend(hit_ids(&body));
    }
    let mut by_id = newest_first.clone();
    by_id.sort();
    assert_eq!(by_offset, by_id);

    // Cursors, newest first: the sort travels in the cursor.
    let sort = json!([{"field": "created_at", "direction": -1}]);
    let mut pages: Vec<Value> =
        vec![search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "word", "limit": 10, "sort": sort})).await.ok()];
    while let Some(next) = pages.last().unwrap().get("next").and_then(Value::as_str).map(str::to_string) {
        assert!(pages.len() < 5, "paging ends");
        pages.push(search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "word", "limit": 10, "next": next})).await.ok());
    }
    let by_next: Vec<String> = pages.iter().flat_map(hit_ids).collect();
    assert_eq!(by_next, newest_first);
    assert!(pages[0].get("previous").is_none(), "the first page has no previous");
    // Back from the last page: the middle page again.
    let previous = pages[2]["previous"].as_str().expect("previous").to_string();
    let back = search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "word", "limit": 10, "next": previous})).await.ok();
    assert_eq!(hit_ids(&back), hit_ids(&pages[1]));
    let previous = back["previous"].as_str().expect("previous").to_string();
    let first =
        search(&app, &amy, json!({"filter_conditions": {"cid": cid}, "query": "word", "limit": 10, "previous": previous})).await.ok();
    assert_eq!(hit_ids(&first), hit_ids(&pages[0]));
    assert!(first.get("previous").is_none(), "back at the start: {first}");
}

#[tokio::test]
async fn dedupe_copies_folds_a_source_and_its_forks_into_one_hit_each_from_the_channel_listed_first() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let src = "agent:s-src";
    app.channel(src, "u1", &["u1", "u2"]).await;
    let base = past_ns();
    let m = app.seed(src, "u1", "dd", 3, base, 1).await;
    app.fork(src, &m[2], "s-fork").await.ok();
    let fork = "agent:s-fork";
    app.wait_fork_finished(fork).await;
    app.fork(fork, &copy_id(fork, &m[1]), "s-fork2").await.ok();
    let fork2 = "agent:s-fork2";
    app.wait_fork_finished(fork2).await;
    let only_in_fork = app.say(fork, "u1", "message 9 after the fork").await;
    let u2 = app.user("u2");
    let cids = json!({"$in": [fork, src, fork2]});

    let all = found(&app, &u2, json!({"filter_conditions": {"cid": cids}, "query": "message"})).await;
    assert_eq!(all.len(), 3 + 3 + 2 + 1, "the copies are searchable in their forks: {all:?}");
    let folded = search(&app, &u2, json!({"filter_conditions": {"cid": cids}, "query": "message", "dedupe_copies": true})).await.ok();
    let mut got: Vec<(String, String)> = folded["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["message"]["id"].as_str().unwrap().into(), r["message"]["channel"]["cid"].as_str().unwrap().into()))
        .collect();
    got.sort();
    let mut want: Vec<(String, String)> = m.iter().map(|s| (copy_id(fork, s), fork.to_string())).collect();
    want.push((only_in_fork.clone(), fork.to_string()));
    want.sort();
    assert_eq!(got, want, "one hit per source message, in the channel listed first");
    // Listed otherwise (or by another filter), the source's own message is kept.
    let folded =
        found(&app, &u2, json!({"filter_conditions": {"cid": {"$in": [src, fork2, fork]}}, "query": "message", "dedupe_copies": true}))
            .await;
    let mut want: BTreeSet<String> = m.iter().cloned().collect();
    want.insert(only_in_fork.clone());
    assert_eq!(folded, want);
    let folded =
        found(&app, &u2, json!({"filter_conditions": {"members": {"$in": ["u2"]}}, "query": "message", "dedupe_copies": true})).await;
    assert_eq!(folded, want, "the source when no channel is listed");
    // A fork of a fork folds into the original too: only the fork2 copy of m[0] is asked.
    let folded =
        found(&app, &u2, json!({"filter_conditions": {"cid": {"$in": [fork2, src]}}, "query": "message", "dedupe_copies": true})).await;
    let copy2 = |s: &String| copy_id(fork2, &copy_id(fork, s));
    assert_eq!(folded, BTreeSet::from([copy2(&m[0]), copy2(&m[1]), m[2].clone()]));
}

/// Index upkeep under concurrent sends (the store's writers run concurrently on PostgreSQL):
/// every message sent is found by its own word and by the shared one, exactly once, and after
/// concurrent edits and hard deletes only the current texts match.
#[tokio::test]
async fn concurrent_sends_edits_and_deletes_keep_the_index_exact() {
    let app = TestApp::spawn().await;
    app.users(&["amy"]).await;
    let channels: Vec<String> = (0..4).map(|i| format!("agent:s-conc-{i}")).collect();
    for cid in &channels {
        app.channel(cid, "amy", &["amy"]).await;
    }
    let n = 160;
    let sends = (0..n).map(|i| {
        let cid = channels[i % channels.len()].clone();
        let app = &app;
        async move {
            app.send_message(&cid, json!({"id": format!("conc-{i:03}"), "text": format!("shared unique{i} words"), "user_id": "amy"})).await
        }
    });
    futures_util::stream::iter(sends).buffer_unordered(16).collect::<Vec<_>>().await;
    let amy = app.user("amy");
    let filter = json!({"members": {"$in": ["amy"]}});
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..(n / 100 + 2) {
        let mut payload = json!({"filter_conditions": filter, "query": "shared", "limit": 100});
        if let Some(c) = &next {
            payload["next"] = json!(c);
        }
        let body = search(&app, &amy, payload).await.ok();
        seen.extend(hit_ids(&body));
        next = body.get("next").and_then(Value::as_str).map(str::to_string);
        if next.is_none() {
            break;
        }
    }
    let mut want: Vec<String> = (0..n).map(|i| format!("conc-{i:03}")).collect();
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
    for i in [0, n / 2, n - 1] {
        let got = found(&app, &amy, json!({"filter_conditions": filter, "query": format!("unique{i}")})).await;
        assert_eq!(got, BTreeSet::from([format!("conc-{i:03}")]));
    }
    // Edits (every even message) and hard deletes (every third odd one), all at once.
    let changes = (0..n).filter(|i| i % 2 == 0 || i % 6 == 1).map(|i| {
        let app = &app;
        async move {
            if i % 2 == 0 {
                app.put(&format!("/messages/conc-{i:03}"), &app.server(), json!({"set": {"text": format!("changed unique{i}")}}))
                    .await
                    .ok();
            } else {
                app.delete(&format!("/messages/conc-{i:03}?hard=true"), &app.server()).await.ok();
            }
        }
    });
    futures_util::stream::iter(changes).buffer_unordered(16).collect::<Vec<_>>().await;
    let all = |query: &'static str| {
        let (app, amy, filter) = (&app, amy.clone(), filter.clone());
        async move {
            let mut seen = BTreeSet::new();
            for offset in (0..n).step_by(100) {
                let body =
                    search(app, &amy, json!({"filter_conditions": filter, "query": query, "limit": 100, "offset": offset})).await.ok();
                seen.extend(hit_ids(&body));
            }
            seen
        }
    };
    let changed: BTreeSet<String> = (0..n).filter(|i| i % 2 == 0).map(|i| format!("conc-{i:03}")).collect();
    let unchanged: BTreeSet<String> = (0..n).filter(|i| i % 2 == 1 && i % 6 != 1).map(|i| format!("conc-{i:03}")).collect();
    assert_eq!(all("changed").await, changed, "every edit re-indexed its text");
    assert_eq!(all("shared").await, unchanged, "edited and deleted messages no longer match their old text");
}

#[tokio::test]
async fn the_default_order_is_relevance_then_id() {
    let app = TestApp::spawn().await;
    app.users(&["amy"]).await;
    let cid = "agent:s-rank";
    app.channel(cid, "amy", &["amy"]).await;
    // The weaker match has the smaller id, so an order by id alone would put it first.
    app.send_message(cid, json!({"id": "rank-a", "text": "rank appears once in this longer message about other things", "user_id": "amy"}))
        .await;
    app.send_message(cid, json!({"id": "rank-b", "text": "rank rank rank", "user_id": "amy"})).await;
    app.send_message(cid, json!({"id": "rank-c", "text": "rank appears once in this longer message about other things", "user_id": "amy"}))
        .await;
    let body = search(&app, &app.user("amy"), json!({"filter_conditions": {"cid": cid}, "query": "rank"})).await.ok();
    assert_eq!(hit_ids(&body), vec!["rank-b", "rank-a", "rank-c"], "{body}");
    let by_id = search(
        &app,
        &app.user("amy"),
        json!({"filter_conditions": {"cid": cid}, "query": "rank", "sort": [{"field": "id", "direction": -1}]}),
    )
    .await
    .ok();
    assert_eq!(hit_ids(&by_id), vec!["rank-c", "rank-b", "rank-a"]);
}
