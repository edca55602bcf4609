//! Users, app settings, channel types, guests and bans.

use crate::ctx::{ApiPath, Body, Ctx};
use crate::error::ApiResult;
use crate::input::{self, bool_opt, get, i64_opt, obj_opt, str_list, str_opt, Obj};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::AppSettings;
use offshoot_core::query::{self, UserField};
use offshoot_core::render::{self, Dialect};
use offshoot_core::{ids, token, Error};
use offshoot_store::{UserInput, UserPatch};
use serde_json::{json, Map, Value};

fn server_only(ctx: &Ctx, what: &str) -> Result<(), Error> {
    if ctx.viewer.is_server() {
        Ok(())
    } else {
        Err(Error::not_allowed(format!("{what} is a server-side operation")))
    }
}

const USER_KNOWN: &[&str] = &[
    "id",
    "role",
    "name",
    "image",
    "language",
    "teams",
    "invisible",
    "created_at",
    "updated_at",
    "last_active",
    "online",
    "banned",
    "shadow_banned",
    "deleted_at",
    "privacy_settings",
    "teams_role",
    "blocked_user_ids",
    "revoke_tokens_issued_before",
];

fn user_input(v: &Value) -> Result<UserInput, Error> {
    let Value::Object(o) = v else { return Err(Error::input("every user must be an object")) };
    let id = ids::parse_user_id(&input::str_req(o, "id")?)?;
    let name = str_opt(o, "name")?;
    if name.as_ref().is_some_and(|n| n.chars().count() > 1000) {
        return Err(Error::input("user name is longer than 1000 characters"));
    }
    Ok(UserInput {
        id,
        role: str_opt(o, "role")?,
        name,
        image: str_opt(o, "image")?,
        language: str_opt(o, "language")?,
        teams: str_list(o, "teams")?,
        invisible: bool_opt(o, "invisible")?,
        custom: input::limited(input::custom(o, USER_KNOWN)?, "user")?,
    })
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

/// `POST /users`: `{"users": {"id": {...}}}` (or a list).
pub async fn upsert_users(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    server_only(&ctx, "upserting users")?;
    let inputs: Vec<UserInput> = match get(&body, "users") {
        Some(Value::Object(m)) => m.values().map(user_input).collect::<Result<_, _>>()?,
        Some(Value::Array(a)) => a.iter().map(user_input).collect::<Result<_, _>>()?,
        _ => return Err(Error::input("field \"users\" is required: an object keyed by user id").into()),
    };
    if inputs.len() > 100 {
        return Err(Error::input("at most 100 users per request").into());
    }
    let users = st.store.upsert_users(&inputs).await?;
    Ok(ctx.ok(json!({"users": users_map(&st, ctx.dialect, &users).await?, "membership_deletion_task_id": ""})))
}

/// `PATCH /users`: `{"users": [{"id", "set", "unset"}]}`.
pub async fn partial_update_users(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    let Some(list) = input::arr_opt(&body, "users")? else { return Err(Error::input("field \"users\" is required").into()) };
    if list.len() > 100 {
        return Err(Error::input("at most 100 users per request").into());
    }
    let mut patches = Vec::new();
    for item in list {
        let Value::Object(o) = item else { return Err(Error::input("every entry of \"users\" must be an object").into()) };
        let id = ids::parse_user_id(&input::str_req(o, "id")?)?;
        if !ctx.viewer.is_server() && ctx.viewer.user_id() != Some(id.as_str()) {
            return Err(Error::not_allowed("users can only update themselves").into());
        }
        let set = obj_opt(o, "set")?.cloned().unwrap_or_default();
        if !ctx.viewer.is_server() && set.contains_key("role") {
            return Err(Error::not_allowed("users cannot change their role").into());
        }
        let unset = str_list(o, "unset")?.unwrap_or_default();
        patches.push(UserPatch { id, set, unset });
    }
    let out = st.store.partial_update_users(&patches).await?;
    Ok(ctx.ok(json!({"users": users_map(&st, ctx.dialect, &out).await?, "membership_deletion_task_id": ""})))
}

/// `GET /users?payload={"filter_conditions": {…}, "sort": […], "limit", "offset"}`: Query
/// Users with Stream's filter operators on id, role, name, banned, times and custom fields.
pub async fn query_users(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    let payload: Map<String, Value> = match ctx.q("payload") {
        Some(p) => serde_json::from_str(p).map_err(|e| Error::input(format!("payload is not valid JSON: {e}")))?,
        None => Map::new(),
    };
    let filter = obj_opt(&payload, "filter_conditions")?.cloned().unwrap_or_default();
    let tree = query::parse_filter::<UserField>(&filter)?;
    let sort = query::parse_sort(get(&payload, "sort"), query::user_sort_field)?;
    let limit = i64_opt(&payload, "limit")?.unwrap_or(30);
    if !(0..=100).contains(&limit) {
        return Err(Error::input("limit must be between 0 and 100").into());
    }
    let offset = i64_opt(&payload, "offset")?.unwrap_or(0);
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
        "file_upload_config": {"allowed_file_extensions": [], "blocked_file_extensions": [], "allowed_mime_types": [], "blocked_mime_types": []},
        "image_upload_config": {"allowed_file_extensions": [], "blocked_file_extensions": [], "allowed_mime_types": [], "blocked_mime_types": []},
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

pub async fn get_app(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    server_only(&ctx, "reading app settings")?;
    let s = st.store.app_settings().await?;
    Ok(ctx.ok(json!({"app": render_app(ctx.dialect, &s, &st.api_key)})))
}

/// `PATCH /app`: flat keys; known ones are typed, others stored as they are.
pub async fn update_app(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    server_only(&ctx, "updating app settings")?;
    // Applied to the stored settings under the app row's lock (concurrent patches all survive).
    st.store.update_app_settings(|s| apply_app_patch(s, &body)).await?;
    Ok(ctx.ok(json!({})))
}

/// `PATCH /app`'s body applied to the settings: known keys are typed, others stored as they are.
fn apply_app_patch(s: &mut AppSettings, body: &Obj) -> Result<(), Error> {
    for (k, v) in body {
        match k.as_str() {
            "fork_enabled" => s.fork_enabled = bool_opt(body, k)?.unwrap_or(true),
            "webhook_url" => {
                let url = str_opt(body, k)?.filter(|u| !u.is_empty());
                if let Some(u) = &url {
                    if !(u.starts_with("http://") || u.starts_with("https://")) {
                        return Err(Error::input("webhook_url must be an http:// or https:// URL"));
                    }
                }
                s.webhook_url = url;
            }
            "webhook_events" => s.webhook_events = str_list(body, k)?.unwrap_or_default(),
            "event_hooks" => {
                let hooks = input::arr_opt(body, k)?.cloned().unwrap_or_default();
                if hooks.iter().any(|h| !h.is_object()) {
                    return Err(Error::input("event_hooks must be an array of objects"));
                }
                s.event_hooks = hooks
                    .into_iter()
                    .map(|mut h| {
                        if let Value::Object(o) = &mut h {
                            o.entry("id").or_insert_with(|| ids::new_id().into());
                            o.entry("enabled").or_insert(true.into());
                            o.entry("event_types").or_insert(json!([]));
                        }
                        h
                    })
                    .collect();
            }
            "webhook_dialect" => {
                let d = str_opt(body, k)?.unwrap_or_else(|| "legacy".into());
                if d != "legacy" && d != "v2" {
                    return Err(Error::input("webhook_dialect must be \"legacy\" or \"v2\""));
                }
                s.webhook_dialect = d;
            }
            "disable_auth_checks" => s.disable_auth_checks = bool_opt(body, k)?.unwrap_or(false),
            "revoke_tokens_issued_before" => s.revoke_tokens_issued_before = input::ts_opt(body, k)?,
            _ => {
                s.extra.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

/// `POST /guest`: a guest user and its token.
pub async fn create_guest(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    let Some(u) = get(&body, "user") else { return Err(Error::input("field \"user\" is required").into()) };
    let mut inp = user_input(u)?;
    inp.role = Some("guest".into());
    inp.id = format!("guest-{}-{}", ids::new_id()[..8].to_owned(), inp.id);
    let users = st.store.upsert_users(&[inp]).await?;
    let user = &users[0];
    let tok = token::sign(&token::Claims { user_id: Some(user.id.clone()), ..Default::default() }, &st.api_secret);
    Ok(ctx.ok(json!({"access_token": tok, "user": render::user(ctx.dialect, user)})))
}

/// `POST /moderation/ban` with `target_user_id` and `shadow`.
pub async fn ban_user(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("banning users needs server-side or admin rights").into());
    }
    let target = ids::parse_user_id(&input::str_req(&body, "target_user_id")?)?;
    let shadow = bool_opt(&body, "shadow")?.unwrap_or(false);
    st.store.set_ban(&target, shadow, true).await?;
    Ok(ctx.ok(json!({})))
}

/// `DELETE /moderation/ban?target_user_id=…` (lifts both kinds of ban).
pub async fn unban_user(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    if !ctx.viewer.is_admin() {
        return Err(Error::not_allowed("unbanning users needs server-side or admin rights").into());
    }
    let Some(target) = ctx.q("target_user_id") else { return Err(Error::input("query parameter target_user_id is required").into()) };
    let target = ids::parse_user_id(target)?;
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
    let mut v = render_type(ctx.dialect, &ct);
    if let Value::Object(o) = &mut v {
        o.insert("duration".into(), crate::duration().into());
    }
    Ok(Json(v))
}

pub async fn list_channel_types(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    let types = st.store.channel_types().await?;
    let map: Map<String, Value> = types.iter().map(|t| (t.name.clone(), render_type(ctx.dialect, t))).collect();
    Ok(ctx.ok(json!({"channel_types": map})))
}

/// `PUT /channeltypes/{name}`: creates or updates; `max_message_length` is enforced.
pub async fn put_channel_type(
    State(st): State<ApiState>,
    ctx: Ctx,
    ApiPath(name): ApiPath<String>,
    Body(body): Body,
) -> ApiResult<Json<Value>> {
    server_only(&ctx, "changing channel types")?;
    let name = ids::parse_channel_type(&name)?;
    let max = i64_opt(&body, "max_message_length")?;
    if let Some(m) = max {
        if !(1..=20_000).contains(&m) {
            return Err(Error::input("max_message_length must be between 1 and 20000").into());
        }
    }
    let mut extra = Map::new();
    for (k, v) in &body {
        if !matches!(k.as_str(), "max_message_length" | "name" | "created_at" | "updated_at" | "permissions" | "grants") {
            extra.insert(k.clone(), v.clone());
        }
    }
    let ct = st.store.put_channel_type(&name, max, &extra).await?;
    let mut v = render_type(ctx.dialect, &ct);
    if let Value::Object(o) = &mut v {
        o.insert("duration".into(), crate::duration().into());
    }
    Ok(Json(v))
}
