//! Presence and watcher records (`presence.rs`): who is online, who watches, the events of the
//! first connection / last close and first watch / last unwatch, dead instances swept, and
//! concurrent connections of one user on separate stores (as separate ws processes) deciding
//! "first" and "last" exactly once.

use crate::support::{agent_channel, events_since, kinds, race, with_store};
use offshoot_core::model::OutboxEvent;

fn of_kind<'a>(events: &'a [OutboxEvent], kind: &str) -> Vec<&'a OutboxEvent> {
    events.iter().filter(|e| e.event.kind == kind).collect()
}

#[tokio::test]
async fn a_connected_user_is_online_and_the_first_connection_and_last_close_are_announced_to_presence_watchers() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "pr", &["amy", "ben", "cat"]).await;
        s.register_instance("i1").await.expect("instance");
        // ben watches with presence, cat without.
        assert!(s.open_connection("i1", "ben-c", "ben").await.expect("open").is_some());
        assert!(s.watch_channel("ben-c", Some("ben"), &ch.cid, true).await.expect("watch"));
        s.open_connection("i1", "cat-c", "cat").await.expect("open");
        assert!(s.watch_channel("cat-c", Some("cat"), &ch.cid, false).await.expect("watch"));
        assert!(!s.watch_channel("cat-c", Some("ben"), &ch.cid, true).await.expect("watch"), "not ben's connection");
        assert!(!s.watch_channel("nope", None, &ch.cid, true).await.expect("watch"), "no such connection");
        let seq = s.last_event_seq().await.expect("seq");

        let amy = s.open_connection("i1", "amy-1", "amy").await.expect("open").expect("amy exists");
        assert!(amy.online && amy.last_active.is_some(), "{amy:?}");
        assert!(s.get_user("amy").await.expect("get").expect("amy").online);
        s.open_connection("i1", "amy-2", "amy").await.expect("second connection");
        s.close_connection("amy-1").await.expect("close first");
        assert!(s.get_user("amy").await.expect("get").expect("amy").online, "one connection left");
        s.close_connection("amy-2").await.expect("close last");
        s.close_connection("amy-2").await.expect("closing twice is harmless");
        assert!(!s.get_user("amy").await.expect("get").expect("amy").online);

        let events = events_since(s, seq).await;
        let presence = of_kind(&events, "user.presence.changed");
        assert_eq!(presence.len(), 2, "{:?}", kinds(&events));
        let online: Vec<bool> = presence.iter().map(|e| e.event.user.as_ref().expect("user").online).collect();
        assert_eq!(online, [true, false]);
        for e in &presence {
            assert_eq!(e.audience.connections, ["ben-c"], "only the watcher that asked for presence");
            assert!(!e.audience.webhooks);
        }
    })
    .await;
}

#[tokio::test]
async fn invisible_users_are_offline_and_announce_nothing() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "inv", &["amy", "ben"]).await;
        s.partial_update_users(&[offshoot_store::UserPatch {
            id: "amy".into(),
            set: serde_json::json!({"invisible": true}).as_object().cloned().unwrap_or_default(),
            unset: vec![],
        }])
        .await
        .expect("make amy invisible");
        s.open_connection("i1", "ben-c", "ben").await.expect("open");
        s.watch_channel("ben-c", None, &ch.cid, true).await.expect("watch");
        let seq = s.last_event_seq().await.expect("seq");
        let amy = s.open_connection("i1", "amy-c", "amy").await.expect("open").expect("amy");
        assert!(!amy.online, "invisible users appear offline");
        s.close_connection("amy-c").await.expect("close");
        assert!(of_kind(&events_since(s, seq).await, "user.presence.changed").is_empty());
    })
    .await;
}

#[tokio::test]
async fn watchers_are_counted_by_user_listed_and_announced_on_first_watch_and_last_unwatch() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "wa", &["amy", "ben"]).await;
        let cid = ch.cid.clone();
        for (c, u) in [("amy-1", "amy"), ("amy-2", "amy"), ("ben-1", "ben")] {
            s.open_connection("i1", c, u).await.expect("open");
        }
        let seq = s.last_event_seq().await.expect("seq");
        for c in ["amy-1", "amy-2", "ben-1"] {
            assert!(s.watch_channel(c, None, &cid, false).await.expect("watch"));
        }
        s.watch_channel("amy-1", None, &cid, false).await.expect("watching again changes nothing");
        assert_eq!(s.watcher_count(&cid).await.expect("count"), 2, "distinct users");
        assert_eq!(s.watcher_counts(&[cid.clone(), "agent:none".into()]).await.expect("counts").get(&cid), Some(&2));
        let ids: Vec<String> = s.watchers(&cid, 10, 0).await.expect("watchers").into_iter().map(|u| u.id).collect();
        assert_eq!(ids, ["amy", "ben"]);
        let ids: Vec<String> = s.watchers(&cid, 1, 1).await.expect("watchers").into_iter().map(|u| u.id).collect();
        assert_eq!(ids, ["ben"]);

        s.unwatch_channel("amy-1", Some("amy"), &cid).await.expect("unwatch one of amy's");
        s.close_connection("amy-2").await.expect("close amy's other");
        s.unwatch_channel("ben-1", Some("amy"), &cid).await.expect("not amy's: left alone");
        assert_eq!(s.watcher_count(&cid).await.expect("count"), 1);
        let events = events_since(s, seq).await;
        let watching: Vec<(String, String, i64)> = events
            .iter()
            .filter(|e| e.event.kind.starts_with("user.watching."))
            .map(|e| {
                let count = e.event.extra.get("watcher_count").and_then(|v| v.as_i64()).expect("watcher_count");
                (e.event.kind.clone(), e.event.user.as_ref().expect("user").id.clone(), count)
            })
            .collect();
        assert_eq!(
            watching,
            [
                ("user.watching.start".to_string(), "amy".to_string(), 1),
                ("user.watching.start".to_string(), "ben".to_string(), 2),
                ("user.watching.stop".to_string(), "amy".to_string(), 1),
            ]
        );
        for e in events.iter().filter(|e| e.event.kind.starts_with("user.watching.")) {
            assert_eq!(e.audience.watchers_of.as_deref(), Some(cid.as_str()));
        }
    })
    .await;
}

#[tokio::test]
async fn a_dead_instance_is_swept_and_its_users_announced_offline() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "dead", &["amy", "ben"]).await;
        s.register_instance("live").await.expect("live");
        s.register_instance("dead").await.expect("dead");
        s.open_connection("live", "ben-c", "ben").await.expect("open");
        s.watch_channel("ben-c", None, &ch.cid, true).await.expect("watch");
        s.open_connection("dead", "amy-c", "amy").await.expect("open");
        s.watch_channel("amy-c", None, &ch.cid, false).await.expect("watch");
        let seq = s.last_event_seq().await.expect("seq");
        let now = offshoot_core::time::now();
        assert_eq!(s.dead_instances("live", now + 1).await.expect("dead"), ["dead"]);
        assert!(s.dead_instances("live", now - 60_000_000_000).await.expect("dead").is_empty(), "both beat just now");
        s.sweep_instance("dead").await.expect("sweep");
        assert!(!s.beat_instance("dead").await.expect("beat"), "a swept instance learns it was taken for dead");
        assert!(s.beat_instance("live").await.expect("beat"));
        assert!(!s.get_user("amy").await.expect("get").expect("amy").online);
        assert_eq!(s.watcher_count(&ch.cid).await.expect("count"), 1);
        assert_eq!(kinds(&events_since(s, seq).await), ["user.watching.stop", "user.presence.changed"]);
        assert!(s.instance_connections("dead").await.expect("conns").is_empty());
        assert_eq!(s.instance_connections("live").await.expect("conns"), ["ben-c"]);
    })
    .await;
}

#[tokio::test]
async fn concurrent_connections_and_closes_of_one_user_announce_online_once_and_offline_once() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "race", &["amy", "ben"]).await;
        let cid = ch.cid.clone();
        s.open_connection("i0", "ben-c", "ben").await.expect("open");
        s.watch_channel("ben-c", None, &cid, true).await.expect("watch");
        let seq = s.last_event_seq().await.expect("seq");
        const N: usize = 6;
        let cid2 = cid.clone();
        let opened = race(&ctx.url, N, move |store, i| {
            let cid = cid2.clone();
            async move {
                let conn = format!("amy-{i}");
                store.open_connection(&format!("i{i}"), &conn, "amy").await?;
                store.watch_channel(&conn, Some("amy"), &cid, false).await
            }
        })
        .await;
        assert!(opened.iter().all(|r| matches!(r, Ok(true))), "{opened:?}");
        assert_eq!(s.watcher_count(&cid).await.expect("count"), 2);
        let closed = race(&ctx.url, N, |store, i| async move { store.close_connection(&format!("amy-{i}")).await }).await;
        assert!(closed.iter().all(Result::is_ok), "{closed:?}");

        let events = events_since(s, seq).await;
        let presence: Vec<bool> =
            of_kind(&events, "user.presence.changed").iter().map(|e| e.event.user.as_ref().expect("user").online).collect();
        assert_eq!(presence, [true, false], "{:?}", kinds(&events));
        assert_eq!(of_kind(&events, "user.watching.start").len(), 1, "{:?}", kinds(&events));
        assert_eq!(of_kind(&events, "user.watching.stop").len(), 1, "{:?}", kinds(&events));
        assert_eq!(s.watcher_count(&cid).await.expect("count"), 1);
        assert!(!s.get_user("amy").await.expect("get").expect("amy").online);
    })
    .await;
}

#[tokio::test]
async fn a_connection_of_a_user_without_a_record_watches_but_has_no_presence() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "anon", &["amy"]).await;
        assert!(s.open_connection("i1", "anon-c", "anon-1").await.expect("open").is_none(), "no user record");
        assert!(s.watch_channel("anon-c", None, &ch.cid, true).await.expect("watch"));
        assert_eq!(s.watcher_count(&ch.cid).await.expect("count"), 1);
        let listed = s.watchers(&ch.cid, 10, 0).await.expect("watchers");
        assert_eq!((listed[0].id.as_str(), listed[0].role.as_str()), ("anon-1", "anonymous"));
        let seq = s.last_event_seq().await.expect("seq");
        s.close_connection("anon-c").await.expect("close");
        assert_eq!(kinds(&events_since(s, seq).await), ["user.watching.stop"]);
        assert_eq!(s.watcher_count(&ch.cid).await.expect("count"), 0);
    })
    .await;
}
