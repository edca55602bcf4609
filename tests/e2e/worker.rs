//! The worker on apalis: failing backfills end `failed` after their attempts, several worker
//! processes split the backfills and take over from one that is killed, job counts.

use crate::helpers::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

/// Runs SQL against the test's database (to inject faults, to look at apalis's tables).
pub(crate) async fn execute(db: &TestDb, sql: &str) {
    use sqlx::Connection;
    match backend() {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.expect("open the SQLite database");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            let _ = c.close().await;
        }
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.expect("open the PostgreSQL database");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            let _ = c.close().await;
        }
    }
}

/// Makes every insert of a copy into `fork_cid` of a message created before `before_ns` fail,
/// as a database fault would.
pub(crate) async fn inject_copy_fault(db: &TestDb, fork_cid: &str, before_ns: i64) {
    let sql = match backend() {
        Backend::Sqlite => format!(
            "CREATE TRIGGER injected_fault BEFORE INSERT ON message WHEN NEW.cid = '{fork_cid}' AND NEW.created_at < {before_ns} \
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"
        ),
        Backend::Postgres => format!(
            "CREATE FUNCTION injected_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.cid = '{fork_cid}' AND NEW.created_at < {before_ns} THEN RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER injected_fault BEFORE INSERT ON message FOR EACH ROW EXECUTE FUNCTION injected_fault();"
        ),
    };
    execute(db, &sql).await;
}

/// Removes what [`inject_copy_fault`] added.
pub(crate) async fn remove_copy_fault(db: &TestDb) {
    let sql = match backend() {
        Backend::Sqlite => "DROP TRIGGER injected_fault;",
        Backend::Postgres => "DROP TRIGGER injected_fault ON message; DROP FUNCTION injected_fault();",
    };
    execute(db, sql).await;
}

/// A backfill job's row in apalis's table: its id, status and the worker holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobRow {
    pub id: String,
    pub status: String,
    pub lock_by: Option<String>,
}

/// Every backfill job's row in apalis's table, by id.
pub(crate) async fn backfill_jobs(db: &TestDb) -> Vec<JobRow> {
    use sqlx::Connection;
    let rows: Vec<(String, String, Option<String>)> = match backend() {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.expect("open the SQLite database");
            let rows = sqlx::query_as("SELECT id, status, lock_by FROM Jobs WHERE job_type = 'offshoot.backfill' ORDER BY id")
                .fetch_all(&mut c)
                .await
                .expect("read Jobs");
            let _ = c.close().await;
            rows
        }
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.expect("open the PostgreSQL database");
            let rows = sqlx::query_as("SELECT id, status, lock_by FROM apalis.jobs WHERE job_type = 'offshoot.backfill' ORDER BY id")
                .fetch_all(&mut c)
                .await
                .expect("read apalis.jobs");
            let _ = c.close().await;
            rows
        }
    };
    rows.into_iter().map(|(id, status, lock_by)| JobRow { id, status, lock_by }).collect()
}

/// Waits (bounded) until exactly one backfill job is running; returns its row.
pub(crate) async fn wait_one_running_backfill(db: &TestDb) -> JobRow {
    let deadline = Instant::now() + WAIT;
    loop {
        let jobs = backfill_jobs(db).await;
        let running: Vec<&JobRow> = jobs.iter().filter(|j| j.status == "Running").collect();
        if let [job] = running.as_slice() {
            if job.lock_by.is_some() {
                return (*job).clone();
            }
        }
        assert!(Instant::now() < deadline, "no backfill job running within {WAIT:?}: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn queue<'a>(counts: &'a Value, name: &str) -> &'a Value {
    counts["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["queue"] == json!(name)))
        .unwrap_or_else(|| panic!("no queue {name}: {counts}"))
}

#[tokio::test]
async fn a_backfill_that_keeps_failing_ends_failed_after_its_attempts_and_keeps_what_it_copied() {
    let app = TestApp::spawn_with(|c| {
        c.worker.backfill.max_attempts = 3;
        c.worker.backfill.backoff_base = Duration::from_millis(400);
    })
    .await;
    app.users(&["u1"]).await;
    app.channel("agent:faulty", "u1", &["u1"]).await;
    let start = past_ns();
    let m = app.seed("agent:faulty", "u1", "faulty", 150, start, 8).await;
    // The newest page (the newest 100) is copied by the request; the 50 older ones fail.
    inject_copy_fault(&app.db, "agent:faulty-fork", start + 50 * 1_000_000).await;

    let started = Instant::now();
    let r = app.fork("agent:faulty", &m[149], "faulty-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    let task_id = r["fork"]["task_id"].as_str().expect("a task id").to_string();
    let done = app.wait_fork_finished("agent:faulty-fork").await;

    assert_eq!(done["status"], json!("failed"), "{done}");
    assert_eq!(done["failed_reason"], json!("backfill_error"), "{done}");
    assert_eq!(done["copied_message_count"], json!(100), "a failed fork keeps the newest page it copied: {done}");
    // Three attempts with back-off in between (at least half of 400 ms, then of 800 ms).
    assert!(started.elapsed() >= Duration::from_millis(600), "the attempts were spaced by back-off: {:?}", started.elapsed());
    assert_eq!(app.all_messages("agent:faulty-fork").await.len(), 100);
    let task = app.get(&format!("/tasks/{task_id}"), &app.server()).await.ok();
    assert_eq!(task["status"], json!("failed"), "{task}");
    assert_eq!(task["error"]["type"], json!("backfill_error"), "{task}");
    let counts = app.get("/jobs", &app.server()).await.ok();
    assert_eq!(queue(&counts, "offshoot.backfill")["dead_lettered"], json!(1), "{counts}");
    assert_eq!(queue(&counts, "offshoot.backfill")["queued"], json!(0), "nothing is left to retry: {counts}");
}

/// A fork queued by the API is started by the worker at once, not at its next poll: on
/// PostgreSQL LISTEN/NOTIFY wakes it, on SQLite the pushing process wakes its own worker
/// (`queue::Wake`). With the poll, apalis's heartbeat (which also fetches) and the reconciler
/// an hour apart, only the wake-up can start the backfill.
#[tokio::test]
async fn a_queued_backfill_starts_at_once_even_when_the_worker_polls_only_hourly() {
    let app = TestApp::spawn_with(|c| {
        c.worker_poll_interval = Duration::from_secs(3600);
        c.worker.heartbeat = Duration::from_secs(3600);
        c.worker.reconcile_interval = Duration::from_secs(3600);
    })
    .await;
    app.users(&["u1"]).await;
    app.channel("agent:woken", "u1", &["u1"]).await;
    let m = app.seed("agent:woken", "u1", "woken", 150, past_ns(), 8).await;
    // A first fork's job may be found by the worker's first poll (at its start) or by a
    // wake-up; either way, once that job has run the first poll is past (a job starts only
    // from a fetch, and the first fetch is the first poll), so only wake-ups are left for the
    // forks after it.
    let r = app.fork("agent:woken", &m[149], "woken-first").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    assert_eq!(app.wait_fork_finished("agent:woken-first").await["status"], json!("completed"));
    // One after the other: each fork's job is pushed right after the last one finished, while
    // the worker may be fetching again (the race `queue::Wake` has to survive).
    for i in 0..5 {
        let r = app.fork("agent:woken", &m[149], &format!("woken-fork-{i}")).await.ok();
        assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
        let done = app.wait_fork_finished_within(&format!("agent:woken-fork-{i}"), Duration::from_secs(60)).await;
        assert_eq!(done["status"], json!("completed"), "{done}");
        assert_eq!(done["copied_message_count"], json!(150), "{done}");
    }
}

/// Makes the queue's table say that a live worker took every backfill job, while no worker runs
/// them: the state a task lost inside a worker leaves behind (its worker keeps its heartbeat,
/// so apalis never hands the job to anyone else). The "worker" is seen in a day's time.
async fn hand_backfill_jobs_to_a_ghost(db: &TestDb) {
    let sql = match backend() {
        Backend::Sqlite => {
            "INSERT INTO Workers (id, worker_type, storage_name, layers, last_seen, started_at) \
             VALUES ('ghost', 'offshoot.backfill', 'SqliteStorage', '', strftime('%s', 'now') + 86400, strftime('%s', 'now')); \
             UPDATE Jobs SET status = 'Running', lock_by = 'ghost', lock_at = strftime('%s', 'now'), \
             run_at = strftime('%s', 'now') WHERE job_type = 'offshoot.backfill';"
        }
        Backend::Postgres => {
            "INSERT INTO apalis.workers (id, worker_type, storage_name, layers, last_seen, started_at) \
             VALUES ('ghost', 'offshoot.backfill', 'PostgresStorage', '', now() + interval '1 day', now()); \
             UPDATE apalis.jobs SET status = 'Running', lock_by = 'ghost', lock_at = now(), run_at = now() \
             WHERE job_type = 'offshoot.backfill';"
        }
    };
    execute(db, sql).await;
}

/// Puts every backfill job out of the workers' reach for a day (due then).
async fn postpone_backfill_jobs(db: &TestDb) {
    let sql = match backend() {
        Backend::Sqlite => "UPDATE Jobs SET run_at = strftime('%s', 'now') + 86400 WHERE job_type = 'offshoot.backfill';",
        Backend::Postgres => "UPDATE apalis.jobs SET run_at = now() + interval '1 day' WHERE job_type = 'offshoot.backfill';",
    };
    execute(db, sql).await;
}

#[tokio::test]
async fn a_backfill_whose_job_the_queue_holds_but_no_worker_runs_is_queued_again_and_finishes() {
    let app = TestApp::spawn_without_worker().await;
    app.users(&["u1"]).await;
    app.channel("agent:held", "u1", &["u1"]).await;
    let m = app.seed("agent:held", "u1", "held", 250, past_ns(), 8).await;
    let r = app.fork("agent:held", &m[249], "held-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    // The ghost takes the job once the worker is up: on SQLite a starting worker takes back
    // every job a previous run left running (the ghost's too), and the job stays out of the
    // worker's reach until the ghost has it.
    postpone_backfill_jobs(&app.db).await;
    let _worker = TestApp::spawn_on(app.db.clone(), |c| {
        c.roles = offshoot::Roles { api: false, ws: false, worker: true };
        c.worker.reconcile_interval = Duration::from_millis(500);
        c.worker.stall_after = Duration::from_secs(2);
    })
    .await;
    hand_backfill_jobs_to_a_ghost(&app.db).await;
    let counts = app.get("/jobs", &app.server()).await.ok();
    assert_eq!(queue(&counts, "offshoot.backfill")["running"], json!(1), "the ghost holds the fork's job: {counts}");
    let done = app.wait_fork_finished("agent:held-fork").await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(250), "{done}");
    assert_eq!(app.all_messages("agent:held-fork").await.len(), 250, "every message copied once");
    // The worker's own job counts as running until apalis has recorded its end, which it does
    // after the fork's last page has committed: wait for that, boundedly.
    let deadline = Instant::now() + Duration::from_secs(15);
    let counts = loop {
        let counts = app.get("/jobs", &app.server()).await.ok();
        if queue(&counts, "offshoot.backfill")["running"] == json!(1) || Instant::now() >= deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        queue(&counts, "offshoot.backfill")["running"],
        json!(1),
        "the ghost's job is still held; another job did the work: {counts}"
    );
}

#[tokio::test]
async fn job_counts_are_server_side_only() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.get("/jobs", &app.user("u1")).await.err(403, 17);
    let counts = app.get("/jobs", &app.server()).await.ok();
    for name in ["offshoot.backfill", "offshoot.webhook"] {
        let q = queue(&counts, name);
        for state in ["queued", "running", "retrying", "failed", "dead_lettered"] {
            assert!(q[state].is_i64(), "{name}.{state}: {counts}");
        }
    }
}

/// Distinct workers holding a running backfill job (PostgreSQL).
async fn busy_backfill_workers(db: &TestDb) -> HashSet<String> {
    use sqlx::{Connection, Row};
    let mut c = sqlx::PgConnection::connect(&db.url).await.expect("open the PostgreSQL database");
    let rows = sqlx::query("SELECT DISTINCT lock_by FROM apalis.jobs WHERE job_type = 'offshoot.backfill' AND status = 'Running'")
        .fetch_all(&mut c)
        .await
        .expect("read apalis.jobs");
    let _ = c.close().await;
    rows.iter().filter_map(|r| r.try_get::<Option<String>, _>("lock_by").ok().flatten()).collect()
}

#[tokio::test]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn on_postgres_two_workers_split_eight_forks_and_when_one_is_killed_the_other_finishes_them() {
    require_postgres("several worker processes on one database");
    let db = TestDb::create().await;
    let env = [
        ("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"),
        ("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "150"),
        ("OFFSHOOT_WORKER_HEARTBEAT_SECS", "2"),
        ("OFFSHOOT_WORKER_POLL_MS", "200"),
    ];
    let first = ServerProcess::start(&db, &env).await;
    let mut second = ServerProcess::start(&db, &[env.as_slice(), &[("OFFSHOOT_ROLES", "worker")]].concat()).await;
    first.users(&["u1"]).await;
    first.channel("agent:many", "u1", &["u1"]).await;
    let m = first.seed("agent:many", "u1", "many", 300, past_ns(), 8).await;

    let forks: Vec<String> = (0..8).map(|i| format!("many-fork-{i}")).collect();
    for f in &forks {
        let r = first.fork("agent:many", &m[299], f).await.ok();
        assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    }
    // Both processes take backfills (each runs 4 at a time).
    let deadline = Instant::now() + WAIT;
    loop {
        let busy = busy_backfill_workers(&db).await;
        if busy.len() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the two workers never ran backfills at the same time: {busy:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    second.kill();

    for f in &forks {
        let cid = format!("agent:{f}");
        let done = first.wait_fork_finished(&cid).await;
        assert_eq!(done["status"], json!("completed"), "{done}");
        assert_eq!(done["copied_message_count"], json!(300), "{done}");
        let all: Vec<String> = first.all_messages(&cid).await.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect();
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len(), "no copy twice in {cid}");
        let expected: Vec<String> = m.iter().map(|s| copy_id(&cid, s)).collect();
        assert_eq!(all, expected, "every message of {cid} exactly once, in order");
    }
}

/// On PostgreSQL a worker process that starts leaves the jobs of the live ones alone (they may
/// be running them), and a worker that dies has its jobs taken over by a live one by heartbeat
/// (`OFFSHOOT_WORKER_HEARTBEAT_SECS`): the dead worker's own job is put back in the queue and
/// run by the live worker, and the fork finishes with every message copied once. The job's row
/// tells the takeover apart from the reconciler, which would queue a new job instead (after
/// 60 s without a page).
#[tokio::test]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn on_postgres_a_starting_worker_leaves_live_jobs_alone_and_a_dead_workers_fork_is_taken_over_by_heartbeat() {
    require_postgres("several worker processes on one database");
    let db = TestDb::create().await;
    let heartbeat = ("OFFSHOOT_WORKER_HEARTBEAT_SECS", "2");
    // The first process copies a page, then pauses a minute: its job is running when it dies.
    let mut first =
        ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"), ("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "60000"), heartbeat]).await;
    first.users(&["u1"]).await;
    first.channel("agent:taken", "u1", &["u1"]).await;
    let m = first.seed("agent:taken", "u1", "taken", 300, past_ns(), 8).await;
    let fc = "agent:taken-fork";
    let r = first.fork("agent:taken", &m[299], "taken-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    let held = wait_one_running_backfill(&db).await;

    // Every role: its API answers once the fork's first process is gone.
    let second = ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"), heartbeat]).await;
    let now = backfill_jobs(&db).await;
    assert!(now.contains(&held), "the second process is up (its start-up is done) and the first still holds its job: {now:?}");

    first.kill();
    let killed = std::time::Instant::now();
    let done = second.wait_fork_finished(fc).await;
    eprintln!("figure: the fork of a worker killed mid-backfill finished {:?} after the kill", killed.elapsed());
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(300), "{done}");
    let all: Vec<String> = second.all_messages(fc).await.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect();
    assert_eq!(all, m.iter().map(|s| copy_id(fc, s)).collect::<Vec<_>>(), "every message exactly once, in order");
    let after = backfill_jobs(&db).await;
    let same = after.iter().find(|j| j.id == held.id).unwrap_or_else(|| panic!("the first job's row is gone: {after:?}"));
    assert_ne!(same.lock_by, held.lock_by, "the dead worker's job went to the live worker: {after:?}");
    assert_eq!(after.len(), 1, "no other job was queued for the fork: {after:?}");
}
