//! `GET /channels/{type}/{id}/lineage`: the whole fork tree in one answer, in both dialects,
//! with the permissions of the forks list.

use crate::helpers::{channel_path, ts_of, unique, TestApp};
use serde_json::{json, Value};

/// `{root}` (amy, ben) forked into `{root}-a` (amy, ben) and `{root}-b` (ben alone), and
/// `{root}-a` into `{root}-c` (amy alone). Returns the four cids, root first.
async fn tree(app: &TestApp) -> [String; 4] {
    app.users(&["amy", "ben"]).await;
    let root = format!("agent:{}", unique("lin"));
    app.channel_with(&root, json!({"created_by_id": "ben", "members": ["amy", "ben"], "name": "the root"})).await;
    let id = |s: &str| format!("{}-{s}", root.trim_start_matches("agent:"));
    let pa = app.say(&root, "amy", "where a starts").await;
    app.fork_with(&root, json!({"message_id": pa, "channel": {"id": id("a"), "name": "branch a"}})).await.ok();
    let pb = app.say(&root, "ben", "where b starts").await;
    app.fork_with(&root, json!({"message_id": pb, "channel": {"id": id("b"), "members": ["ben"]}})).await.ok();
    let a = format!("agent:{}", id("a"));
    let pc = app.say(&a, "amy", "where c starts").await;
    app.fork_with(&a, json!({"message_id": pc, "channel": {"id": id("c"), "members": ["amy"]}})).await.ok();
    let (b, c) = (format!("agent:{}", id("b")), format!("agent:{}", id("c")));
    [root, a, b, c]
}

fn lineage_path(prefix: &str, cid: &str) -> String {
    format!("{prefix}{}/lineage", channel_path(cid))
}

fn shape(body: &Value) -> Vec<(String, Value, i64)> {
    body["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("nodes: {body}"))
        .iter()
        .map(|n| (n["cid"].as_str().expect("cid").to_string(), n["parent_cid"].clone(), n["depth"].as_i64().expect("depth")))
        .collect()
}

#[tokio::test]
async fn the_lineage_is_the_whole_tree_from_any_node_in_both_dialects() {
    let app = TestApp::spawn().await;
    let [root, a, b, c] = tree(&app).await;
    let expected = vec![(root.clone(), Value::Null, 0), (a.clone(), json!(root), 1), (b.clone(), json!(root), 1), (c.clone(), json!(a), 2)];
    for (prefix, nanos) in [("", false), ("/api/v2/chat", true)] {
        let body = app.get(&lineage_path(prefix, &c), &app.server()).await.ok();
        assert_eq!((body["cid"].clone(), body["root_cid"].clone(), body["truncated_tree"].clone()), (json!(c), json!(root), json!(false)));
        assert_eq!(shape(&body), expected, "{prefix}: {body}");
        let nodes = body["nodes"].as_array().expect("nodes");
        assert!(nodes.iter().all(|n| n["readable"] == json!(true)), "server-side reads every node: {body}");
        let r = &nodes[0];
        assert_eq!(
            (r["name"].clone(), r["member_count"].clone(), r["deleted"].clone(), r["fork"].clone()),
            (json!("the root"), json!(2), json!(false), Value::Null)
        );
        let fa = &nodes[1]["fork"];
        assert_eq!(nodes[1]["name"], json!("branch a"));
        assert_eq!(fa["status"], json!("completed"));
        assert_eq!(fa["fork_point_text"], json!("where a starts"));
        // Copied in the fork request itself: no backfill, no task.
        assert_eq!((fa["copied_message_count"].clone(), fa["task_id"].clone()), (json!(1), Value::Null), "{fa}");
        assert_eq!(fa["copied_message_count"], fa["total_message_count"], "a finished fork copied its total: {fa}");
        assert_eq!(fa["truncated"], json!(false));
        assert_eq!(nodes[2]["member_count"], json!(1));
        // The dialect decides the timestamps: RFC 3339 text, or integer nanoseconds.
        for t in [&r["created_at"], &fa["created_at"]] {
            assert_eq!(t.is_i64(), nanos, "{prefix}: {t}");
            assert!(ts_of(t) > 0);
        }
    }
    // The same tree, asked from the root.
    let from_root = app.get(&lineage_path("", &root), &app.server()).await.ok();
    assert_eq!(shape(&from_root), expected);
}

#[tokio::test]
async fn a_member_sees_the_nodes_it_may_not_read_as_their_place_and_status_only() {
    let app = TestApp::spawn().await;
    let [root, a, b, c] = tree(&app).await;
    // amy is in the root, a and c, not in b.
    let body = app.get(&lineage_path("", &a), &app.user("amy")).await.ok();
    assert_eq!(shape(&body).len(), 4);
    let nodes = body["nodes"].as_array().expect("nodes");
    let hidden = nodes.iter().find(|n| n["cid"] == json!(b)).expect("b is in the tree");
    assert_eq!(hidden, &json!({"cid": b, "parent_cid": root, "depth": 1, "readable": false, "fork": {"status": "completed"}}));
    let seen: Vec<&Value> = nodes.iter().filter(|n| n["readable"] == json!(true)).map(|n| &n["cid"]).collect();
    assert_eq!(seen, vec![&json!(root), &json!(a), &json!(c)]);

    // ben, in b alone of the forks: the root reads, a and c do not.
    let body = app.get(&lineage_path("/api/v2/chat", &b), &app.user("ben")).await.ok();
    let readable: Vec<(Value, Value)> =
        body["nodes"].as_array().expect("nodes").iter().map(|n| (n["cid"].clone(), n["readable"].clone())).collect();
    assert_eq!(readable, vec![(json!(root), json!(true)), (json!(a), json!(true)), (json!(b), json!(true)), (json!(c), json!(false))]);
}

#[tokio::test]
async fn a_non_member_is_refused_and_an_unknown_channel_is_404() {
    let app = TestApp::spawn().await;
    let [_, _, b, _] = tree(&app).await;
    app.users(&["carl"]).await;
    app.get(&lineage_path("", &b), &app.user("amy")).await.err(403, 17);
    app.get(&lineage_path("", &b), &app.user("carl")).await.err(403, 17);
    app.get(&lineage_path("", "agent:nothing-here"), &app.server()).await.err(404, 16);
    app.get(&lineage_path("/api/v2/chat", "agent:nothing-here"), &app.user("carl")).await.err(404, 16);
    let bad = app.get(&format!("{}?max_nodes=0", lineage_path("", &b)), &app.server()).await.err(400, 4);
    assert!(bad["message"].as_str().expect("message").contains("max_nodes"), "{bad}");
    app.get(&format!("{}?max_nodes=5001", lineage_path("", &b)), &app.server()).await.err(400, 4);
    app.get(&format!("{}?max_nodes=many", lineage_path("", &b)), &app.server()).await.err(400, 4);
}

#[tokio::test]
async fn max_nodes_cuts_the_tree_breadth_first_and_says_so() {
    let app = TestApp::spawn().await;
    let [root, a, b, _] = tree(&app).await;
    let body = app.get(&format!("{}?max_nodes=3", lineage_path("", &root)), &app.server()).await.ok();
    assert_eq!(body["truncated_tree"], json!(true));
    let cids: Vec<String> = shape(&body).into_iter().map(|(c, _, _)| c).collect();
    assert_eq!(cids, vec![root.clone(), a, b]);
    let all = app.get(&format!("{}?max_nodes=4", lineage_path("", &root)), &app.server()).await.ok();
    assert_eq!(all["truncated_tree"], json!(false));
}

#[tokio::test]
async fn a_hard_deleted_root_stays_as_a_deleted_node_server_side() {
    let app = TestApp::spawn().await;
    let [root, a, _, c] = tree(&app).await;
    app.delete(&format!("{}?hard_delete=true", channel_path(&root)), &app.server()).await.ok();
    let body = app.get(&lineage_path("", &c), &app.server()).await.ok();
    assert_eq!(body["root_cid"], json!(root));
    let nodes = body["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 4);
    assert_eq!(
        (nodes[0]["deleted"].clone(), nodes[0]["created_at"].clone(), nodes[0]["fork"].clone()),
        (json!(true), Value::Null, Value::Null)
    );
    assert_eq!(nodes[1]["parent_cid"], json!(root));
    // A member of a still reads a; the deleted root is only a place for it.
    let as_amy = app.get(&lineage_path("", &a), &app.user("amy")).await.ok();
    assert_eq!(as_amy["nodes"][0], json!({"cid": root, "parent_cid": null, "depth": 0, "readable": false, "fork": null}));
    // The deleted root itself: server-side it still has a tree, for a user it is gone.
    app.get(&lineage_path("", &root), &app.server()).await.ok();
    app.get(&lineage_path("", &root), &app.user("amy")).await.err(404, 16);
}
