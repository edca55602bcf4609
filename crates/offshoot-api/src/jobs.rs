//! Server-side endpoints of the job queue: dead-lettered webhook deliveries (list, replay) and
//! job counts per queue and state.

use crate::ctx::{Body, Ctx};
use crate::error::ApiResult;
use crate::input::{self, bool_opt};
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::Error;
use serde_json::{json, Value};

fn require_server_side(ctx: &Ctx) -> Result<(), Error> {
    if ctx.viewer.is_admin() {
        Ok(())
    } else {
        Err(Error::not_allowed("the job queue is managed server-side"))
    }
}

/// `GET /webhooks/dead_letters?limit=25&offset=0`: newest first.
pub async fn list_dead_letters(State(st): State<ApiState>, ctx: Ctx) -> ApiResult<Json<Value>> {
    require_server_side(&ctx)?;
    let limit = ctx.q("limit").map(|l| l.parse::<i64>().map_err(|_| Error::input("limit must be a number"))).transpose()?.unwrap_or(25);
    let offset = ctx.q("offset").map(|l| l.parse::<i64>().map_err(|_| Error::input("offset must be a number"))).transpose()?.unwrap_or(0);
    if !(1..=1000).contains(&limit) || offset < 0 {
        return Err(Error::input("limit must be 1..1000 and offset ≥ 0").into());
    }
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
pub async fn replay_dead_letters(State(st): State<ApiState>, ctx: Ctx, Body(body): Body) -> ApiResult<Json<Value>> {
    require_server_side(&ctx)?;
    let ids = input::str_list(&body, "ids")?;
    let all = bool_opt(&body, "all")?.unwrap_or(false);
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
