//! The store conformance suite: every public `Store` method, run against the backend named by
//! `OFFSHOOT_TEST_BACKEND` (`sqlite`, the default: a fresh database file per test; `postgres`:
//! a fresh database per test on the server at `OFFSHOOT_TEST_PG_URL`).
//!
//! ```text
//! OFFSHOOT_TEST_BACKEND=sqlite   cargo test -p offshoot-store --test conformance
//! OFFSHOOT_TEST_BACKEND=postgres cargo test -p offshoot-store --test conformance -- --include-ignored
//! ```
//!
//! Tests that only mean something on PostgreSQL carry `#[ignore = "PostgreSQL only: …"]`
//! (reported as ignored on SQLite) and fail if run there (`support::require_postgres`).

#[path = "conformance/support.rs"]
mod support;

#[path = "conformance/app_and_users.rs"]
mod app_and_users;
#[path = "conformance/channels.rs"]
mod channels;
#[path = "conformance/dead_letters.rs"]
mod dead_letters;
#[path = "conformance/forks.rs"]
mod forks;
#[path = "conformance/lineage.rs"]
mod lineage;
#[path = "conformance/messages.rs"]
mod messages;
#[path = "conformance/outbox.rs"]
mod outbox;
#[path = "conformance/presence.rs"]
mod presence;
#[path = "conformance/rate_limits.rs"]
mod rate_limits;
#[path = "conformance/schema.rs"]
mod schema;

use offshoot_store::{Backend, Store};
use support::{test_backend, with_store, TestBackend, TestDb};

#[tokio::test]
async fn connect_migrates_a_fresh_database_and_a_second_connect_is_a_no_op() {
    let db = TestDb::new().await;
    let first = Store::connect(&db.url).await.expect("first connect migrates");
    let expected = match test_backend() {
        TestBackend::Sqlite => Backend::Sqlite,
        TestBackend::Postgres => Backend::Postgres,
    };
    assert_eq!(first.backend(), expected);
    assert_eq!(Backend::from_url(&db.url).expect("known scheme"), expected);
    first.ping().await.expect("ping");
    first.upsert_users(&[support::user_input("survivor")]).await.expect("upsert");
    first.close().await;

    // Running the migrations again finds them applied and keeps the data.
    let second = Store::connect(&db.url).await.expect("second connect finds the migrations applied");
    second.ping().await.expect("ping after reconnect");
    assert!(second.get_user("survivor").await.expect("get user").is_some(), "data written before the reconnect is still there");
    let agent = second.channel_type("agent").await.expect("channel type").expect("seeded agent type");
    assert_eq!(agent.max_message_length, 5000, "the seed rows were not inserted twice or changed");
    second.close().await;
    db.remove().await;
}

#[tokio::test]
async fn ping_answers_on_a_fresh_store_and_backend_names_are_stable() {
    with_store(|ctx| async move {
        ctx.store.ping().await.expect("ping");
        assert_eq!(Backend::Sqlite.name(), "sqlite");
        assert_eq!(Backend::Postgres.name(), "postgres");
        assert_eq!(Backend::from_url("postgresql://x/y").expect("postgresql"), Backend::Postgres);
        assert_eq!(Backend::from_url("sqlite::memory:").expect("sqlite"), Backend::Sqlite);
        assert_eq!(Backend::from_url(&ctx.url).expect("the test url"), ctx.store.backend());
        for bad in ["mysql://x/y", "offshoot.db", "postgre://x/y", ""] {
            let e = Backend::from_url(bad).expect_err("an unknown scheme is refused, not taken for SQLite");
            assert!(e.to_string().contains("not supported"), "{bad}: {e}");
        }
    })
    .await;
}
