//! Users, app settings, channel types, guests and bans.

use crate::ctx::{ApiPath, ApiQuery, Body, Ctx};
use crate::error::ApiResult;
use crate::input::{de, present, required, Obj, Patch, UserBody, Users};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::AppSettings;
use offshoot_core::query::{self, UserField};
use offshoot_core::render::{self, Dialect};
use offshoot_core::{ids, token, Error};
use offshoot_store::UserPatch;
use secrecy::ExposeSecret;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

fn server_only(ctx: &Ctx, what: &str) -> Result<(), Error> {
    if ctx.viewer.is_server() {
        Ok(())
    } else {
        Err(Error::not_allowed(format!("{what} is a server-side operation")))
    }
}

async fn users_map(st: &ApiState, d: Dialect, users: &[offshoot_core::model::User]) -> Result<Value, Error> {
    Ok(Value::Object(full_users(st, d, users).await?.into_iter().collect()))
}

/// Users as the users endpoints answer them, each with their unread counters.
async fn full_users(st: &ApiState, d: Dialect, users: &[offshoot_core::model::User]) -> Result<Vec<(String, Value)>, Error> {
    let ids: Vec<String> = users.iter().map(|u| u.id.clone()).collect();
    let counts = st.store.unread_counts_of(&ids).await?;
    Ok(users.iter().map(|u| (u.id.clone(), render::full_user(d, u, counts.get(&u.id).copied().unwrap_or_default()))).collect())
}

#[derive(Deserialize)]
pub struct UpsertUsersRequest {
    users: Option<Users>,
}

/// `POST /users`: `{"users": {"id": {...}}}` (or a list).
pub async fn upsert_users(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<UpsertUsersRequest>) -> ApiResult<Json<Value>> {
    server_only(&ctx, "upserting users")?;
    let bodies: Vec<UserBody> = match present(body.users, "users")? {
        Users::Map(m) => m.into_values().collect(),
        Users::List(l) => l,
    };
    if bodies.len() > 100 {
        return Err(Error::input("at most 100 users per request").into());
    }
    let inputs = bodies.into_iter().map(UserBody::into_input).collect::<Result<Vec<_>, _>>()?;
    let users = st.store.upsert_users(&inputs).await?;
    Ok(ctx.ok(json!({"users": users_map(&st, ctx.dialect, &users).await?, "membership_deletion_task_id": ""})))
}

#[derive(Deserialize)]
pub struct PartialUpdateUsersRequest {
    users: Option<Vec<UserPatchInput>>,
}

#[derive(Deserialize)]
struct UserPatchInput {
    id: Option<String>,
    #[serde(flatten)]
    patch: Patch,
}

/// `PATCH /users`: `{"users": [{"id", "set", "unset"}]}`.
pub async fn partial_update_users(
    State(st): State<ApiState>,
    ctx: Ctx,
    Body(body): Body<PartialUpdateUsersRequest>,
) -> ApiResult<Json<Value>> {
    let list = present(body.users, "users")?;
    if list.len() > 100 {
        return Err(Error::input("at most 100 users per request").into());
    }
    let mut patches = Vec::new();
    for item in list {
        let id = ids::parse_user_id(&required(item.id, "users.id")?)?;
        if !ctx.viewer.is_server() && ctx.viewer.user_id() != Some(id.as_str()) {
            return Err(Error::not_allowed("users can only update themselves").into());
        }
        let (set, unset) = item.patch.into_parts();
        if !ctx.viewer.is_server() && set.contains_key("role") {
            return Err(Error::not_allowed("users cannot change their role").into());
        }
        patches.push(UserPatch { id, set, unset });
    }
    let out = st.store.partial_update_users(&patches).await?;
    Ok(ctx.ok(json!({"users": users_map(&st, ctx.dialect, &out).await?, "membership_deletion_task_id": ""})))
}

#[derive(Deserialize)]
pub struct QueryUsersQuery {
    payload: Option<String>,
}

/// The JSON in `GET /users?payload=`.
#[derive(Default, Deserialize)]
struct QueryUsersPayload {
    filter_conditions: Option<Obj>,
    sort: Option<Value>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    offset: Option<i64>,
}

/// `GET /users?payload={"filter_conditions": {…}, "sort": […], "limit", "offset"}`: Query
/// Users with Stream's filter operators on id, role, name, banned, times and custom fields.
pub async fn query_users(State(st): State<ApiState>, ctx: Ctx, ApiQuery(q): ApiQuery<QueryUsersQuery>) -> ApiResult<Json<Value>> {
    let payload: QueryUsersPayload = match q.payload {
        Some(p) => {
            serde_json::from_str(&p).map_err(|e| Error::input(format!("payload is not valid JSON: {e}")).field("field", "payload"))?
        }
        None => QueryUsersPayload::default(),
    };
    let tree = query::parse_filter::<UserField>(&payload.filter_conditions.unwrap_or_default())?;
    let sort = query::parse_sort(payload.sort.as_ref(), query::user_sort_field)?;
    let limit = payload.limit.unwrap_or(30);
    if !(0..=100).contains(&limit) {
        return Err(Error::input("limit must be between 0 and 100").into());
    }
    let offset = payload.offset.unwrap_or(0);
    let users = st.store.query_users(&tree, &sort, limit, offset).await?;
    let users: Vec<Value> = full_users(&st, ctx.dialect, &users).await?.into_iter().map(|(_, u)| u).collect();
    Ok(ctx.ok(json!({"users": users})))
}

fn render_app(d: Dialect, s: &AppSettings, key: &str) -> Value {
    let mut o = Map::new();
    for (k, v) in &s.extra {
        o.insert(k.clone(), v.clone());
    }
    let base = json!({
        "name": "offshoot",
        "api_key": key,
        "fork_enabled": s.fork_enabled,
        "webhook_url": s.webhook_url.clone().unwrap_or_default(),
        "webhook_events": s.webhook_events,
        "event_hooks": s.event_hooks,
        "webhook_dialect": s.webhook_dialect,
        "disable_auth_checks": s.disable_auth_checks,
        "disable_permissions_checks": false,
        "multi_tenant_enabled": false,
        "enable_hook_payload_compression": false,
        "async_url_enrich_enabled": false,
        "auto_translation_enabled": false,
        "custom_action_handler_url": "",
        "before_message_send_hook_url": "",
        "sqs_url": "", "sqs_key": "", "sqs_secret": "", "sns_topic_arn": "", "sns_key": "", "sns_secret": "",
        "permission_version": "v2",
        "policies": {},
        "grants": {},
        "channel_configs": {},
        "call_types": {},
        "push_notifications": {"version": "v3", "offline_only": false, "providers": []},
        "video_provider": "", "suspended": false, "suspended_explanation": "", "organization": "offshoot",

    });
    // Fields getstream's AppResponseFields requires; Offshoot has no such features.
    let absent = json!({
        "id": 1, "allow_multi_user_devices": true, "campaign_enabled": false, "cdn_expiration_seconds": 0,
        "enforce_unique_usernames": "no", "feed_audit_logs_enabled": false, "guest_user_creation_disabled": false,
        "image_moderation_enabled": false, "max_aggregated_activities_length": 0,
        "member_custom_on_mentioned_users_enabled": false, "member_custom_on_messages_enabled": false,
        "member_custom_on_typing_events_enabled": false, "moderation_audio_call_moderation_enabled": false,
        "moderation_enabled": false, "moderation_keyframe_video_enabled": false, "moderation_llm_configurability_enabled": false,
        "moderation_multitenant_blocklist_enabled": false, "moderation_video_call_moderation_enabled": false,
        "moderation_webhook_url": "", "placement": "", "reminders_interval": 0, "use_hook_v2": false,
        "user_response_time_enabled": false, "user_search_disallowed_roles": [],
    });
    for part in [base, absent] {
        if let Value::Object(b) = part {
            o.extend(b);
        }
    }
    if let Some(t) = s.revoke_tokens_issued_before {
        o.insert("revoke_tokens_issued_before".into(), d.ts(t));
    }
    Value::Object(o)
}

/// `GET /app`: server-side gets every setting; a client (the JS SDK's `getAppSettings`, which
/// its attachment manager calls before each upload) gets only [`CLIENT_APP_FIELDS`].
pub async fn get_app(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    let s = st.store.app_settings().await?;
    let mut app = render_app(ctx.dialect, &s, &st.api_key);
    crate::files::render_upload_configs(&mut app, &s, st.uploads.as_deref());
    if !ctx.viewer.is_server() {
        if let Value::Object(o) = &mut app {
            o.retain(|k, _| CLIENT_APP_FIELDS.contains(&k.as_str()));
        }
    }
    Ok(ctx.ok(json!({"app": app})))
}

/// The app settings a client may read: what it needs to upload (the upload configs), the
/// feature flags that change what a client shows, and nothing that configures the server
/// (webhook URLs, hooks, queues, secrets, stored custom settings).
pub const CLIENT_APP_FIELDS: &[&str] = &[
    "name",
    "organization",
    "api_key",
    "fork_enabled",
    "file_upload_config",
    "image_upload_config",
    "auto_translation_enabled",
    "async_url_enrich_enabled",
    "multi_tenant_enabled",
    "permission_version",
    "suspended",
    "suspended_explanation",
    "video_provider",
    "cdn_expiration_seconds",
    "guest_user_creation_disabled",
    "user_search_disallowed_roles",
];

/// `PATCH /app`: flat keys; known ones are typed, others stored as they are.
#[derive(Deserialize)]
pub struct UpdateAppRequest {
    #[serde(default, deserialize_with = "de::some_bool")]
    fork_enabled: Option<Option<bool>>,
    #[serde(default, deserialize_with = "de::some")]
    webhook_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "de::some")]
    webhook_events: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "de::some")]
    event_hooks: Option<Option<Vec<Obj>>>,
    #[serde(default, deserialize_with = "de::some")]
    webhook_dialect: Option<Option<String>>,
    #[serde(default, deserialize_with = "de::some_bool")]
    disable_auth_checks: Option<Option<bool>>,
    #[serde(default, deserialize_with = "de::some_ts")]
    revoke_tokens_issued_before: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::some")]
    file_upload_config: Option<Option<crate::files::UploadConfig>>,
    #[serde(default, deserialize_with = "de::some")]
    image_upload_config: Option<Option<crate::files::UploadConfig>>,
    /// Every other setting, stored as it is.
    #[serde(flatten)]
    extra: Obj,
}

pub async fn update_app(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<UpdateAppRequest>) -> ApiResult<Json<Value>> {
    server_only(&ctx, "updating app settings")?;
    if let Some(Some(u)) = &body.webhook_url {
        if !(u.is_empty() || u.starts_with("http://") || u.starts_with("https://")) {
            return Err(Error::input("webhook_url must be an http:// or https:// URL").field("field", "webhook_url").into());
        }
    }
    if let Some(Some(d)) = &body.webhook_dialect {
        if d != "legacy" && d != "v2" {
            return Err(Error::input("webhook_dialect must be \"legacy\" or \"v2\"").field("field", "webhook_dialect").into());
        }
    }
    // Applied to the stored settings under the app row's lock (concurrent patches all survive).
    st.store.update_app_settings(|s| apply_app_patch(s, &body)).await?;
    Ok(ctx.ok(json!({})))
}

/// `PATCH /app`'s body applied to the settings: a key that is present (even `null`) is set.
fn apply_app_patch(s: &mut AppSettings, body: &UpdateAppRequest) -> Result<(), Error> {
    if let Some(enabled) = body.fork_enabled {
        s.fork_enabled = enabled.unwrap_or(true);
    }
    if let Some(url) = &body.webhook_url {
        s.webhook_url = url.clone().filter(|u| !u.is_empty());
    }
    if let Some(events) = &body.webhook_events {
        s.webhook_events = events.clone().unwrap_or_default();
    }
    if let Some(hooks) = &body.event_hooks {
        s.event_hooks = hooks
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|mut o| {
                o.entry("id").or_insert_with(|| ids::new_id().into());
                o.entry("enabled").or_insert(true.into());
                o.entry("event_types").or_insert(json!([]));
                Value::Object(o)
            })
            .collect();
    }
    if let Some(d) = &body.webhook_dialect {
        s.webhook_dialect = d.clone().unwrap_or_else(|| "legacy".into());
    }
    if let Some(disabled) = body.disable_auth_checks {
        s.disable_auth_checks = disabled.unwrap_or(false);
    }
    if let Some(before) = body.revoke_tokens_issued_before {
        s.revoke_tokens_issued_before = before;
    }
    for (k, v) in &body.extra {
        s.extra.insert(k.clone(), v.clone());
    }
    for (key, config) in [("file_upload_config", &body.file_upload_config), ("image_upload_config", &body.image_upload_config)] {
        match config {
            Some(Some(c)) => {
                s.extra.insert(key.into(), serde_json::to_value(c.normalized()).map_err(|_| Error::internal())?);
            }
            Some(None) => {
                s.extra.remove(key);
            }
            None => {}
        }
    }
    Ok(())
}

#[derive(Deserialize)]
pub struct CreateGuestRequest {
    user: Option<UserBody>,
}

/// `POST /guest`: a guest user and its token.
pub async fn create_guest(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<CreateGuestRequest>) -> ApiResult<Json<Value>> {
    let mut inp = present(body.user, "user")?.into_input()?;
    inp.role = Some("guest".into());
    inp.id = format!("guest-{}-{}", ids::new_id()[..8].to_owned(), inp.id);
    let users = st.store.upsert_users(&[inp]).await?;
    let user = &users[0];
    let tok = token::sign(&token::Claims { user_id: Some(user.id.clone()), ..Default::default() }, st.api_secret.expose_secret());
    Ok(ctx.ok(json!({"access_token": tok, "user": render::user(ctx.dialect, user)})))
}

#[derive(Deserialize)]
pub struct BanRequest {
    target_user_id: Option<String>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    shadow: Option<bool>,
}

/// `POST /moderation/ban` with `target_user_id` and `shadow`.
pub async fn ban_user(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<BanRequest>) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("banning users needs server-side or admin rights").into());
    }
    let target = ids::parse_user_id(&required(body.target_user_id, "target_user_id")?)?;
    st.store.set_ban(&target, body.shadow.unwrap_or(false), true).await?;
    Ok(ctx.ok(json!({})))
}

#[derive(Deserialize)]
pub struct UnbanQuery {
    target_user_id: Option<String>,
}

/// `DELETE /moderation/ban?target_user_id=…` (lifts both kinds of ban).
pub async fn unban_user(State(st): State<ApiState>, ctx: Ctx, ApiQuery(q): ApiQuery<UnbanQuery>) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("unbanning users needs server-side or admin rights").into());
    }
    let target = ids::parse_user_id(&required(q.target_user_id, "target_user_id")?)?;
    st.store.lift_bans(&target).await?;
    Ok(ctx.ok(json!({})))
}

fn render_type(d: Dialect, ct: &offshoot_core::model::ChannelType) -> Value {
    let ch = offshoot_core::model::Channel { config: Some(ct.clone()), ..Default::default() };
    let mut cfg = render::channel(d, &ch, &[]).get("config").cloned().unwrap_or(json!({}));
    if let Value::Object(o) = &mut cfg {
        o.insert("permissions".into(), json!([]));
        o.insert("grants".into(), json!({}));
    }
    cfg
}

pub async fn get_channel_type(State(st): State<ApiState>, ctx: Ctx, ApiPath(name): ApiPath<String>) -> ApiResult<Json<Value>> {
    let name = ids::parse_channel_type(&name)?;
    let Some(ct) = st.store.channel_type(&name).await? else {
        return Err(Error::not_found(format!("channel type {name:?} does not exist")).into());
    };
    Ok(ctx.ok(render_type(ctx.dialect, &ct)))
}

pub async fn list_channel_types(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    let types = st.store.channel_types().await?;
    let map: Map<String, Value> = types.iter().map(|t| (t.name.clone(), render_type(ctx.dialect, t))).collect();
    Ok(ctx.ok(json!({"channel_types": map})))
}

/// `PUT /channeltypes/{name}`: known fields typed, read-only ones dropped, every other
/// setting stored as it is.
#[derive(Deserialize)]
#[allow(dead_code)] // the read-only keys are named only to keep them out of `extra`
pub struct PutChannelTypeRequest {
    #[serde(default, deserialize_with = "de::opt_i64")]
    max_message_length: Option<i64>,
    #[serde(default)]
    name: IgnoredAny,
    #[serde(default)]
    created_at: IgnoredAny,
    #[serde(default)]
    updated_at: IgnoredAny,
    #[serde(default)]
    permissions: IgnoredAny,
    #[serde(default)]
    grants: IgnoredAny,
    #[serde(flatten)]
    extra: Obj,
}

/// `PUT /channeltypes/{name}`: creates or updates; `max_message_length` is enforced.
pub async fn put_channel_type(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(name): ApiPath<String>,
    Body(body): Body<PutChannelTypeRequest>,
) -> ApiResult<Json<Value>> {
    server_only(&ctx, "changing channel types")?;
    let name = ids::parse_channel_type(&name)?;
    if let Some(m) = body.max_message_length {
        if !(1..=20_000).contains(&m) {
            return Err(Error::input("max_message_length must be between 1 and 20000").field("field", "max_message_length").into());
        }
    }
    let ct = st.store.put_channel_type(&name, body.max_message_length, &body.extra).await?;
    Ok(ctx.ok(render_type(ctx.dialect, &ct)))
}
