//! Message search: `GET /search?payload=…` (and `/api/v2/chat/search`), as Stream answers it,
//! with Offshoot's `dedupe_copies` (docs/compatibility.md, "Search").

use crate::ctx::{ApiQuery, Ctx};
use crate::error::ApiResult;
use crate::state::ApiState;
use axum::extract::State;
use axum::Json;
use offshoot_core::model::Viewer;
use offshoot_core::search::{Search, SearchPayload};
use offshoot_core::{perm, render, Error};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
pub struct SearchQuery {
    payload: Option<String>,
}

/// `GET /search`: the messages the caller may read that match, each with its `channel`.
pub async fn search_messages(State(st): State<ApiState>, ctx: Ctx, ApiQuery(q): ApiQuery<SearchQuery>) -> ApiResult<Json<Value>> {
    let Some(payload) = q.payload else {
        return Err(Error::input("payload is required: the search as JSON").field("field", "payload").into());
    };
    let payload: SearchPayload =
        serde_json::from_str(&payload).map_err(|e| Error::input(format!("payload is not valid JSON: {e}")).field("field", "payload"))?;
    let search = Search::parse(&payload)?;
    let page = st.store.search_messages(&search, &ctx.viewer).await?;
    // Every channel searched by a user who is not an admin is one of their channels.
    let member = matches!(&ctx.viewer, Viewer::User { .. }) && !ctx.viewer.is_admin();
    let results: Vec<Value> = page
        .hits
        .iter()
        .map(|(m, ch)| {
            let mut message = render::message(ctx.dialect, m);
            if let Value::Object(o) = &mut message {
                o.insert("channel".into(), render::channel(ctx.dialect, ch, &perm::own_capabilities(&ctx.viewer, member, &ch.kind)));
            }
            json!({ "message": message })
        })
        .collect();
    let mut out = json!({ "results": results });
    if let Some(next) = page.next {
        out["next"] = next.into();
    }
    if let Some(previous) = page.previous {
        out["previous"] = previous.into();
    }
    Ok(ctx.ok(out))
}
