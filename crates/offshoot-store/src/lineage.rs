//! A channel's whole fork tree in one statement: up the `source` links to the root, then every
//! fork below it to any depth, breadth first (docs/fork.md, "Lineage").

use crate::rows::{fork_json, Flag, Json, Nested};
use crate::{Result, Store};
use offshoot_core::model::{Custom, ForkSummary};
use sqlx::AssertSqlSafe;
use std::collections::HashSet;

/// Nodes a lineage returns when the caller names no bound.
pub const DEFAULT_MAX_NODES: i64 = 1_000;
/// The most nodes one lineage returns.
pub const MAX_MAX_NODES: i64 = 5_000;
/// Steps the walk up from the channel asked about takes at most. A fork is always a new
/// channel, so the links cannot loop, except through a cid that was hard-deleted and created
/// again as a fork of its own descendant; the bound ends such a walk.
const MAX_ANCESTORS: i64 = 10_000;
/// Characters of the fork point's text a node carries.
pub const FORK_POINT_CHARS: i64 = 140;

/// One channel of a tree.
#[derive(Debug, Clone)]
pub struct LineageNode {
    pub cid: String,
    /// The channel it was forked from; `None` for the root.
    pub parent_cid: Option<String>,
    /// 0 for the root.
    pub depth: i64,
    /// The channel row; `None` when the channel was hard-deleted (the root of a tree whose
    /// source is gone).
    pub channel: Option<LineageChannel>,
    /// Its fork summary, with the live progress of a backfill; `None` for the root.
    pub fork: Option<ForkSummary>,
    /// The first [`FORK_POINT_CHARS`] characters of the source message it was forked at, while
    /// that message exists, is not deleted and is visible to everyone.
    pub fork_point_text: Option<String>,
    /// Whether the user the tree was asked for is a member of this channel.
    pub member: bool,
}

/// What a node shows of its channel row.
#[derive(Debug, Clone)]
pub struct LineageChannel {
    pub custom: Custom,
    pub member_count: i64,
    pub created_at: i64,
    pub deleted_at: Option<i64>,
}

impl LineageChannel {
    /// The channel's `name`, when it has a string one.
    pub fn name(&self) -> Option<&str> {
        self.custom.get("name").and_then(|v| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Lineage {
    /// The top of the tree: the oldest ancestor reachable by `source` links (it may be a
    /// hard-deleted channel, whose node then has no `channel`).
    pub root_cid: String,
    /// Breadth first: by depth, then by creation time (then cid).
    pub nodes: Vec<LineageNode>,
    /// The tree has more nodes than the bound let through.
    pub truncated: bool,
}

#[derive(sqlx::FromRow)]
struct NodeRow {
    cid: String,
    parent_cid: Option<String>,
    depth: i64,
    present: Flag,
    custom: Option<Json<Custom>>,
    member_count: i64,
    created_at: Option<i64>,
    deleted_at: Option<i64>,
    fork: Option<Nested<ForkSummary>>,
    fork_point_text: Option<String>,
    member: Flag,
}

impl Store {
    /// The fork tree `cid` belongs to: its root (following `source` up) and up to `max_nodes`
    /// nodes below it, breadth first, with each node's channel, fork summary and whether
    /// `user_id` is a member. One statement, whatever the tree's depth.
    ///
    /// A channel that is in no tree is a tree of one node. A channel that does not exist and is
    /// no fork's source is a tree of one node without a channel row; the caller decides whether
    /// that is a 404.
    pub async fn lineage(&self, cid: &str, max_nodes: i64, user_id: Option<&str>) -> Result<Lineage> {
        let max_nodes = max_nodes.clamp(1, MAX_MAX_NODES);
        // `tree` stops one level past the most the answer can hold (a chain of max_nodes + 1
        // nodes, enough to tell a cut), and the answer takes one row more than it returns.
        let sql = format!(
            "WITH RECURSIVE up(cid, n) AS (\
                SELECT CAST($1 AS TEXT), CAST(0 AS BIGINT) \
                UNION ALL \
                SELECT uf.source_cid, up.n + 1 FROM up JOIN fork uf ON uf.cid = up.cid WHERE up.n < $2\
             ), \
             root(cid) AS (SELECT cid FROM up ORDER BY n DESC LIMIT 1), \
             tree(cid, parent_cid, depth) AS (\
                SELECT cid, CAST(NULL AS TEXT), CAST(0 AS BIGINT) FROM root \
                UNION ALL \
                SELECT tf.cid, tf.source_cid, tree.depth + 1 FROM tree JOIN fork tf ON tf.source_cid = tree.cid WHERE tree.depth < $3\
             ) \
             SELECT t.cid, t.parent_cid, t.depth, c.cid IS NOT NULL AS present, c.custom, \
                (SELECT COUNT(*) FROM member mm WHERE mm.cid = t.cid) AS member_count, c.created_at, c.deleted_at, \
                {fork} AS fork, \
                (SELECT substr(m.text, 1, {FORK_POINT_CHARS}) FROM message m WHERE m.id = o.source_message_id AND m.cid = o.source_cid \
                    AND m.deleted_at IS NULL AND m.type <> 'deleted' AND m.shadowed = FALSE AND m.restricted_visibility = '[]') AS fork_point_text, \
                EXISTS (SELECT 1 FROM member mu WHERE mu.cid = t.cid AND mu.user_id = $4) AS member \
             FROM tree t LEFT JOIN channel c ON c.cid = t.cid LEFT JOIN fork o ON o.cid = t.cid \
             ORDER BY t.depth, COALESCE(o.created_at, c.created_at), t.cid \
             LIMIT $5",
            fork = fork_json(self.backend(), "t.cid"),
        );
        let rows: Vec<NodeRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(cid.to_string())
            .bind(MAX_ANCESTORS)
            .bind(max_nodes)
            .bind(user_id.map(str::to_string))
            .bind(max_nodes + 1)
            .fetch_all(crate::counted(self.pool()))
            .await?;
        let root_cid = rows.first().map(|r| r.cid.clone()).unwrap_or_else(|| cid.to_string());
        let truncated = rows.len() as i64 > max_nodes;
        // A cid met twice is a loop (see MAX_ANCESTORS): its first, shallowest, place is kept.
        let mut seen = HashSet::new();
        let nodes = rows
            .into_iter()
            .take(max_nodes as usize)
            .filter(|r| seen.insert(r.cid.clone()))
            .map(|r| LineageNode {
                channel: r.present.0.then(|| LineageChannel {
                    custom: r.custom.map(|c| c.0).unwrap_or_default(),
                    member_count: r.member_count,
                    created_at: r.created_at.unwrap_or_default(),
                    deleted_at: r.deleted_at,
                }),
                cid: r.cid,
                parent_cid: r.parent_cid,
                depth: r.depth,
                fork: r.fork.map(|f| f.0),
                fork_point_text: r.fork_point_text,
                member: r.member.0,
            })
            .collect();
        Ok(Lineage { root_cid, nodes, truncated })
    }
}
