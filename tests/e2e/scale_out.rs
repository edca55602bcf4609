//! Scale-out on PostgreSQL as an operator runs it: separate `offshoot serve` processes (two
//! `api`, one `ws`, two `worker`) on one database. A fork created through one api process is
//! announced exactly once to a WebSocket client of the ws process; a worker SIGKILLed
//! mid-backfill and every database connection cut (`pg_terminate_backend`) do not stop the
//! fork from completing with the exact count and no duplicate copy; requests during the cut
//! answer (200 or a 503 envelope) within a bounded time instead of hanging.
//!
//! SQLite is one process only (README, "Configuration"), so this test runs on PostgreSQL.

use crate::helpers::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use sqlx::Connection;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// How long a request may take while the database connections are being cut: the pool's
/// acquire timeout (30 s) and a margin; in practice the answer comes at once.
const ANSWER_WITHIN: Duration = Duration::from_secs(40);

fn role(roles: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OFFSHOOT_ROLES", roles.to_string()),
        // Small, slow pages: the backfill lasts long enough to kill a worker in the middle.
        ("OFFSHOOT_BACKFILL_PAGE_SIZE", "100".to_string()),
        ("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "150".to_string()),
    ]
}

async fn start(db: &TestDb, roles: &str) -> ServerProcess {
    let env = role(roles);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ServerProcess::start(db, &env).await
}

/// Cuts every connection to the test database but this one.
async fn terminate_connections(db_url: &str) -> u64 {
    let mut conn = sqlx::PgConnection::connect(db_url).await.expect("an admin connection to the test database");
    let rows = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await
    .expect("pg_terminate_backend");
    let _ = conn.close().await;
    rows.len() as u64
}

async fn fork_copies(db_url: &str, fork_cid: &str) -> (i64, i64) {
    let mut conn = sqlx::PgConnection::connect(db_url).await.expect("connect");
    let row: (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT source_message_id) FROM message WHERE cid = $1 AND source_message_id IS NOT NULL")
            .bind(fork_cid)
            .fetch_one(&mut conn)
            .await
            .expect("count copies");
    let _ = conn.close().await;
    row
}

#[tokio::test]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn separate_api_ws_and_worker_processes_fork_announce_once_and_survive_a_killed_worker_and_cut_connections() {
    require_postgres("separate api, ws and worker processes on one database; SQLite runs one process");
    let db = TestDb::create().await;
    let api1 = start(&db, "api").await;
    let api2 = start(&db, "api").await;
    let ws = start(&db, "ws").await;
    let mut worker1 = start(&db, "worker").await;
    let worker2 = start(&db, "worker").await;

    // A source of 1,500 top-level messages, written through both api processes.
    api1.users(&["owner", "watcher"]).await;
    api1.channel("agent:scaled", "owner", &["owner", "watcher"]).await;
    let start_ns = past_ns();
    let messages: Vec<Value> = (0..1500)
        .map(|i| json!({"id": format!("s-{i:05}"), "text": format!("m{i}"), "user_id": "owner", "created_at": rfc3339(start_ns + i as i64 * 1_000_000)}))
        .collect();
    let (first, second) = messages.split_at(750);
    tokio::join!(api1.send_many("agent:scaled", first.to_vec(), 8), api2.send_many("agent:scaled", second.to_vec(), 8));

    // A WebSocket client of the ws process watches the source (the watch goes through api2).
    let json_param = json!({"user_id": "watcher", "user_details": {"id": "watcher"}}).to_string();
    let url = reqwest::Url::parse_with_params(
        &format!("{}/connect", ws.base.replacen("http", "ws", 1)),
        &[("json", json_param.as_str()), ("api_key", API_KEY), ("authorization", &ws.user("watcher")), ("stream-auth-type", "jwt")],
    )
    .expect("url");
    let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("ws handshake");
    let first_frame = next_json(&mut socket, Duration::from_secs(20)).await.expect("health.check");
    let connection_id = first_frame["connection_id"].as_str().expect("connection_id").to_string();
    api2.post(
        &format!("{}/query?connection_id={connection_id}", channel_path("agent:scaled")),
        &api2.user("watcher"),
        json!({"watch": true}),
    )
    .await
    .ok();

    // The fork, through api1: the newest page now, 1,400 messages in the background.
    let fork = api1.fork("agent:scaled", "s-01499", "scaled-fork").await.ok();
    assert_eq!(fork["fork"]["status"], json!("backfilling"), "{}", fork["fork"]);
    let task = fork["fork"]["task_id"].as_str().expect("task id").to_string();

    // Mid-backfill: SIGKILL one worker, then cut every database connection.
    let deadline = Instant::now() + WAIT;
    loop {
        let t = api1.get(&format!("/tasks/{task}"), &api1.server()).await.ok();
        let copied = t["result"]["copied_message_count"].as_i64().unwrap_or(0);
        if copied > 200 {
            assert_eq!(t["status"], json!("running"), "killed mid-backfill, not after: {t}");
            break;
        }
        assert!(Instant::now() < deadline, "the backfill did not progress: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker1.kill();
    let cut = terminate_connections(&db.url).await;
    assert!(cut > 0, "the processes had database connections to cut");

    // Requests during and right after the cut answer within a bound: 200, or a 503 envelope.
    for i in 0..10 {
        let target = if i % 2 == 0 { &api1 } else { &api2 };
        let begun = Instant::now();
        let r = tokio::time::timeout(ANSWER_WITHIN, target.get(&channel_path("agent:scaled"), &target.server()))
            .await
            .unwrap_or_else(|_| panic!("a request during the cut hung for more than {ANSWER_WITHIN:?}"));
        match r.status {
            200 | 404 | 405 => {}
            503 => {
                assert_error_envelope(&r.body);
            }
            other => panic!("a request during the cut answered {other} after {:?}: {}", begun.elapsed(), r.body),
        }
        if i == 4 {
            terminate_connections(&db.url).await;
        }
    }

    // The surviving worker finishes: exact count, no duplicate copy.
    let summary = api2.wait_fork_finished("agent:scaled-fork").await;
    assert_eq!(summary["status"], json!("completed"), "{summary}");
    assert_eq!(summary["copied_message_count"], json!(1500), "{summary}");
    let (copies, distinct) = fork_copies(&db.url, "agent:scaled-fork").await;
    assert_eq!((copies, distinct), (1500, 1500), "every source message copied exactly once");

    // channel.forked reached the ws process's client exactly once per channel: on the source it
    // watches, and on the fork, which it is a member of.
    let mut forked: std::collections::BTreeMap<String, usize> = Default::default();
    let until = Instant::now() + WAIT;
    while forked.len() < 2 && Instant::now() < until {
        if let Some(v) = next_json(&mut socket, Duration::from_secs(1)).await {
            if v["type"] == json!("channel.forked") {
                assert_eq!(v["fork"]["channel_cid"], json!("agent:scaled-fork"), "{v}");
                *forked.entry(v["cid"].as_str().expect("cid").to_string()).or_default() += 1;
            }
        }
    }
    let grace = Instant::now() + Duration::from_secs(3);
    while Instant::now() < grace {
        if let Some(v) = next_json(&mut socket, Duration::from_millis(500)).await {
            if v["type"] == json!("channel.forked") {
                *forked.entry(v["cid"].as_str().expect("cid").to_string()).or_default() += 1;
            }
        }
    }
    let expected: std::collections::BTreeMap<String, usize> =
        [("agent:scaled".to_string(), 1), ("agent:scaled-fork".to_string(), 1)].into_iter().collect();
    assert_eq!(forked, expected, "channel.forked once on the source and once on the fork");
    drop(worker2);
}

/// The next JSON text frame within `wait`, skipping pings; `None` on timeout.
async fn next_json(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    wait: Duration,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return None,
            Ok(Some(Ok(Message::Text(t)))) => return Some(serde_json::from_str(t.as_str()).expect("a JSON frame")),
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
            Ok(other) => panic!("the WebSocket ended: {other:?}"),
        }
    }
}
