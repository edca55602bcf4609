//! Figure s: message search. 200,000 messages in 500 agent channels, written through the HTTP
//! API as clients write them (so the full-text index is kept by the sends themselves); then a
//! user who is a member of 100 of those channels searches them for one word with the UI kit's
//! request (`filter_conditions: {members: {$in: [me]}}`, newest first, 10 results), one search
//! at a time: p50 and p99 of the answer. Two words are timed: a rare one (in about 1 message in
//! 1,000, the kind of word a person searches for) and a common one (in about 1 message in 10,
//! so the engine ranks thousands of matches per search).
//!
//! The goal: p50 ≤ 30 ms on both engines for the one-word query. Whether sends keep
//! their figures with the index is read from figure f with and without the full-text index
//! (docs/performance.md, "Message search").

use crate::seed::Rng;
use crate::server::{user_token, Api};
use crate::{median, ms, percentile};
use anyhow::{ensure, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub const CHANNELS: usize = 500;
pub const MESSAGES: usize = 200_000;
/// The channels the searching user is a member of.
pub const MEMBER_OF: usize = 100;
/// Searches timed per word.
pub const SEARCHES: usize = 200;
/// Sends in flight while seeding.
const SEND_CONCURRENCY: usize = 32;
/// Distinct rare words: each is in about 1 message in [`RARE_WORDS`].
const RARE_WORDS: usize = 1_000;
const SEARCHER: &str = "searcher";
const AUTHOR: &str = "search-author";
/// Every message's filler: 40–200 characters of these words, none of them the rare words or
/// the common word.
const FILLER: [&str; 24] = [
    "the",
    "agent",
    "reads",
    "logs",
    "and",
    "explains",
    "how",
    "to",
    "configure",
    "deployment",
    "flags",
    "metrics",
    "roll",
    "back",
    "safely",
    "if",
    "migration",
    "fails",
    "user",
    "asks",
    "about",
    "costs",
    "latency",
    "retries",
];
const COMMON: &str = "kubernetes";

/// What [`run`] measured.
#[derive(Debug, Clone)]
pub struct SearchFigure {
    pub messages: usize,
    pub seed_took: Duration,
    pub rare: Vec<Duration>,
    pub common: Vec<Duration>,
    /// Hits of the rare word's searches (at most 10 a search), on average.
    pub rare_hits: f64,
}

fn rare_word(i: usize) -> String {
    format!("zeta{i:04}")
}

/// A message's text: filler, one rare word, and the common word in one message of ten.
fn text(rng: &mut Rng) -> String {
    let n = 8 + rng.below(24);
    let mut words: Vec<String> = (0..n).map(|_| FILLER[rng.below(FILLER.len())].to_string()).collect();
    words.insert(rng.below(words.len()), rare_word(rng.below(RARE_WORDS)));
    if rng.below(10) == 0 {
        words.push(COMMON.to_string());
    }
    words.join(" ")
}

/// Seeds `messages` messages over [`CHANNELS`] channels (`quick`: a tenth of them), then times
/// [`SEARCHES`] searches of each word.
pub async fn run(api: &Api, quick: bool) -> Result<SearchFigure> {
    let messages = if quick { MESSAGES / 10 } else { MESSAGES };
    api.post("/users", &json!({"users": {SEARCHER: {"id": SEARCHER}, AUTHOR: {"id": AUTHOR}}})).await?;
    for c in 0..CHANNELS {
        let members: Vec<&str> = if c < MEMBER_OF { vec![AUTHOR, SEARCHER] } else { vec![AUTHOR] };
        api.post(&format!("/channels/agent/search-{c:03}/query"), &json!({"data": {"created_by_id": AUTHOR, "members": members}})).await?;
    }
    let started = Instant::now();
    let mut rng = Rng::new(46);
    let sends: Vec<(String, Value)> = (0..messages)
        .map(|i| {
            (format!("/channels/agent/search-{:03}/message", i % CHANNELS), json!({"message": {"text": text(&mut rng), "user_id": AUTHOR}}))
        })
        .collect();
    let results: Vec<Result<Value>> = futures_util::stream::iter(sends.iter().map(|(path, body)| api.post(path, body)))
        .buffer_unordered(SEND_CONCURRENCY)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let seed_took = started.elapsed();

    let token = user_token(SEARCHER)?;
    let search = |word: String| {
        let payload = json!({
            "filter_conditions": {"members": {"$in": [SEARCHER]}}, "limit": 10,
            "sort": [{"field": "created_at", "direction": -1}],
            "message_filter_conditions": {"type": "regular", "text": word},
        });
        let path = format!("/search?payload={}", urlencode(&payload.to_string()));
        let (api, token) = (api.clone(), token.clone());
        async move { api.call_as(&token, reqwest::Method::GET, &path, None).await }
    };
    let mut rare = Vec::with_capacity(SEARCHES);
    let mut hits = 0usize;
    for i in 0..SEARCHES {
        let (body, took) = search(rare_word((i * 7) % RARE_WORDS)).await?;
        let n = body["results"].as_array().map_or(0, Vec::len);
        hits += n;
        rare.push(took);
    }
    let mut common = Vec::with_capacity(SEARCHES);
    for _ in 0..SEARCHES {
        let (body, took) = search(COMMON.to_string()).await?;
        ensure!(body["results"].as_array().map_or(0, Vec::len) == 10, "the common word finds a full page: {body}");
        common.push(took);
    }
    Ok(SearchFigure { messages, seed_took, rare, common, rare_hits: hits as f64 / SEARCHES as f64 })
}

/// The figure's lines, as the other figures print theirs.
pub fn report(backend: &str, f: &SearchFigure) -> String {
    format!(
        "s. search ({backend}): {} messages in {CHANNELS} channels (seeded in {:.1} s), a member of {MEMBER_OF}: \
         rare word p50 {} p99 {} ({:.1} hits), common word p50 {} p99 {} (goal p50 ≤ 30 ms)",
        f.messages,
        f.seed_took.as_secs_f64(),
        ms(median(&f.rare)),
        ms(percentile(&f.rare, 99.0)),
        f.rare_hits,
        ms(median(&f.common)),
        ms(percentile(&f.common, 99.0)),
    )
}

/// Percent-encodes a query string value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
