//! Fork: the synchronous part (one transaction: channel, members, newest page, summary, task,
//! events) and the backfill steps the worker runs (one transaction per page, with the cursor).

use crate::channels::{event_for, insert_channel_row, load_channel, load_members, lock_channel, reload, MemberInput, NewChannel};
use crate::messages::load_message;
use crate::rows::{self, placeholders, Flag, ForkSummaryRow, Json, FORK_COLS};
use crate::sql::{arguments, Bind};
use crate::users::{ensure_users, load_users};
use crate::{domain, not_found, Backend, Result, Store, Tx};
use offshoot_core::fork::{self as plan, SizeLimits};
use offshoot_core::model::{Audience, Channel, Custom, Event, ForkStatus, ForkSummary, Message, Task, User};
use offshoot_core::{ids, time, Error, ErrorKind};
use serde_json::{json, Map, Value};
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::HashMap;

#[derive(Debug, Clone, Default)]
pub struct ForkRequest {
    pub source_cid: String,
    pub message_id: String,
    pub target_id: String,
    pub custom: Custom,
    pub team: Option<String>,
    pub members: Option<Vec<MemberInput>>,
    pub exclude_attachments: bool,
    pub created_by_id: Option<String>,
    /// Custom keys of the source channel the fork keeps (unless `custom` sets them).
    pub inherit_data: Vec<String>,
    /// Refuse a fork point the agent is still writing (`fork_point_generating`).
    pub require_finished: bool,
}

#[derive(Debug, Clone)]
pub struct ForkOutcome {
    pub channel: Channel,
    pub fork: ForkSummary,
    pub message_id_map: Map<String, Value>,
    /// False when the request was a retry that found the existing fork.
    pub created: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillStep {
    /// More pages to copy.
    More,
    /// The fork is completed or failed (now or before).
    Done,
    /// The fork no longer exists (hard-deleted).
    Gone,
}

/// Messages a fork copies: visible to a client (not hidden by rewind or truncation, not
/// deleted, not shadowed), created up to the fork point; a reply only when its parent is
/// copied too. `$1` source cid, `$2` truncated_at, `$3`/`$4` the fork point, `$5`/`$6` the
/// cap boundary (oldest copied position).
///
/// The parent check ends in `LIMIT 1 OFFSET 0` so that PostgreSQL looks each reply's parent up
/// by its key: without it, it turned the `EXISTS` into a hashed subplan that read every
/// top-level message of the source up to the fork point, on every page and in the fork request
/// (docs/performance.md, "Fork request"; an `OFFSET` keeps the planner from rewriting the `EXISTS`).
const ELIGIBLE: &str = "m.cid = $1 AND m.hidden_at IS NULL AND m.created_at > $2 AND m.deleted_at IS NULL AND m.shadowed = FALSE \
    AND m.type NOT IN ('deleted', 'ephemeral', 'error') AND (m.created_at, m.id) <= ($3, $4) AND (m.created_at, m.id) >= ($5, $6) \
    AND (m.parent_id IS NULL OR EXISTS (SELECT 1 FROM message p WHERE p.id = m.parent_id AND p.cid = $1 AND p.parent_id IS NULL \
    AND p.hidden_at IS NULL AND p.created_at > $2 AND p.deleted_at IS NULL AND p.shadowed = FALSE AND p.type NOT IN ('deleted', 'ephemeral', 'error') \
    AND (p.created_at, p.id) <= ($3, $4) AND (p.created_at, p.id) >= ($5, $6) LIMIT 1 OFFSET 0))";

struct ForkRow {
    summary: ForkSummary,
    exclude_attachments: bool,
    point_created_at: i64,
    planned: bool,
    boundary: Option<(i64, String)>,
    cursor: Option<(i64, String)>,
    first_page_map: Map<String, Value>,
}

/// The fork table's row as stored: the summary and the backfill's own state.
#[derive(sqlx::FromRow)]
struct ForkStateRow {
    #[sqlx(flatten)]
    summary: ForkSummaryRow,
    exclude_attachments: Flag,
    point_created_at: i64,
    planned: Flag,
    boundary_created_at: Option<i64>,
    boundary_id: Option<String>,
    cursor_created_at: Option<i64>,
    cursor_id: Option<String>,
    first_page_map: Json<Map<String, Value>>,
}

impl TryFrom<ForkStateRow> for ForkRow {
    type Error = crate::StoreError;

    fn try_from(r: ForkStateRow) -> Result<ForkRow> {
        Ok(ForkRow {
            summary: r.summary.try_into()?,
            exclude_attachments: r.exclude_attachments.0,
            point_created_at: r.point_created_at,
            planned: r.planned.0,
            boundary: r.boundary_created_at.zip(r.boundary_id),
            cursor: r.cursor_created_at.zip(r.cursor_id),
            first_page_map: r.first_page_map.0,
        })
    }
}

async fn load_fork_row(conn: &mut AnyConnection, cid: &str) -> Result<Option<ForkRow>> {
    let row: Option<ForkStateRow> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {FORK_COLS}, f.exclude_attachments, f.point_created_at, f.planned, f.boundary_created_at, f.boundary_id, f.cursor_created_at, f.cursor_id, f.first_page_map FROM fork f WHERE f.cid = $1"
    )))
    .bind(cid.to_string())
    .fetch_optional(crate::counted(&mut *conn))
    .await?;
    row.map(ForkRow::try_from).transpose()
}

/// Why a copy could not be made.
enum CopyFailure {
    IdTaken,
    TooLarge,
}

/// What the copy needs to know of a source message before copying it; the row itself is
/// copied by the database (`INSERT … SELECT`), never decoded here.
#[derive(sqlx::FromRow, serde::Deserialize)]
struct CopySource {
    id: String,
    parent_id: Option<String>,
    quoted_message_id: Option<String>,
    created_at: i64,
    text_chars: i64,
    custom_bytes: i64,
    attachments: i64,
    reply_count: i64,
    restricted: Flag,
}

/// The columns of [`CopySource`]: only the sizes of the text, custom data and attachments are
/// read, never their content (stored custom data is the serialised object itself, so its length
/// in bytes is its size).
fn copy_source_cols(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => {
            "m.id, m.parent_id, m.quoted_message_id, m.created_at, LENGTH(m.text) AS text_chars, \
             LENGTH(CAST(m.custom AS BLOB)) AS custom_bytes, json_array_length(m.attachments) AS attachments, m.reply_count, \
             m.restricted_visibility <> '[]' AS restricted"
        }
        Backend::Postgres => {
            "m.id, m.parent_id, m.quoted_message_id, m.created_at, LENGTH(m.text) AS text_chars, \
             OCTET_LENGTH(m.custom) AS custom_bytes, CASE WHEN m.attachments = '[]' THEN 0 ELSE json_array_length(m.attachments::json) END AS attachments, \
             m.reply_count, m.restricted_visibility <> '[]' AS restricted"
        }
    }
}

/// The sources `sql` selects (its select list written `{cols}`), newest first.
async fn fetch_sources(tx: &mut Tx, sql: &str, binds: &[Bind]) -> Result<Vec<CopySource>> {
    let cols = copy_source_cols(tx.backend);
    let sql = sql.replace("{cols}", cols);
    let mut sources: Vec<CopySource> = rows::fetch_json(&mut tx.tx, &sql, cols, arguments(binds)?).await?;
    // Newest first, as the statement orders them (the JSON read does not keep the order).
    sources.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    Ok(sources)
}

/// Rows per statement of a page's copy (a full page, [`offshoot_core::fork::BACKFILL_PAGE`], is
/// one statement of each kind): 4 bound values a row, well inside both engines' limits.
const COPY_CHUNK: usize = 1000;

/// One planned copy: (source id, copy id, parent copy id, quoted copy id).
type Copy = (String, String, Option<String>, Option<String>);

/// What a page copies, in order, up to the first message that cannot be copied.
struct CopyPlan {
    copies: Vec<Copy>,
    /// Copies whose `reply_count` may change: copies of sources with replies (some may have been
    /// copied by earlier pages); the parents of copied replies are added after the copy.
    recount: Vec<String>,
    /// Copies of sources with restricted visibility (most pages have none).
    restricted: bool,
    newest: i64,
    failure: Option<CopyFailure>,
}

/// Plans the copy of `sources` (newest first), skipping those already copied by this fork and
/// stopping at the first that cannot be copied: its id taken by another message (`taken`:
/// copy id → the cid and source of the message holding it) or too large.
fn plan_copies(
    fork_cid: &str,
    sources: &[CopySource],
    copy_ids: &[String],
    taken: &HashMap<String, (String, Option<String>)>,
    exclude_attachments: bool,
    limits: SizeLimits,
) -> CopyPlan {
    let mut plan =
        CopyPlan { copies: Vec::with_capacity(sources.len()), recount: Vec::new(), restricted: false, newest: i64::MIN, failure: None };
    for (src, copy_id) in sources.iter().zip(copy_ids) {
        if let Some((cid, source_id)) = taken.get(copy_id) {
            if cid == fork_cid && source_id.as_deref() == Some(src.id.as_str()) {
                continue;
            }
            plan.failure = Some(CopyFailure::IdTaken);
            break;
        }
        if !limits.fits_sizes(src.text_chars, src.custom_bytes as usize, if exclude_attachments { 0 } else { src.attachments as usize }) {
            plan.failure = Some(CopyFailure::TooLarge);
            break;
        }
        plan.newest = plan.newest.max(src.created_at);
        plan.restricted |= src.restricted.0;
        if src.reply_count > 0 {
            plan.recount.push(copy_id.clone());
        }
        plan.copies.push((
            src.id.clone(),
            copy_id.clone(),
            src.parent_id.as_ref().map(|p| ids::copy_id(fork_cid, p)),
            src.quoted_message_id.as_ref().map(|q| ids::copy_id(fork_cid, q)),
        ));
    }
    plan
}

/// Copy ids among `copy_ids` that a message holds already: copy id → its cid and source.
async fn taken_ids(tx: &mut Tx, copy_ids: &[String]) -> Result<HashMap<String, (String, Option<String>)>> {
    let mut taken = HashMap::new();
    for chunk in copy_ids.chunks(COPY_CHUNK) {
        let sql =
            format!("SELECT id, cid, source_message_id FROM message WHERE id IN ({})", rows::many_placeholders(tx.backend, 1, chunk.len()));
        let mut q = sqlx::query_as::<_, (String, String, Option<String>)>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        for (id, cid, source_id) in q.fetch_all(crate::counted(&mut *tx.tx)).await? {
            taken.insert(id, (cid, source_id));
        }
    }
    Ok(taken)
}

/// Inserts the copies' message rows; the database copies everything but the ids from the source
/// row, and skips a copy whose id is taken. Returns the rows inserted.
async fn insert_copies(
    conn: &mut AnyConnection,
    backend: Backend,
    fork_cid: &str,
    copies: &[Copy],
    exclude_attachments: bool,
) -> Result<()> {
    let attachments = if exclude_attachments { "'[]'" } else { "m.attachments" };
    for chunk in copies.chunks(COPY_CHUNK) {
        let values = rows::value_rows(backend, 2, chunk.len(), 4);
        let sql = format!(
            "INSERT INTO message (id, cid, user_id, type, text, html, mml, command, parent_id, show_in_channel, quoted_message_id, \
             attachments, mentioned_users, restricted_visibility, silent, i18n, custom, shadowed, pinned, reply_count, \
             deleted_reply_count, created_at, updated_at, message_text_updated_at, source_cid, source_message_id) \
             SELECT v.column2, {p1}, m.user_id, m.type, m.text, m.html, m.mml, m.command, v.column3, m.show_in_channel, v.column4, \
             {attachments}, m.mentioned_users, m.restricted_visibility, m.silent, m.i18n, m.custom, FALSE, FALSE, 0, \
             0, m.created_at, m.updated_at, m.message_text_updated_at, m.cid, m.id \
             FROM (VALUES {values}) AS v JOIN message m ON m.id = v.column1",
            p1 = rows::many_placeholders(backend, 1, 1),
        );
        let mut q = sqlx::query(AssertSqlSafe(sql)).bind(fork_cid.to_string());
        for (src, copy, parent, quoted) in chunk {
            q = q.bind(src.clone()).bind(copy.clone()).bind(parent.clone()).bind(quoted.clone());
        }
        q.execute(crate::counted(&mut *conn)).await?;
    }
    Ok(())
}

/// Copies `sources` (newest first) into the fork. Stops at the first message that cannot be
/// copied and returns the failure; what was copied before it stays.
async fn copy_messages(
    tx: &mut Tx,
    fork_cid: &str,
    sources: &[CopySource],
    exclude_attachments: bool,
    limits: SizeLimits,
    map: &mut Map<String, Value>,
) -> Result<(i64, Option<CopyFailure>)> {
    let backend = tx.backend;
    let copy_ids: Vec<String> = sources.iter().map(|m| ids::copy_id(fork_cid, &m.id)).collect();
    // A copy id is rarely taken (by a copy an earlier attempt made, or by another message, which
    // fails the fork), and looking every id up cost a page as much as reading its sources: copy
    // as if none were, under a savepoint, and only when the key refused a row undo that and plan
    // again knowing which are taken. A plain insert, not `ON CONFLICT DO NOTHING`, whose
    // speculative inserts made PostgreSQL's copy about a quarter slower (docs/performance.md,
    // "Backfill copy").
    let mut plan = plan_copies(fork_cid, sources, &copy_ids, &HashMap::new(), exclude_attachments, limits);
    let mut savepoint = sqlx::Connection::begin(&mut *tx.tx).await?;
    let all_free = match insert_copies(&mut savepoint, backend, fork_cid, &plan.copies, exclude_attachments).await {
        Ok(()) => true,
        Err(crate::StoreError::Conflict(_)) => false,
        Err(e) => return Err(e),
    };
    if all_free {
        savepoint.commit().await?;
    } else {
        savepoint.rollback().await?;
        let taken = taken_ids(tx, &copy_ids).await?;
        plan = plan_copies(fork_cid, sources, &copy_ids, &taken, exclude_attachments, limits);
        insert_copies(&mut tx.tx, backend, fork_cid, &plan.copies, exclude_attachments).await?;
    }
    if !exclude_attachments {
        crate::files::copy_refs(tx, &plan.copies).await?;
    }
    if plan.restricted {
        // Restricted visibility rows of the copies.
        for chunk in plan.copies.chunks(COPY_CHUNK) {
            let values = rows::value_rows(backend, 1, chunk.len(), 2);
            let sql = format!(
                "INSERT INTO message_restricted (message_id, user_id, created_at, updated_at) \
                 SELECT v.column2, r.user_id, r.created_at, r.updated_at FROM (VALUES {values}) AS v JOIN message_restricted r ON r.message_id = v.column1"
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (src, copy, _, _) in chunk {
                q = q.bind(src.clone()).bind(copy.clone());
            }
            q.execute(crate::counted(&mut *tx.tx)).await?;
        }
    }
    let copied = plan.copies.len() as i64;
    let mut recount = plan.recount;
    for (src, copy, parent, _) in plan.copies {
        recount.extend(parent);
        map.insert(src, Value::String(copy));
    }
    // `reply_count` of a copy counts its copied replies; replies usually arrive before their
    // parents (newest first), so recount the parents this batch touched.
    recount.sort();
    recount.dedup();
    for chunk in recount.chunks(500) {
        let sql = format!(
            "UPDATE message SET reply_count = (SELECT COUNT(*) FROM message r WHERE r.parent_id = message.id) WHERE id IN ({})",
            rows::many_placeholders(backend, 1, chunk.len())
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    if copied > 0 {
        sqlx::query("UPDATE channel SET message_count = message_count + $1, last_message_at = CASE WHEN last_message_at IS NULL OR last_message_at < $2 THEN $2 ELSE last_message_at END WHERE cid = $3")
            .bind(copied)
            .bind(plan.newest)
            .bind(fork_cid.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
    }
    Ok((copied, plan.failure))
}

fn failure_reason(f: &CopyFailure) -> &'static str {
    match f {
        CopyFailure::IdTaken => plan::FAILED_ID_TAKEN,
        CopyFailure::TooLarge => plan::FAILED_TOO_LARGE,
    }
}

fn eligible_binds(source_cid: &str, truncated_at: Option<i64>, point: (i64, &str), boundary: Option<&(i64, String)>) -> Vec<Bind> {
    let (b_ts, b_id) = boundary.cloned().unwrap_or((i64::MIN, String::new()));
    vec![
        Bind::S(source_cid.to_string()),
        Bind::I(truncated_at.unwrap_or(i64::MIN)),
        Bind::I(point.0),
        Bind::S(point.1.to_string()),
        Bind::I(b_ts),
        Bind::S(b_id),
    ]
}

/// Writes `channel.forked` on the source (watchers and webhooks) and on the fork (watchers and
/// its first 100 members, WebSocket only; webhooks too when the source is gone or deleted).
async fn announce_forked(tx: &mut Tx, fork_cid: &str) -> Result<()> {
    let Some(fork_ch) = load_channel(&mut tx.tx, &tx.cache, fork_cid).await? else {
        return not_found(format!("fork {fork_cid:?} does not exist"));
    };
    let Some(summary) = fork_ch.fork.clone() else { return not_found(format!("channel {fork_cid:?} is not a fork")) };
    let user = match &summary.created_by_id {
        Some(id) => load_users(&mut tx.tx, std::slice::from_ref(id)).await?.remove(id),
        None => None,
    };
    let source = load_channel(&mut tx.tx, &tx.cache, &summary.source_channel_cid).await?;
    let source_gone = source.as_ref().is_none_or(|s| s.deleted_at.is_some());
    if let Some(src) = &source {
        let mut ev = event_for("channel.forked", src, user.clone());
        ev.channel = Some(src.clone());
        ev.fork = Some(summary.clone());
        tx.event(ev, Audience { watchers_of: Some(src.cid.clone()), users: Vec::new(), webhooks: true, ..Default::default() }).await?;
    }
    let members: Vec<String> =
        load_members(&mut tx.tx, fork_cid, plan::MAX_MEMBERS as i64, 0).await?.into_iter().map(|m| m.user_id).collect();
    let mut ev = event_for("channel.forked", &fork_ch, user);
    ev.channel = Some(fork_ch.clone());
    ev.fork = Some(summary);
    tx.event(ev, Audience { watchers_of: Some(fork_cid.to_string()), users: members, webhooks: source_gone, ..Default::default() }).await?;
    Ok(())
}

/// Whether the agent is still writing `message_id` in `cid`: its AI state (kept by
/// [`Store::publish`] from `ai_indicator.update` / `.clear` / `.stop`) is a generating one.
async fn still_generating(conn: &mut AnyConnection, cid: &str, message_id: &str) -> Result<bool> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM ai_state WHERE cid = $1 AND message_id = $2")
        .bind(cid.to_string())
        .bind(message_id.to_string())
        .fetch_optional(crate::counted(&mut *conn))
        .await?;
    let state = state.unwrap_or_default();
    Ok(!matches!(state.as_str(), "AI_STATE_ERROR" | "AI_STATE_IDLE" | ""))
}

async fn finish(tx: &mut Tx, fork_cid: &str, failed: Option<&str>) -> Result<()> {
    let now = time::now();
    let status = if failed.is_some() { ForkStatus::Failed } else { ForkStatus::Completed };
    sqlx::query(
        "UPDATE fork SET status = $1, failed_reason = $2, updated_at = $3, \
         copied_message_count = (SELECT COUNT(*) FROM message WHERE cid = $4 AND source_message_id IS NOT NULL), \
         total_message_count = (SELECT COUNT(*) FROM message WHERE cid = $4 AND source_message_id IS NOT NULL), \
         oldest_source_message_id = CASE WHEN truncated THEN (SELECT source_message_id FROM message WHERE cid = $4 AND source_message_id IS NOT NULL ORDER BY created_at, id LIMIT 1) ELSE NULL END \
         WHERE cid = $4",
    )
    .bind(status.as_str())
    .bind(failed.map(str::to_string))
    .bind(now)
    .bind(fork_cid.to_string())
    .execute(crate::counted(&mut *tx.tx))
    .await?;
    announce_forked(tx, fork_cid).await
}

impl Store {
    /// The fork request: everything in one transaction.
    #[tracing::instrument(name = "store.create_fork", skip_all, fields(source = %req.source_cid, message_id = %req.message_id, target = %req.target_id))]
    pub async fn create_fork(&self, req: &ForkRequest) -> Result<ForkOutcome> {
        let outcome = match self.retrying("create_fork", || self.create_fork_once(req)).await {
            // A request from another source (not serialised by the source's lock) created the
            // target channel first. It has committed by now: look again, so this request gets
            // the answer the fork document gives (fork_target_conflict, or fork_target_exists).
            Err(crate::StoreError::Conflict(_)) => self.retrying("create_fork", || self.create_fork_once(req)).await,
            other => other,
        }?;
        if outcome.created {
            metrics::counter!("offshoot_forks_created_total").increment(1);
            crate::ops::record_fork_finished(&outcome.fork);
        }
        Ok(outcome)
    }

    /// The steps of the fork document (`docs/fork.md`), in one transaction under the source's
    /// lock: a retry finds the fork it made; otherwise validate the point, check the limits,
    /// create the channel, copy the newest page, announce.
    async fn create_fork_once(&self, req: &ForkRequest) -> Result<ForkOutcome> {
        let mut tx = self.begin().await?;
        tx.custom_plans().await?;
        lock_channel(&mut tx, &req.source_cid).await?;
        let (kind, _) = ids::parse_cid(&req.source_cid)?;
        let fork_cid = ids::cid(&kind, &req.target_id);
        if let Some(existing) = load_fork_row(&mut tx.tx, &fork_cid).await? {
            return self.existing_fork(tx, req, &fork_cid, existing).await;
        }
        let source = forkable_source(&mut tx, req, &fork_cid).await?;
        let point = validate_point(&mut tx, req, &source).await?;
        let members = check_limits(&mut tx, req, &source).await?;
        let creator = create_fork_channel(&mut tx, req, &source, &point, &fork_cid, &members).await?;
        let (map, failure, nothing_left) = copy_newest_page(&mut tx, req, &source, &point, &fork_cid).await?;
        let announced = announce_created(&mut tx, &fork_cid, creator).await?;
        let finished = failure.is_some() || nothing_left;
        match failure {
            Some(f) => finish(&mut tx, &fork_cid, Some(failure_reason(&f))).await?,
            None if nothing_left => finish(&mut tx, &fork_cid, None).await?,
            None => {}
        }
        if finished {
            // Finished synchronously: there is no background task.
            sqlx::query("UPDATE fork SET task_id = NULL WHERE cid = $1")
                .bind(fork_cid.clone())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        }
        // A fork finished now changed its row since the announcement read the channel.
        let channel = if finished { reload(&mut tx, &fork_cid).await? } else { announced };
        tx.commit(self).await?;
        let Some(fork) = channel.fork.clone() else { return not_found(format!("channel {fork_cid:?} is not a fork")) };
        Ok(ForkOutcome { fork, channel, message_id_map: map, created: true })
    }

    /// A retry returns the existing fork; another fork under that id is a conflict.
    async fn existing_fork(&self, mut tx: Tx, req: &ForkRequest, fork_cid: &str, existing: ForkRow) -> Result<ForkOutcome> {
        let s = &existing.summary;
        if s.source_channel_cid == req.source_cid && s.source_message_id == req.message_id {
            let channel = reload(&mut tx, fork_cid).await?;
            tx.commit(self).await?;
            let Some(fork) = channel.fork.clone() else { return not_found(format!("channel {fork_cid:?} is not a fork")) };
            return Ok(ForkOutcome { fork, channel, message_id_map: existing.first_page_map, created: false });
        }
        domain(
            Error::new(
                ErrorKind::ForkTargetConflict,
                format!("channel {fork_cid:?} is already a fork of message {:?} of {:?}", s.source_message_id, s.source_channel_cid),
            )
            .field("source_channel_cid", s.source_channel_cid.clone())
            .field("source_message_id", s.source_message_id.clone()),
        )
    }
}

/// The source, if it may be forked (an agent channel, not deleted, not itself still copying)
/// into `fork_cid`, which must not exist.
async fn forkable_source(tx: &mut Tx, req: &ForkRequest, fork_cid: &str) -> Result<Channel> {
    let Some(source) = load_channel(&mut tx.tx, &tx.cache, &req.source_cid).await? else {
        return not_found(format!("channel {:?} does not exist", req.source_cid));
    };
    if source.deleted_at.is_some() {
        return not_found(format!("channel {:?} was deleted", req.source_cid));
    }
    if source.kind != "agent" {
        return domain(Error::input(format!("channel {:?} is not an agent channel; only agent channels can be forked", req.source_cid)));
    }
    if let Some(f) = &source.fork {
        if f.status == ForkStatus::Backfilling {
            return domain(Error::new(
                ErrorKind::ForkInProgress,
                format!("channel {:?} is a fork whose history is still being copied; fork it once channel.forked arrives", req.source_cid),
            ));
        }
    }
    if load_channel(&mut tx.tx, &tx.cache, fork_cid).await?.is_some() {
        return domain(Error::new(ErrorKind::ForkTargetExists, format!("channel {fork_cid:?} already exists; fork into a new channel id")));
    }
    Ok(source)
}

/// The fork point: a visible top-level regular or system message of the source, finished when
/// the request asks so, and the only visible message at its `created_at`.
async fn validate_point(tx: &mut Tx, req: &ForkRequest, source: &Channel) -> Result<Message> {
    let point = match load_message(&mut tx.tx, &req.message_id).await? {
        Some((m, false))
            if m.cid == source.cid
                && m.parent_id.is_none()
                && (m.kind == "regular" || m.kind == "system")
                && m.deleted_at.is_none()
                && !m.shadowed
                && source.truncated_at.is_none_or(|t| m.created_at > t) =>
        {
            m
        }
        _ => {
            return domain(Error::input(format!(
                "message_id {:?} is not a visible top-level regular or system message of channel {:?}",
                req.message_id, source.cid
            )));
        }
    };
    if req.require_finished && still_generating(&mut tx.tx, &source.cid, &point.id).await? {
        return domain(
            Error::new(ErrorKind::ForkPointGenerating, format!("message {:?} is still being generated (an ai_indicator.update without ai_indicator.clear); fork it once the answer is finished", point.id)),
        );
    }
    let clash: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message m WHERE m.cid = $1 AND m.created_at = $2 AND m.id <> $3 AND m.hidden_at IS NULL AND m.deleted_at IS NULL AND m.shadowed = FALSE")
        .bind(source.cid.clone())
        .bind(point.created_at)
        .bind(point.id.clone())
        .fetch_one(crate::counted(&mut *tx.tx))
        .await?;
    if clash > 0 {
        return domain(Error::new(
            ErrorKind::ForkPointAmbiguous,
            format!("another visible message has the same created_at as {:?}, so the fork point is ambiguous", point.id),
        ));
    }
    Ok(point)
}

/// The limits: forks per source, and the members the fork takes over (named, or the source's).
async fn check_limits(tx: &mut Tx, req: &ForkRequest, source: &Channel) -> Result<Vec<MemberInput>> {
    let forks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM fork WHERE source_cid = $1 AND status <> 'failed'")
        .bind(source.cid.clone())
        .fetch_one(crate::counted(&mut *tx.tx))
        .await?;
    if forks >= plan::MAX_FORKS {
        return domain(
            Error::new(
                ErrorKind::TooManyForks,
                format!("channel {:?} already has {} forks that did not fail", source.cid, plan::MAX_FORKS),
            )
            .field("limit", plan::MAX_FORKS.to_string()),
        );
    }
    Ok(match &req.members {
        Some(m) => m.clone(),
        None => {
            let ms = load_members(&mut tx.tx, &source.cid, plan::MAX_MEMBERS as i64 + 1, 0).await?;
            if ms.len() > plan::MAX_MEMBERS {
                return domain(Error::input(format!(
                    "channel {:?} has more than {} members; name the fork's members in channel.members",
                    source.cid,
                    plan::MAX_MEMBERS
                )));
            }
            ms.into_iter().map(|m| MemberInput { user_id: m.user_id, channel_role: Some(m.channel_role), custom: m.custom }).collect()
        }
    })
}

/// The fork channel, its members and its fork row (`backfilling`, cursor at the point).
/// Returns the creator.
async fn create_fork_channel(
    tx: &mut Tx,
    req: &ForkRequest,
    source: &Channel,
    point: &Message,
    fork_cid: &str,
    members: &[MemberInput],
) -> Result<Option<User>> {
    let now = time::now();
    let creator_id = req.created_by_id.clone().or_else(|| source.created_by_id.clone());
    let ids: Vec<String> = creator_id.iter().cloned().chain(members.iter().map(|m| m.user_id.clone())).collect();
    let mut users = ensure_users(tx, &ids, "user").await?;
    if let Some(missing) = ids.iter().find(|id| !users.contains_key(*id)) {
        return not_found(format!("user {missing:?} was deleted while it was used"));
    }
    let creator = creator_id.as_ref().and_then(|id| users.remove(id));
    let new = NewChannel {
        kind: source.kind.clone(),
        id: req.target_id.clone(),
        created_by_id: creator_id.clone(),
        team: req.team.clone().or_else(|| source.team.clone()),
        custom: {
            let mut custom = req.custom.clone();
            for key in &req.inherit_data {
                if let (Some(v), false) = (source.custom.get(key), custom.contains_key(key)) {
                    custom.insert(key.clone(), v.clone());
                }
            }
            custom
        },
        members: Vec::new(),
    };
    if serde_json::to_vec(&new.custom)?.len() > plan::MAX_CUSTOM_BYTES {
        return domain(Error::input(format!(
            "the fork's channel data (with the inherited keys) would exceed {} bytes",
            plan::MAX_CUSTOM_BYTES
        )));
    }
    // Another request created the channel since we looked: `create_fork` looks again.
    if !insert_channel_row(tx, fork_cid, &new, now).await? {
        return Err(crate::StoreError::Conflict(format!("channel {fork_cid:?} was created concurrently")));
    }
    // The members, in one statement (at most `MAX_MEMBERS`).
    if !members.is_empty() {
        let values: Vec<String> =
            (0..members.len()).map(|i| format!("($1, ${}, ${}, ${}, $2, $2)", 3 + i * 3, 4 + i * 3, 5 + i * 3)).collect();
        let sql = format!(
            "INSERT INTO member (cid, user_id, channel_role, custom, created_at, updated_at) VALUES {} ON CONFLICT (cid, user_id) DO NOTHING",
            values.join(", ")
        );
        let mut q = sqlx::query(AssertSqlSafe(sql)).bind(fork_cid.to_string()).bind(now);
        for m in members {
            q = q
                .bind(m.user_id.clone())
                .bind(m.channel_role.clone().unwrap_or_else(|| "channel_member".into()))
                .bind(serde_json::to_string(&m.custom)?);
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    let task_id = uuid::Uuid::now_v7().to_string();
    sqlx::query("INSERT INTO fork (cid, source_cid, source_message_id, status, task_id, created_by_id, exclude_attachments, point_created_at, cursor_created_at, cursor_id, created_at, updated_at) VALUES ($1, $2, $3, 'backfilling', $4, $5, $6, $7, $7, $8, $9, $9)")
        .bind(fork_cid.to_string())
        .bind(source.cid.clone())
        .bind(point.id.clone())
        .bind(task_id.clone())
        .bind(creator_id.clone())
        .bind(req.exclude_attachments)
        .bind(point.created_at)
        .bind(point.id.clone())
        .bind(now)
        .execute(crate::counted(&mut *tx.tx))
        .await?;
    Ok(creator)
}

/// The newest page: up to 100 top-level messages up to the fork point and up to 100 of their
/// replies, newest first, with the page's id map recorded on the fork. Returns the map, why a
/// copy failed (if one did) and whether nothing is left to copy.
async fn copy_newest_page(
    tx: &mut Tx,
    req: &ForkRequest,
    source: &Channel,
    point: &Message,
    fork_cid: &str,
) -> Result<(Map<String, Value>, Option<CopyFailure>, bool)> {
    let binds = eligible_binds(&source.cid, source.truncated_at, (point.created_at, &point.id), None);
    let top = fetch_sources(
        tx,
        &format!(
            "SELECT {{cols}} FROM message m WHERE {ELIGIBLE} AND m.parent_id IS NULL ORDER BY m.created_at DESC, m.id DESC LIMIT {}",
            plan::PAGE_TOP_LEVEL
        ),
        &binds,
    )
    .await?;
    let mut replies = Vec::new();
    if !top.is_empty() {
        // The parents are the eligible page itself, so only the replies' own visibility is
        // checked here; without `cid` in the filter the planner walks the parent_id index.
        let mut b = vec![Bind::I(source.truncated_at.unwrap_or(i64::MIN)), Bind::I(point.created_at), Bind::S(point.id.clone())];
        b.extend(top.iter().map(|m| Bind::S(m.id.clone())));
        let sql = format!(
            "SELECT {{cols}} FROM message m WHERE m.parent_id IN ({}) AND m.hidden_at IS NULL AND m.created_at > $1 \
             AND m.deleted_at IS NULL AND m.shadowed = FALSE AND m.type NOT IN ('deleted', 'ephemeral', 'error') \
             AND (m.created_at, m.id) <= ($2, $3) ORDER BY m.created_at DESC, m.id DESC LIMIT {}",
            placeholders(4, top.len()),
            plan::PAGE_REPLIES
        );
        replies = fetch_sources(tx, &sql, &b).await?;
    }
    let nothing_left = (top.len() as i64) < plan::PAGE_TOP_LEVEL && (replies.len() as i64) < plan::PAGE_REPLIES;
    let mut page: Vec<CopySource> = top.into_iter().chain(replies).collect();
    page.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let limits = SizeLimits::for_max_message_length(source.max_message_length());
    let mut map = Map::new();
    let (_, failure) = copy_messages(tx, fork_cid, &page, req.exclude_attachments, limits, &mut map).await?;
    sqlx::query("UPDATE fork SET first_page_map = $1, copied_message_count = (SELECT COUNT(*) FROM message WHERE cid = $2) WHERE cid = $2")
        .bind(serde_json::to_string(&map)?)
        .bind(fork_cid.to_string())
        .execute(crate::counted(&mut *tx.tx))
        .await?;
    Ok((map, failure, nothing_left))
}

/// `channel.created` for the fork and `notification.added_to_channel` for each member, once.
/// Returns the fork's channel as announced.
async fn announce_created(tx: &mut Tx, fork_cid: &str, creator: Option<User>) -> Result<Channel> {
    let channel = reload(tx, fork_cid).await?;
    let mut ev = event_for("channel.created", &channel, creator.clone());
    ev.channel = Some(channel.clone());
    tx.event(ev, Audience { watchers_of: Some(fork_cid.to_string()), users: Vec::new(), webhooks: true, ..Default::default() }).await?;
    let member_rows = load_members(&mut tx.tx, fork_cid, plan::MAX_MEMBERS as i64, 0).await?;
    for m in member_rows {
        let uid = m.user_id.clone();
        let mut note: Event = event_for("notification.added_to_channel", &channel, creator.clone());
        note.channel = Some(channel.clone());
        note.member = Some(m);
        tx.event(note, Audience { watchers_of: None, users: vec![uid], webhooks: false, ..Default::default() }).await?;
    }
    Ok(channel)
}

impl Store {
    /// Every backfilling fork, oldest first, with the time its row last changed (each committed page moves
    /// it): the worker's reconciler tells a backfill that makes progress from a stalled one.
    pub async fn backfilling_progress(&self) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as("SELECT cid, updated_at FROM fork WHERE status = 'backfilling' ORDER BY created_at, cid")
            .fetch_all(crate::counted(self.pool()))
            .await?)
    }

    /// Copies the next page of a backfilling fork, in one transaction with its cursor.
    #[tracing::instrument(name = "store.backfill_step", skip(self))]
    pub async fn backfill_step(&self, fork_cid: &str, page_size: i64) -> Result<BackfillStep> {
        let (step, page) = self.retrying("backfill_step", || self.backfill_step_once(fork_cid, page_size)).await?;
        if let Some((copied, finished)) = page {
            crate::ops::record_backfill_page(copied);
            if let Some(fork) = finished {
                crate::ops::record_fork_finished(&fork);
            }
        }
        Ok(step)
    }

    /// The step, and for a committed page: messages copied and, when the fork finished, its
    /// final status and whether it was truncated (for the metrics, recorded after the commit).
    async fn backfill_step_once(&self, fork_cid: &str, page_size: i64) -> Result<(BackfillStep, Option<(i64, Option<ForkSummary>)>)> {
        let early = self.plan_early(fork_cid).await?;
        let mut tx = self.begin_background().await?;
        // From here to the commit a page holds SQLite's one writer (docs/performance.md, "SQLite writer and backfill pages").
        let began = std::time::Instant::now();
        tx.custom_plans().await?;
        let Some(f) = lock_fork(&mut tx, fork_cid).await? else { return Ok((BackfillStep::Gone, None)) };
        if f.summary.status != ForkStatus::Backfilling {
            return Ok((BackfillStep::Done, None));
        }
        let mut summary = f.summary.clone();
        let Some(source) = load_channel(&mut tx.tx, &tx.cache, &f.summary.source_channel_cid).await? else {
            // A hard-deleted source ends the backfill with what was copied.
            finish(&mut tx, fork_cid, None).await?;
            tx.commit(self).await?;
            summary.status = ForkStatus::Completed;
            return Ok((BackfillStep::Done, Some((0, Some(summary)))));
        };
        let point = (f.point_created_at, f.summary.source_message_id.as_str());
        let boundary = match (f.planned, early) {
            (true, _) => f.boundary.clone(),
            // Planned on the source as it was a moment ago; the cap holds whatever changed
            // since, as no page copies past it (`copy_next_page`).
            (false, Some((truncated_at, plan))) if truncated_at == source.truncated_at => {
                record_plan(&mut tx, fork_cid, plan, &mut summary).await?
            }
            (false, _) => {
                let plan = compute_plan(&mut tx.tx, &source, point).await?;
                record_plan(&mut tx, fork_cid, plan, &mut summary).await?
            }
        };
        let (copied, failure, more, capped) = copy_next_page(&mut tx, fork_cid, &source, &f, boundary.as_ref(), page_size).await?;
        summary.truncated |= capped;
        let step = match failure {
            Some(f) => {
                finish(&mut tx, fork_cid, Some(failure_reason(&f))).await?;
                summary.status = ForkStatus::Failed;
                BackfillStep::Done
            }
            None if !more => {
                finish(&mut tx, fork_cid, None).await?;
                summary.status = ForkStatus::Completed;
                BackfillStep::Done
            }
            None => BackfillStep::More,
        };
        tx.commit(self).await?;
        tracing::debug!(fork = fork_cid, copied, held_ms = began.elapsed().as_secs_f64() * 1000.0, "backfill page committed");
        let finished = (step == BackfillStep::Done).then_some(summary);
        Ok((step, Some((copied, finished))))
    }

    /// The plan of a backfill that has none yet, made outside any write transaction, with the
    /// source's truncation it was made for; `None` when the fork is planned (every page but the
    /// first), gone, finished or its source is gone.
    async fn plan_early(&self, fork_cid: &str) -> Result<Option<(Option<i64>, BackfillPlan)>> {
        let unplanned = |f: &ForkRow| !f.planned && f.summary.status == ForkStatus::Backfilling;
        {
            let mut conn = self.pool().acquire().await?;
            match load_fork_row(&mut conn, fork_cid).await? {
                Some(f) if unplanned(&f) => {}
                _ => return Ok(None),
            }
        }
        // Tens of milliseconds of a connection's thread (SQLite) or a database process: several
        // forks starting at once plan one after another, leaving requests a core (docs/performance.md,
        // "SQLite writer and backfill pages"). The turn is taken holding no connection, so waiting plans cannot take the
        // connections the work in its turn needs.
        let _turn = self.background_turn().await;
        // A read-only transaction only to plan its statements with their values (PostgreSQL).
        let mut conn = self.pool().begin().await?;
        if self.backend() == crate::Backend::Postgres {
            crate::custom_plans(&mut conn).await?;
        }
        let Some(f) = load_fork_row(&mut conn, fork_cid).await?.filter(unplanned) else { return Ok(None) };
        let Some(source) = load_channel(&mut conn, &self.cache, &f.summary.source_channel_cid).await? else { return Ok(None) };
        let plan = compute_plan(&mut conn, &source, (f.point_created_at, f.summary.source_message_id.as_str())).await?;
        Ok(Some((source.truncated_at, plan)))
    }

    /// Ends a backfill that cannot go on (the worker gave up after its attempts): the fork
    /// becomes `failed` with `reason`, keeps what it copied, and `channel.forked` is written.
    /// False when the fork is gone or no longer backfilling.
    pub async fn fail_backfill(&self, fork_cid: &str, reason: &str) -> Result<bool> {
        self.retrying("fail_backfill", || self.fail_backfill_once(fork_cid, reason)).await
    }

    async fn fail_backfill_once(&self, fork_cid: &str, reason: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        let Some(f) = lock_fork(&mut tx, fork_cid).await? else { return Ok(false) };
        if f.summary.status != ForkStatus::Backfilling {
            return Ok(false);
        }
        finish(&mut tx, fork_cid, Some(reason)).await?;
        tx.commit(self).await?;
        Ok(true)
    }

    /// Source id → copy id for the copies `fork_cid` holds, of the given source ids.
    pub async fn fork_message_ids(&self, fork_cid: &str, source_ids: &[String]) -> Result<Map<String, Value>> {
        let mut out = Map::new();
        for chunk in source_ids.chunks(500) {
            let sql = format!(
                "SELECT id, source_message_id FROM message WHERE cid = $1 AND source_message_id IN ({})",
                placeholders(2, chunk.len())
            );
            let mut q = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(sql)).bind(fork_cid.to_string());
            for id in chunk {
                q = q.bind(id.clone());
            }
            for (copy_id, source_id) in q.fetch_all(crate::counted(self.pool())).await? {
                out.insert(source_id, Value::String(copy_id));
            }
        }
        Ok(out)
    }

    /// Forks of a channel, newest first.
    pub async fn list_forks(&self, source_cid: &str, limit: i64, offset: i64) -> Result<Vec<ForkSummary>> {
        let rows: Vec<ForkSummaryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {FORK_COLS} FROM fork f WHERE f.source_cid = $1 ORDER BY f.created_at DESC, f.cid DESC LIMIT $2 OFFSET $3"
        )))
        .bind(source_cid.to_string())
        .bind(limit)
        .bind(offset)
        .fetch_all(crate::counted(self.pool()))
        .await?;
        rows.into_iter().map(ForkSummary::try_from).collect()
    }

    /// The task behind a fork's backfill, in Stream's task shape.
    pub async fn task(&self, task_id: &str) -> Result<Option<Task>> {
        let cid: Option<String> = sqlx::query_scalar("SELECT cid FROM fork WHERE task_id = $1")
            .bind(task_id.to_string())
            .fetch_optional(crate::counted(self.pool()))
            .await?;
        let Some(cid) = cid else { return Ok(None) };
        let mut conn = self.pool().acquire().await?;
        let Some(f) = load_fork_row(&mut conn, &cid).await? else { return Ok(None) };
        let s = f.summary;
        let status = match s.status {
            ForkStatus::Backfilling if !f.planned => "pending",
            ForkStatus::Backfilling => "running",
            ForkStatus::Completed => "completed",
            ForkStatus::Failed => "failed",
        };
        let error = s
            .failed_reason
            .as_ref()
            .map(|r| json!({"type": r, "description": format!("the fork failed for good: {r}"), "stacktrace": "", "version": ""}));
        Ok(Some(Task {
            id: task_id.to_string(),
            status: status.to_string(),
            result: json!({
                "fork_channel_cid": s.channel_cid,
                "source_channel_cid": s.source_channel_cid,
                "source_message_id": s.source_message_id,
                "fork_status": s.status.as_str(),
                "copied_message_count": s.copied_message_count,
                "total_message_count": s.total_message_count.map(|t| t.max(s.copied_message_count)),
                "truncated": s.truncated,
            }),
            error,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }))
    }
}

/// A backfill's plan: the cap boundary (the oldest position copied, when the fork holds the
/// newest `MAX_COPIED` eligible messages), whether that truncates the history, and the total.
struct BackfillPlan {
    boundary: Option<(i64, String)>,
    truncated: bool,
    total: i64,
}

/// Plans a backfill from the source as it is: reads only. The boundary is found by walking the
/// newest `MAX_COPIED` eligible messages, tens of milliseconds on a large source, so the worker
/// plans before its first page's transaction ([`Store::backfill_step`]): on SQLite that walk
/// held the one write lock, and every request waited for it (docs/performance.md, "SQLite writer and backfill pages").
async fn compute_plan(conn: &mut AnyConnection, source: &Channel, point: (i64, &str)) -> Result<BackfillPlan> {
    let binds = eligible_binds(&source.cid, source.truncated_at, point, None);
    // One walk of the newest `MAX_COPIED + 1` eligible messages: how many there are (at most
    // one past the cap, which says the cap truncates the history) and the one at the cap. A
    // walk to the cap and a second one to count a source under it took 8–15 and 6–10 ms of a
    // 10,000-message fork's backfill on PostgreSQL (docs/performance.md, "Backfill copy").
    let cap = plan::MAX_COPIED;
    let sql = format!(
        "SELECT COUNT(*), MAX(CASE WHEN newest.n = {cap} THEN newest.created_at END), MAX(CASE WHEN newest.n = {cap} THEN newest.id END) \
         FROM (SELECT m.created_at, m.id, ROW_NUMBER() OVER (ORDER BY m.created_at DESC, m.id DESC) AS n FROM message m WHERE {ELIGIBLE} \
         ORDER BY m.created_at DESC, m.id DESC LIMIT {}) AS newest",
        cap + 1
    );
    let (count, at, id): (i64, Option<i64>, Option<String>) =
        sqlx::query_as_with(AssertSqlSafe(sql), arguments(&binds)?).fetch_one(crate::counted(&mut *conn)).await?;
    let boundary = at.zip(id);
    Ok(BackfillPlan { boundary, truncated: count > cap, total: count.min(cap) })
}

/// Records the plan on the fork row (its first page) and returns the boundary.
async fn record_plan(tx: &mut Tx, fork_cid: &str, plan: BackfillPlan, summary: &mut ForkSummary) -> Result<Option<(i64, String)>> {
    summary.truncated = plan.truncated;
    sqlx::query("UPDATE fork SET planned = $1, boundary_created_at = $2, boundary_id = $3, truncated = $4, total_message_count = $5, updated_at = $6 WHERE cid = $7")
        .bind(true)
        .bind(plan.boundary.as_ref().map(|b| b.0))
        .bind(plan.boundary.as_ref().map(|b| b.1.clone()))
        .bind(plan.truncated)
        .bind(plan.total)
        .bind(time::now())
        .bind(fork_cid.to_string())
        .execute(crate::counted(&mut *tx.tx))
        .await?;
    Ok(plan.boundary)
}

/// Copies the page of up to `page_size` eligible messages below the cursor and moves the
/// cursor past it. Returns the messages copied, why a copy failed (if one did), whether more
/// may follow (a full page, below the cap), and whether the cap cut the page.
async fn copy_next_page(
    tx: &mut Tx,
    fork_cid: &str,
    source: &Channel,
    f: &ForkRow,
    boundary: Option<&(i64, String)>,
    page_size: i64,
) -> Result<(i64, Option<CopyFailure>, bool, bool)> {
    let point = (f.point_created_at, f.summary.source_message_id.as_str());
    let cursor = f.cursor.clone().unwrap_or((point.0, point.1.to_string()));
    let mut binds = eligible_binds(&source.cid, source.truncated_at, point, boundary);
    binds.push(Bind::I(cursor.0));
    binds.push(Bind::S(cursor.1.clone()));
    let sql = format!("SELECT {{cols}} FROM message m WHERE {ELIGIBLE} AND (m.created_at, m.id) < ($7, $8) ORDER BY m.created_at DESC, m.id DESC LIMIT {}", page_size.max(1));
    let page = fetch_sources(tx, &sql, &binds).await?;
    let Some(last) = page.last().map(|m| (m.created_at, m.id.clone())) else { return Ok((0, None, false, false)) };
    let full = page.len() as i64 >= page_size.max(1);
    // The newest page's copies were made by the request (the walk starts at the fork point);
    // the rest is copied up to the cap: the plan's boundary keeps to it, and this holds it even
    // when the source changed after the plan was made.
    let room = (plan::MAX_COPIED - f.summary.copied_message_count).max(0) as usize;
    let mut todo: Vec<CopySource> = page.into_iter().filter(|m| !f.first_page_map.contains_key(&m.id)).collect();
    let capped = todo.len() > room;
    todo.truncate(room);
    let limits = SizeLimits::for_max_message_length(source.max_message_length());
    let mut map = Map::new();
    let (copied, failure) = copy_messages(tx, fork_cid, &todo, f.exclude_attachments, limits, &mut map).await?;
    // Cut here, the history is longer than the cap even if the plan found it was not (messages
    // imported below the cursor since): the fork is truncated (docs/fork.md, the cap).
    sqlx::query(
        "UPDATE fork SET cursor_created_at = $1, cursor_id = $2, copied_message_count = copied_message_count + $5, updated_at = $4, \
         truncated = truncated OR $6 WHERE cid = $3",
    )
    .bind(last.0)
    .bind(last.1)
    .bind(fork_cid.to_string())
    .bind(time::now())
    .bind(copied)
    .bind(capped)
    .execute(crate::counted(&mut *tx.tx))
    .await?;
    Ok((copied, failure, full && !capped, capped))
}

/// Locks a fork as a backfill page does and loads its row: the fork's channel row first (a
/// message sent into the fork locks it too), then the fork row, so one page runs at a time per
/// fork, across processes (crate doc, lock order).
async fn lock_fork(tx: &mut Tx, fork_cid: &str) -> Result<Option<ForkRow>> {
    lock_channel(tx, fork_cid).await?;
    if tx.backend == Backend::Postgres {
        sqlx::query("SELECT cid FROM fork WHERE cid = $1 FOR UPDATE")
            .bind(fork_cid.to_string())
            .fetch_optional(crate::counted(&mut *tx.tx))
            .await?;
    }
    load_fork_row(&mut tx.tx, fork_cid).await
}
