//! Messages, replies, reactions and threads.

use crate::channels::{load_bare, require_read, DEFAULT_REPLY_LIMIT};
use crate::ctx::{Answer, ApiPath, ApiQuery, Body, ChannelPath, Ctx};
use crate::error::ApiResult;
use crate::input::{self, de, present, required, Actor, MessageInput, Obj, PageInput, Patch, UserRef};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::{Audience, Channel, Message, NewMessage, Reaction, User, Viewer};
use offshoot_core::render::{self, Dialect};
use offshoot_core::{ids, perm, time, Error};
use offshoot_store::{Editor, Page, PageDir};
use serde::Deserialize;
use serde_json::{json, Value};

/// A body that carries a message and may name the acting user beside it.
#[derive(Deserialize)]
pub struct MessageRequest {
    message: Option<MessageInput>,
    #[serde(flatten)]
    actor: Actor,
}

/// `POST /channels/{type}/{id}/message`.
pub async fn send_message(State(st): State<ApiState>, ctx: Ctx, path: ChannelPath, Body(body): Body<MessageRequest>) -> ApiResult<Answer> {
    let cid = path.cid;
    // A server-side send reads nothing first: the store checks the channel (exists, not
    // deleted, the text's length for its type) under its lock. A user's is checked here first.
    let ch = match ctx.viewer {
        Viewer::Server => None,
        _ => Some(load_bare(&st, &cid).await?),
    };
    let msg = present(body.message, "message")?;
    // The author as named; the send reads (or creates) the stored user in its transaction.
    let author = match &ctx.viewer {
        Viewer::Server => {
            let id = msg
                .actor
                .id()?
                .or(body.actor.id()?)
                .ok_or_else(|| Error::input("a server-side message needs message.user_id (or message.user.id)"))?;
            User::placeholder(&id, "user")
        }
        Viewer::User { id, role } => {
            let on_behalf = msg.actor.id()?.filter(|other| other != id);
            if on_behalf.is_some() && role != "admin" {
                return Err(Error::not_allowed("a user can only send messages as itself").into());
            }
            let member = st.store.is_member(&cid, id).await?;
            if !perm::may_write(&ctx.viewer, member) {
                return Err(
                    Error::not_allowed(format!("you are not allowed to send messages to channel {cid:?}: only its members can")).into()
                );
            }
            match on_behalf {
                // An admin may write as another user, as a server-side request may.
                Some(other) => User::placeholder(&other, "user"),
                None => ctx.user.clone().unwrap_or_else(|| User::placeholder(id, role)),
            }
        }
        Viewer::Anonymous { .. } => return Err(Error::not_allowed("anonymous users cannot send messages").into()),
    };
    let mut new = msg.into_new(ctx.viewer.is_admin(), ch.as_ref().map_or(i64::MAX, Channel::max_message_length))?;
    new.user_id = author.id.clone();
    if matches!(new.kind.as_str(), "ephemeral" | "error") {
        let ch = match ch {
            Some(ch) => ch,
            None => load_bare(&st, &cid).await?,
        };
        ch.check_text(&new.text)?;
        // Never stored: the author as stored, read here.
        let author = match st.store.get_user(&author.id).await? {
            Some(stored) => stored,
            None => author,
        };
        return send_ephemeral(&st, &ctx, &ch, new, author).await;
    }
    let m = st.store.send_message(&cid, &new, &author).await?;
    Ok(ctx.message_answer(&m))
}

/// `ephemeral` and `error` messages, as Stream has them: pushed to their author's connections
/// only (`message.new`), never stored, so no read, query or fork ever returns them.
async fn send_ephemeral(st: &ApiState, ctx: &Ctx, ch: &Channel, new: NewMessage, author: User) -> ApiResult<Answer> {
    let now = time::now();
    let m = Message {
        id: if new.id.is_empty() { ids::new_id() } else { new.id },
        cid: ch.cid.clone(),
        user_id: author.id.clone(),
        user: Some(author.clone()),
        kind: new.kind,
        text: new.text,
        html: new.html,
        mml: new.mml,
        command: new.command,
        parent_id: new.parent_id,
        show_in_channel: new.show_in_channel,
        attachments: new.attachments,
        mentioned_users: new.mentioned_users,
        silent: new.silent,
        i18n: new.i18n,
        custom: new.custom,
        created_at: now,
        updated_at: now,
        ..Default::default()
    };
    let ev = offshoot_core::model::Event {
        kind: "message.new".into(),
        cid: Some(ch.cid.clone()),
        channel_type: Some(ch.kind.clone()),
        channel_id: Some(ch.id.clone()),
        user: Some(author.clone()),
        message: Some(m.clone()),
        created_at: now,
        ..Default::default()
    };
    st.store.publish(ev, Audience { watchers_of: None, users: vec![author.id.clone()], webhooks: false, ..Default::default() }).await?;
    Ok(ctx.message_answer(&m))
}

/// A message the caller may see, with its channel.
async fn visible_message(st: &ApiState, ctx: &Ctx, id: &str) -> Result<(Message, Channel), Error> {
    let found = st.store.get_message_in_channel(id, &ctx.viewer).await?;
    checked(st, ctx, id, found).await
}

/// The message and its channel when the viewer may see it and read the channel; not found
/// otherwise (also when the channel is deleted).
async fn checked(st: &ApiState, ctx: &Ctx, id: &str, found: Option<(Message, bool, Channel)>) -> Result<(Message, Channel), Error> {
    let missing = || Error::not_found(format!("message with id {id:?} does not exist"));
    let (m, hidden, ch) = found.ok_or_else(missing)?;
    if !offshoot_store::is_visible(&m, hidden, ch.truncated_at, &ctx.viewer) || ch.deleted_at.is_some() {
        return Err(missing());
    }
    require_read(st, &ctx.viewer, &ch.cid).await?;
    Ok((m, ch))
}

/// [`visible_message`] for a write: the same checks, on the message as stored and its channel's
/// row (`Store::message_for_write`, two statements instead of six); the write's transaction
/// hydrates what it announces and answers.
async fn writable_message(st: &ApiState, ctx: &Ctx, id: &str) -> Result<(Message, Channel), Error> {
    let found = st.store.message_for_write(id).await?;
    checked(st, ctx, id, found).await
}

pub async fn get_message(State(st): State<ApiState>, ctx: Ctx, ApiPath(id): ApiPath<String>) -> ApiResult<Json<Value>> {
    let (m, ch) = visible_message(&st, &ctx, &id).await?;
    let mut v = render::message(ctx.dialect, &m);
    v["channel"] = render::channel(ctx.dialect, &ch, &[]);
    Ok(ctx.ok(json!({"message": v})))
}

fn may_edit(ctx: &Ctx, m: &Message) -> Result<(), Error> {
    if ctx.viewer.is_admin() || ctx.viewer.user_id() == Some(m.user_id.as_str()) {
        Ok(())
    } else {
        Err(Error::not_allowed("you can only change your own messages"))
    }
}

/// Who changes `m`: the acting user, else (a server-side request naming nobody) its author,
/// as hydrated or else as stored.
async fn editor(st: &ApiState, ctx: &Ctx, actor: &Actor, m: &Message) -> Result<User, Error> {
    if let Some(user) = actor.acting(&ctx.viewer, ctx.user.as_ref(), false)? {
        return Ok(user);
    }
    if let Some(user) = &m.user {
        return Ok(user.clone());
    }
    Ok(st.store.get_user(&m.user_id).await?.unwrap_or_else(|| User::placeholder(&m.user_id, "user")))
}

/// Who changes message `id`. A server-side request names a user or nobody (the author) and reads
/// nothing first: the store checks the message under its channel's lock (an agent streams its
/// answer as updates: docs/performance.md, "Agent streaming"). A user's request is checked here
/// first: the user must see the message, read its channel and own it (or be an admin).
async fn editor_of(st: &ApiState, ctx: &Ctx, actor: &Actor, id: &str) -> Result<Editor, Error> {
    if ctx.viewer.is_server() {
        return Ok(actor.id()?.map_or(Editor::Author, Editor::Named));
    }
    let (m, _) = writable_message(st, ctx, id).await?;
    may_edit(ctx, &m)?;
    Ok(Editor::User(editor(st, ctx, actor, &m).await?))
}

/// `POST /messages/{id}`: full update.
pub async fn update_message(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    Body(body): Body<MessageRequest>,
) -> ApiResult<Answer> {
    let msg = present(body.message, "message")?;
    let editor = editor_of(&st, &ctx, &msg.actor, &id).await?;
    // The length is checked against the channel's type, as locked, in the change.
    let new = msg.into_new(ctx.viewer.is_admin(), i64::MAX)?;
    let who = editor.clone();
    let updated = st
        .store
        .edit_message(&id, editor, move |m, ch| {
            if m.deleted_at.is_some() {
                return Err(Error::input("a deleted message cannot be updated"));
            }
            input::check_length(&new.text, ch.max_message_length())?;
            let by = who.id_for(m).to_string();
            replace(m, &new, &by);
            Ok(())
        })
        .await?;
    Ok(ctx.message_answer(&updated))
}

/// A full update: what a message sent as `new` sets replaces `m`'s; `by` pins it.
fn replace(m: &mut Message, new: &NewMessage, by: &str) {
    m.text = new.text.clone();
    m.html = new.html.clone();
    m.mml = new.mml.clone();
    m.attachments = new.attachments.clone();
    m.mentioned_users = new.mentioned_users.clone();
    m.custom = new.custom.clone();
    m.silent = new.silent;
    if new.i18n.is_some() {
        m.i18n = new.i18n.clone();
    }
    set_pinned(m, new.pinned, by);
}

fn set_pinned(m: &mut Message, pinned: bool, by: &str) {
    if pinned && !m.pinned {
        m.pinned_at = Some(time::now());
        if !by.is_empty() {
            m.pinned_by_id = Some(by.to_string());
        }
    }
    if !pinned {
        m.pinned_at = None;
        m.pinned_by_id = None;
        m.pin_expires = None;
    }
    m.pinned = pinned;
}

/// Applies `set` / `unset` to a message (known fields to their place, others to custom data).
/// `html` is server-side only, as in a full update (`server` says who is asking).
fn apply_partial(m: &mut Message, set: &Obj, unset: &[String], max_text: i64, by: &str, server: bool) -> Result<(), Error> {
    for (k, v) in set {
        match k.as_str() {
            "text" => {
                let t = v.as_str().ok_or_else(|| Error::input("set.text must be a string"))?;
                input::check_length(t, max_text)?;
                m.text = t.to_string();
                m.html = input::html_of(t);
            }
            "html" if !server => return Err(Error::not_allowed("set.html can only be changed by server-side requests")),
            "html" => m.html = v.as_str().unwrap_or_default().to_string(),
            "mml" => m.mml = v.as_str().map(str::to_string),
            "attachments" => {
                let a = v.as_array().ok_or_else(|| Error::input("set.attachments must be an array"))?;
                input::check_attachments(a.len())?;
                m.attachments = a.clone();
            }
            "pinned" => set_pinned(m, v.as_bool().ok_or_else(|| Error::input("set.pinned must be a boolean"))?, by),
            "pin_expires" => m.pin_expires = time::parse(v),
            "silent" => m.silent = v.as_bool().unwrap_or(false),
            "mentioned_users" => {
                let list = Vec::<UserRef>::deserialize(v).map_err(|e| Error::input(format!("set.mentioned_users is not valid: {e}")))?;
                m.mentioned_users = input::mentioned(Some(list))?;
            }
            "i18n" => m.i18n = v.as_object().cloned(),
            "show_in_channel" => m.show_in_channel = m.parent_id.is_some() && v.as_bool().unwrap_or(false),
            "id"
            | "cid"
            | "type"
            | "user"
            | "user_id"
            | "parent_id"
            | "created_at"
            | "updated_at"
            | "deleted_at"
            | "reply_count"
            | "shadowed"
            | "restricted_visibility"
            | "quoted_message_id" => {
                return Err(Error::input(format!("field {k:?} cannot be changed by a partial update")));
            }
            "custom" => {
                if let Some(c) = v.as_object() {
                    for (ck, cv) in c {
                        m.custom.insert(ck.clone(), cv.clone());
                    }
                }
            }
            _ => {
                m.custom.insert(k.clone(), v.clone());
            }
        }
    }
    for k in unset {
        match k.as_str() {
            "pinned" => set_pinned(m, false, by),
            "attachments" => m.attachments.clear(),
            "mml" => m.mml = None,
            "i18n" => m.i18n = None,
            "mentioned_users" => m.mentioned_users.clear(),
            "text" => {
                m.text.clear();
                m.html.clear();
            }
            _ => {
                m.custom.remove(k);
            }
        }
    }
    input::check_custom(&m.custom)
}

/// `set` / `unset` of a message, and who makes the change.
#[derive(Deserialize)]
pub struct PatchMessageRequest {
    #[serde(flatten)]
    patch: Patch,
    #[serde(flatten)]
    actor: Actor,
}

/// `PUT /messages/{id}`: partial update.
pub async fn partial_update_message(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    Body(body): Body<PatchMessageRequest>,
) -> ApiResult<Answer> {
    let editor = editor_of(&st, &ctx, &body.actor, &id).await?;
    let (set, unset) = body.patch.into_parts();
    let server = ctx.viewer.is_server();
    let who = editor.clone();
    let updated = st
        .store
        .edit_message(&id, editor, move |m, ch| {
            let by = who.id_for(m).to_string();
            apply_partial(m, &set, &unset, ch.max_message_length(), &by, server)
        })
        .await?;
    Ok(ctx.message_answer(&updated))
}

/// `PATCH /messages/{id}/ephemeral`: broadcasts `message.updated` with the change, stores nothing.
pub async fn ephemeral_update(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    Body(body): Body<PatchMessageRequest>,
) -> ApiResult<Json<Value>> {
    let (mut m, ch) = visible_message(&st, &ctx, &id).await?;
    may_edit(&ctx, &m)?;
    let actor = editor(&st, &ctx, &body.actor, &m).await?;
    let (set, unset) = body.patch.into_parts();
    apply_partial(&mut m, &set, &unset, ch.max_message_length(), &actor.id, ctx.viewer.is_server())?;
    m.updated_at = time::now();
    let ev = offshoot_core::model::Event {
        kind: "message.updated".into(),
        cid: Some(ch.cid.clone()),
        channel_type: Some(ch.kind.clone()),
        channel_id: Some(ch.id.clone()),
        user: Some(actor),
        message: Some(m.clone()),
        created_at: time::now(),
        ..Default::default()
    };
    st.store.publish(ev, Audience { watchers_of: Some(ch.cid.clone()), users: Vec::new(), webhooks: false, ..Default::default() }).await?;
    Ok(ctx.ok(json!({"message": render::message(ctx.dialect, &m)})))
}

#[derive(Deserialize)]
pub struct DeleteMessageQuery {
    #[serde(default, deserialize_with = "de::opt_bool")]
    hard: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    delete_for_me: Option<bool>,
    deleted_by: Option<String>,
}

/// `DELETE /messages/{id}[?hard=true]`.
pub async fn delete_message(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteMessageQuery>,
) -> ApiResult<Json<Value>> {
    let (m, _) = writable_message(&st, &ctx, &id).await?;
    may_edit(&ctx, &m)?;
    if q.delete_for_me.unwrap_or(false) {
        return Err(Error::input("delete_for_me is not supported by this server").into());
    }
    let hard = q.hard.unwrap_or(false);
    let actor = match q.deleted_by.as_deref() {
        Some(by) if ctx.viewer.is_server() => Some(st.store.get_user(by).await?.unwrap_or_else(|| User::placeholder(by, "user"))),
        _ => ctx.user.clone(),
    };
    let deleted = st.store.delete_message(&id, hard, actor.as_ref()).await?;
    crate::files::after_hard_delete(&st, hard && !deleted.attachments.is_empty()).await;
    Ok(ctx.ok(json!({"message": render::message(ctx.dialect, &deleted)})))
}

#[derive(Deserialize)]
pub struct RepliesQuery {
    #[serde(flatten)]
    page: PageInput,
    sort: Option<String>,
}

/// `GET /messages/{id}/replies`.
pub async fn get_replies(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<RepliesQuery>,
) -> ApiResult<Json<Value>> {
    let (parent, ch) = visible_message(&st, &ctx, &id).await?;
    let page = q.page.page(DEFAULT_REPLY_LIMIT)?;
    let mut replies = st.store.replies(&parent, ch.truncated_at, &ctx.viewer, &page).await?;
    if q.sort.as_deref().map(sort_is_descending).transpose()?.unwrap_or(false) {
        replies.reverse();
    }
    Ok(ctx.ok(json!({"messages": replies.iter().map(|m| render::message(ctx.dialect, m)).collect::<Vec<_>>()})))
}

/// `sort` of replies as the SDKs send it: a JSON array (JS) or comma-separated,
/// individually percent-encoded JSON objects (getstream); true when it is descending.
///
/// Stream sorts replies on `created_at` only: its OpenAPI takes one sort item, and the JS SDK
/// types it `{created_at: 1 | -1}` (docs/compatibility.md). Any other field is a 400 whose
/// `exception_fields.field` names it.
fn sort_is_descending(raw: &str) -> Result<bool, Error> {
    let bad = || Error::input("sort must be a list of {field, direction} on created_at").field("field", "sort");
    let items: Vec<Value> = match serde_json::from_str::<Value>(raw) {
        Ok(Value::Array(a)) => a,
        Ok(v @ Value::Object(_)) => vec![v],
        _ => raw
            .split(',')
            .map(|part| serde_json::from_str(&percent_encoding::percent_decode_str(part).decode_utf8_lossy()).map_err(|_| bad()))
            .collect::<Result<_, _>>()?,
    };
    let mut desc = false;
    for item in &items {
        let Value::Object(o) = item else { return Err(bad()) };
        // JS's object form `{created_at: -1}` arrives as a list of one such object.
        let (field, direction) = match o.get("field") {
            Some(f) => (f.as_str().ok_or_else(bad)?, o.get("direction")),
            None if o.len() == 1 => o.iter().next().map(|(k, v)| (k.as_str(), Some(v))).ok_or_else(bad)?,
            None => return Err(bad()),
        };
        if field != "created_at" {
            return Err(Error::input(format!("replies cannot be sorted on {field:?}: only created_at")).field("field", field));
        }
        desc = match direction {
            None => false,
            Some(d) => match d.as_i64() {
                Some(1) => false,
                Some(-1) => true,
                _ => return Err(Error::input("sort direction must be 1 or -1").field("field", "sort")),
            },
        };
    }
    Ok(desc)
}

#[derive(Deserialize)]
pub struct SendReactionRequest {
    reaction: Option<ReactionInput>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    enforce_unique: Option<bool>,
    #[serde(flatten)]
    actor: Actor,
}

/// A reaction as sent: its type and score, who reacts, and custom data.
#[derive(Deserialize)]
struct ReactionInput {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    score: Option<i64>,
    #[serde(flatten)]
    actor: Actor,
    #[serde(flatten)]
    _read_only: ReactionReadOnly,
    #[serde(flatten)]
    custom: input::Extra,
}

/// Reaction fields the server sets; a client's copy is dropped.
#[derive(Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
struct ReactionReadOnly {
    #[serde(default)]
    message_id: serde::de::IgnoredAny,
    #[serde(default)]
    created_at: serde::de::IgnoredAny,
    #[serde(default)]
    updated_at: serde::de::IgnoredAny,
}

/// `POST /messages/{id}/reaction`.
pub async fn send_reaction(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    Body(body): Body<SendReactionRequest>,
) -> ApiResult<Json<Value>> {
    let (m, ch) = writable_message(&st, &ctx, &id).await?;
    let r = present(body.reaction, "reaction")?;
    let kind = required(r.kind, "reaction.type")?;
    if kind.len() > 64 {
        return Err(Error::input("reaction type is longer than 64 characters").into());
    }
    let user = r
        .actor
        .acting(&ctx.viewer, ctx.user.as_ref(), false)?
        .or(body.actor.acting(&ctx.viewer, ctx.user.as_ref(), false)?)
        .ok_or_else(|| Error::input("a server-side reaction needs reaction.user_id"))?;
    if !ctx.viewer.is_admin() && !st.store.is_member(&ch.cid, &user.id).await? {
        return Err(Error::not_allowed("only members can react").into());
    }
    let reaction = Reaction {
        message_id: m.id.clone(),
        user_id: user.id.clone(),
        kind,
        score: r.score.unwrap_or(1),
        custom: r.custom.into_custom(),
        ..Default::default()
    };
    let (m, r) = st.store.add_reaction(&id, &reaction, body.enforce_unique.unwrap_or(false), &user).await?;
    Ok(ctx.ok(json!({"message": render::message(ctx.dialect, &m), "reaction": render::reaction(ctx.dialect, &r)})))
}

#[derive(Deserialize)]
pub struct DeleteReactionQuery {
    user_id: Option<String>,
}

/// `DELETE /messages/{id}/reaction/{type}[?user_id=…]`.
pub async fn delete_reaction(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath((id, kind)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<DeleteReactionQuery>,
) -> ApiResult<Json<Value>> {
    writable_message(&st, &ctx, &id).await?;
    let user = match &ctx.viewer {
        Viewer::Server => {
            let uid = q.user_id.ok_or_else(|| Error::input("a server-side request must pass user_id"))?;
            User::placeholder(&ids::parse_user_id(&uid)?, "user")
        }
        _ => Actor::default().acting(&ctx.viewer, ctx.user.as_ref(), true)?.expect("client-side users act as themselves"),
    };
    let (m, r) = st.store.remove_reaction(&id, &kind, &user).await?;
    Ok(ctx.ok(json!({"message": render::message(ctx.dialect, &m), "reaction": render::reaction(ctx.dialect, &r)})))
}

/// `GET /messages/{id}/reactions`.
pub async fn get_reactions(State(st): State<ApiState>, ctx: Ctx, ApiPath(id): ApiPath<String>) -> ApiResult<Json<Value>> {
    let (m, _) = visible_message(&st, &ctx, &id).await?;
    Ok(ctx.ok(json!({"reactions": m.latest_reactions.iter().map(|r| render::reaction(ctx.dialect, r)).collect::<Vec<_>>()})))
}

fn thread_state(d: Dialect, parent: &Message, replies: &[Message], ch: &Channel) -> Value {
    let participants: Vec<Value> = parent
        .thread_participants
        .iter()
        .map(|u| json!({"user_id": u.id, "user": render::user(d, u), "channel_cid": ch.cid, "created_at": d.ts(parent.created_at)}))
        .collect();
    json!({
        "parent_message_id": parent.id,
        "parent_message": render::message(d, parent),
        "channel_cid": ch.cid,
        "channel": render::channel(d, ch, &[]),
        "created_by_user_id": parent.user_id,
        "created_by": parent.user.as_ref().map(|u| render::user(d, u)),
        "reply_count": parent.reply_count,
        "participant_count": parent.thread_participants.len(),
        "active_participant_count": parent.thread_participants.len(),
        "thread_participants": participants,
        "latest_replies": replies.iter().map(|m| render::message(d, m)).collect::<Vec<_>>(),
        "read": [],
        "title": parent.text.chars().take(60).collect::<String>(),
        "custom": {},
        "created_at": d.ts(parent.created_at),
        "updated_at": d.ts(parent.updated_at),
        "last_message_at": d.ts(replies.last().map(|r| r.created_at).unwrap_or(parent.created_at)),
    })
}

#[derive(Deserialize)]
pub struct QueryThreadsRequest {
    filter: Option<ThreadFilter>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    reply_limit: Option<i64>,
    #[serde(flatten)]
    actor: Actor,
}

#[derive(Deserialize)]
struct ThreadFilter {
    channel_cid: Option<CidCondition>,
}

/// `channel_cid` as a cid, `{"$eq": cid}` or `{"$in": [cids]}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum CidCondition {
    Cid(String),
    Operator(Obj),
}

/// `POST /threads`: `{filter: {channel_cid}, limit, reply_limit, user_id}`.
pub async fn query_threads(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<QueryThreadsRequest>) -> ApiResult<Json<Value>> {
    let viewer = match (&ctx.viewer, body.actor.id()?) {
        (Viewer::Server, Some(uid)) => Viewer::User { id: uid, role: "user".into() },
        (v, _) => v.clone(),
    };
    let cids: Option<Vec<String>> = match body.filter.and_then(|f| f.channel_cid) {
        None => None,
        Some(CidCondition::Cid(s)) => Some(vec![s]),
        Some(CidCondition::Operator(op)) => match op.get("$eq").or(op.get("$in")) {
            Some(Value::String(s)) => Some(vec![s.clone()]),
            Some(Value::Array(a)) => Some(a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()),
            _ => return Err(Error::input("filter.channel_cid supports $eq and $in").into()),
        },
    };
    let threads = st.store.query_threads(&viewer, cids.as_deref(), body.limit.unwrap_or(10), body.reply_limit.unwrap_or(3)).await?;
    let out: Vec<Value> = threads.iter().map(|(p, r, ch)| thread_state(ctx.dialect, p, r, ch)).collect();
    Ok(ctx.ok(json!({"threads": out})))
}

#[derive(Deserialize)]
pub struct GetThreadQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    reply_limit: Option<i64>,
}

/// `GET /threads/{message_id}`.
pub async fn get_thread(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<GetThreadQuery>,
) -> ApiResult<Json<Value>> {
    let (parent, ch) = visible_message(&st, &ctx, &id).await?;
    if parent.parent_id.is_some() {
        return Err(Error::input(format!("message {id:?} is a reply, not a thread's parent")).into());
    }
    let page = Page { limit: q.reply_limit.unwrap_or(10), dir: PageDir::Latest };
    let replies = st.store.replies(&parent, ch.truncated_at, &ctx.viewer, &page).await?;
    Ok(ctx.ok(json!({"thread": thread_state(ctx.dialect, &parent, &replies, &ch)})))
}
