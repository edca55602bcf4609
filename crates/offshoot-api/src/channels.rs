//! Channels: get-or-create and query, updates, members, delete, truncate, rewind, read state,
//! client events and Query Channels.

use crate::ctx::{ApiPath, Body, ChannelPath, Ctx};
use crate::error::ApiResult;
use crate::input::{self, bool_opt, get, i64_opt, obj_opt, str_opt, Obj};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::{Audience, Channel, Event, User, Viewer, UNWATCH_EVENT, WATCH_EVENT};
use offshoot_core::query::{self, ChannelSortField, Sort};
use offshoot_core::render;
use offshoot_core::{ids, perm, time, Error};
use offshoot_store::{ChannelFilter, ChannelState, ChannelUpdate, MemberInput, NewChannel, Page, PageDir};
use serde_json::{json, Map, Value};

/// Messages in a channel state when the query names no limit. JS `stream-chat` sends none on
/// `watch()` and treats fewer than 100 as "no older page", so the default is 100.
pub const DEFAULT_MESSAGE_LIMIT: i64 = 100;
/// Messages per channel in Query Channels when `message_limit` is absent (JS assumes 25).
pub const DEFAULT_QUERY_CHANNELS_MESSAGE_LIMIT: i64 = 25;
/// Replies per page when the request names no limit.
pub const DEFAULT_REPLY_LIMIT: i64 = 25;
pub const DEFAULT_MEMBER_LIMIT: i64 = 100;

/// The channel, which must exist and not be deleted.
pub(crate) async fn load(st: &ApiState, cid: &str) -> Result<Channel, Error> {
    match st.store.get_channel(cid).await? {
        Some(ch) if ch.deleted_at.is_none() => Ok(ch),
        _ => Err(Error::not_found(format!("channel {cid:?} does not exist"))),
    }
}

pub(crate) async fn is_member(st: &ApiState, viewer: &Viewer, cid: &str) -> Result<bool, Error> {
    match viewer.user_id() {
        Some(uid) => Ok(st.store.is_member(cid, uid).await?),
        None => Ok(false),
    }
}

pub(crate) async fn require_read(st: &ApiState, viewer: &Viewer, cid: &str) -> Result<bool, Error> {
    let member = is_member(st, viewer, cid).await?;
    if !perm::may_read(viewer, member) {
        return Err(Error::not_allowed(format!("you are not allowed to read channel {cid:?}: only its members can")));
    }
    Ok(member)
}

/// Message pagination from `{limit, id_lt, id_lte, id_gt, id_gte, id_around}`.
pub(crate) fn page_of(o: Option<&Obj>, default_limit: i64) -> Result<Page, Error> {
    let Some(o) = o else { return Ok(Page { limit: default_limit, dir: PageDir::Latest }) };
    let limit = i64_opt(o, "limit")?.unwrap_or(default_limit);
    if !(0..=300).contains(&limit) {
        return Err(Error::input("messages.limit must be between 0 and 300"));
    }
    let dir = if let Some(id) = str_opt(o, "id_lt")? {
        PageDir::Before { id, inclusive: false }
    } else if let Some(id) = str_opt(o, "id_lte")? {
        PageDir::Before { id, inclusive: true }
    } else if let Some(id) = str_opt(o, "id_gt")? {
        PageDir::After { id, inclusive: false }
    } else if let Some(id) = str_opt(o, "id_gte")? {
        PageDir::After { id, inclusive: true }
    } else if let Some(id) = str_opt(o, "id_around")? {
        PageDir::Around { id }
    } else {
        PageDir::Latest
    };
    Ok(Page { limit, dir })
}

/// ChannelState as a channel query returns it.
pub(crate) async fn channel_state(
    st: &ApiState,
    ctx: &Ctx,
    ch: &Channel,
    page: &Page,
    member_limit: i64,
) -> Result<Map<String, Value>, Error> {
    let state = st.store.channel_state(ch, &ctx.viewer, page, member_limit).await?;
    Ok(render_state(st, ctx, ch, state))
}

/// A channel and its state as a channel query renders them.
fn render_state(st: &ApiState, ctx: &Ctx, ch: &Channel, state: ChannelState) -> Map<String, Value> {
    let d = ctx.dialect;
    let ChannelState { is_member: member, messages, pinned, members, reads } = state;
    let caps = perm::own_capabilities(&ctx.viewer, member, &ch.kind);
    let mut o = Map::new();
    o.insert("channel".into(), render::channel(d, ch, &caps));
    o.insert("messages".into(), messages.iter().map(|m| render::message(d, m)).collect());
    o.insert("pinned_messages".into(), pinned.iter().map(|m| render::message(d, m)).collect());
    o.insert("members".into(), members.iter().map(|m| render::member(d, m)).collect());
    o.insert(
        "read".into(),
        reads
            .iter()
            .map(|r| {
                let u = members
                    .iter()
                    .find(|m| m.user_id == r.user_id)
                    .and_then(|m| m.user.clone())
                    .unwrap_or_else(|| User::placeholder(&r.user_id, "user"));
                let mut o = json!({"user": render::user(d, &u), "last_read": d.ts(r.last_read), "unread_messages": r.unread_messages});
                if let Some(mid) = &r.last_read_message_id {
                    o["last_read_message_id"] = mid.clone().into();
                }
                o
            })
            .collect(),
    );
    o.insert("watcher_count".into(), st.watchers.watcher_count(&ch.cid).into());
    o.insert("watchers".into(), json!([]));
    o.insert("threads".into(), json!([]));
    o.insert("hidden".into(), false.into());
    if let Some(uid) = ctx.viewer.user_id() {
        if let Some(m) = members.iter().find(|m| m.user_id == uid) {
            o.insert("membership".into(), render::member(d, m));
        }
    }
    o
}

const CHANNEL_DATA_KNOWN: &[&str] = &[
    "created_by",
    "created_by_id",
    "members",
    "team",
    "frozen",
    "disabled",
    "config_overrides",
    "filter_tags",
    "invites",
    "id",
    "type",
    "cid",
    "created_at",
    "updated_at",
    "own_capabilities",
    "member_count",
    "auto_translation_enabled",
    "auto_translation_language",
    "fork",
    "truncated_at",
    "deleted_at",
];

/// `POST /channels/{type}/{id}/query`: get-or-create, optionally watch.
pub async fn query_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let ChannelPath { kind, id, cid } = path;
    get_or_create(&st, &ctx, &kind, &id, &cid, &body).await
}

/// `POST /channels/{type}/query`: a distinct channel keyed by its members.
pub async fn query_distinct_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(kind): ApiPath<String>,
    Body(body): Body,
) -> ApiResult<Json<Value>> {
    let kind = ids::parse_channel_type(&kind)?;
    let data = obj_opt(&body, "data")?.cloned().unwrap_or_default();
    let Some(members) = get(&data, "members") else { return Err(Error::input("a channel without an id needs data.members").into()) };
    let mut ids: Vec<String> = input::members(members, "data.members")?.into_iter().map(|m| m.user_id).collect();
    ids.sort();
    let digest = ids::copy_id("distinct", &ids.join(","));
    let id = format!("!members-{}", &digest.replace('-', "")[..24]);
    let cid = ids::cid(&kind, &id);
    get_or_create(&st, &ctx, &kind, &id, &cid, &body).await
}

/// `GET /api/v2/chat/channels/{type}/{id}` (getstream's read-only variant).
pub async fn get_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    let limit = ctx.q("messages_limit").and_then(|l| l.parse().ok()).unwrap_or(DEFAULT_MESSAGE_LIMIT);
    let mut m = Map::new();
    m.insert("limit".into(), limit.into());
    for k in ["id_lt", "id_lte", "id_gt", "id_gte", "id_around"] {
        if let Some(v) = ctx.q(&format!("messages_{k}")) {
            m.insert(k.into(), v.into());
        }
    }
    let page = page_of(Some(&m), DEFAULT_MESSAGE_LIMIT)?;
    let state = channel_state(&st, &ctx, &ch, &page, DEFAULT_MEMBER_LIMIT).await?;
    Ok(ctx.ok(Value::Object(state)))
}

async fn get_or_create(st: &ApiState, ctx: &Ctx, kind: &str, id: &str, cid: &str, body: &Obj) -> ApiResult<Json<Value>> {
    if st.store.channel_type(kind).await?.is_none() {
        return Err(Error::input(format!("channel type {kind:?} does not exist")).into());
    }
    let data = obj_opt(body, "data")?.cloned().unwrap_or_default();
    let existing = st.store.get_channel(cid).await?.filter(|c| c.deleted_at.is_none());
    let ch = match existing {
        Some(ch) => {
            require_read(st, &ctx.viewer, cid).await?;
            ch
        }
        None => {
            let creator = match &ctx.viewer {
                Viewer::Server => {
                    let from_data = match str_opt(&data, "created_by_id")? {
                        Some(id) => Some(id),
                        None => match obj_opt(&data, "created_by")? {
                            Some(u) => str_opt(u, "id")?,
                            None => None,
                        },
                    };
                    match from_data.or(input::actor_id(body)?) {
                        Some(id) => Some(ids::parse_user_id(&id)?),
                        None => {
                            return Err(
                                Error::input("creating a channel server-side needs data.created_by_id (or data.created_by.id)").into()
                            )
                        }
                    }
                }
                Viewer::User { id, role } => {
                    if role == "guest" {
                        return Err(Error::not_allowed("guests cannot create channels").into());
                    }
                    Some(id.clone())
                }
                Viewer::Anonymous { .. } => return Err(Error::not_allowed("anonymous users cannot create channels").into()),
            };
            let mut members = match get(&data, "members") {
                Some(m) => input::members(m, "data.members")?,
                None => Vec::new(),
            };
            if let (Viewer::User { id, .. }, false) = (&ctx.viewer, members.is_empty()) {
                if !members.iter().any(|m| &m.user_id == id) {
                    members.push(MemberInput { user_id: id.clone(), ..Default::default() });
                }
            }
            let custom = input::limited(input::custom(&data, CHANNEL_DATA_KNOWN)?, "channel")?;
            let new = NewChannel {
                kind: kind.to_string(),
                id: id.to_string(),
                created_by_id: creator,
                team: str_opt(&data, "team")?,
                custom,
                members,
            };
            let (ch, _) = st.store.create_channel(&new).await?;
            ch
        }
    };
    watch_if_asked(st, ctx, body, cid).await?;
    let page = page_of(obj_opt(body, "messages")?, DEFAULT_MESSAGE_LIMIT)?;
    let member_limit =
        obj_opt(body, "members")?.map(|m| i64_opt(m, "limit")).transpose()?.flatten().unwrap_or(DEFAULT_MEMBER_LIMIT).clamp(0, 300);
    let state = channel_state(st, ctx, &ch, &page, member_limit).await?;
    Ok(ctx.ok(Value::Object(state)))
}

async fn watch_if_asked(st: &ApiState, ctx: &Ctx, body: &Obj, cid: &str) -> Result<(), Error> {
    if bool_opt(body, "watch")?.unwrap_or(false) || bool_opt(body, "presence")?.unwrap_or(false) {
        let conn = ctx.q("connection_id").map(str::to_string).or(str_opt(body, "connection_id")?);
        if let Some(conn) = conn {
            // Only the caller's own connections (any, server-side); the ws role checks.
            let owner = ctx.viewer.user_id();
            if !st.watchers.watch(&conn, owner, cid) {
                // The connection lives in another process (the ws role): tell it through the
                // outbox, ahead of every event that follows.
                relay_watch(st, WATCH_EVENT, &conn, owner, cid).await?;
            }
        }
    }
    Ok(())
}

async fn relay_watch(st: &ApiState, kind: &str, connection_id: &str, owner: Option<&str>, cid: &str) -> Result<(), Error> {
    let mut extra = Map::new();
    extra.insert("connection_id".into(), connection_id.into());
    if let Some(owner) = owner {
        extra.insert("user_id".into(), owner.into());
    }
    let event = Event { kind: kind.into(), cid: Some(cid.to_string()), extra, created_at: time::now(), ..Default::default() };
    st.store.publish(event, Audience::default()).await?;
    Ok(())
}

pub async fn stop_watching(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    // As for watching: the channel must exist and the caller must be allowed to read it.
    load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    if let Some(conn) = ctx.q("connection_id").map(str::to_string).or(str_opt(&body, "connection_id")?) {
        let owner = ctx.viewer.user_id();
        if !st.watchers.unwatch(&conn, owner, &cid) {
            relay_watch(&st, UNWATCH_EVENT, &conn, owner, &cid).await?;
        }
    }
    Ok(ctx.ok(json!({})))
}

async fn actor(st: &ApiState, ctx: &Ctx, body: &Obj) -> Result<Option<User>, Error> {
    let a = input::acting_user(&ctx.viewer, ctx.user.as_ref(), body, false)?;
    match a {
        Some(u) => Ok(Some(st.store.get_user(&u.id).await?.unwrap_or(u))),
        None => Ok(None),
    }
}

/// The preamble of every channel-wide change: the path's channel, which must exist and which
/// the caller may manage, and the acting user.
async fn managed(st: &ApiState, ctx: &Ctx, path: ChannelPath, body: &Obj) -> Result<(String, Channel, Option<User>), Error> {
    let cid = path.cid;
    let ch = load(st, &cid).await?;
    require_manage(ctx, &ch)?;
    let actor = actor(st, ctx, body).await?;
    Ok((cid, ch, actor))
}

fn require_manage(ctx: &Ctx, ch: &Channel) -> Result<(), Error> {
    if perm::may_manage_channel(&ctx.viewer, ch.created_by_id.as_deref()) {
        Ok(())
    } else {
        Err(Error::not_allowed(format!("you are not allowed to change channel {:?}", ch.cid)))
    }
}

/// `POST /channels/{type}/{id}`: full update, members, optional system message, in one
/// transaction.
pub async fn update_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let (cid, ch, actor) = managed(&st, &ctx, path, &body).await?;
    let mut update = ChannelUpdate::default();
    if let Some(data) = obj_opt(&body, "data")? {
        update.custom = Some(input::limited(input::custom(data, CHANNEL_DATA_KNOWN)?, "channel")?);
        update.team = str_opt(data, "team")?;
        update.frozen = bool_opt(data, "frozen")?;
    }
    if let Some(m) = get(&body, "add_members") {
        update.add_members = input::members(m, "add_members")?;
    }
    if let Some(m) = get(&body, "remove_members") {
        update.remove_members = input::members(m, "remove_members")?.into_iter().map(|m| m.user_id).collect();
    }
    if let Some(msg) = obj_opt(&body, "message")? {
        let mut new = input::new_message(msg, true, ch.config.as_ref().map(|c| c.max_message_length).unwrap_or(5000))?;
        let author = match input::actor_id(msg)?.or(actor.as_ref().map(|a| a.id.clone())) {
            Some(id) => User::placeholder(&id, "user"),
            None => return Err(Error::input("the system message needs a user_id").into()),
        };
        new.kind = "system".into();
        update.message = Some((new, author));
    }
    let (ch, sys) = st.store.update_channel(&cid, &update, actor.as_ref()).await?;
    let mut out = Map::new();
    if let Some(m) = sys {
        out.insert("message".into(), render::message(ctx.dialect, &m));
    }
    let members = st.store.members(&cid, DEFAULT_MEMBER_LIMIT, 0).await?;
    let member = is_member(&st, &ctx.viewer, &cid).await?;
    out.insert("channel".into(), render::channel(ctx.dialect, &ch, &perm::own_capabilities(&ctx.viewer, member, &ch.kind)));
    out.insert("members".into(), members.iter().map(|m| render::member(ctx.dialect, m)).collect());
    Ok(ctx.ok(Value::Object(out)))
}

/// `PATCH /channels/{type}/{id}`: `set` / `unset`.
pub async fn partial_update_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let (cid, _, actor) = managed(&st, &ctx, path, &body).await?;
    let set = obj_opt(&body, "set")?.cloned().unwrap_or_default();
    let unset = input::str_list(&body, "unset")?.unwrap_or_default();
    let ch = st.store.partial_update_channel(&cid, &set, &unset, actor.as_ref()).await?;
    let member = is_member(&st, &ctx.viewer, &cid).await?;
    let members = st.store.members(&cid, DEFAULT_MEMBER_LIMIT, 0).await?;
    Ok(ctx.ok(json!({
        "channel": render::channel(ctx.dialect, &ch, &perm::own_capabilities(&ctx.viewer, member, &ch.kind)),
        "members": members.iter().map(|m| render::member(ctx.dialect, m)).collect::<Vec<_>>(),
    })))
}

/// `DELETE /channels/{type}/{id}[?hard_delete=true]`.
pub async fn delete_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load(&st, &cid).await?;
    require_manage(&ctx, &ch)?;
    let hard = ctx.q_bool("hard_delete");
    let ch = st.store.delete_channel(&cid, hard, ctx.user.as_ref()).await?;
    Ok(ctx.ok(json!({"channel": render::channel(ctx.dialect, &ch, &[])})))
}

/// `POST /channels/delete`: `{cids, hard_delete}`; done at once, reported as a completed task.
pub async fn delete_channels(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("deleting channels in bulk needs server-side or admin rights").into());
    }
    let cids = input::str_list(&body, "cids")?.ok_or_else(|| Error::input("field \"cids\" is required"))?;
    if cids.len() > 100 {
        return Err(Error::input("at most 100 cids per request").into());
    }
    let hard = bool_opt(&body, "hard_delete")?.unwrap_or(false);
    let mut result = Map::new();
    for cid in &cids {
        ids::parse_cid(cid)?;
        let status = match st.store.delete_channel(cid, hard, None).await {
            Ok(_) => json!({"status": "ok"}),
            Err(e) => json!({"status": "error", "error": Error::from(e).message}),
        };
        result.insert(cid.clone(), status);
    }
    Ok(ctx.ok(json!({"task_id": ids::new_id(), "result": result})))
}

/// `POST /channels/{type}/{id}/truncate`.
pub async fn truncate_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let (cid, ch, actor) = managed(&st, &ctx, path, &body).await?;
    let hard = bool_opt(&body, "hard_delete")?.unwrap_or(false);
    let at = input::ts_opt(&body, "truncated_at")?;
    let msg = match obj_opt(&body, "message")? {
        Some(m) => {
            let mut new = input::new_message(m, true, ch.config.as_ref().map(|c| c.max_message_length).unwrap_or(5000))?;
            new.user_id = input::actor_id(m)?
                .or(actor.as_ref().map(|a| a.id.clone()))
                .ok_or_else(|| Error::input("the truncate message needs a user_id"))?;
            Some(new)
        }
        None => None,
    };
    let author = match &msg {
        Some(m) if actor.is_none() => Some(User::placeholder(&m.user_id, "user")),
        _ => actor.clone(),
    };
    let (ch, sys) = st.store.truncate_channel(&cid, at, hard, author.as_ref(), msg.as_ref()).await?;
    let mut out = json!({"channel": render::channel(ctx.dialect, &ch, &[])});
    if let Some(m) = sys {
        out["message"] = render::message(ctx.dialect, &m);
    }
    Ok(ctx.ok(out))
}

/// `POST /channels/agent/{id}/rewind`.
pub async fn rewind_channel(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let ChannelPath { kind, cid, .. } = path;
    if !perm::may_fork_or_rewind(&ctx.viewer) {
        return Err(
            Error::not_allowed("rewind is a server-side operation: it needs the RewindChannel permission (server-side or admin)").into()
        );
    }
    load(&st, &cid).await?;
    if kind != "agent" {
        return Err(Error::input(format!("channel {cid:?} is not an agent channel; only agent channels can be rewound")).into());
    }
    let message_id = input::str_req(&body, "message_id")?;
    let expected = input::str_req(&body, "expected_last_message_id")?;
    let inclusive = bool_opt(&body, "inclusive")?.unwrap_or(false);
    let actor = actor(&st, &ctx, &body).await?;
    let ch = st.store.rewind_channel(&cid, &message_id, &expected, inclusive, actor.as_ref()).await?;
    Ok(ctx.ok(json!({"channel": render::channel(ctx.dialect, &ch, &[])})))
}

/// `POST /channels/{type}/{id}/read`.
pub async fn mark_read(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    load(&st, &cid).await?;
    let Some(user) = actor(&st, &ctx, &body).await? else { return Err(Error::input("mark read needs a user_id").into()) };
    if !ctx.viewer.is_server() {
        require_read(&st, &ctx.viewer, &cid).await?;
    }
    let mid = str_opt(&body, "message_id")?;
    let at = st.store.mark_read(&cid, &user, mid.as_deref()).await?;
    let ev = json!({"type": "message.read", "cid": cid, "user": render::user(ctx.dialect, &user), "created_at": ctx.dialect.ts(at)});
    Ok(ctx.ok(json!({"event": ev})))
}

/// `POST /channels/{type}/{id}/event`: typing, AI state and custom events, relayed to watchers.
pub async fn send_event(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load(&st, &cid).await?;
    let Some(ev) = obj_opt(&body, "event")? else { return Err(Error::input("field \"event\" is required").into()) };
    let kind = input::str_req(ev, "type")?;
    if !ctx.viewer.is_server() {
        let member = require_read(&st, &ctx.viewer, &cid).await?;
        if !perm::may_write(&ctx.viewer, member) {
            return Err(Error::not_allowed("you cannot send events to this channel").into());
        }
    }
    let user = input::acting_user(&ctx.viewer, ctx.user.as_ref(), ev, false)?;
    let user = match user {
        Some(u) => Some(st.store.get_user(&u.id).await?.unwrap_or(u)),
        None => None,
    };
    let extra = input::custom(ev, &["type", "user", "user_id", "cid", "channel_id", "channel_type", "created_at"])?;
    let event = Event {
        kind,
        cid: Some(cid.clone()),
        channel_type: Some(ch.kind.clone()),
        channel_id: Some(ch.id.clone()),
        user,
        extra,
        created_at: time::now(),
        ..Default::default()
    };
    let rendered = render::event(ctx.dialect, &event);
    st.store.publish(event, Audience { watchers_of: Some(cid), users: Vec::new(), webhooks: false }).await?;
    Ok(ctx.ok(json!({"event": rendered})))
}

/// `POST /channels`: Query Channels.
pub async fn query_channels(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    let filter = obj_opt(&body, "filter_conditions")?.or(obj_opt(&body, "filter")?).cloned().unwrap_or_default();
    let mut f = ChannelFilter {
        limit: i64_opt(&body, "limit")?.unwrap_or(10),
        offset: i64_opt(&body, "offset")?.unwrap_or(0),
        ..Default::default()
    };
    if !(0..=100).contains(&f.limit) {
        return Err(Error::input("limit must be at most 100").into());
    }
    if !filter.is_empty() {
        f.filter = Some(query::parse_filter(&filter)?);
    }
    f.sort = query::parse_sort(get(&body, "sort"), query::channel_sort_field)?;
    if f.sort.is_empty() {
        f.sort.push(Sort { field: ChannelSortField::LastUpdated, desc: true });
    }
    f.user_id = match &ctx.viewer {
        Viewer::User { id, .. } => Some(id.clone()),
        _ => input::actor_id(&body)?,
    };
    match &ctx.viewer {
        Viewer::Server => {}
        Viewer::User { role, .. } if role == "admin" => {}
        Viewer::User { id, .. } => f.member_of = Some(id.clone()),
        Viewer::Anonymous { .. } => return Ok(ctx.ok(json!({"channels": []}))),
    }
    let channels = st.store.query_channels(&f).await?;
    let msg_limit = i64_opt(&body, "message_limit")?.unwrap_or(DEFAULT_QUERY_CHANNELS_MESSAGE_LIMIT).clamp(0, 300);
    let member_limit = i64_opt(&body, "member_limit")?.unwrap_or(DEFAULT_MEMBER_LIMIT).clamp(0, 300);
    // Every channel's state in a fixed number of statements (the store's `channel_states`).
    let states = st.store.channel_states(&channels, &ctx.viewer, msg_limit, member_limit).await?;
    let mut out = Vec::new();
    for (ch, state) in channels.iter().zip(states) {
        watch_if_asked(&st, &ctx, &body, &ch.cid).await?;
        out.push(Value::Object(render_state(&st, &ctx, ch, state)));
    }
    Ok(ctx.ok(json!({"channels": out})))
}
