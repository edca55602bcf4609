//! The fork endpoints: fork a channel, look up copy ids, list a channel's forks, and the task
//! behind a backfill.

use crate::channels::{channel_state, is_member, load, page_of, require_read, DEFAULT_MEMBER_LIMIT, DEFAULT_MESSAGE_LIMIT};
use crate::ctx::{ApiPath, Body, ChannelPath, Ctx};
use crate::error::ApiResult;
use crate::input::{self, bool_opt, get, obj_opt, str_opt};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::fork::{MAX_LOOKUP, MAX_MEMBERS};
use offshoot_core::model::{ForkStatus, Viewer};
use offshoot_core::{ids, perm, render, Error};
use offshoot_store::ForkRequest;
use serde_json::{json, Value};

async fn require_fork_enabled(st: &ApiState) -> Result<(), Error> {
    if st.store.app_settings().await?.fork_enabled {
        Ok(())
    } else {
        Err(Error::not_allowed("fork is not enabled for this app: PATCH /app with fork_enabled: true to turn it on"))
    }
}

const DATA_KNOWN: &[&str] = &[
    "created_by",
    "created_by_id",
    "members",
    "team",
    "id",
    "type",
    "cid",
    "created_at",
    "updated_at",
    "frozen",
    "disabled",
    "own_capabilities",
    "member_count",
    "config_overrides",
    "fork",
];

/// `POST /channels/{type}/{id}/fork`.
pub async fn fork_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let source_cid = path.cid;
    require_fork_enabled(&st).await?;
    if !perm::may_fork_or_rewind(&ctx.viewer) {
        return Err(Error::not_allowed(
            "fork is a server-side operation: it needs the ForkChannel permission, which only server-side requests and admins have",
        )
        .into());
    }
    let message_id = input::str_req(&body, "message_id")?;
    let Some(target) = obj_opt(&body, "channel")? else {
        return Err(Error::input("field \"channel\" is required, with the new channel's id").into());
    };
    let target_id = ids::parse_channel_id(&input::str_req(target, "id")?)?;
    let data = obj_opt(target, "data")?.cloned().unwrap_or_default();
    if get(&data, "members").is_some() {
        return Err(Error::input("members go in channel.members, not channel.data.members").into());
    }
    let members = match get(target, "members") {
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
        Viewer::Server => input::actor_id(&body)?,
        Viewer::User { id, .. } => Some(id.clone()),
        Viewer::Anonymous { .. } => None,
    };
    let mut custom = input::custom(&data, DATA_KNOWN)?;
    if let Some(v) = get(target, "name") {
        custom.entry("name").or_insert(v.clone());
    }
    let mut req = ForkRequest {
        source_cid: source_cid.clone(),
        message_id,
        target_id,
        custom,
        team: str_opt(&data, "team")?,
        members,
        exclude_attachments: bool_opt(&body, "exclude_attachments")?.unwrap_or(false),
        created_by_id,
        inherit_data: input::str_list(&body, "inherit_data")?.unwrap_or_default(),
        require_finished: bool_opt(&body, "require_finished")?.unwrap_or(false),
    };
    req.custom = input::limited(std::mem::take(&mut req.custom), "channel")?;
    let outcome = st.store.create_fork(&req).await?;
    if outcome.fork.status == ForkStatus::Backfilling {
        // After the commit; a lost push only delays the backfill until the reconciler runs.
        if let Err(e) = st.jobs.enqueue_backfill(&outcome.fork.channel_cid).await {
            tracing::warn!(fork = %outcome.fork.channel_cid, error = %e.message, "queueing the backfill failed; the reconciler will queue it");
        }
    }
    let page = page_of(obj_opt(&body, "messages")?, DEFAULT_MESSAGE_LIMIT)?;
    let mut state = channel_state(&st, &ctx, &outcome.channel, &page, DEFAULT_MEMBER_LIMIT).await?;
    let mut fork = render::fork(ctx.dialect, &outcome.fork);
    fork["message_id_map"] = Value::Object(outcome.message_id_map);
    state.insert("fork".into(), fork);
    Ok(ctx.ok(Value::Object(state)))
}

/// `POST /channels/{type}/{id}/fork/message_ids`: source id → copy id, for the copies the
/// fork holds. Needs only read access to the fork.
pub async fn lookup_fork_message_ids(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    require_fork_enabled(&st).await?;
    let ch = load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    let ids = input::str_list(&body, "source_message_ids")?.ok_or_else(|| Error::input("field \"source_message_ids\" is required"))?;
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
pub async fn list_forks(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath) -> ApiResult<Json<Value>> {
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
    let limit = ctx.q("limit").map(|l| l.parse::<i64>().map_err(|_| Error::input("limit must be a number"))).transpose()?.unwrap_or(25);
    let offset = ctx.q("offset").map(|l| l.parse::<i64>().map_err(|_| Error::input("offset must be a number"))).transpose()?.unwrap_or(0);
    if !(1..=100).contains(&limit) || offset < 0 {
        return Err(Error::input("limit must be 1..100 and offset ≥ 0").into());
    }
    let forks = st.store.list_forks(&cid, limit, offset).await?;
    let mut out = json!({"forks": forks.iter().map(|f| render::fork(ctx.dialect, f)).collect::<Vec<_>>()});
    if let Some(f) = ch.as_ref().and_then(|c| c.fork.as_ref()) {
        out["source"] = render::fork(ctx.dialect, f);
    }
    Ok(ctx.ok(out))
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
