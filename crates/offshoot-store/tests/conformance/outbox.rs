//! The transactional outbox: the events each change writes, reading them in order, consumer
//! cursors and client events.

use crate::support::{agent_channel, events_since, kinds, member, msg, require_postgres, user, watchers_and_hooks, with_store};
use offshoot_core::model::{Audience, Event, Reaction};
use offshoot_core::time;
use offshoot_store::{ChannelUpdate, Store};
use serde_json::{json, Map};
use std::time::Duration;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn custom_event(kind: &str, n: i64) -> Event {
    let mut extra = Map::new();
    extra.insert("n".into(), json!(n));
    Event { kind: kind.into(), cid: Some("agent:x".into()), extra, created_at: time::now(), ..Default::default() }
}

async fn publish_n(s: &Store, n: i64) {
    for i in 0..n {
        s.publish(custom_event("custom.ping", i), watchers_and_hooks("agent:x")).await.expect("publish");
    }
}

#[tokio::test]
async fn every_change_writes_its_events_to_the_outbox_in_order() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        assert_eq!(s.last_event_seq().await.expect("seq"), 0, "a fresh outbox is empty");
        let ch = agent_channel(s, "ob", &["amy"]).await;
        let cid = ch.cid.clone();
        s.send_message(&cid, &msg("m", "hello"), &user("amy")).await.expect("send");
        s.update_message("m", &user("amy"), |m| {
            m.text = "hello!".into();
            Ok(())
        })
        .await
        .expect("edit");
        s.add_reaction("m", &Reaction { kind: "like".into(), score: 1, ..Default::default() }, false, &user("amy")).await.expect("react");
        s.remove_reaction("m", "like", &user("amy")).await.expect("unreact");
        s.delete_message("m", false, Some(&user("amy"))).await.expect("delete message");
        s.update_channel(&cid, &ChannelUpdate { custom: Some(Map::new()), ..Default::default() }, None).await.expect("update channel");
        s.partial_update_channel(&cid, &Map::new(), &[], None).await.expect("partial update channel");
        s.truncate_channel(&cid, None, false, None, None).await.expect("truncate");
        s.mark_read(&cid, &user("amy"), None).await.expect("read");
        s.add_members(&cid, &[member("ben")], None).await.expect("add member");
        s.remove_members(&cid, &strings(&["amy"]), None).await.expect("remove member");
        s.delete_channel(&cid, false, None).await.expect("delete channel");

        let events = events_since(s, 0).await;
        assert_eq!(
            kinds(&events),
            strings(&[
                "channel.created",
                "member.added",
                "notification.added_to_channel",
                "message.new",
                "notification.message_new",
                "message.updated",
                "reaction.new",
                "reaction.deleted",
                "message.deleted",
                "channel.updated",
                "channel.updated",
                "channel.truncated",
                "message.read",
                "notification.mark_read",
                "member.added",
                "notification.added_to_channel",
                "member.removed",
                "notification.removed_from_channel",
                "channel.deleted",
            ])
        );
        // A send's notification is stored in its event's row and shares its `seq`.
        let shared =
            |w: &[offshoot_core::model::OutboxEvent]| w[1].event.kind == "notification.message_new" && w[0].event.kind == "message.new";
        assert!(events.windows(2).all(|w| w[0].seq < w[1].seq || (w[0].seq == w[1].seq && shared(w))), "seq ascends");
        assert_eq!(s.last_event_seq().await.expect("seq"), events.last().expect("events").seq);
        assert!(events.iter().all(|e| e.event.cid.as_deref() == Some(cid.as_str())), "every event names its channel");
        for e in &events {
            if e.event.kind == "message.new" || e.event.kind == "notification.message_new" {
                // Each member's unread counters ride along; the notification skips watchers.
                let mut unread = std::collections::BTreeMap::new();
                unread.insert("amy".to_string(), offshoot_store::UnreadCounts::default());
                let expected = match e.event.kind.as_str() {
                    "message.new" => Audience { unread, ..watchers_and_hooks(&cid) },
                    _ => Audience { users: strings(&["amy"]), except_watchers_of: Some(cid.clone()), unread, ..Default::default() },
                };
                assert_eq!(e.audience, expected, "{}", e.event.kind);
            } else if e.event.kind.starts_with("notification.") {
                // Membership notifications go to the member, mark_read to the reader.
                let to = match &e.event.member {
                    Some(m) => m.user_id.clone(),
                    None => e.event.user.as_ref().expect("a notification names its user").id.clone(),
                };
                assert_eq!(
                    e.audience,
                    Audience { watchers_of: None, users: vec![to], webhooks: false, ..Default::default() },
                    "{}",
                    e.event.kind
                );
            } else {
                assert_eq!(e.audience, watchers_and_hooks(&cid), "{}", e.event.kind);
            }
        }
        let by_kind = |k: &str| events.iter().find(|e| e.event.kind == k).expect("event present").event.clone();
        assert_eq!(by_kind("channel.created").channel.map(|c| c.cid), Some(cid.clone()));
        assert_eq!(by_kind("member.added").member.map(|m| m.user_id), Some("amy".to_string()));
        assert_eq!(by_kind("message.new").message.map(|m| m.text), Some("hello".to_string()));
        assert_eq!(by_kind("message.updated").message.map(|m| m.text), Some("hello!".to_string()));
        assert_eq!(by_kind("reaction.new").reaction.map(|r| r.kind), Some("like".to_string()));
        let unreacted = by_kind("reaction.deleted");
        assert_eq!(unreacted.reaction.map(|r| (r.kind, r.user_id, r.score)), Some(("like".to_string(), "amy".to_string(), 1)));
        assert_eq!(
            by_kind("reaction.new").message.map(|m| m.reaction_counts),
            Some(json!({"like": 1}).as_object().cloned().expect("object"))
        );
        assert_eq!(
            unreacted.message.map(|m| m.reaction_counts),
            Some(Map::new()),
            "reaction.deleted carries the message without the reaction"
        );
        let deleted = by_kind("message.deleted");
        assert_eq!((deleted.hard_delete, deleted.message.map(|m| m.kind)), (Some(false), Some("deleted".to_string())));
        assert!(by_kind("channel.truncated").channel.and_then(|c| c.truncated_at).is_some());
        assert_eq!(by_kind("member.removed").member.map(|m| m.user_id), Some("amy".to_string()));
        assert!(by_kind("channel.deleted").channel.and_then(|c| c.deleted_at).is_some());
    })
    .await;
}

/// A send's `notification.message_new` is stored in the row of its `message.new` (one row a
/// send, not two, each with the message): it is read back as both events with the row's `seq`,
/// never split between two reads, the same from memory and from the table, and is the
/// `message.new` with the channel, without the channel's watcher count, to the members who do
/// not watch it. A notification that no longer decodes is left out, its event is not.
#[tokio::test]
async fn a_sends_notification_is_stored_in_its_events_row_and_read_back_with_it() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "noted", &["amy", "ben"]).await;
        let before = s.last_event_seq().await.expect("seq");
        s.send_message(&ch.cid, &msg("noted-1", "hello"), &user("amy")).await.expect("send");
        let pool = sqlx::AnyPool::connect(&ctx.url).await.expect("connect");
        let rows: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM event WHERE seq > $1").bind(before).fetch_one(&pool).await.expect("count rows");
        assert_eq!(rows, 1, "one outbox row for the send");

        let events = s.events_after(before, 1).await.expect("events");
        assert_eq!(kinds(&events.iter().map(|e| (**e).clone()).collect::<Vec<_>>()), strings(&["message.new", "notification.message_new"]));
        assert_eq!(events[0].seq, events[1].seq, "both carry the row's seq");
        assert!(s.events_after(events[0].seq, 10).await.expect("events").is_empty(), "the next read starts after the row");
        let (new, note) = (&events[0].event, &events[1].event);
        assert!(new.extra.contains_key("watcher_count"), "the channel's watchers hear the watcher count");
        let mut expected = new.clone();
        expected.kind = "notification.message_new".into();
        expected.channel = Some(s.get_channel(&ch.cid).await.expect("read").expect("exists"));
        expected.extra = Map::new();
        assert_eq!(*note, expected, "the message.new with the channel as the send left it");
        let unread = events[0].audience.unread.clone();
        assert_eq!(unread.keys().cloned().collect::<Vec<_>>(), strings(&["amy", "ben"]));
        assert_eq!(events[0].audience, Audience { unread: unread.clone(), ..watchers_and_hooks(&ch.cid) });
        assert_eq!(
            events[1].audience,
            Audience { users: strings(&["amy", "ben"]), except_watchers_of: Some(ch.cid.clone()), unread, ..Default::default() }
        );
        // Another store (as another process: on SQLite it reads the table, not this one's memory).
        let other = Store::connect(&ctx.url).await.expect("a second store, as another process");
        assert_eq!(other.events_after(before, 1).await.expect("events"), events);

        sqlx::query("UPDATE event SET note = '{' WHERE seq = $1").bind(events[0].seq).execute(&pool).await.expect("break the note");
        let read = other.events_after(before, 10).await.expect("events");
        assert_eq!(read, events[..1].to_vec(), "the event without its undecodable notification");
        other.close().await;
        pool.close().await;
    })
    .await;
}

#[tokio::test]
async fn events_after_reads_from_a_seq_in_order_with_a_limit() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        assert!(s.events_after(0, 10).await.expect("events").is_empty());
        publish_n(s, 5).await;
        let first = s.events_after(0, 2).await.expect("events");
        assert_eq!(first.iter().map(|e| e.event.extra["n"].clone()).collect::<Vec<_>>(), vec![json!(0), json!(1)]);
        let rest = s.events_after(first[1].seq, 10).await.expect("events");
        assert_eq!(rest.iter().map(|e| e.event.extra["n"].clone()).collect::<Vec<_>>(), vec![json!(2), json!(3), json!(4)]);
        assert_eq!(s.last_event_seq().await.expect("seq"), rest[2].seq);
        assert!(s.events_after(rest[2].seq, 10).await.expect("events").is_empty());
    })
    .await;
}

/// `event_span_after` is `events_after` without the events: the same last `seq` and count for
/// every start and limit (a consumer that passes events by moves its cursor exactly as far).
#[tokio::test]
async fn event_span_after_ends_where_events_after_ends() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        assert_eq!(s.event_span_after(0, 10).await.expect("span"), (None, 0));
        publish_n(s, 7).await;
        let all = s.events_after(0, 100).await.expect("events");
        for after in [0, all[2].seq, all[6].seq] {
            for limit in [1, 3, 100] {
                let events = s.events_after(after, limit).await.expect("events");
                let span = s.event_span_after(after, limit).await.expect("span");
                assert_eq!(span, (events.last().map(|e| e.seq), events.len() as i64), "after {after}, limit {limit}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn publish_stores_a_client_event_as_given_and_wakes_waiters() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let notify = s.event_notify();
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let event = custom_event("ai_indicator.update", 7);
        let audience = Audience { watchers_of: None, users: strings(&["amy", "ben"]), webhooks: false, ..Default::default() };
        s.publish(event.clone(), audience.clone()).await.expect("publish");
        tokio::time::timeout(Duration::from_secs(5), woken).await.expect("a commit with events wakes the waiters");
        let stored = s.events_after(0, 10).await.expect("events");
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].event, event, "the event round-trips");
        assert_eq!(stored[0].audience, audience);
    })
    .await;
}

#[tokio::test]
async fn a_cursor_starts_at_the_end_of_the_outbox_and_stays_where_it_was_moved() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        publish_n(s, 2).await;
        let start = s.outbox_cursor("hooks").await.expect("cursor");
        assert_eq!(start, s.last_event_seq().await.expect("seq"), "a new cursor starts at the end");
        publish_n(s, 2).await;
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), start, "an existing cursor stays where it is");
        let end = s.last_event_seq().await.expect("seq");
        assert!(s.advance_cursor_from("hooks", start, end).await.expect("advance"));
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), end);
        assert!(!s.advance_cursor_from("hooks", start, start).await.expect("move back"), "a cursor that moved on cannot be set back");
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), end);
        assert_eq!(s.outbox_cursor("other").await.expect("cursor"), end, "each consumer has its own cursor");
    })
    .await;
}

#[tokio::test]
async fn advance_cursor_from_only_moves_a_cursor_that_is_still_where_the_caller_saw_it() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let from = s.outbox_cursor("hooks").await.expect("cursor");
        publish_n(s, 2).await;
        let to = s.last_event_seq().await.expect("seq");
        assert!(!s.advance_cursor_from("hooks", from + 1, to).await.expect("stale cas"), "a stale `from` loses");
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), from);
        assert!(s.advance_cursor_from("hooks", from, to).await.expect("cas"));
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), to);
        assert!(!s.advance_cursor_from("hooks", from, to).await.expect("second cas"), "the same move cannot happen twice");
        assert_eq!(s.outbox_cursor("hooks").await.expect("cursor"), to);
    })
    .await;
}

#[tokio::test]
async fn relay_notifications_returns_at_shutdown() {
    with_store(|ctx| async move {
        tokio::time::timeout(Duration::from_secs(10), ctx.store.relay_notifications(std::future::ready(())))
            .await
            .expect("relay_notifications stops when shutdown resolves");
    })
    .await;
}

/// Another process on the same database reads every event from the outbox; on PostgreSQL it
/// is also woken through LISTEN/NOTIFY (on SQLite there is nothing to relay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_store_on_the_same_database_reads_the_events_and_on_postgres_hears_them() {
    with_store(|ctx| async move {
        let other = Store::connect(&ctx.url).await.expect("a second store, as another process");
        if ctx.store.backend() == offshoot_store::Backend::Postgres {
            let (stop, relay) = crate::support::spawn_relay(&other);
            let events = other.event_notify();
            // The listener connects in the background: publish until the other store hears
            // one, within a bounded time.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            let mut heard = false;
            while !heard && tokio::time::Instant::now() < deadline {
                let woken = events.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                ctx.store.publish(custom_event("custom.ping", 0), watchers_and_hooks("agent:x")).await.expect("publish");
                heard = tokio::time::timeout(Duration::from_millis(300), woken).await.is_ok();
            }
            assert!(heard, "the other store was not woken by a commit of this one");
            let _ = stop.send(());
            tokio::time::timeout(Duration::from_secs(10), relay).await.expect("the relay stops at shutdown").expect("relay task");
        }
        ctx.store.publish(custom_event("custom.last", 1), watchers_and_hooks("agent:x")).await.expect("publish");
        let seen = other.events_after(0, 1_000).await.expect("events of the other store");
        assert_eq!(seen, ctx.store.events_after(0, 1_000).await.expect("events"));
        assert_eq!(seen.last().map(|e| e.event.kind.as_str()), Some("custom.last"));
        other.close().await;
    })
    .await;
}

/// A process's consumers take the events it committed from memory (`events.rs`,
/// `Recent`), as they were before they were written. What they read must be what any other
/// process reads from the outbox: every kind of change, several events in one statement (sends
/// written together), and the same `seq` for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reads_its_own_events_as_another_process_reads_them() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "mem", &["amy", "ben"]).await;
        let cid = ch.cid.clone();
        let mut first = msg("m0", "hello \"quoted\" \u{1F600}\n");
        first.custom = json!({"n": 1.25, "deep": {"list": [1, "two", null]}}).as_object().cloned().expect("object");
        s.send_message(&cid, &first, &user("amy")).await.expect("send");
        // Sends at once, written in groups: several events in one statement.
        let sends = (1..24).map(|i| {
            let (s, cid) = (s.clone(), cid.clone());
            tokio::spawn(async move { s.send_message(&cid, &msg(&format!("m{i}"), &format!("text {i}")), &user("ben")).await })
        });
        for send in sends.collect::<Vec<_>>() {
            send.await.expect("task").expect("send");
        }
        s.update_message("m0", &user("amy"), |m| {
            m.text = "hello again".into();
            Ok(())
        })
        .await
        .expect("edit");
        s.add_reaction("m1", &Reaction { kind: "like".into(), score: 1, ..Default::default() }, false, &user("amy")).await.expect("react");
        s.delete_message("m2", false, Some(&user("ben"))).await.expect("delete message");
        s.add_members(&cid, &[member("cy")], None).await.expect("add member");
        s.mark_read(&cid, &user("amy"), None).await.expect("read");

        let other = Store::connect(&ctx.url).await.expect("a second store, as another process");
        let own = events_since(s, 0).await;
        assert!(own.len() > 30, "{} events", own.len());
        assert_eq!(events_since(&other, 0).await, own);
        // With the rows gone, the process still reads its events from memory, those written
        // several to a statement included. On SQLite all of them; on PostgreSQL the run up to the
        // first statement whose numbers another writer's draws interleaved (the sends above
        // are concurrent), whose rows it did not keep.
        other.prune_events(time::now() + 1_000_000_000).await.expect("prune");
        let after_prune = events_since(s, 0).await;
        match s.backend() {
            offshoot_store::Backend::Sqlite => assert_eq!(after_prune, own),
            offshoot_store::Backend::Postgres => {
                assert!(!after_prune.is_empty() && own.starts_with(&after_prune), "{} of {} from memory", after_prune.len(), own.len())
            }
        }
        other.close().await;
    })
    .await;
}

/// The events served from memory are exactly the run right after the cursor: an event another
/// process wrote in between is read from the database, in its place. The memory is seen by
/// taking the rows away: the process that wrote them still reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reads_from_memory_only_the_unbroken_run_of_its_own_events() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let other = Store::connect(&ctx.url).await.expect("a second store, as another process");
        let start = s.last_event_seq().await.expect("seq");
        s.publish(custom_event("custom.own", 1), watchers_and_hooks("agent:x")).await.expect("publish");
        s.publish(custom_event("custom.own", 2), watchers_and_hooks("agent:x")).await.expect("publish");
        other.publish(custom_event("custom.other", 3), watchers_and_hooks("agent:x")).await.expect("publish");
        s.publish(custom_event("custom.own", 4), watchers_and_hooks("agent:x")).await.expect("publish");
        let n = |events: &[offshoot_core::model::OutboxEvent]| -> Vec<i64> {
            events.iter().map(|e| e.event.extra["n"].as_i64().expect("n")).collect()
        };
        assert_eq!(n(&events_since(s, start).await), vec![1, 2, 3, 4]);
        assert_eq!(n(&events_since(&other, start).await), vec![1, 2, 3, 4]);

        let later = time::now() + 1_000_000_000;
        assert_eq!(other.prune_events(later).await.expect("prune"), 4, "no cursor: every old event goes");
        assert!(events_since(&other, start).await.is_empty());
        assert_eq!(n(&events_since(s, start).await), vec![1, 2], "the run before the other process's event");
        other.close().await;
    })
    .await;
}

#[tokio::test]
async fn pruning_deletes_only_old_events_every_cursor_passed() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let start = s.outbox_cursor("hooks").await.expect("cursor");
        publish_n(s, 4).await;
        let events = s.events_after(start, 10).await.expect("events");
        // The cursor has passed the first three.
        assert!(s.advance_cursor_from("hooks", start, events[2].seq).await.expect("advance"));
        let later = time::now() + 1_000_000_000;
        assert_eq!(s.prune_events(time::now() - 3_600 * 1_000_000_000).await.expect("prune"), 0, "nothing is old enough");
        let deleted = s.prune_events(later).await.expect("prune");
        assert_eq!(deleted, 3, "the events the cursor passed go");
        // Read as another process reads the outbox (this one keeps its recent events in memory,
        // `events.rs`).
        let other = Store::connect(&ctx.url).await.expect("a second store");
        let left: Vec<i64> = other.events_after(start, 10).await.expect("events").iter().map(|e| e.seq).collect();
        assert_eq!(left, vec![events[3].seq], "an unread event stays");
        other.close().await;
    })
    .await;
}

/// On PostgreSQL an event's `seq` is drawn when its row is inserted, not when its transaction
/// commits. Were two writers free to commit in any order, a consumer could read a later `seq`,
/// move its cursor past it, and never see the earlier one that commits afterwards. Writers hold
/// the outbox lock shared until they commit, and a reader first takes it exclusively, so it
/// waits for every numbered event's transaction to end. Here one writer is held inside its
/// transaction after its event is numbered (a trigger waits on an advisory lock the test
/// holds), a second writer publishes and commits (writers do not wait for each other), and a
/// consumer reading meanwhile must not see the second event without the first. The second
/// writer is the consumer's own store, which keeps the second event in memory (`events.rs`,
/// `Recent`): the run it serves from there must stop at the first event's number too.
///
/// SQLite has a single writer: numbering order is commit order by construction, so there is
/// nothing to race there and the test only runs on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn a_consumer_never_reads_past_an_event_that_commits_later_on_postgres() {
    use sqlx::{Connection, PgConnection};
    const GATE: i64 = 4_242_424;
    require_postgres("writers numbering events out of commit order");
    with_store(|ctx| async move {
        let mut admin = PgConnection::connect(&ctx.url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION test_hold_event() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.type = 'test.held' THEN PERFORM pg_advisory_xact_lock({GATE}); END IF; RETURN NEW; END $$; \
             CREATE TRIGGER test_hold_event AFTER INSERT ON event FOR EACH ROW EXECUTE FUNCTION test_hold_event();"
        )))
        .execute(&mut admin)
        .await
        .expect("install the holding trigger");
        let mut gate = PgConnection::connect(&ctx.url).await.expect("connect");
        sqlx::query("SELECT pg_advisory_lock($1)").bind(GATE).execute(&mut gate).await.expect("close the gate");

        // Counts lock waits: on the gate, and on anything else.
        async fn waiting(admin: &mut PgConnection, on_gate: bool) -> i64 {
            let sql = if on_gate {
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory' AND objid = $1"
            } else {
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND NOT (locktype = 'advisory' AND objid = $1)"
            };
            sqlx::query_scalar(sql).bind(GATE).fetch_one(admin).await.expect("pg_locks")
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);

        let reader = ctx.store.clone();
        let start = reader.last_event_seq().await.expect("last seq");
        let (held, free) = (Store::connect(&ctx.url).await.expect("connect"), reader.clone());
        let first = tokio::spawn({
            let held = held.clone();
            async move { held.publish(custom_event("test.held", 1), watchers_and_hooks("agent:x")).await }
        });
        // The first writer has numbered its event and waits at the gate, its transaction open.
        while waiting(&mut admin, true).await == 0 {
            assert!(!first.is_finished(), "the first writer finished without meeting the gate: {:?}", first.await);
            assert!(tokio::time::Instant::now() < deadline, "the first writer never reached the gate");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let second = tokio::spawn({
            let free = free.clone();
            async move { free.publish(custom_event("test.free", 2), watchers_and_hooks("agent:x")).await }
        });
        // The second writer is not held up by the first.
        let second = tokio::time::timeout(Duration::from_secs(10), second).await.expect("the second writer waited for the first");
        second.expect("join").expect("the second publish");

        // A consumer reads now (it may wait for the first writer) and moves its cursor past
        // what it read.
        let early = tokio::spawn({
            let reader = reader.clone();
            async move { events_since(&reader, start).await }
        });
        while !early.is_finished() && waiting(&mut admin, false).await == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the reader neither finished nor waited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(GATE).execute(&mut gate).await.expect("open the gate");
        let read_early = early.await.expect("join");
        let cursor = read_early.last().map(|e| e.seq).unwrap_or(start);
        first.await.expect("join").expect("the first publish");

        let all = events_since(&reader, start).await;
        assert_eq!(kinds(&all), strings(&["test.held", "test.free"]), "both events, in the order they were numbered");
        assert!(
            read_early.iter().all(|e| e.event.kind != "test.free") || kinds(&read_early) == kinds(&all),
            "the later event was read without the earlier one: {:?}",
            kinds(&read_early)
        );
        let read_late = events_since(&reader, cursor).await;
        let mut consumed = kinds(&read_early);
        consumed.extend(kinds(&read_late));
        assert_eq!(consumed, kinds(&all), "a consumer following its cursor reads every event once, in order");
        held.close().await;
    })
    .await;
}

/// Many writers on several pools commit events in whatever order their commits finish, while a
/// consumer follows its cursor the whole time: it reads every event exactly once, in `seq`
/// order. On SQLite the writers queue for the one write lock; on PostgreSQL they run at once,
/// and the reader's wait for writers still committing is what keeps it from skipping one. Some
/// writers share the consumer's store, so it reads their events from memory (`events.rs`,
/// `Recent`) between reads of the others' from the table, and its memory holds numbers out of
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_following_racing_writers_reads_every_event_once_in_order() {
    const WRITERS: i64 = 6;
    const EACH: i64 = 40;
    with_store(|ctx| async move {
        let start = ctx.store.last_event_seq().await.expect("last seq");
        let mut stores = vec![ctx.store.clone()];
        for _ in 0..2 {
            stores.push(Store::connect(&ctx.url).await.expect("connect"));
        }
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..WRITERS {
            let s = stores[w as usize % stores.len()].clone();
            writers.spawn(async move {
                for i in 0..EACH {
                    s.publish(custom_event("custom.race", w * 1_000 + i), watchers_and_hooks("agent:x")).await.expect("publish");
                }
            });
        }
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = tokio::spawn({
            let (store, done) = (ctx.store.clone(), done.clone());
            async move {
                let (mut cursor, mut read) = (start, Vec::new());
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let page = store.events_after(cursor, 7).await.expect("events_after");
                    if let Some(last) = page.last() {
                        cursor = last.seq;
                    }
                    let empty = page.is_empty();
                    read.extend(page.iter().map(|e| offshoot_core::model::OutboxEvent::clone(e)));
                    if finished && empty {
                        return read;
                    }
                }
            }
        });
        while let Some(joined) = writers.join_next().await {
            joined.expect("writer");
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let read = reader.await.expect("reader");
        // The outbox as a process that wrote none of it reads it: from the table.
        let table = Store::connect(&ctx.url).await.expect("connect");
        let all = events_since(&table, start).await;
        assert_eq!(all.len() as i64, WRITERS * EACH, "every publish wrote one event");
        let numbered = |v: &[offshoot_core::model::OutboxEvent]| v.iter().map(|e| (e.seq, e.event.extra["n"].clone())).collect::<Vec<_>>();
        assert_eq!(numbered(&read), numbered(&all), "the following consumer read every event once, in seq order");
        for s in stores[1..].iter().chain([&table]) {
            s.close().await;
        }
    })
    .await;
}
