//! A channel's whole fork tree in one statement: up the `source` links to the root, then every
//! fork below it to any depth, breadth first (docs/fork.md, "Lineage").

use crate::rows::{self, Flag, Json};
use crate::{Result, Store, StoreError};
use offshoot_core::model::{Custom, ForkStatus, ForkSummary};
use serde::Deserialize;
use sqlx::any::AnyArguments;
use sqlx::Arguments;
use std::collections::HashSet;

fn encode(e: sqlx::error::BoxDynError) -> StoreError {
    StoreError::Db(sqlx::Error::Encode(e))
}

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

/// The columns of the statement, in [`NodeRow`]'s field order (the names [`rows::fetch_json`]
/// reads them by on SQLite).
const NODE_COLS: &str = "cid, parent_cid, depth, present, custom, member_count, created_at, deleted_at, \
    f_source_cid, f_source_message_id, f_status, f_copied_message_count, f_total_message_count, f_truncated, \
    f_oldest_source_message_id, f_failed_reason, f_task_id, f_created_by_id, f_created_at, f_updated_at, \
    fork_point_text, member";

/// One node as the statement returns it, as sqlx columns (PostgreSQL) or as a JSON array of
/// [`NODE_COLS`] (SQLite). The `f_` columns are the fork record's, all NULL for a node that is
/// no fork (the root).
#[derive(sqlx::FromRow, Deserialize)]
struct NodeRow {
    cid: String,
    parent_cid: Option<String>,
    depth: i64,
    present: Flag,
    custom: Option<Json<Custom>>,
    member_count: i64,
    created_at: Option<i64>,
    deleted_at: Option<i64>,
    f_source_cid: Option<String>,
    f_source_message_id: Option<String>,
    f_status: Option<String>,
    f_copied_message_count: Option<i64>,
    f_total_message_count: Option<i64>,
    f_truncated: Option<Flag>,
    f_oldest_source_message_id: Option<String>,
    f_failed_reason: Option<String>,
    f_task_id: Option<String>,
    f_created_by_id: Option<String>,
    f_created_at: Option<i64>,
    f_updated_at: Option<i64>,
    fork_point_text: Option<String>,
    member: Flag,
}

impl NodeRow {
    /// Its place in the answer's order: by depth, then by creation time (the fork record's,
    /// which is the node's; the root's is its own level), then cid.
    fn order_key(&self) -> (i64, i64, &str) {
        (self.depth, self.f_created_at.unwrap_or_default(), &self.cid)
    }

    fn node(self) -> Result<LineageNode> {
        let fork = match self.f_status {
            None => None,
            Some(status) => {
                let Some(status) = ForkStatus::parse(&status) else {
                    return Err(StoreError::Db(sqlx::Error::Decode(format!("unknown fork status {status:?}").into())));
                };
                Some(ForkSummary {
                    channel_cid: self.cid.clone(),
                    source_channel_cid: self.f_source_cid.unwrap_or_default(),
                    source_message_id: self.f_source_message_id.unwrap_or_default(),
                    status,
                    copied_message_count: self.f_copied_message_count.unwrap_or_default(),
                    total_message_count: self.f_total_message_count,
                    truncated: self.f_truncated.is_some_and(|t| t.0),
                    oldest_source_message_id: self.f_oldest_source_message_id,
                    failed_reason: self.f_failed_reason,
                    task_id: self.f_task_id,
                    created_by_id: self.f_created_by_id,
                    created_at: self.f_created_at.unwrap_or_default(),
                    updated_at: self.f_updated_at.unwrap_or_default(),
                })
            }
        };
        Ok(LineageNode {
            channel: self.present.0.then(|| LineageChannel {
                custom: self.custom.map(|c| c.0).unwrap_or_default(),
                member_count: self.member_count,
                created_at: self.created_at.unwrap_or_default(),
                deleted_at: self.deleted_at,
            }),
            fork,
            cid: self.cid,
            parent_cid: self.parent_cid,
            depth: self.depth,
            fork_point_text: self.fork_point_text,
            member: self.member.0,
        })
    }
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
        // The answer is the first max_nodes + 1 nodes breadth first (one more than it returns,
        // to tell a cut). `probe` walks down breadth first too and is read lazily: both engines
        // produce a recursive query's rows level by level and stop once `reach` has taken
        // max_nodes + 1 of them, so `reach` is the deepest level the answer can need. `tree` then
        // takes every level down to that one (whole levels, to order each by creation time), so
        // a tree of 200,000 channels costs what its first few levels cost. `cut` orders and cuts
        // before the joins, which then run for the returned nodes only. The depth bounds end a
        // walk through looping source links (see MAX_ANCESTORS).
        let sql = format!(
            "WITH RECURSIVE up(cid, n) AS (\
                SELECT CAST($1 AS TEXT), CAST(0 AS BIGINT) \
                UNION ALL \
                SELECT uf.source_cid, up.n + 1 FROM up JOIN fork uf ON uf.cid = up.cid WHERE up.n < $2\
             ), \
             root(cid) AS (SELECT cid FROM up ORDER BY n DESC LIMIT 1), \
             probe(cid, depth) AS (\
                SELECT cid, CAST(0 AS BIGINT) FROM root \
                UNION ALL \
                SELECT pf.cid, probe.depth + 1 FROM probe JOIN fork pf ON pf.source_cid = probe.cid WHERE probe.depth < $3\
             ), \
             reach(d) AS (SELECT MAX(p.depth) FROM (SELECT depth FROM probe LIMIT $5) p), \
             tree(cid, parent_cid, depth, created_at) AS (\
                SELECT cid, CAST(NULL AS TEXT), CAST(0 AS BIGINT), CAST(0 AS BIGINT) FROM root \
                UNION ALL \
                SELECT tf.cid, tf.source_cid, tree.depth + 1, tf.created_at FROM tree JOIN fork tf ON tf.source_cid = tree.cid \
                WHERE tree.depth < (SELECT d FROM reach)\
             ), \
             cut AS (SELECT cid, parent_cid, depth, created_at FROM tree ORDER BY depth, created_at, cid LIMIT $5) \
             SELECT t.cid, t.parent_cid, t.depth, c.cid IS NOT NULL AS present, c.custom, \
                (SELECT COUNT(*) FROM member mm WHERE mm.cid = t.cid) AS member_count, c.created_at, c.deleted_at, \
                o.source_cid AS f_source_cid, o.source_message_id AS f_source_message_id, o.status AS f_status, \
                o.copied_message_count AS f_copied_message_count, o.total_message_count AS f_total_message_count, o.truncated AS f_truncated, \
                o.oldest_source_message_id AS f_oldest_source_message_id, o.failed_reason AS f_failed_reason, o.task_id AS f_task_id, \
                o.created_by_id AS f_created_by_id, o.created_at AS f_created_at, o.updated_at AS f_updated_at, \
                (SELECT substr(m.text, 1, {FORK_POINT_CHARS}) FROM message m WHERE m.id = o.source_message_id AND m.cid = o.source_cid \
                    AND m.deleted_at IS NULL AND m.type <> 'deleted' AND m.shadowed = FALSE AND m.restricted_visibility = '[]') AS fork_point_text, \
                EXISTS (SELECT 1 FROM member mu WHERE mu.cid = t.cid AND mu.user_id = $4) AS member \
             FROM cut t LEFT JOIN channel c ON c.cid = t.cid LEFT JOIN fork o ON o.cid = t.cid"
        );
        let mut args = AnyArguments::default();
        args.add(cid.to_string()).map_err(encode)?;
        args.add(MAX_ANCESTORS).map_err(encode)?;
        args.add(max_nodes).map_err(encode)?;
        args.add(user_id.map(str::to_string)).map_err(encode)?;
        args.add(max_nodes + 1).map_err(encode)?;
        // On SQLite the rows cross as one JSON text that SQLite builds, not as a thousand rows
        // of 22 columns converted one by one by sqlx's `Any` driver (docs/performance.md,
        // "Lineage").
        let mut conn = self.pool().acquire().await?;
        let mut rows: Vec<NodeRow> = rows::fetch_json(&mut conn, &sql, NODE_COLS, args).await?;
        drop(conn);
        // The JSON read does not keep the statement's order.
        rows.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let root_cid = rows.first().map(|r| r.cid.clone()).unwrap_or_else(|| cid.to_string());
        let truncated = rows.len() as i64 > max_nodes;
        // A cid met twice is a loop (see MAX_ANCESTORS): its first, shallowest, place is kept.
        let mut seen = HashSet::new();
        let nodes = rows
            .into_iter()
            .take(max_nodes as usize)
            .filter(|r| seen.insert(r.cid.clone()))
            .map(NodeRow::node)
            .collect::<Result<Vec<_>>>()?;
        Ok(Lineage { root_cid, nodes, truncated })
    }
}
