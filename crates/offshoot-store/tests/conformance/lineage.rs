//! The lineage: a channel's whole fork tree in one statement, from any of its nodes, bounded,
//! with deleted channels in it.

use crate::support::{agent_channel, member, msg, user, with_store};
use offshoot_core::model::ForkStatus;
use offshoot_store::lineage::Lineage;
use offshoot_store::{count_statements, ForkOutcome, ForkRequest, Store};
use serde_json::json;

/// Sends a message into `source_cid` and forks there into `agent:{target_id}`, named after
/// itself, with `members` (the source's when `None`).
async fn fork_at(s: &Store, source_cid: &str, target_id: &str, members: Option<&[&str]>, text: &str) -> ForkOutcome {
    let point = format!("{target_id}-point");
    s.send_message(source_cid, &msg(&point, text), &user("amy")).await.expect("send the fork point");
    let req = ForkRequest {
        source_cid: source_cid.into(),
        message_id: point,
        target_id: target_id.into(),
        custom: json!({"name": format!("{target_id} name")}).as_object().cloned().expect("object"),
        members: members.map(|m| m.iter().map(|u| member(u)).collect()),
        ..Default::default()
    };
    s.create_fork(&req).await.expect("create fork")
}

/// `agent:r` (amy and ben) forked into `a` and `b` (ben alone); `a` into `c`, `c` into `d`,
/// `d` into `e`: five levels, six channels.
async fn four_levels(s: &Store) {
    agent_channel(s, "r", &["amy", "ben"]).await;
    fork_at(s, "agent:r", "a", None, "fork a here").await;
    fork_at(s, "agent:r", "b", Some(&["ben"]), "fork b here").await;
    fork_at(s, "agent:a", "c", None, "fork c here").await;
    fork_at(s, "agent:c", "d", None, "fork d here").await;
    fork_at(s, "agent:d", "e", None, "fork e here").await;
}

fn shape(l: &Lineage) -> Vec<(String, Option<String>, i64)> {
    l.nodes.iter().map(|n| (n.cid.clone(), n.parent_cid.clone(), n.depth)).collect()
}

fn node(cid: &str, parent: Option<&str>, depth: i64) -> (String, Option<String>, i64) {
    (cid.to_string(), parent.map(str::to_string), depth)
}

#[tokio::test]
async fn a_lineage_asked_from_any_node_is_the_whole_tree_breadth_first() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        four_levels(s).await;
        let expected = vec![
            node("agent:r", None, 0),
            node("agent:a", Some("agent:r"), 1),
            node("agent:b", Some("agent:r"), 1),
            node("agent:c", Some("agent:a"), 2),
            node("agent:d", Some("agent:c"), 3),
            node("agent:e", Some("agent:d"), 4),
        ];
        for asked in ["agent:r", "agent:b", "agent:d", "agent:e"] {
            let l = s.lineage(asked, 1_000, Some("amy")).await.expect("lineage");
            assert_eq!(l.root_cid, "agent:r", "asked from {asked}");
            assert!(!l.truncated, "asked from {asked}");
            assert_eq!(shape(&l), expected, "asked from {asked}");
        }
        let l = s.lineage("agent:d", 1_000, Some("amy")).await.expect("lineage");
        let root = &l.nodes[0];
        assert!(root.fork.is_none() && root.fork_point_text.is_none(), "the root is no fork");
        assert_eq!(root.channel.as_ref().expect("root row").member_count, 2);
        let b = &l.nodes[2];
        let b_channel = b.channel.as_ref().expect("b's row");
        assert_eq!((b_channel.name(), b_channel.member_count, b_channel.deleted_at), (Some("b name"), 1, None));
        let b_fork = b.fork.as_ref().expect("b is a fork");
        assert_eq!((b_fork.source_channel_cid.as_str(), b_fork.source_message_id.as_str()), ("agent:r", "b-point"));
        assert_eq!(b_fork.status, ForkStatus::Completed, "a short source completes at once");
        assert_eq!(b.fork_point_text.as_deref(), Some("fork b here"));
        let members: Vec<(&str, bool)> = l.nodes.iter().map(|n| (n.cid.as_str(), n.member)).collect();
        assert_eq!(
            members,
            vec![("agent:r", true), ("agent:a", true), ("agent:b", false), ("agent:c", true), ("agent:d", true), ("agent:e", true)],
            "amy is a member of every channel but b"
        );
        let as_server = s.lineage("agent:d", 1_000, None).await.expect("lineage");
        assert!(as_server.nodes.iter().all(|n| !n.member), "no user, no membership");
    })
    .await;
}

#[tokio::test]
async fn a_lineage_is_one_statement_whatever_the_depth() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        agent_channel(s, "solo", &["amy"]).await;
        let (solo, n) = count_statements(s.lineage("agent:solo", 1_000, Some("amy"))).await;
        assert_eq!((solo.expect("lineage").nodes.len(), n), (1, 1));
        four_levels(s).await;
        let (deep, n) = count_statements(s.lineage("agent:e", 1_000, Some("amy"))).await;
        assert_eq!((deep.expect("lineage").nodes.len(), n), (6, 1));
    })
    .await;
}

#[tokio::test]
async fn a_lineage_past_max_nodes_keeps_the_shallowest_oldest_nodes_and_says_it_was_cut() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        four_levels(s).await;
        let cut = s.lineage("agent:e", 3, Some("amy")).await.expect("lineage");
        assert!(cut.truncated);
        assert_eq!(shape(&cut), vec![node("agent:r", None, 0), node("agent:a", Some("agent:r"), 1), node("agent:b", Some("agent:r"), 1)]);
        let exact = s.lineage("agent:e", 6, Some("amy")).await.expect("lineage");
        assert!(!exact.truncated, "six nodes fit in six");
        assert_eq!(exact.nodes.len(), 6);
        let five = s.lineage("agent:r", 5, Some("amy")).await.expect("lineage");
        assert!(five.truncated);
        assert_eq!(five.nodes.last().map(|n| n.cid.as_str()), Some("agent:d"), "the deepest node is the one left out");
    })
    .await;
}

#[tokio::test]
async fn a_hard_deleted_source_stays_in_the_tree_as_a_node_without_a_channel() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        four_levels(s).await;
        // Soft-deleted: the node keeps its row and says so.
        s.delete_channel("agent:b", false, None).await.expect("soft delete b");
        let l = s.lineage("agent:e", 1_000, None).await.expect("lineage");
        let b = l.nodes.iter().find(|n| n.cid == "agent:b").expect("b still in the tree");
        assert!(b.channel.as_ref().expect("b's row").deleted_at.is_some());

        // The root hard-deleted: its forks still name it, so the tree keeps its place.
        s.delete_channel("agent:r", true, None).await.expect("hard delete r");
        let l = s.lineage("agent:e", 1_000, None).await.expect("lineage");
        assert_eq!(l.root_cid, "agent:r");
        assert_eq!(l.nodes.len(), 6);
        assert!(l.nodes[0].channel.is_none() && l.nodes[0].fork.is_none(), "the root is a placeholder");
        assert_eq!(l.nodes[1].fork.as_ref().expect("a's fork").source_channel_cid, "agent:r");
        assert_eq!(l.nodes[1].fork_point_text, None, "the fork point went with its channel");

        // A fork in the middle hard-deleted: its own fork row goes with it, so the tree below it
        // starts at its cid, and the tree above no longer reaches below it.
        s.delete_channel("agent:c", true, None).await.expect("hard delete c");
        let below = s.lineage("agent:e", 1_000, None).await.expect("lineage");
        assert_eq!(below.root_cid, "agent:c");
        assert_eq!(shape(&below), vec![node("agent:c", None, 0), node("agent:d", Some("agent:c"), 1), node("agent:e", Some("agent:d"), 2)]);
        assert!(below.nodes[0].channel.is_none());
        let above = s.lineage("agent:a", 1_000, None).await.expect("lineage");
        assert_eq!(shape(&above), vec![node("agent:r", None, 0), node("agent:a", Some("agent:r"), 1), node("agent:b", Some("agent:r"), 1)]);

        // A cid that never existed is a tree of one node without a row.
        let none = s.lineage("agent:nothing", 1_000, None).await.expect("lineage");
        assert_eq!(shape(&none), vec![node("agent:nothing", None, 0)]);
        assert!(none.nodes[0].channel.is_none());
    })
    .await;
}

#[tokio::test]
async fn a_fork_point_text_is_cut_at_140_characters_not_bytes() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        agent_channel(s, "long", &["amy"]).await;
        let text = "é".repeat(200);
        fork_at(s, "agent:long", "cut", None, &text).await;
        let l = s.lineage("agent:cut", 1_000, None).await.expect("lineage");
        assert_eq!(l.nodes[1].fork_point_text.as_deref(), Some("é".repeat(140).as_str()));
    })
    .await;
}

#[tokio::test]
async fn a_cut_inside_a_level_keeps_that_level_s_oldest_forks_whatever_their_parents() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        agent_channel(s, "w", &["amy"]).await;
        fork_at(s, "agent:w", "wa", None, "a").await;
        fork_at(s, "agent:w", "wb", None, "b").await;
        // b's fork is older than a's, though a comes first in its level.
        fork_at(s, "agent:wb", "wb1", None, "b1").await;
        fork_at(s, "agent:wa", "wa1", None, "a1").await;
        let cut = s.lineage("agent:wa1", 4, None).await.expect("lineage");
        assert!(cut.truncated);
        assert_eq!(
            shape(&cut),
            vec![
                node("agent:w", None, 0),
                node("agent:wa", Some("agent:w"), 1),
                node("agent:wb", Some("agent:w"), 1),
                node("agent:wb1", Some("agent:wb"), 2)
            ]
        );
        let all = s.lineage("agent:wa1", 5, None).await.expect("lineage");
        assert!(!all.truncated);
        assert_eq!(all.nodes.last().map(|n| n.cid.as_str()), Some("agent:wa1"));
    })
    .await;
}
