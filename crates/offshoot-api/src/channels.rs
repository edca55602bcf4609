//! Channels: get-or-create and query, updates, members, delete, truncate, rewind, read state,
//! client events and Query Channels.

use crate::ctx::{ApiPath, ApiQuery, Body, ChannelPath, Ctx};
use crate::error::ApiResult;
use crate::input::{
    self, de, present, required, Actor, ChannelData, ConnectionQuery, LimitInput, MessageInput, PageInput, Patch, WatchInput,
};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::{Audience, Channel, Event, Member, NewMessage, User, Viewer, UNWATCH_EVENT, WATCH_EVENT};
use offshoot_core::query::{self, ChannelSortField, Sort};
use offshoot_core::render;
use offshoot_core::{ids, perm, time, Error};
use offshoot_store::{ChannelFilter, ChannelState, ChannelUpdate, MemberInput, NewChannel, Page, ReadState};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Messages in a channel state when the query names no limit. JS `stream-chat` sends none on
/// `watch()` and treats fewer than 100 as "no older page", so the default is 100.
pub const DEFAULT_MESSAGE_LIMIT: i64 = 100;
/// Messages per channel in Query Channels when `message_limit` is absent (JS assumes 25).
pub const DEFAULT_QUERY_CHANNELS_MESSAGE_LIMIT: i64 = 25;
/// Replies per page when the request names no limit.
pub const DEFAULT_REPLY_LIMIT: i64 = 25;
pub const DEFAULT_MEMBER_LIMIT: i64 = 100;
/// Watchers listed when `watchers` names no limit.
pub const DEFAULT_WATCHER_LIMIT: i64 = 10;

/// The channel, which must exist and not be deleted.
pub(crate) async fn load(st: &ApiState, cid: &str) -> Result<Channel, Error> {
    match st.store.get_channel(cid).await? {
        Some(ch) if ch.deleted_at.is_none() => Ok(ch),
        _ => Err(Error::not_found(format!("channel {cid:?} does not exist"))),
    }
}

/// [`load`] without the channel's creator (one statement): for writes that need the channel's
/// own fields, fork and type only.
pub(crate) async fn load_bare(st: &ApiState, cid: &str) -> Result<Channel, Error> {
    match st.store.get_channel_bare(cid).await? {
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

/// ChannelState as a channel query returns it.
pub(crate) async fn channel_state(
    st: &ApiState,
    ctx: &Ctx,
    ch: &Channel,
    page: &Page,
    member_limit: i64,
) -> Result<Map<String, Value>, Error> {
    let state = st.store.channel_state(ch, &ctx.viewer, page, member_limit).await?;
    let watcher_count = st.store.watcher_count(&ch.cid).await?;
    Ok(render_state(ctx, ch, state, watcher_count).into_map())
}

/// A channel and its state as a channel query renders them, written straight to the response
/// by the typed views of [`render`]: a Query Channels page holds hundreds of messages and
/// members, and building a `Value` tree of them first was a seventh of the server's time
/// (docs/performance.md, "Query Channels").
pub(crate) struct StateOut {
    dialect: render::Dialect,
    channel: Channel,
    own_capabilities: Vec<&'static str>,
    watcher_count: i64,
    state: ChannelState,
    /// The viewer's place in `state.members`, when they are one of them.
    membership: Option<usize>,
}

impl StateOut {
    /// The state as one map, for the endpoints that add to it.
    fn into_map(self) -> Map<String, Value> {
        match serde_json::to_value(&self) {
            Ok(Value::Object(o)) => o,
            _ => Map::new(),
        }
    }
}

impl Serialize for StateOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let d = self.dialect;
        let ChannelState { members, reads, messages, pinned, .. } = &self.state;
        let mut o = s.serialize_map(None)?;
        o.serialize_entry("channel", &render::ChannelOut { dialect: d, channel: &self.channel, own_capabilities: &self.own_capabilities })?;
        o.serialize_entry("members", &MembersOut(d, members))?;
        o.serialize_entry("read", &ReadsOut(d, reads, members))?;
        o.serialize_entry("watcher_count", &self.watcher_count)?;
        o.serialize_entry("watchers", &[] as &[Value])?;
        o.serialize_entry("threads", &[] as &[Value])?;
        o.serialize_entry("hidden", &false)?;
        if let Some(m) = self.membership.and_then(|i| members.get(i)) {
            o.serialize_entry("membership", &render::MemberOut(d, m))?;
        }
        o.serialize_entry("messages", &render::MessagesOut(d, messages))?;
        o.serialize_entry("pinned_messages", &render::MessagesOut(d, pinned))?;
        o.end()
    }
}

/// A channel's first members.
struct MembersOut<'a>(render::Dialect, &'a [Member]);

impl Serialize for MembersOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.1.iter().map(|m| render::MemberOut(self.0, m)))
    }
}

/// The read states of a channel's first members, each with the member's user (a placeholder
/// when the member is not among them).
struct ReadsOut<'a>(render::Dialect, &'a [ReadState], &'a [Member]);

impl Serialize for ReadsOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ReadsOut(d, reads, members) = *self;
        s.collect_seq(reads.iter().map(|r| ReadOut(d, r, members.iter().find(|m| m.user_id == r.user_id).and_then(|m| m.user.as_ref()))))
    }
}

/// A member's read state (the wire's `read` entry).
struct ReadOut<'a>(render::Dialect, &'a ReadState, Option<&'a User>);

impl Serialize for ReadOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let ReadOut(d, r, user) = *self;
        let mut o = s.serialize_map(None)?;
        match user {
            Some(u) => o.serialize_entry("user", &render::UserOut(d, u))?,
            None => o.serialize_entry("user", &render::UserOut(d, &User::placeholder(&r.user_id, "user")))?,
        }
        o.serialize_entry("last_read", &render::TsOut(d, r.last_read))?;
        o.serialize_entry("unread_messages", &r.unread_messages)?;
        if let Some(mid) = &r.last_read_message_id {
            o.serialize_entry("last_read_message_id", mid)?;
        }
        o.end()
    }
}

fn render_state(ctx: &Ctx, ch: &Channel, state: ChannelState, watcher_count: i64) -> StateOut {
    let own_capabilities = perm::own_capabilities(&ctx.viewer, state.is_member, &ch.kind);
    let membership = ctx.viewer.user_id().and_then(|uid| state.members.iter().position(|m| m.user_id == uid));
    StateOut { dialect: ctx.dialect, channel: ch.clone(), own_capabilities, watcher_count, state, membership }
}

/// The body of a channel query (`POST /channels/{type}/{id}/query` and the distinct
/// variant): the channel's data when it is created, the pages of its state, watching.
#[derive(Deserialize)]
pub struct ChannelQueryRequest {
    data: Option<ChannelData>,
    messages: Option<PageInput>,
    members: Option<LimitInput>,
    watchers: Option<LimitInput>,
    #[serde(flatten)]
    watch: WatchInput,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/{type}/{id}/query`: get-or-create, optionally watch.
pub async fn query_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<ConnectionQuery>,
    Body(mut body): Body<ChannelQueryRequest>,
) -> ApiResult<Json<Value>> {
    let ChannelPath { kind, id, cid } = path;
    let members = body.data.as_mut().and_then(|d| d.members.take()).map(|m| input::members(m, "data.members")).transpose()?;
    get_or_create(&st, &ctx, (&kind, &id, &cid), q, body, members).await
}

/// `POST /channels/{type}/query`: a distinct channel keyed by its members.
pub async fn query_distinct_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(kind): ApiPath<String>,
    ApiQuery(q): ApiQuery<ConnectionQuery>,
    Body(mut body): Body<ChannelQueryRequest>,
) -> ApiResult<Json<Value>> {
    let kind = ids::parse_channel_type(&kind)?;
    let Some(members) = body.data.as_mut().and_then(|d| d.members.take()) else {
        return Err(Error::input("a channel without an id needs data.members").into());
    };
    let members = input::members(members, "data.members")?;
    let mut ids: Vec<String> = members.iter().map(|m| m.user_id.clone()).collect();
    ids.sort();
    let digest = ids::copy_id("distinct", &ids.join(","));
    let id = format!("!members-{}", &digest.replace('-', "")[..24]);
    let cid = ids::cid(&kind, &id);
    get_or_create(&st, &ctx, (&kind, &id, &cid), q, body, Some(members)).await
}

/// The query string of `GET /api/v2/chat/channels/{type}/{id}`: the messages page.
#[derive(Deserialize)]
pub struct GetChannelQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    messages_limit: Option<i64>,
    messages_id_lt: Option<String>,
    messages_id_lte: Option<String>,
    messages_id_gt: Option<String>,
    messages_id_gte: Option<String>,
    messages_id_around: Option<String>,
}

/// `GET /api/v2/chat/channels/{type}/{id}` (getstream's read-only variant).
pub async fn get_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<GetChannelQuery>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    let page = PageInput {
        limit: q.messages_limit,
        id_lt: q.messages_id_lt,
        id_lte: q.messages_id_lte,
        id_gt: q.messages_id_gt,
        id_gte: q.messages_id_gte,
        id_around: q.messages_id_around,
    }
    .page(DEFAULT_MESSAGE_LIMIT)?;
    let state = channel_state(&st, &ctx, &ch, &page, DEFAULT_MEMBER_LIMIT).await?;
    Ok(ctx.ok(Value::Object(state)))
}

async fn get_or_create(
    st: &ApiState,
    ctx: &Ctx,
    (kind, id, cid): (&str, &str, &str),
    q: ConnectionQuery,
    body: ChannelQueryRequest,
    members: Option<Vec<MemberInput>>,
) -> ApiResult<Json<Value>> {
    if st.store.channel_type(kind).await?.is_none() {
        return Err(Error::input(format!("channel type {kind:?} does not exist")).into());
    }
    let existing = st.store.get_channel(cid).await?.filter(|c| c.deleted_at.is_none());
    let ch = match existing {
        Some(ch) => {
            require_read(st, &ctx.viewer, cid).await?;
            ch
        }
        None => {
            let data = body.data.unwrap_or_default();
            let creator = match &ctx.viewer {
                Viewer::Server => match data.creator().map(str::to_string).or(body.actor.id()?) {
                    Some(id) => Some(ids::parse_user_id(&id)?),
                    None => {
                        return Err(Error::input("creating a channel server-side needs data.created_by_id (or data.created_by.id)").into())
                    }
                },
                Viewer::User { id, role } => {
                    if role == "guest" {
                        return Err(Error::not_allowed("guests cannot create channels").into());
                    }
                    Some(id.clone())
                }
                Viewer::Anonymous { .. } => return Err(Error::not_allowed("anonymous users cannot create channels").into()),
            };
            let mut members = members.unwrap_or_default();
            if let (Viewer::User { id, .. }, false) = (&ctx.viewer, members.is_empty()) {
                if !members.iter().any(|m| &m.user_id == id) {
                    members.push(MemberInput { user_id: id.clone(), ..Default::default() });
                }
            }
            let new = NewChannel {
                kind: kind.to_string(),
                id: id.to_string(),
                created_by_id: creator,
                team: data.team,
                custom: data.custom.limited("channel")?,
                members,
            };
            let (ch, _) = st.store.create_channel(&new).await?;
            ch
        }
    };
    watch_if_asked(st, ctx, &q, &body.watch, cid).await?;
    let page = body.messages.unwrap_or_default().page(DEFAULT_MESSAGE_LIMIT)?;
    let member_limit = body.members.and_then(|m| m.limit).unwrap_or(DEFAULT_MEMBER_LIMIT).clamp(0, 300);
    let mut state = channel_state(st, ctx, &ch, &page, member_limit).await?;
    // The watcher list only when asked (`watchers: {limit, offset}`), as Stream pages it.
    if let Some(w) = body.watchers {
        let (limit, offset) = (w.limit.unwrap_or(DEFAULT_WATCHER_LIMIT), w.offset.unwrap_or(0));
        if !(0..=300).contains(&limit) || !(0..=10_000).contains(&offset) {
            return Err(Error::input("watchers.limit must be 0..300 and watchers.offset 0..10000").field("field", "watchers").into());
        }
        let users = st.store.watchers(cid, limit, offset).await?;
        state.insert("watchers".into(), users.iter().map(|u| render::user(ctx.dialect, u)).collect());
    }
    Ok(ctx.ok(Value::Object(state)))
}

async fn watch_if_asked(st: &ApiState, ctx: &Ctx, q: &ConnectionQuery, w: &WatchInput, cid: &str) -> Result<(), Error> {
    if w.asked() {
        if let Some(conn) = q.connection_id.as_ref().or(w.connection_id.as_ref()) {
            // Only the caller's own connections (any, server-side); the ws role checks.
            let owner = ctx.viewer.user_id();
            if !st.watchers.watch(conn, owner, cid) {
                // The connection lives in another process (the ws role): tell it through the
                // outbox, ahead of every event that follows.
                relay_watch(st, WATCH_EVENT, conn, owner, cid).await?;
            }
            // The shared record every ws process counts and lists watchers from, and which
            // presence events are addressed by.
            st.store.watch_channel(conn, owner, cid, w.presence.unwrap_or(false)).await?;
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

#[derive(Deserialize)]
pub struct StopWatchingRequest {
    connection_id: Option<String>,
}

pub async fn stop_watching(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<ConnectionQuery>,
    Body(body): Body<StopWatchingRequest>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    // As for watching: the channel must exist and the caller must be allowed to read it.
    load(&st, &cid).await?;
    require_read(&st, &ctx.viewer, &cid).await?;
    if let Some(conn) = q.connection_id.or(body.connection_id) {
        let owner = ctx.viewer.user_id();
        if !st.watchers.unwatch(&conn, owner, &cid) {
            relay_watch(&st, UNWATCH_EVENT, &conn, owner, &cid).await?;
        }
        st.store.unwatch_channel(&conn, owner, &cid).await?;
    }
    Ok(ctx.ok(json!({})))
}

/// The acting user a body names (server-side) or the caller, with its stored record. A
/// client-side caller's record is the one authentication already read ([`Ctx::user`]).
pub(crate) async fn actor(st: &ApiState, ctx: &Ctx, actor: &Actor) -> Result<Option<User>, Error> {
    match actor.acting(&ctx.viewer, ctx.user.as_ref(), false)? {
        Some(u) if ctx.viewer.is_server() => Ok(Some(st.store.get_user(&u.id).await?.unwrap_or(u))),
        acting => Ok(acting),
    }
}

/// The preamble of every channel-wide change: the path's channel, which must exist and which
/// the caller may manage, and the acting user.
async fn managed(st: &ApiState, ctx: &Ctx, path: ChannelPath, a: &Actor) -> Result<(String, Channel, Option<User>), Error> {
    let cid = path.cid;
    let ch = load(st, &cid).await?;
    require_manage(ctx, &ch)?;
    let actor = actor(st, ctx, a).await?;
    Ok((cid, ch, actor))
}

fn require_manage(ctx: &Ctx, ch: &Channel) -> Result<(), Error> {
    if perm::may_manage_channel(&ctx.viewer, ch.created_by_id.as_deref()) {
        Ok(())
    } else {
        Err(Error::not_allowed(format!("you are not allowed to change channel {:?}", ch.cid)))
    }
}

/// A system message a channel change sends (`update`, `truncate`): its author is the
/// message's own user, else the acting user.
fn system_message(msg: MessageInput, ch: &Channel, actor: Option<&User>, what: &str) -> Result<NewMessage, Error> {
    let author = msg.actor.id()?.or(actor.map(|a| a.id.clone()));
    let mut new = msg.into_new(true, ch.max_message_length())?;
    new.user_id = author.ok_or_else(|| Error::input(format!("the {what} message needs a user_id")))?;
    Ok(new)
}

#[derive(Deserialize)]
pub struct UpdateChannelRequest {
    data: Option<ChannelData>,
    add_members: Option<Vec<input::MemberRef>>,
    remove_members: Option<Vec<input::MemberRef>>,
    message: Option<MessageInput>,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/{type}/{id}`: full update, members, optional system message, in one
/// transaction.
pub async fn update_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<UpdateChannelRequest>,
) -> ApiResult<Json<Value>> {
    let (cid, ch, actor) = managed(&st, &ctx, path, &body.actor).await?;
    let mut update = ChannelUpdate::default();
    if let Some(data) = body.data {
        update.team = data.team;
        update.frozen = data.frozen;
        update.custom = Some(data.custom.limited("channel")?);
    }
    if let Some(m) = body.add_members {
        update.add_members = input::members(m, "add_members")?;
    }
    if let Some(m) = body.remove_members {
        update.remove_members = input::members(m, "remove_members")?.into_iter().map(|m| m.user_id).collect();
    }
    if let Some(msg) = body.message {
        let mut new = system_message(msg, &ch, actor.as_ref(), "system")?;
        new.kind = "system".into();
        let author = User::placeholder(&new.user_id, "user");
        update.message = Some((new, author));
    }
    let (ch, sys) = st.store.update_channel(&cid, &update, actor.as_ref()).await?;
    let mut out = Map::new();
    if let Some(m) = sys {
        out.insert("message".into(), render::message(ctx.dialect, &m));
    }
    out.extend(channel_and_members(&st, &ctx, &ch).await?);
    Ok(ctx.ok(Value::Object(out)))
}

/// `channel` (with the caller's capabilities) and `members` of a changed channel.
async fn channel_and_members(st: &ApiState, ctx: &Ctx, ch: &Channel) -> Result<Map<String, Value>, Error> {
    let members = st.store.members(&ch.cid, DEFAULT_MEMBER_LIMIT, 0).await?;
    let member = is_member(st, &ctx.viewer, &ch.cid).await?;
    let mut out = Map::new();
    out.insert("channel".into(), render::channel(ctx.dialect, ch, &perm::own_capabilities(&ctx.viewer, member, &ch.kind)));
    out.insert("members".into(), members.iter().map(|m| render::member(ctx.dialect, m)).collect());
    Ok(out)
}

#[derive(Deserialize)]
pub struct PartialUpdateChannelRequest {
    #[serde(flatten)]
    patch: Patch,
    #[serde(flatten)]
    actor: Actor,
}

/// `PATCH /channels/{type}/{id}`: `set` / `unset`.
pub async fn partial_update_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<PartialUpdateChannelRequest>,
) -> ApiResult<Json<Value>> {
    let (cid, _, actor) = managed(&st, &ctx, path, &body.actor).await?;
    let (set, unset) = body.patch.into_parts();
    let ch = st.store.partial_update_channel(&cid, &set, &unset, actor.as_ref()).await?;
    Ok(ctx.ok(Value::Object(channel_and_members(&st, &ctx, &ch).await?)))
}

#[derive(Deserialize)]
pub struct DeleteChannelQuery {
    #[serde(default, deserialize_with = "de::opt_bool")]
    hard_delete: Option<bool>,
}

/// `DELETE /channels/{type}/{id}[?hard_delete=true]`.
pub async fn delete_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<DeleteChannelQuery>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load(&st, &cid).await?;
    require_manage(&ctx, &ch)?;
    let ch = st.store.delete_channel(&cid, q.hard_delete.unwrap_or(false), ctx.user.as_ref()).await?;
    crate::files::after_hard_delete(&st, q.hard_delete.unwrap_or(false)).await;
    Ok(ctx.ok(json!({"channel": render::channel(ctx.dialect, &ch, &[])})))
}

#[derive(Deserialize)]
pub struct DeleteChannelsRequest {
    cids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    hard_delete: Option<bool>,
}

/// `POST /channels/delete`: `{cids, hard_delete}`; done at once, reported as a completed task.
pub async fn delete_channels(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<DeleteChannelsRequest>) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("deleting channels in bulk needs server-side or admin rights").into());
    }
    let cids = present(body.cids, "cids")?;
    if cids.len() > 100 {
        return Err(Error::input("at most 100 cids per request").into());
    }
    let hard = body.hard_delete.unwrap_or(false);
    let mut result = Map::new();
    for cid in &cids {
        ids::parse_cid(cid)?;
        let status = match st.store.delete_channel(cid, hard, None).await {
            Ok(_) => json!({"status": "ok"}),
            Err(e) => json!({"status": "error", "error": Error::from(e).message}),
        };
        result.insert(cid.clone(), status);
    }
    crate::files::after_hard_delete(&st, hard).await;
    Ok(ctx.ok(json!({"task_id": ids::new_id(), "result": result})))
}

#[derive(Deserialize)]
pub struct TruncateRequest {
    #[serde(default, deserialize_with = "de::opt_bool")]
    hard_delete: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_ts")]
    truncated_at: Option<i64>,
    message: Option<MessageInput>,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/{type}/{id}/truncate`.
pub async fn truncate_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<TruncateRequest>,
) -> ApiResult<Json<Value>> {
    let (cid, ch, actor) = managed(&st, &ctx, path, &body.actor).await?;
    let msg = body.message.map(|m| system_message(m, &ch, actor.as_ref(), "truncate")).transpose()?;
    let author = match &msg {
        Some(m) if actor.is_none() => Some(User::placeholder(&m.user_id, "user")),
        _ => actor.clone(),
    };
    let hard = body.hard_delete.unwrap_or(false);
    let (ch, sys) = st.store.truncate_channel(&cid, body.truncated_at, hard, author.as_ref(), msg.as_ref()).await?;
    crate::files::after_hard_delete(&st, hard).await;
    let mut out = json!({"channel": render::channel(ctx.dialect, &ch, &[])});
    if let Some(m) = sys {
        out["message"] = render::message(ctx.dialect, &m);
    }
    Ok(ctx.ok(out))
}

#[derive(Deserialize)]
pub struct RewindRequest {
    message_id: Option<String>,
    expected_last_message_id: Option<String>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    inclusive: Option<bool>,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/agent/{id}/rewind`.
pub async fn rewind_channel(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<RewindRequest>,
) -> ApiResult<Json<Value>> {
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
    let message_id = required(body.message_id, "message_id")?;
    let expected = required(body.expected_last_message_id, "expected_last_message_id")?;
    let actor = actor(&st, &ctx, &body.actor).await?;
    let ch = st.store.rewind_channel(&cid, &message_id, &expected, body.inclusive.unwrap_or(false), actor.as_ref()).await?;
    Ok(ctx.ok(json!({"channel": render::channel(ctx.dialect, &ch, &[])})))
}

#[derive(Deserialize)]
pub struct MarkReadRequest {
    message_id: Option<String>,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/{type}/{id}/read`.
pub async fn mark_read(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<MarkReadRequest>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    load(&st, &cid).await?;
    let Some(user) = actor(&st, &ctx, &body.actor).await? else { return Err(Error::input("mark read needs a user_id").into()) };
    if !ctx.viewer.is_server() {
        require_read(&st, &ctx.viewer, &cid).await?;
    }
    let at = st.store.mark_read(&cid, &user, body.message_id.as_deref()).await?;
    let ev = json!({"type": "message.read", "cid": cid, "user": render::user(ctx.dialect, &user), "created_at": ctx.dialect.ts(at)});
    Ok(ctx.ok(json!({"event": ev})))
}

#[derive(Deserialize)]
pub struct SendEventRequest {
    event: Option<EventInput>,
}

/// A client event: its type and acting user; every other key travels with it.
#[derive(Deserialize)]
struct EventInput {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(flatten)]
    actor: Actor,
    #[serde(flatten)]
    _read_only: EventReadOnly,
    #[serde(flatten)]
    extra: input::Extra,
}

/// Event fields the server sets; a client's copy is dropped.
#[derive(Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of the event's extra fields
struct EventReadOnly {
    #[serde(default)]
    cid: serde::de::IgnoredAny,
    #[serde(default)]
    channel_id: serde::de::IgnoredAny,
    #[serde(default)]
    channel_type: serde::de::IgnoredAny,
    #[serde(default)]
    created_at: serde::de::IgnoredAny,
}

/// `POST /channels/{type}/{id}/event`: typing, AI state and custom events, relayed to watchers.
pub async fn send_event(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    Body(body): Body<SendEventRequest>,
) -> ApiResult<Json<Value>> {
    let cid = path.cid;
    let ch = load_bare(&st, &cid).await?;
    let ev = present(body.event, "event")?;
    let kind = required(ev.kind, "event.type")?;
    if !ctx.viewer.is_server() {
        let member = require_read(&st, &ctx.viewer, &cid).await?;
        if !perm::may_write(&ctx.viewer, member) {
            return Err(Error::not_allowed("you cannot send events to this channel").into());
        }
    }
    let extra = ev.extra.into_custom();
    if kind.starts_with("ai_indicator.") {
        // The AI state is kept per (channel, message id) in an indexed table.
        match extra.get("message_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) => {
                ids::parse_message_id(id).map_err(|e| e.field("field", "event.message_id"))?;
            }
            Some(_) => return Err(Error::input("event.message_id must be a string").field("field", "event.message_id").into()),
        }
    }
    let user = actor(&st, &ctx, &ev.actor).await?;
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
    st.store.publish(event, Audience { watchers_of: Some(cid), users: Vec::new(), webhooks: false, ..Default::default() }).await?;
    Ok(ctx.ok(json!({"event": rendered})))
}

#[derive(Deserialize)]
pub struct QueryChannelsRequest {
    filter_conditions: Option<input::Obj>,
    filter: Option<input::Obj>,
    sort: Option<Value>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    offset: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    message_limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    member_limit: Option<i64>,
    #[serde(flatten)]
    watch: WatchInput,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels`: Query Channels.
pub async fn query_channels(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiQuery(q): ApiQuery<ConnectionQuery>,
    Body(body): Body<QueryChannelsRequest>,
) -> ApiResult<QueryChannelsResponse> {
    let filter = body.filter_conditions.or(body.filter).unwrap_or_default();
    let mut f = ChannelFilter { limit: body.limit.unwrap_or(10), offset: body.offset.unwrap_or(0), ..Default::default() };
    if !(0..=100).contains(&f.limit) {
        return Err(Error::input("limit must be at most 100").into());
    }
    if !filter.is_empty() {
        f.filter = Some(query::parse_filter(&filter)?);
    }
    f.sort = query::parse_sort(body.sort.as_ref(), query::channel_sort_field)?;
    if f.sort.is_empty() {
        f.sort.push(Sort { field: ChannelSortField::LastUpdated, desc: true });
    }
    f.user_id = match &ctx.viewer {
        Viewer::User { id, .. } => Some(id.clone()),
        _ => body.actor.id()?,
    };
    match &ctx.viewer {
        Viewer::Server => {}
        Viewer::User { role, .. } if role == "admin" => {}
        Viewer::User { id, .. } => f.member_of = Some(id.clone()),
        Viewer::Anonymous { .. } => return Ok(QueryChannelsResponse { channels: Vec::new(), duration: crate::duration() }),
    }
    let channels = st.store.query_channels(&f).await?;
    let msg_limit = body.message_limit.unwrap_or(DEFAULT_QUERY_CHANNELS_MESSAGE_LIMIT).clamp(0, 300);
    let member_limit = body.member_limit.unwrap_or(DEFAULT_MEMBER_LIMIT).clamp(0, 300);
    // Every channel's state in a fixed number of statements (the store's `channel_states`).
    let states = st.store.channel_states(&channels, &ctx.viewer, msg_limit, member_limit).await?;
    for ch in &channels {
        watch_if_asked(&st, &ctx, &q, &body.watch, &ch.cid).await?;
    }
    let cids: Vec<String> = channels.iter().map(|c| c.cid.clone()).collect();
    let counts = st.store.watcher_counts(&cids).await?;
    let mut out = Vec::new();
    for (ch, state) in channels.iter().zip(states) {
        let count = counts.get(&ch.cid).copied().unwrap_or(0);
        out.push(render_state(&ctx, ch, state, count));
    }
    Ok(QueryChannelsResponse { channels: out, duration: crate::duration() })
}

/// The answer of Query Channels, written straight out (see [`StateOut`]).
#[derive(Serialize)]
pub struct QueryChannelsResponse {
    channels: Vec<StateOut>,
    duration: String,
}

/// About how many bytes a message takes in the answer, with its user (1.6 KB in figure g's).
const MESSAGE_BYTES: usize = 1_600;
/// About how many bytes a channel takes besides its messages: itself, its members, their reads.
const CHANNEL_BYTES: usize = 8_192;

impl axum::response::IntoResponse for QueryChannelsResponse {
    /// As [`Json`] answers, into a buffer sized for the answer: a page of 30 channels is about
    /// 1.2 MB, and growing a buffer to it from 128 bytes copied it about once more
    /// (docs/performance.md, "Query Channels").
    fn into_response(self) -> axum::response::Response {
        let messages: usize = self.channels.iter().map(|c| c.state.messages.len() + c.state.pinned.len()).sum();
        let size = (messages * MESSAGE_BYTES + self.channels.len() * CHANNEL_BYTES).min(16 << 20);
        let mut buf = Vec::with_capacity(size.max(128));
        match serde_json::to_writer(&mut buf, &self) {
            Ok(()) => ([(axum::http::header::CONTENT_TYPE, "application/json")], buf).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "Query Channels' answer did not serialise");
                crate::error::ApiError::from(Error::internal()).into_response()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read state is written as the `Value` form the SDK suites passed against: the member's
    /// user (a placeholder for a reader who is not among the members), the timestamp in the
    /// dialect's form, and the last read message only when there is one.
    #[test]
    fn a_read_state_renders_with_its_member_or_a_placeholder_in_both_dialects() {
        let member = Member {
            cid: "agent:c".into(),
            user_id: "amy".into(),
            user: Some(User { id: "amy".into(), role: "user".into(), name: Some("Amy".into()), ..Default::default() }),
            channel_role: "channel_member".into(),
            custom: Map::new(),
            created_at: 1,
            updated_at: 1,
        };
        let reads = [
            ReadState {
                user_id: "amy".into(),
                last_read: 1_704_067_200_123_456_000,
                last_read_message_id: Some("m1".into()),
                unread_messages: 2,
            },
            ReadState { user_id: "ben".into(), last_read: 5_000, last_read_message_id: None, unread_messages: 0 },
        ];
        for d in [render::Dialect::Legacy, render::Dialect::V2] {
            let written = serde_json::to_value(ReadsOut(d, &reads, std::slice::from_ref(&member))).expect("serialise");
            let amy = member.user.as_ref().expect("user");
            let expected = json!([
                {"user": render::user(d, amy), "last_read": d.ts(reads[0].last_read), "unread_messages": 2, "last_read_message_id": "m1"},
                {"user": render::user(d, &User::placeholder("ben", "user")), "last_read": d.ts(5_000), "unread_messages": 0},
            ]);
            assert_eq!(written, expected, "{d:?}");
        }
    }
}
