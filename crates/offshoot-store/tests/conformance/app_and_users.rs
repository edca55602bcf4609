//! The app row and its settings, users and bans, channel types.

use crate::support::{assert_kind, msg, user, user_input, with_store};
use offshoot_core::model::AppSettings;
use offshoot_core::ErrorKind;
use offshoot_store::UserInput;
use serde_json::{json, Map, Value};

fn custom(v: Value) -> Map<String, Value> {
    v.as_object().expect("an object").clone()
}

#[tokio::test]
async fn ensure_app_generates_a_key_pair_once_and_then_returns_it_unchanged() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let (key, secret, generated) = s.ensure_app(None, None).await.expect("ensure app");
        assert!(generated, "the first start generates the pair");
        assert_eq!(key.len(), 12);
        assert_eq!(secret.len(), 64);
        let again = s.ensure_app(None, None).await.expect("ensure app again");
        assert_eq!(again, (key.clone(), secret.clone(), false), "a later start returns the stored pair");
        // Only half a configured pair is not a replacement.
        let half = s.ensure_app(Some("other"), None).await.expect("ensure app with a key only");
        assert_eq!(half, (key, secret, false));
    })
    .await;
}

#[tokio::test]
async fn a_configured_key_pair_is_stored_on_first_start_and_replaces_the_stored_one_later() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let first = s.ensure_app(Some("key1"), Some("secret1")).await.expect("ensure app");
        assert_eq!(first, ("key1".to_string(), "secret1".to_string(), false), "a configured pair is not generated");
        let replaced = s.ensure_app(Some("key2"), Some("secret2")).await.expect("ensure app with a new pair");
        assert_eq!(replaced, ("key2".to_string(), "secret2".to_string(), false));
        let unconfigured = s.ensure_app(None, None).await.expect("ensure app without configuration");
        assert_eq!(unconfigured, ("key2".to_string(), "secret2".to_string(), false), "the replacement was stored");
    })
    .await;
}

#[tokio::test]
async fn app_settings_default_before_the_app_exists_and_round_trip_after() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let defaults = s.app_settings().await.expect("settings before the app row");
        assert!(defaults.fork_enabled);
        assert_eq!(defaults.webhook_dialect, "legacy");
        s.ensure_app(None, None).await.expect("ensure app");
        assert_eq!(s.app_settings().await.expect("settings"), AppSettings::default());

        let changed = AppSettings {
            fork_enabled: false,
            webhook_url: Some("http://127.0.0.1:9/hook".into()),
            webhook_events: vec!["message.new".into(), "channel.forked".into()],
            webhook_dialect: "v2".into(),
            revoke_tokens_issued_before: Some(1_700_000_000_000_000_000),
            extra: custom(json!({"reminders_interval": 60, "nested": {"a": [1, 2]}})),
            ..AppSettings::default()
        };
        let c2 = changed.clone();
        let stored = s
            .update_app_settings(|settings| {
                *settings = c2.clone();
                Ok(())
            })
            .await
            .expect("update settings");
        assert_eq!(stored, changed);
        assert_eq!(s.app_settings().await.expect("settings after update"), changed);
    })
    .await;
}

#[tokio::test]
async fn upserting_a_user_again_keeps_created_at_and_role_but_replaces_custom_data() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let first = UserInput {
            id: "ada".into(),
            role: Some("admin".into()),
            name: Some("Ada".into()),
            language: Some("en".into()),
            teams: Some(vec!["blue".into()]),
            custom: custom(json!({"color": "red", "age": 36})),
            ..Default::default()
        };
        let created = s.upsert_users(&[first]).await.expect("upsert").remove(0);
        assert_eq!(created.role, "admin");
        assert_eq!(created.custom, custom(json!({"color": "red", "age": 36})));

        let second = UserInput { id: "ada".into(), custom: custom(json!({"color": "green"})), ..Default::default() };
        let updated = s.upsert_users(&[second]).await.expect("upsert again").remove(0);
        let stored = s.get_user("ada").await.expect("get user").expect("exists");
        assert_eq!(stored, updated, "the returned user is what was stored");
        assert_eq!(stored.created_at, created.created_at, "created_at survives an upsert");
        assert!(stored.updated_at >= created.updated_at);
        assert_eq!(stored.role, "admin", "a role left out keeps its stored value");
        assert_eq!(stored.language.as_deref(), Some("en"));
        assert_eq!(stored.teams, vec!["blue".to_string()]);
        assert_eq!(stored.name, None, "the name is replaced, as Stream's upsert does");
        assert_eq!(stored.custom, custom(json!({"color": "green"})), "custom data is replaced, not merged");
        assert!(s.get_user("nobody").await.expect("get user").is_none());
    })
    .await;
}

#[tokio::test]
async fn a_partial_user_update_sets_and_unsets_known_fields_and_custom_keys() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let input = UserInput { id: "bo".into(), name: Some("Bo".into()), custom: custom(json!({"keep": 1, "drop": 2})), ..Default::default() };
        let before = s.upsert_users(&[input]).await.expect("upsert").remove(0);
        let set = custom(json!({"name": "Bo B.", "image": "http://img", "role": "admin", "teams": ["a", "b"], "mood": "ok", "banned": true, "created_at": 1}));
        let after = s.partial_update_user("bo", &set, &["drop".to_string(), "language".to_string()]).await.expect("partial update");
        assert_eq!(after.name.as_deref(), Some("Bo B."));
        assert_eq!(after.image.as_deref(), Some("http://img"));
        assert_eq!(after.role, "admin");
        assert_eq!(after.teams, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(after.custom, custom(json!({"keep": 1, "mood": "ok"})));
        assert!(!after.banned, "banned is not settable by a partial update");
        assert_eq!(after.created_at, before.created_at, "created_at is not settable by a partial update");
        assert_eq!(s.get_user("bo").await.expect("get").expect("exists"), after);

        let unset = s.partial_update_user("bo", &Map::new(), &["name".to_string(), "image".to_string(), "mood".to_string()]).await.expect("unset");
        assert_eq!(unset.name, None);
        assert_eq!(unset.image, None);
        assert_eq!(unset.custom, custom(json!({"keep": 1})));

        assert_kind(s.partial_update_user("ghost", &set, &[]).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn get_users_returns_the_known_ones_and_missing_users_names_the_rest_in_order() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        s.upsert_users(&[user_input("u1"), user_input("u2"), user_input("u3")]).await.expect("upsert");
        let ids: Vec<String> = ["u3", "x1", "u1", "u1", "x2"].iter().map(|s| s.to_string()).collect();
        let found = s.get_users(&ids).await.expect("get users");
        let mut keys: Vec<&String> = found.keys().collect();
        keys.sort();
        assert_eq!(keys, vec!["u1", "u3"]);
        assert_eq!(found["u3"].name.as_deref(), Some("u3 name"));
        assert_eq!(s.missing_users(&ids).await.expect("missing"), vec!["x1".to_string(), "x2".to_string()]);
        assert!(s.missing_users(&[]).await.expect("missing of none").is_empty());
        // More ids than one IN list chunk holds.
        let many: Vec<String> = (0..1_200).map(|i| format!("nobody{i}")).chain(["u2".to_string()]).collect();
        assert_eq!(s.get_users(&many).await.expect("many").len(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_shadow_ban_shadows_later_messages_and_a_ban_is_recorded_separately() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        crate::support::agent_channel(s, "bans", &["troll"]).await;
        s.set_ban("troll", true, true).await.expect("shadow ban");
        let u = s.get_user("troll").await.expect("get").expect("exists");
        assert!(u.shadow_banned && !u.banned);
        let m = s.send_message("agent:bans", &msg("t1", "hello"), &user("troll")).await.expect("send");
        assert!(m.shadowed, "a shadow-banned author's message is shadowed");

        s.set_ban("troll", false, true).await.expect("ban");
        s.set_ban("troll", true, false).await.expect("lift shadow ban");
        let u = s.get_user("troll").await.expect("get").expect("exists");
        assert!(u.banned && !u.shadow_banned);
        let m = s.send_message("agent:bans", &msg("t2", "hello again"), &user("troll")).await.expect("send");
        assert!(!m.shadowed);
        // An upsert does not lift bans.
        s.upsert_users(&[user_input("troll")]).await.expect("upsert");
        assert!(s.get_user("troll").await.expect("get").expect("exists").banned);

        assert_kind(s.set_ban("ghost", false, true).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn the_agent_and_messaging_channel_types_exist_with_a_5000_character_limit() {
    with_store(|ctx| async move {
        let types = ctx.store.channel_types().await.expect("channel types");
        let names: Vec<(&str, i64)> = types.iter().map(|t| (t.name.as_str(), t.max_message_length)).collect();
        assert_eq!(names, vec![("agent", 5000), ("messaging", 5000)]);
        assert!(ctx.store.channel_type("livestream").await.expect("channel type").is_none());
    })
    .await;
}

#[tokio::test]
async fn put_channel_type_creates_a_type_and_later_updates_its_limit_and_merges_its_config() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let created = s.put_channel_type("support", None, &custom(json!({"replies": true}))).await.expect("create type");
        assert_eq!(created.max_message_length, 5000, "the default limit");
        assert_eq!(s.channel_type("support").await.expect("get").expect("exists"), created);

        let updated = s.put_channel_type("support", Some(120), &custom(json!({"reactions": false}))).await.expect("update type");
        assert_eq!(updated.max_message_length, 120);
        assert_eq!(updated.extra, custom(json!({"replies": true, "reactions": false})));
        assert_eq!(updated.created_at, created.created_at);
        let kept = s.put_channel_type("support", None, &Map::new()).await.expect("update nothing");
        assert_eq!(kept.max_message_length, 120, "a limit left out keeps its value");
        assert_eq!(s.channel_type("support").await.expect("get").expect("exists"), kept);

        let agent = s.put_channel_type("agent", Some(10), &Map::new()).await.expect("lower agent limit");
        assert_eq!(agent.max_message_length, 10);
        assert_eq!(s.channel_types().await.expect("list").len(), 3);
    })
    .await;
}

/// Reads `read` until `done` holds for its result, for at most ten seconds.
async fn eventually<T, F, Fut>(what: &str, read: F, done: impl Fn(&T) -> bool) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let value = read().await;
        if done(&value) {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Settings and channel types are read from memory once cached, and a change reaches every
/// store: the changing one at once, another process's (on PostgreSQL, where several share the
/// database) through NOTIFY while its listener runs. Without the listener it reads the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_settings_and_channel_types_follow_changes_made_here_and_in_another_process() {
    use offshoot_store::{count_statements, Backend, Store};
    with_store(|ctx| async move {
        let s = &ctx.store;
        s.ensure_app(None, None).await.expect("app");
        s.app_settings().await.expect("settings");
        s.channel_type("agent").await.expect("type");
        if s.backend() == Backend::Sqlite {
            assert_eq!(count_statements(s.app_settings()).await.1, 0, "settings come from memory");
            assert_eq!(count_statements(s.channel_type("agent")).await.1, 0, "channel types come from memory");
        }
        s.update_app_settings(|a| {
            a.fork_enabled = false;
            Ok(())
        })
        .await
        .expect("change settings");
        assert!(!s.app_settings().await.expect("settings").fork_enabled, "the changing store sees its change");
        s.put_channel_type("agent", Some(77), &Map::new()).await.expect("change type");
        assert_eq!(s.channel_type("agent").await.expect("type").expect("agent").max_message_length, 77);
        if s.backend() != Backend::Postgres {
            return;
        }

        let other = Store::connect(&ctx.url).await.expect("a second store, as another process");
        assert!(count_statements(other.app_settings()).await.1 > 0, "without its listener the other store reads the database");
        let (stop, relay) = crate::support::spawn_relay(&other);
        eventually(
            "the other store never served the settings from memory (its listener did not start)",
            || async {
                other.app_settings().await.expect("settings");
                other.channel_type("agent").await.expect("type");
                (count_statements(other.app_settings()).await.1, count_statements(other.channel_type("agent")).await.1)
            },
            |n| *n == (0, 0),
        )
        .await;
        s.update_app_settings(|a| {
            a.fork_enabled = true;
            Ok(())
        })
        .await
        .expect("change settings again");
        s.put_channel_type("agent", Some(5000), &Map::new()).await.expect("change the type again");
        eventually(
            "the other store kept its cached settings after the change",
            || async { other.app_settings().await.expect("settings").fork_enabled },
            |enabled| *enabled,
        )
        .await;
        eventually(
            "the other store kept its cached channel type after the change",
            || async { other.channel_type("agent").await.expect("type").expect("agent").max_message_length },
            |n| *n == 5000,
        )
        .await;
        let _ = stop.send(());
        relay.await.expect("the relay stops");
        assert!(count_statements(other.app_settings()).await.1 > 0, "without its listener the other store reads the database again");
        other.close().await;
    })
    .await;
}

/// SQLite: a write that finds the database file locked by another connection (apalis's job
/// rows, another process) waits for it and then succeeds, instead of failing: the store's
/// writer connection has no busy handler and tries `BEGIN IMMEDIATE` again itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_another_connection_holding_the_sqlite_write_lock() {
    use sqlx::{Connection, Executor, SqliteConnection};
    with_store(|ctx| async move {
        if ctx.store.backend() != offshoot_store::Backend::Sqlite {
            return;
        }
        let mut other = SqliteConnection::connect(&ctx.url).await.expect("connect");
        other.execute("BEGIN IMMEDIATE").await.expect("take the write lock");
        let write = tokio::spawn({
            let store = ctx.store.clone();
            async move { store.upsert_users(&[user_input("while-locked")]).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        assert!(!write.is_finished(), "the write did not wait for the lock: {:?}", write.await);
        other.execute("COMMIT").await.expect("release the write lock");
        write.await.expect("join").expect("the write succeeds once the lock is free");
        assert!(ctx.store.get_user("while-locked").await.expect("read").is_some());
    })
    .await;
}
