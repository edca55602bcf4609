//! The fork endpoints: fork a channel, look up copy ids, list a channel's forks, its whole fork
//! tree, and the task behind a backfill.

use crate::channels::{channel_state, is_member, load, require_read, DEFAULT_MEMBER_LIMIT, DEFAULT_MESSAGE_LIMIT};
use crate::ctx::{ApiPath, ApiQuery, Body, ChannelPath, Ctx};
use crate::error::ApiResult;
use crate::input::{self, de, present, required, Actor, ChannelData, MemberRef, PageInput};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::fork::{MAX_LOOKUP, MAX_MEMBERS};
use offshoot_core::model::{ForkStatus, Viewer};
use offshoot_core::render::{Dialect, TsOut};
use offshoot_core::{ids, perm, render, Error};
use offshoot_store::lineage::{self, LineageNode};
use offshoot_store::ForkRequest;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

async fn require_fork_enabled(st: &ApiState) -> Result<(), Error> {
    if st.store.app_settings().await?.fork_enabled {
        Ok(())
    } else {
        Err(Error::not_allowed("fork is not enabled for this app: PATCH /app with fork_enabled: true to turn it on"))
    }
}

/// The body of `POST /channels/{type}/{id}/fork` (docs/fork.md).
#[derive(Deserialize)]
pub struct ForkChannelRequest {
    message_id: Option<String>,
    channel: Option<ForkTarget>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    exclude_attachments: Option<bool>,
    inherit_data: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    require_finished: Option<bool>,
    messages: Option<PageInput>,
    #[serde(flatten)]
    actor: Actor,
}

/// The new channel: its id, data and members.
#[derive(Deserialize)]
struct ForkTarget {
    id: Option<String>,
    data: Option<ChannelData>,
    members: Option<Vec<MemberRef>>,
    name: Option<Value>,
}

/// `POST /channels/{type}/{id}/fork`.
pub async fn fork_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<ForkChannelRequest>,
) -> ApiResult<Json<Value>> {
    let source_cid = path.cid;
    require_fork_enabled(&st).await?;
    if !perm::may_fork_or_rewind(&ctx.viewer) {
        return Err(Error::not_allowed(
            "fork is a server-side operation: it needs the ForkChannel permission, which only server-side requests and admins have",
        )
        .into());
    }
    let message_id = required(body.message_id, "message_id")?;
    let Some(target) = body.channel else {
        return Err(Error::input("field \"channel\" is required, with the new channel's id").field("field", "channel").into());
    };
    let target_id = ids::parse_channel_id(&required(target.id, "channel.id")?)?;
    let data = target.data.unwrap_or_default();
    if data.members.is_some() {
        return Err(Error::input("members go in channel.members, not channel.data.members").into());
    }
    let members = match target.members {
        Some(m) => {
            let list = input::members(m, "channel.members")?;
            if list.len() > MAX_MEMBERS {
                return Err(Error::input(format!("channel.members can name at most {MAX_MEMBERS} members")).into());
            }
            Some(list)
        }
        None => None,
    };
    let created_by_id = match &ctx.viewer {
        Viewer::Server => body.actor.id()?,
        Viewer::User { id, .. } => Some(id.clone()),
        Viewer::Anonymous { .. } => None,
    };
    let team = data.team;
    let mut custom = data.custom.into_custom();
    if let Some(v) = target.name {
        custom.entry("name").or_insert(v);
    }
    let req = ForkRequest {
        source_cid: source_cid.clone(),
        message_id,
        target_id,
        custom: input::Extra::from(custom).limited("channel")?,
        team,
        members,
        exclude_attachments: body.exclude_attachments.unwrap_or(false),
        created_by_id,
        inherit_data: body.inherit_data.unwrap_or_default(),
        require_finished: body.require_finished.unwrap_or(false),
    };
    let outcome = st.store.create_fork(&req).await?;
    if outcome.fork.status == ForkStatus::Backfilling {
        // After the commit; a lost push only delays the backfill until the reconciler runs.
        if let Err(e) = st.jobs.enqueue_backfill(&outcome.fork.channel_cid).await {
            tracing::warn!(fork = %outcome.fork.channel_cid, error = %e.message, "queueing the backfill failed; the reconciler will queue it");
        }
    }
    let page = body.messages.unwrap_or_default().page(DEFAULT_MESSAGE_LIMIT)?;
    let mut state = channel_state(&st, &ctx, &outcome.channel, &page, DEFAULT_MEMBER_LIMIT).await?;
    let mut fork = render::fork(ctx.dialect, &outcome.fork);
    fork["message_id_map"] = Value::Object(outcome.message_id_map);
    state.insert("fork".into(), fork);
    Ok(ctx.ok(Value::Object(state)))
}

/// `POST /channels/{type}/{id}/fork/message_ids`: source id → copy id, for the copies the
/// fork holds. Needs only read access to the fork.
#[derive(Deserialize)]
pub struct LookupForkMessageIdsRequest {
    source_message_ids: Option<Vec<String>>,
}

pub async fn lookup_fork_message_ids(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<LookupForkMessageIdsRequest>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    require_fork_enabled(&st).await?;
    let ch = load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    let ids = present(body.source_message_ids, "source_message_ids")?;
    if ids.len() > MAX_LOOKUP {
        return Err(Error::input(format!("source_message_ids can hold at most {MAX_LOOKUP} ids")).into());
    }
    if ch.fork.is_none() {
        return Err(Error::input(format!("channel {cid:?} is not a fork")).into());
    }
    let map = st.store.fork_message_ids(&cid, &ids).await?;
    Ok(ctx.ok(json!({"message_id_map": map})))
}

/// `GET /channels/{type}/{id}/forks?limit=&offset=`: the channel's forks, newest first, and
/// its own source when it is a fork. Works after the source was deleted.
pub async fn list_forks(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<input::ListQuery>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = st.store.get_channel(&cid).await?;
    let allowed = match &ch {
        Some(_) => ctx.viewer.is_admin() || is_member(&st, &ctx.viewer, &cid).await?,
        None if !ctx.viewer.is_admin() => return Err(Error::not_found(format!("channel {cid:?} does not exist")).into()),
        None => true,
    };
    if !allowed {
        return Err(Error::not_allowed(format!("you are not allowed to read channel {cid:?}")).into());
    }
    let (limit, offset) = q.limit_offset(100)?;
    let forks = st.store.list_forks(&cid, limit, offset).await?;
    let mut out = json!({"forks": forks.iter().map(|f| render::fork(ctx.dialect, f)).collect::<Vec<_>>()});
    if let Some(f) = ch.as_ref().and_then(|c| c.fork.as_ref()) {
        out["source"] = render::fork(ctx.dialect, f);
    }
    Ok(ctx.ok(out))
}

/// `GET /channels/{type}/{id}/lineage?max_nodes=`.
#[derive(Deserialize)]
pub struct LineageQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    max_nodes: Option<i64>,
}

/// `GET /channels/{type}/{id}/lineage`: the whole fork tree the channel belongs to, from its
/// root down, breadth first, bounded by `max_nodes` (docs/fork.md, "Lineage"). The same callers
/// as [`list_forks`]; nodes the caller may not read show their place and status only.
pub async fn get_lineage(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<LineageQuery>,
) -> ApiResult<LineageAnswer> {
    let cid = path.cid;
    let max_nodes = q.max_nodes.unwrap_or(lineage::DEFAULT_MAX_NODES);
    if !(1..=lineage::MAX_MAX_NODES).contains(&max_nodes) {
        return Err(Error::input(format!("max_nodes must be 1..{}", lineage::MAX_MAX_NODES)).field("field", "max_nodes").into());
    }
    let ch = st.store.get_channel_bare(&cid).await?;
    let allowed = match &ch {
        Some(_) => ctx.viewer.is_admin() || is_member(&st, &ctx.viewer, &cid).await?,
        None if !ctx.viewer.is_admin() => return Err(Error::not_found(format!("channel {cid:?} does not exist")).into()),
        None => true,
    };
    if !allowed {
        return Err(Error::not_allowed(format!("you are not allowed to read channel {cid:?}")).into());
    }
    let tree = st.store.lineage(&cid, max_nodes, ctx.viewer.user_id()).await?;
    // A hard-deleted channel still has a tree while forks name it as their source.
    if ch.is_none() && tree.nodes.len() <= 1 {
        return Err(Error::not_found(format!("channel {cid:?} does not exist")).into());
    }
    let nodes = tree.nodes.into_iter().map(|n| NodeOut::of(ctx.dialect, &ctx.viewer, n)).collect();
    Ok(LineageAnswer { cid, root_cid: tree.root_cid, truncated_tree: tree.truncated, nodes, duration: crate::duration() })
}

/// The answer of `GET …/lineage`, written straight out from typed views, with no
/// `serde_json::Value` tree of a thousand nodes built and dropped in between
/// (docs/performance.md, "Lineage").
#[derive(Serialize)]
pub struct LineageAnswer {
    cid: String,
    root_cid: String,
    truncated_tree: bool,
    nodes: Vec<NodeOut>,
    duration: String,
}

/// About how many bytes a node takes in the answer (about 450 for a readable fork).
const NODE_BYTES: usize = 512;

impl axum::response::IntoResponse for LineageAnswer {
    fn into_response(self) -> axum::response::Response {
        let mut buf = Vec::with_capacity((self.nodes.len() * NODE_BYTES + 256).min(16 << 20));
        match serde_json::to_writer(&mut buf, &self) {
            Ok(()) => ([(axum::http::header::CONTENT_TYPE, "application/json")], buf).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "a lineage did not serialise");
                crate::error::ApiError::from(Error::internal()).into_response()
            }
        }
    }
}

/// One node of a lineage: everything for a channel the caller may read, its place in the tree
/// and its status otherwise.
#[derive(Serialize)]
#[serde(untagged)]
enum NodeOut {
    Readable {
        cid: String,
        parent_cid: Option<String>,
        depth: i64,
        readable: bool,
        name: Option<String>,
        member_count: i64,
        created_at: Option<TsOut>,
        deleted: bool,
        fork: Option<NodeFork>,
    },
    Hidden {
        cid: String,
        parent_cid: Option<String>,
        depth: i64,
        readable: bool,
        fork: Option<StatusOnly>,
    },
}

/// A readable node's fork: its status and progress, live while backfilling, as
/// `GET /tasks/{id}` reports them.
#[derive(Serialize)]
struct NodeFork {
    status: &'static str,
    copied_message_count: i64,
    total_message_count: Option<i64>,
    truncated: bool,
    source_message_id: String,
    fork_point_text: Option<String>,
    task_id: Option<String>,
    created_at: TsOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed_reason: Option<String>,
}

#[derive(Serialize)]
struct StatusOnly {
    status: &'static str,
}

impl NodeOut {
    fn of(d: Dialect, viewer: &Viewer, n: LineageNode) -> NodeOut {
        let readable = match n.channel {
            Some(_) => perm::may_read(viewer, n.member),
            // A hard-deleted channel has nothing left to read but its place.
            None => viewer.is_admin(),
        };
        if !readable {
            let fork = n.fork.map(|f| StatusOnly { status: f.status.as_str() });
            return NodeOut::Hidden { cid: n.cid, parent_cid: n.parent_cid, depth: n.depth, readable: false, fork };
        }
        let fork = n.fork.map(|f| NodeFork {
            status: f.status.as_str(),
            total_message_count: f.total_message_count.map(|t| t.max(f.copied_message_count)),
            copied_message_count: f.copied_message_count,
            truncated: f.truncated,
            source_message_id: f.source_message_id,
            fork_point_text: n.fork_point_text,
            task_id: f.task_id,
            created_at: TsOut(d, f.created_at),
            failed_reason: f.failed_reason,
        });
        let ch = n.channel.as_ref();
        NodeOut::Readable {
            name: ch.and_then(|c| c.name()).map(str::to_string),
            member_count: ch.map_or(0, |c| c.member_count),
            created_at: ch.map(|c| TsOut(d, c.created_at)),
            deleted: ch.is_none_or(|c| c.deleted_at.is_some()),
            cid: n.cid,
            parent_cid: n.parent_cid,
            depth: n.depth,
            readable: true,
            fork,
        }
    }
}

/// `GET /tasks/{id}`.
pub async fn get_task(State(st): State<ApiState>, ctx: Ctx, ApiPath(id): ApiPath<String>) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("tasks are read server-side").into());
    }
    let Some(t) = st.store.task(&id).await? else { return Err(Error::not_found(format!("task {id:?} does not exist")).into()) };
    let d = ctx.dialect;
    let mut out = json!({"task_id": t.id, "status": t.status, "created_at": d.ts(t.created_at), "updated_at": d.ts(t.updated_at), "result": t.result});
    if let Some(e) = t.error {
        out["error"] = e;
    }
    Ok(ctx.ok(out))
}
