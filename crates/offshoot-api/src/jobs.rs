//! Server-side endpoints of the job queue: dead-lettered webhook deliveries (list, replay) and
//! job counts per queue and state.

use crate::ctx::{ApiQuery, Body, Ctx};
use crate::error::ApiResult;
use crate::input::{de, ListQuery};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::Error;
use serde::Deserialize;
use serde_json::{json, Value};

fn require_server_side(ctx: &Ctx) -> Result<(), Error> {
    if ctx.viewer.is_admin() {
        Ok(())
    } else {
        Err(Error::not_allowed("the job queue is managed server-side"))
    }
}

/// `GET /webhooks/dead_letters?limit=25&offset=0`: newest first.
pub async fn list_dead_letters(State(st): State<ApiState>, ctx: Ctx, ApiQuery(q): ApiQuery<ListQuery>) -> ApiResult<Json<Value>> {
    require_server_side(&ctx)?;
    let (limit, offset) = q.limit_offset(1000)?;
    let d = ctx.dialect;
    let letters = st.jobs.dead_letters(limit, offset).await?;
    let out: Vec<Value> = letters
        .iter()
        .map(|l| {
            json!({
                "id": l.id, "url": l.url, "event_type": l.event_type, "event_seq": l.event_seq,
                "attempts": l.attempts, "last_error": l.last_error,
                "first_attempt_at": d.ts(l.first_attempt_at), "created_at": d.ts(l.created_at),
            })
        })
        .collect();
    Ok(ctx.ok(json!({"dead_letters": out})))
}

/// `POST /webhooks/dead_letters/replay` with `{"ids": [...]}` or `{"all": true}`: queues them
/// again for a new retry window, with the same `X-Webhook-Id`.
#[derive(Deserialize)]
pub struct ReplayRequest {
    ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    all: Option<bool>,
}

pub async fn replay_dead_letters(State(st): State<ApiState>, ctx: Ctx, Body(body): Body<ReplayRequest>) -> ApiResult<Json<Value>> {
    require_server_side(&ctx)?;
    let (ids, all) = (body.ids, body.all.unwrap_or(false));
    let replayed = match (ids, all) {
        (Some(_), true) => return Err(Error::input("give either ids or all: true, not both").into()),
        (Some(ids), false) if ids.is_empty() || ids.len() > 1000 => return Err(Error::input("ids must hold 1..1000 ids").into()),
        (Some(ids), false) => st.jobs.replay_dead_letters(Some(&ids)).await?,
        (None, true) => st.jobs.replay_dead_letters(None).await?,
        (None, false) => return Err(Error::input("give ids (a list of dead letter ids) or all: true").into()),
    };
    Ok(ctx.ok(json!({"replayed": replayed})))
}

/// `GET /jobs`: jobs per queue and state (queued, running, retrying, failed, dead_lettered).
pub async fn job_counts(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    require_server_side(&ctx)?;
    let counts = st.jobs.counts().await?;
    Ok(ctx.ok(json!({"queues": counts})))
}
