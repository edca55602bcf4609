//! Realistic agent conversations, written the way clients write them: through the HTTP API,
//! many requests at a time. About one message in ten is a reply in a thread; some quote an
//! earlier message; about one in six carries an attachment, every agent message custom data;
//! reactions, a few deleted messages, and a few shadowed ones (from a shadow-banned user).
//! Several users. No statistics are gathered by hand (no `ANALYZE`): the database has what it
//! gathers itself.

use crate::server::Api;
use anyhow::{Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub const HUMANS: [&str; 4] = ["alice", "bob", "carol", "dave"];
pub const AGENTS: [&str; 2] = ["agent-a", "agent-b"];
/// Shadow-banned: their messages are shadowed.
pub const SHADOWED: &str = "mallory";
/// Messages written before the replies, quotes, reactions and deletes that point at them.
const CHUNK: usize = 250;
const WORDS: &str = "the agent reads the logs and explains step by step how to configure the deployment which flags matter \
what the metrics say and how to roll back safely if the migration fails halfway through the night shift while the user asks \
follow up questions about costs latency retries and whether the cache should be warmed before traffic is switched over";

/// A seeded generator, so every run writes the same history.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n)
    }
}

/// Text of between `min` and `max` characters.
pub fn text(rng: &mut Rng, min: usize, max: usize) -> String {
    let len = min + rng.below(max - min + 1);
    let start = rng.below(WORDS.len() / 2);
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        let piece = &WORDS[start..];
        s.push_str(&piece[..piece.len().min(len - s.len())]);
        s.push(' ');
    }
    s.trim_end().to_string()
}

/// The users every realistic source uses (idempotent), with `mallory` shadow-banned.
pub async fn users(api: &Api) -> Result<()> {
    let mut users = serde_json::Map::new();
    for id in HUMANS.iter().chain(AGENTS.iter()).chain([SHADOWED].iter()) {
        users.insert(id.to_string(), json!({"id": id, "name": id.to_uppercase(), "role": "user", "agent": AGENTS.contains(id)}));
    }
    api.post("/users", &json!({"users": users})).await?;
    api.post("/moderation/ban", &json!({"target_user_id": SHADOWED, "shadow": true})).await?;
    Ok(())
}

/// A realistic source as written.
pub struct Source {
    pub id: String,
    /// Every message written (top-level, replies, deleted, shadowed).
    pub written: usize,
    /// Top-level messages that stay visible (not deleted, not shadowed), oldest first.
    pub visible_top: Vec<String>,
    /// The newest visible top-level message (the fork point).
    pub newest: String,
    pub took: Duration,
    pub requests: usize,
}

enum Req {
    Send(Value),
    React { id: String, kind: &'static str, user: &'static str },
    Delete(String),
}

/// Creates `agent:{id}` and writes `n` messages into it through the API, `concurrency`
/// requests at a time.
pub async fn source(api: &Api, id: &str, n: usize, concurrency: usize) -> Result<Source> {
    let started = Instant::now();
    let mut members: Vec<&str> = HUMANS.to_vec();
    members.extend(AGENTS);
    members.push(SHADOWED);
    api.post(
        &format!("/channels/agent/{id}/query"),
        &json!({"state": false, "data": {"created_by_id": HUMANS[0], "members": members, "name": format!("support conversation {id}"), "topic": "deployment"}}),
    )
    .await?;
    let mut rng = Rng::new(n as u64 ^ id.len() as u64);
    let path = format!("/channels/agent/{id}/message");
    let mut top: Vec<String> = Vec::new();
    let mut visible_top: Vec<String> = Vec::new();
    let mut deleted = std::collections::HashSet::new();
    let mut requests = 0;
    let mut written = 0;
    // Visible messages (id, top-level) of the previous chunk, which this chunk may reply to,
    // quote or react to, and of the one before, from which it deletes a few: nothing is
    // deleted while a request that points at it may be in flight.
    let mut previous: Vec<(String, bool)> = Vec::new();
    let mut older: Vec<(String, bool)> = Vec::new();
    while written < n {
        let count = CHUNK.min(n - written);
        let mut reqs = Vec::with_capacity(count + count / 4);
        let prev_top: Vec<&String> = previous.iter().filter(|(_, is_top)| *is_top).map(|(id, _)| id).collect();
        let mut this_chunk = Vec::with_capacity(count);
        for i in 0..count {
            let k = written + i;
            let mid = format!("{id}-m{k}");
            let (m, shadowed, reply) = message(&mut rng, &mid, k, &prev_top, &previous);
            if !shadowed {
                this_chunk.push((mid.clone(), !reply));
            }
            if !reply {
                top.push(mid.clone());
                if !shadowed {
                    visible_top.push(mid.clone());
                }
            }
            reqs.push(Req::Send(json!({"message": m})));
        }
        for (pid, _) in &previous {
            if rng.below(6) == 0 {
                let kinds = ["like", "love", "haha", "wow"];
                reqs.push(Req::React { id: pid.clone(), kind: kinds[rng.below(kinds.len())], user: HUMANS[rng.below(HUMANS.len())] });
            }
        }
        for (pid, _) in &older {
            if rng.below(300) == 0 {
                deleted.insert(pid.clone());
                reqs.push(Req::Delete(pid.clone()));
            }
        }
        requests += reqs.len();
        send_all(api, &path, reqs, concurrency).await.with_context(|| format!("writing the source {id}"))?;
        written += count;
        older = std::mem::replace(&mut previous, this_chunk);
    }
    visible_top.retain(|m| !deleted.contains(m));
    let newest = newest_visible(api, id).await?;
    Ok(Source { id: id.to_string(), written: n, visible_top, newest, took: started.elapsed(), requests })
}

/// The `k`-th message `mid` of a source: its author (one in 150 the shadowed user, else agents
/// and humans in turn), text, and at random a reply to (and a few shown in the channel) or a
/// quote of a message of the previous chunk, an attachment, the agent's usage or the client's
/// custom data. Returns it, whether it is shadowed and whether it is a reply.
fn message(rng: &mut Rng, mid: &str, k: usize, prev_top: &[&String], previous: &[(String, bool)]) -> (Value, bool, bool) {
    let shadowed = rng.below(150) == 0;
    let agent = !shadowed && k % 2 == 1;
    let user = if shadowed {
        SHADOWED
    } else if agent {
        AGENTS[rng.below(AGENTS.len())]
    } else {
        HUMANS[rng.below(HUMANS.len())]
    };
    let mut m = json!({"id": mid, "user_id": user});
    m["text"] = if agent { text(rng, 200, 900) } else { text(rng, 20, 200) }.into();
    let reply = !prev_top.is_empty() && rng.below(10) == 0;
    if reply {
        // Threads gather around a few parents of the previous chunk.
        let parent = prev_top[rng.below(prev_top.len().min(8))];
        m["parent_id"] = parent.clone().into();
        if rng.below(5) == 0 {
            m["show_in_channel"] = true.into();
        }
    }
    if !previous.is_empty() && rng.below(25) == 0 {
        m["quoted_message_id"] = previous[rng.below(previous.len())].0.clone().into();
    }
    if rng.below(6) == 0 {
        m["attachments"] = json!([{"type": "file", "title": format!("report-{k}.pdf"), "asset_url": format!("https://files.example.com/{k}.pdf"), "file_size": 1000 + k}]);
    }
    if agent {
        m["ai_generated"] = true.into();
        m["model"] = "bench-model-1".into();
        m["usage"] = json!({"prompt_tokens": 100 + k % 900, "completion_tokens": 50 + k % 400});
    } else if rng.below(4) == 0 {
        m["client"] = json!({"app": "web", "version": "3.2.1"});
    }
    (m, shadowed, reply)
}

/// The requests `reqs` of one chunk, `concurrency` at a time: the first error, if any.
async fn send_all(api: &Api, path: &str, reqs: Vec<Req>, concurrency: usize) -> Result<()> {
    let results: Vec<Result<Value>> = futures_util::stream::iter(reqs)
        .map(|r| async move {
            match r {
                Req::Send(body) => api.post(path, &body).await,
                Req::React { id, kind, user } => {
                    api.post(&format!("/messages/{id}/reaction"), &json!({"reaction": {"type": kind, "user_id": user}})).await
                }
                Req::Delete(id) => Ok(api.call(reqwest::Method::DELETE, &format!("/messages/{id}"), None).await?.0),
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().try_for_each(|r| r.map(drop))
}

/// The fork point: the newest visible top-level message as the channel reads it. The
/// server-side read shows shadowed messages too (marked), and the sends were concurrent, so
/// the newest may be one of `SHADOWED`'s: not a fork point (`docs/fork.md`).
async fn newest_visible(api: &Api, id: &str) -> Result<String> {
    let (state, _) = api
        .call(reqwest::Method::POST, &format!("/channels/agent/{id}/query"), Some(&json!({"state": true, "messages": {"limit": 10}})))
        .await?;
    state["messages"]
        .as_array()
        .and_then(|a| a.iter().rev().find(|m| m["parent_id"].is_null() && m["shadowed"] != true && m["type"] == "regular"))
        .and_then(|m| m["id"].as_str())
        .map(str::to_string)
        .context("the source has no visible message")
}
