//! The WebSocket figures (d and e): a load generator of real `/connect` clients on
//! tokio-tungstenite, each a task that reads every frame and records when the message events
//! it waits for arrive.

use crate::server::{user_token, Api, Db, Server};
use crate::{goal, ms, open_loop, percentile, seed, Args, Backend, Report, API_KEY};
use anyhow::{bail, ensure, Context, Result};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as Frame;

/// WebSocket handshakes (and watch requests) in flight while clients connect.
const CONNECT_CONCURRENCY: usize = 64;
/// How long deliveries may trail the last send before they count as missing.
const GRACE: Duration = Duration::from_secs(5);

/// A message event one client received.
struct Receipt {
    client: usize,
    message_id: String,
    seq: Option<i64>,
    at: Instant,
}

#[derive(Deserialize)]
struct EventFrame {
    message: Option<EventMessage>,
}

#[derive(Deserialize)]
struct EventMessage {
    id: String,
    seq: Option<i64>,
}

/// What every client task shares: receipts, and how many connections ended.
#[derive(Default)]
struct Board {
    receipts: Mutex<Vec<Receipt>>,
    closed: AtomicUsize,
}

impl Board {
    fn take(&self) -> Vec<Receipt> {
        std::mem::take(&mut *self.receipts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Client {
    token: String,
    connection_id: String,
    task: tokio::task::JoinHandle<()>,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects user `user` to `/connect` (legacy dialect, as JS `stream-chat` does) and waits for
/// its `health.check` with the connection id: the socket, the user's token, the connection id.
async fn open(ws_base: &str, user: &str) -> Result<(Socket, String, String)> {
    let token = user_token(user)?;
    let json = json!({"user_id": user, "user_details": {"id": user, "name": user}}).to_string();
    let url = reqwest::Url::parse_with_params(
        &format!("{ws_base}/connect"),
        &[("json", json.as_str()), ("api_key", API_KEY), ("authorization", token.as_str()), ("stream-auth-type", "jwt")],
    )?;
    let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str()).await.with_context(|| format!("connecting {user}"))?;
    let connection_id = loop {
        match tokio::time::timeout(Duration::from_secs(30), socket.next()).await {
            Ok(Some(Ok(Frame::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str())?;
                match v["connection_id"].as_str() {
                    Some(id) => break id.to_string(),
                    None => bail!("{user}: the first frame has no connection_id: {v}"),
                }
            }
            Ok(Some(Ok(_))) => continue,
            Ok(other) => bail!("{user}: the connection ended before its first frame: {other:?}"),
            Err(_) => bail!("{user}: no first frame within 30 s"),
        }
    };
    Ok((socket, token, connection_id))
}

/// Connects user `user` ([`open`]), then reads every frame in a task of its own, recording the
/// message events on `board`.
async fn connect(ws_base: &str, index: usize, user: &str, board: Arc<Board>) -> Result<Client> {
    let (mut socket, token, connection_id) = open(ws_base, user).await?;
    let task = tokio::spawn(async move {
        while let Some(frame) = socket.next().await {
            match frame {
                Ok(Frame::Text(t)) => {
                    let at = Instant::now();
                    let s = t.as_str();
                    if !(s.contains("\"type\":\"message.new\"") || s.contains("\"type\":\"message.updated\"")) {
                        continue;
                    }
                    if let Ok(EventFrame { message: Some(m) }) = serde_json::from_str::<EventFrame>(s) {
                        board.receipts.lock().unwrap_or_else(|e| e.into_inner()).push(Receipt {
                            client: index,
                            message_id: m.id,
                            seq: m.seq,
                            at,
                        });
                    }
                }
                Ok(Frame::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = socket.close(None).await;
        board.closed.fetch_add(1, Ordering::SeqCst);
    });
    Ok(Client { token, connection_id, task })
}

/// A client watching a fork's source for `channel.forked`, which is how a client learns that a
/// fork is finished (`docs/fork.md`, Events).
pub struct ForkedWatch {
    /// The `fork.channel_cid` of each `channel.forked` received, in order.
    forked: tokio::sync::mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl ForkedWatch {
    /// Connects `user` (a member of the source) and watches `agent:{source}`.
    pub async fn start(api: &Api, user: &str, source: &str) -> Result<ForkedWatch> {
        let (mut socket, token, connection_id) = open(&api.ws_base(), user).await?;
        watch_as(api, &token, &connection_id, source).await?;
        let (tx, forked) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(Ok(frame)) = socket.next().await {
                let Frame::Text(t) = frame else { continue };
                if !t.as_str().contains("\"type\":\"channel.forked\"") {
                    continue;
                }
                if let Ok(v) = serde_json::from_str::<Value>(t.as_str()) {
                    if let Some(cid) = v["fork"]["channel_cid"].as_str() {
                        let _ = tx.send(cid.to_string());
                    }
                }
            }
        });
        Ok(ForkedWatch { forked, task })
    }

    /// Waits until `channel.forked` has arrived for every one of `cids`.
    pub async fn wait_for(&mut self, cids: &[String], timeout: Duration) -> Result<()> {
        let mut left: std::collections::HashSet<&str> = cids.iter().map(String::as_str).collect();
        let deadline = tokio::time::Instant::now() + timeout;
        while !left.is_empty() {
            match tokio::time::timeout_at(deadline, self.forked.recv()).await {
                Ok(Some(cid)) => drop(left.remove(cid.as_str())),
                Ok(None) => bail!("the watching connection ended before channel.forked for {left:?}"),
                Err(_) => bail!("no channel.forked for {left:?} within {timeout:?}"),
            }
        }
        Ok(())
    }
}

impl Drop for ForkedWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connect_all(ws_base: &str, users: &[String], first_index: usize, board: &Arc<Board>) -> Result<Vec<Client>> {
    let clients: Vec<Result<Client>> = futures_util::stream::iter(users.iter().enumerate())
        .map(|(i, u)| connect(ws_base, first_index + i, u, board.clone()))
        .buffered(CONNECT_CONCURRENCY)
        .collect()
        .await;
    clients.into_iter().collect()
}

fn disconnect(clients: Vec<Client>) {
    for c in clients {
        c.task.abort();
    }
}

async fn upsert_users(api: &Api, users: &[String]) -> Result<()> {
    for chunk in users.chunks(100) {
        let map: serde_json::Map<String, Value> = chunk.iter().map(|u| (u.clone(), json!({"id": u, "name": u}))).collect();
        api.post("/users", &json!({"users": map})).await?;
    }
    Ok(())
}

/// Creates `agent:{id}` with `members` (100 per request).
async fn channel_with(api: &Api, id: &str, members: &[String]) -> Result<()> {
    let mut chunks = members.chunks(100);
    let first: Vec<&String> = chunks.next().map(|c| c.iter().collect()).unwrap_or_default();
    api.post(
        &format!("/channels/agent/{id}/query"),
        &json!({"state": false, "data": {"created_by_id": seed::HUMANS[0], "members": first}}),
    )
    .await?;
    for chunk in chunks {
        api.post(&format!("/channels/agent/{id}"), &json!({"add_members": chunk})).await?;
    }
    Ok(())
}

/// Connection `connection_id` (of the user of `token`) watches `agent:{channel}`.
async fn watch_as(api: &Api, token: &str, connection_id: &str, channel: &str) -> Result<Value> {
    let path = format!("/channels/agent/{channel}/query?connection_id={connection_id}");
    api.call_as(token, reqwest::Method::POST, &path, Some(&json!({"state": false, "watch": true}))).await.map(|r| r.0)
}

/// Each client watches its channel (`POST …/query?connection_id=…` with `watch: true`).
async fn watch(api: &Api, pairs: Vec<(&Client, String)>) -> Result<()> {
    let done: Vec<Result<Value>> = futures_util::stream::iter(pairs)
        .map(|(c, channel)| async move { watch_as(api, &c.token, &c.connection_id, &channel).await })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .collect()
        .await;
    for d in done {
        d?;
    }
    Ok(())
}

pub async fn bench_ws(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let db = Db::create(backend, "ws", &args.pg_url).await?;
    let outcome = match Server::start(&db.url(), "api,ws,worker", args.clients + 2_000).await {
        Ok(server) => {
            let mut runs = Ok(());
            if args.wants('d') {
                runs = capacity(&server, args, report).await;
            }
            if runs.is_ok() && args.wants('e') {
                runs = streaming(&server, args, report).await;
            }
            let stopped = server.stop().await;
            runs.and(stopped)
        }
        Err(e) => Err(e),
    };
    db.drop_it().await;
    outcome
}

/// Durations as whole milliseconds, comma-separated.
fn millis(all: &[Duration]) -> String {
    all.iter().map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0)).collect::<Vec<_>>().join(", ")
}

/// d. Idle connections, fan-out to 1,000 watchers, 100 channels × 10 watchers at 200 msg/s.
/// d. WebSocket capacity: idle clients' memory, one message to 1,000 watchers, and 100
/// channels × 10 watchers at 200 messages/s, then the clients gone at once.
async fn capacity(server: &Server, args: &Args, report: &mut Report) -> Result<()> {
    let (clients, board, rooms) = idle_clients(server, args, report).await?;
    fan_out(&server.api, &clients, &board, args, report).await?;
    rooms_at_rate(&server.api, &clients, &board, &rooms, args, report).await?;
    clients_gone(server, clients, report).await
}

/// The idle figure: `args.clients` clients connected, the server's resident memory before and
/// after. Returns the clients, their board and the 100 rooms.
async fn idle_clients(server: &Server, args: &Args, report: &mut Report) -> Result<(Vec<Client>, Arc<Board>, Vec<String>)> {
    let api = &server.api;
    let ws_base = api.ws_base();
    seed::users(api).await?;
    let users: Vec<String> = (0..args.clients).map(|i| format!("ws-u{i}")).collect();
    upsert_users(api, &users).await?;
    // The channels exist before the clients connect, so the idle figure is taken with the
    // server's caches as they will be.
    channel_with(api, "fan", &users[..1_000]).await?;
    let rooms: Vec<String> = (0..100).map(|c| format!("room-{c}")).collect();
    for (c, room) in rooms.iter().enumerate() {
        channel_with(api, room, &users[1_000 + c * 10..1_000 + c * 10 + 10]).await?;
    }
    crate::settle_disk("d").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = server.rss_kib().context("the server's VmRSS")?;
    let board = Arc::new(Board::default());
    let started = Instant::now();
    let clients = connect_all(&ws_base, &users, 0, &board).await?;
    let connect_time = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_idle = server.rss_kib().context("the server's VmRSS")?;
    let per_conn = (rss_idle.saturating_sub(rss_before)) as f64 / clients.len() as f64;
    report.add(format!(
        "d. {} idle WebSocket clients connected in {:.1} s: server RSS {:.1} → {:.1} MiB, {per_conn:.1} KiB per connection (goal ≤ 30 KiB: {})",
        clients.len(),
        connect_time.as_secs_f64(),
        rss_before as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        goal(per_conn <= 30.0)
    ));

    Ok((clients, board, rooms))
}

/// One message to a channel with 1,000 watchers (the first 1,000 clients), repeated.
async fn fan_out(api: &Api, clients: &[Client], board: &Board, args: &Args, report: &mut Report) -> Result<()> {
    watch(api, clients[..1_000].iter().map(|c| (c, "fan".to_string())).collect()).await?;
    board.take();
    let rounds = if args.quick { 5 } else { 20 };
    let (mut lasts, mut each, mut sends, mut warmups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let cpu = crate::cpu::Mark::now();
    for j in 0..rounds {
        let id = format!("fan-{j}");
        let body = json!({"message": {"id": id, "text": "one message to a thousand watchers", "user_id": seed::AGENTS[0]}});
        // An untimed request first: the first request after the 1,000 watch calls took about
        // 300 ms whatever it was (a channel query too), while the server logged it as a few ms
        // (docs/performance.md, "Measuring on shared two-core machines"); the figure is the
        // fan-out's. Its time is printed.
        let w0 = Instant::now();
        api.post("/channels/agent/room-0/query", &json!({"state": false})).await?;
        warmups.push(w0.elapsed());
        let t0 = Instant::now();
        api.post("/channels/agent/fan/message", &body).await?;
        sends.push(t0.elapsed());
        let deadline = Instant::now() + GRACE;
        loop {
            let n = board.receipts.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|r| r.message_id == id).count();
            if n >= 1_000 || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let got: Vec<Duration> = board.take().into_iter().filter(|r| r.message_id == id).map(|r| r.at.duration_since(t0)).collect();
        ensure!(got.len() == 1_000, "message {id} reached {} of 1,000 watchers within {GRACE:?}", got.len());
        lasts.push(got.iter().copied().max().unwrap_or_default());
        each.extend(got);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let p99_last = percentile(&lasts, 99.0);
    report.add(format!(
        "d. one message to 1,000 watchers ({rounds} messages): send → last watcher p50 {} p99 {}; every delivery p50 {} (goal p99 ≤ 100 ms: {}; each message's last, in order: {}; its send request: {}; the untimed request before it: {}{})",
        ms(percentile(&lasts, 50.0)),
        ms(p99_last),
        ms(percentile(&each, 50.0)),
        goal(p99_last <= Duration::from_millis(100)),
        millis(&lasts),
        millis(&sends),
        millis(&warmups),
        crate::cpu::note("; ", crate::cpu::since(cpu))
    ));

    Ok(())
}

/// 100 channels × 10 watchers (clients 1,000 to 2,000), 200 messages/s in all.
async fn rooms_at_rate(api: &Api, clients: &[Client], board: &Board, rooms: &[String], args: &Args, report: &mut Report) -> Result<()> {
    let room_clients = &clients[1_000..2_000];
    watch(api, room_clients.iter().enumerate().map(|(k, c)| (c, rooms[k / 10].clone())).collect()).await?;
    board.take();
    let closed_before = board.closed.load(Ordering::SeqCst);
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let rate = 200.0;
    let cpu = crate::cpu::Mark::now();
    let run = open_loop(rate, Duration::from_secs_f64(args.step_secs), None, 2_000, |i| {
        let (api, sent) = (api.clone(), sent.clone());
        let room = rooms[i as usize % rooms.len()].clone();
        async move {
            let id = format!("r-{i}");
            let body = json!({"message": {"id": id, "text": crate::chat_message(i)["message"]["text"], "user_id": seed::HUMANS[(i % 4) as usize]}});
            sent.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Instant::now());
            api.post(&format!("/channels/agent/{room}/message"), &body).await.map(|_| ())
        }
    })
    .await;
    ensure!(run.errors == 0, "sends failed in the 200 messages/s run: {:?}", run.first_error);
    let expected = run.latencies.len() * 10;
    let deadline = Instant::now() + GRACE;
    while board.receipts.lock().unwrap_or_else(|e| e.into_inner()).len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let receipts = board.take();
    let mut per_client = vec![0usize; 2_000];
    let mut lat = Vec::with_capacity(receipts.len());
    {
        let sent = sent.lock().unwrap_or_else(|e| e.into_inner());
        for r in &receipts {
            if let Some(t) = sent.get(&r.message_id) {
                lat.push(r.at.duration_since(*t));
                if (1_000..2_000).contains(&r.client) {
                    per_client[r.client - 1_000] += 1;
                }
            }
        }
    }
    let per_room = run.latencies.len() / 100;
    let short = per_client[..1_000].iter().filter(|n| **n < per_room).count();
    let dropped = board.closed.load(Ordering::SeqCst) - closed_before;
    let p99 = percentile(&lat, 99.0);
    report.add(format!(
        "d. 100 channels × 10 watchers, {:.0} messages/s for {:.0} s: {} deliveries of {expected}, p50 {} p99 {} (send → receipt); clients closed {dropped}, clients short of messages {short}{} (goal p99 ≤ 100 ms, none dropped: {})",
        run.rate(),
        args.step_secs,
        lat.len(),
        ms(percentile(&lat, 50.0)),
        ms(p99),
        crate::cpu::note("; ", crate::cpu::since(cpu)),
        goal(p99 <= Duration::from_millis(100) && dropped == 0 && short == 0 && lat.len() >= expected)
    ));
    Ok(())
}

/// The server's memory after the fan-out runs, and how long it takes to remove the records
/// of all the clients gone at once.
async fn clients_gone(server: &Server, clients: Vec<Client>, report: &mut Report) -> Result<()> {
    let rss_busy = server.rss_kib().unwrap_or(0);
    report.add(format!("d. server RSS after the fan-out runs: {:.1} MiB", rss_busy as f64 / 1024.0));
    // The server removes each closed connection's presence records, a write transaction per
    // connection: timed here, and e starts only once they are gone (started during them, e measures the
    // server busy with them: docs/performance.md, "Measuring on shared two-core machines").
    let n = clients.len();
    let started = Instant::now();
    disconnect(clients);
    let left = loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ws_connection").fetch_one(&server.db).await?;
        if left == 0 || started.elapsed() > DRAIN_TIMEOUT {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    report.add(format!(
        "d. {n} clients gone at once: their presence records removed in {:.1} s ({left} left)",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// How long d waits for the server to remove its closed clients' records.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// e. Agent streaming: `streams` channels, one watcher each; every stream sends a placeholder
/// message and `ai_indicator.update`, then 20 partial updates of its text a second, then
/// `ai_indicator.clear`. Steps the number of streams until the p99 passes 100 ms.
async fn streaming(server: &Server, args: &Args, report: &mut Report) -> Result<()> {
    let api = &server.api;
    let ws_base = api.ws_base();
    seed::users(api).await?;
    crate::settle_disk("e").await?;
    let default: &[usize] = if args.quick { &[5, 10, 50, 100] } else { &[5, 10, 25, 50, 100, 150, 200, 300] };
    let steps = args.streams.as_deref().unwrap_or(default);
    let mut best = 0;
    let mut lines = Vec::new();
    for &streams in steps {
        let users: Vec<String> = (0..streams).map(|i| format!("es-{streams}-{i}")).collect();
        upsert_users(api, &users).await?;
        let channels: Vec<String> = (0..streams).map(|i| format!("stream-{streams}-{i}")).collect();
        for (c, u) in channels.iter().zip(&users) {
            channel_with(api, c, &[u.clone(), seed::AGENTS[0].to_string()]).await?;
        }
        let board = Arc::new(Board::default());
        let clients = connect_all(&ws_base, &users, 0, &board).await?;
        watch(api, clients.iter().zip(&channels).map(|(c, ch)| (c, ch.clone())).collect()).await?;
        let cpu = crate::cpu::Mark::now();
        let (outcome, sent) = stream_step(api, &channels, args.step_secs).await;
        let cpu = crate::cpu::since(cpu);
        let updates = sent.len();
        let deadline = Instant::now() + GRACE;
        while board.receipts.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|r| r.seq.is_some()).count() < updates
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let receipts = board.take();
        let mut lat = Vec::with_capacity(updates);
        for r in receipts {
            if let Some(t) = r.seq.and_then(|s| sent.get(&(r.message_id.clone(), s))) {
                lat.push(r.at.duration_since(*t));
            }
        }
        let closed = board.closed.load(Ordering::SeqCst);
        disconnect(clients);
        let p99 = percentile(&lat, 99.0);
        let ok = outcome.is_ok() && lat.len() >= updates && closed == 0 && p99 <= Duration::from_millis(100);
        lines.push(format!(
            "{streams} streams: {} updates/s, update → watcher p50 {} p99 {}{}{}{}",
            (updates as f64 / args.step_secs).round(),
            ms(percentile(&lat, 50.0)),
            ms(p99),
            cpu.map(|u| format!(" [{u}]")).unwrap_or_default(),
            if lat.len() < updates { format!(", {} of {updates} updates not seen", updates - lat.len()) } else { String::new() },
            match &outcome {
                Err(e) => format!(", failed: {e:#}"),
                Ok(()) => String::new(),
            }
        ));
        println!("    [{}] e. {}", crate::clock(), lines.last().map(String::as_str).unwrap_or(""));
        if !ok {
            break;
        }
        best = streams;
    }
    report.add(format!("e. agent streaming ({:.0} s per stream, 20 updates/s, one watcher each): {}", args.step_secs, lines.join("; ")));
    report.add(format!("e. concurrent streams with p99 ≤ 100 ms: {best} (goal ≥ 200: {})", goal(best >= 200)));
    Ok(())
}

type Sent = HashMap<(String, i64), Instant>;

/// The body of a stream's partial update (`PUT /messages/{id}`), serialised without a copy of
/// the text so far.
#[derive(serde::Serialize)]
struct Patch<'a> {
    set: PatchSet<'a>,
    user_id: &'a str,
}

#[derive(serde::Serialize)]
struct PatchSet<'a> {
    text: &'a str,
    seq: i64,
}

/// Runs one stream per channel for `secs` seconds; returns when each update was due.
async fn stream_step(api: &Api, channels: &[String], secs: f64) -> (Result<()>, Sent) {
    let sent: Arc<Mutex<Sent>> = Arc::default();
    let updates = (secs * 20.0).round() as i64;
    let started = Instant::now();
    let results = futures_util::future::join_all(channels.iter().enumerate().map(|(i, channel)| {
        let (api, sent) = (api.clone(), sent.clone());
        let channel = channel.clone();
        // Streams start spread over one update interval, as independent agents would.
        let offset = Duration::from_millis((i as u64 * 50) / channels.len() as u64);
        async move {
            tokio::time::sleep_until((started + offset).into()).await;
            let id = format!("{channel}-answer");
            let agent = seed::AGENTS[0];
            let event =
                |state: &str| json!({"event": {"type": "ai_indicator.update", "ai_state": state, "message_id": id, "user_id": agent}});
            api.post(&format!("/channels/agent/{channel}/event"), &event("AI_STATE_THINKING")).await?;
            api.post(
                &format!("/channels/agent/{channel}/message"),
                &json!({"message": {"id": id, "text": "…", "user_id": agent, "ai_generated": true}}),
            )
            .await?;
            api.post(&format!("/channels/agent/{channel}/event"), &event("AI_STATE_GENERATING")).await?;
            let mut rng = seed::Rng::new(i as u64);
            let mut text = String::new();
            let begin = Instant::now();
            for k in 0..updates {
                let due = begin + Duration::from_millis(50 * k as u64);
                tokio::time::sleep_until(due.into()).await;
                text.push_str(&seed::text(&mut rng, 8, 24));
                text.push(' ');
                sent.lock().unwrap_or_else(|e| e.into_inner()).insert((id.clone(), k), due);
                let patch = Patch { set: PatchSet { text: &text, seq: k }, user_id: agent };
                api.call_unread(reqwest::Method::PUT, &format!("/messages/{id}"), &patch).await?;
            }
            api.post(
                &format!("/channels/agent/{channel}/event"),
                &json!({"event": {"type": "ai_indicator.clear", "message_id": id, "user_id": agent}}),
            )
            .await?;
            Ok::<(), anyhow::Error>(())
        }
    }))
    .await;
    let outcome = results.into_iter().collect::<Result<Vec<()>>>().map(|_| ());
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|e| e.into_inner()));
    (outcome, sent)
}
