//! Figure "flood": one user token sends as fast as it is told (10,000 requests a second, open
//! loop) while other users send messages at a steady rate; the other users' send p99 is held
//! against the same sends without the flood (goal: within 2×), and every answer to the flood
//! is counted by status (goal: refused with 429, never a 5xx). The server runs with Stream's
//! table (README, "Rate limits") raised only as far as the steady senders need
//! (`FLOOD_LIMITS` in main.rs): they are 99 users taking turns at 100 sends a second.

use crate::server::{user_token, Api};
use crate::{goal, ms, open_loop, Run};
use anyhow::{ensure, Result};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Steady senders, taking turns.
const SENDERS: usize = 99;
/// The channel every sender writes to.
const CHANNEL: &str = "/channels/messaging/flood-figure";

/// Answers to the flood, by status.
#[derive(Default)]
pub struct Answers {
    pub ok: AtomicU64,
    pub limited: AtomicU64,
    pub server_error: AtomicU64,
    pub other: AtomicU64,
    pub failed: AtomicU64,
}

/// The figure.
pub struct Flood {
    pub quiet: Run,
    pub flooded: Run,
    pub flood: Run,
    pub answers: Arc<Answers>,
}

impl Flood {
    /// The report's lines.
    pub fn lines(&self) -> Vec<String> {
        let (q, f) = (self.quiet.p(0.99), self.flooded.p(0.99));
        let ratio = f.as_secs_f64() / q.as_secs_f64().max(1e-9);
        let a = &self.answers;
        let (ok, limited, five, other, failed) = (
            a.ok.load(Ordering::Relaxed),
            a.limited.load(Ordering::Relaxed),
            a.server_error.load(Ordering::Relaxed),
            a.other.load(Ordering::Relaxed),
            a.failed.load(Ordering::Relaxed),
        );
        vec![
            format!(
                "flood: other users' send p99 {} quiet, {} under a flood of {:.0} requests/s from one user token: {ratio:.2}× (goal ≤ 2×: {})",
                ms(q),
                ms(f),
                self.flood.rate(),
                goal(ratio <= 2.0)
            ),
            format!(
                "flood: answers to the flood: {ok} accepted, {limited} refused with 429, {five} 5xx, {other} other, {failed} without an answer (goal: no 5xx: {})",
                goal(five == 0)
            ),
        ]
    }
}

async fn send(api: Api, token: String, i: u64) -> Result<()> {
    let body = json!({"message": {"text": format!("steady {i}")}});
    api.call_as(&token, reqwest::Method::POST, &format!("{CHANNEL}/message"), Some(&body)).await?;
    Ok(())
}

/// Runs the figure on a server started with the default limits: `rate` steady sends a second
/// for `duration`, first alone, then beside a flood of `flood_rate` requests a second.
pub async fn measure(api: &Api, rate: f64, flood_rate: f64, duration: Duration) -> Result<Flood> {
    let senders: Vec<String> = (0..SENDERS).map(|i| format!("flood-sender-{i:03}")).collect();
    let attacker = "flood-attacker".to_string();
    let mut users: serde_json::Map<String, Value> = senders.iter().map(|u| (u.clone(), json!({"id": u}))).collect();
    users.insert(attacker.clone(), json!({"id": attacker}));
    api.call(reqwest::Method::POST, "/users", Some(&json!({"users": users}))).await?;
    let mut members = senders.clone();
    members.push(attacker.clone());
    api.call(reqwest::Method::POST, &format!("{CHANNEL}/query"), Some(&json!({"data": {"created_by_id": senders[0], "members": members}})))
        .await?;
    let tokens: Arc<Vec<(String, String)>> = Arc::new(senders.iter().map(|u| Ok((u.clone(), user_token(u)?))).collect::<Result<_>>()?);

    let steady = |tokens: Arc<Vec<(String, String)>>| {
        let api = api.clone();
        move |i: u64| {
            let token = tokens[i as usize % tokens.len()].1.clone();
            send(api.clone(), token, i)
        }
    };
    let quiet = open_loop(rate, duration, None, 1024, steady(tokens.clone())).await;
    ensure!(quiet.errors == 0, "quiet sends failed: {:?}", quiet.first_error);

    let answers = Arc::new(Answers::default());
    let stop = CancellationToken::new();
    let flood = {
        let (api, answers, stop) = (api.clone(), answers.clone(), stop.clone());
        let token = user_token(&attacker)?;
        tokio::spawn(async move {
            open_loop(flood_rate, duration * 2, Some(stop), 20_000, move |i| {
                let (api, answers, token) = (api.clone(), answers.clone(), token.clone());
                async move {
                    let body = json!({"message": {"text": format!("flood {i}")}});
                    let sent = api
                        .http
                        .post(format!("{}{CHANNEL}/message?api_key={}", api.base, crate::API_KEY))
                        .header("Authorization", &token)
                        .header("stream-auth-type", "jwt")
                        .json(&body)
                        .send()
                        .await;
                    let counter = match sent.as_ref().map(|r| r.status().as_u16()) {
                        Ok(200) => &answers.ok,
                        Ok(429) => &answers.limited,
                        Ok(s) if s >= 500 => &answers.server_error,
                        Ok(_) => &answers.other,
                        Err(_) => &answers.failed,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Ok(r) = sent {
                        let _ = r.bytes().await;
                    }
                    Ok(())
                }
            })
            .await
        })
    };
    // The flood gets going before the steady sends are measured beside it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flooded = open_loop(rate, duration, None, 1024, steady(tokens)).await;
    stop.cancel();
    let flood = flood.await?;
    ensure!(flooded.errors == 0, "sends beside the flood failed: {:?}", flooded.first_error);
    Ok(Flood { quiet, flooded, flood, answers })
}
