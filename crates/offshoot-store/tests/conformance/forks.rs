//! Forks: the synchronous copy of the newest page, the backfill, the cap, the task, the
//! lookup, the limits and every refusal and failure the fork document names.

use crate::support::{
    agent_channel, assert_kind, channel_of, events_since, ids_seen_by, kinds, member, msg, msg_at, race, reply_at, seed, user, with_store,
    BASE_TS, MS,
};
use offshoot_core::fork::{BACKFILL_PAGE, FAILED_ID_TAKEN, FAILED_TOO_LARGE, MAX_COPIED, MAX_FORKS};
use offshoot_core::ids::copy_id;
use offshoot_core::model::{Audience, ForkStatus, Message, NewMessage, Reaction, Viewer};
use offshoot_core::ErrorKind;
use offshoot_store::{BackfillStep, ChannelUpdate, ForkOutcome, ForkRequest, Page, PageDir, Store};
use serde_json::{json, Map, Value};

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn request(source_cid: &str, message_id: &str, target_id: &str) -> ForkRequest {
    ForkRequest { source_cid: source_cid.into(), message_id: message_id.into(), target_id: target_id.into(), ..Default::default() }
}

async fn fork(s: &Store, source_cid: &str, message_id: &str, target_id: &str) -> ForkOutcome {
    s.create_fork(&request(source_cid, message_id, target_id)).await.expect("create fork")
}

/// A source `agent:{source_id}` of `n` messages by amy, one a second from `BASE_TS`, forked at
/// its newest into `agent:{target_id}`: the source's ids, oldest first, and the fork.
async fn fork_of_seeded(s: &Store, source_id: &str, n: usize, target_id: &str) -> (Vec<String>, ForkOutcome) {
    let src = agent_channel(s, source_id, &[]).await;
    let ids = seed(s, &src.cid, "amy", "c", n, BASE_TS).await;
    let out = fork(s, &src.cid, &ids[n - 1], target_id).await;
    (ids, out)
}

async fn stored(s: &Store, id: &str) -> Message {
    s.get_message(id, &Viewer::Server).await.expect("get message").expect("message exists").0
}

/// Runs the backfill to the end; returns how many steps answered `More`.
async fn backfill_to_end(s: &Store, fork_cid: &str, page_size: i64) -> usize {
    let mut more = 0;
    loop {
        match s.backfill_step(fork_cid, page_size).await.expect("backfill step") {
            BackfillStep::More => more += 1,
            BackfillStep::Done => return more,
            BackfillStep::Gone => panic!("fork {fork_cid} is gone"),
        }
        assert!(more < 10_000, "the backfill of {fork_cid} does not end");
    }
}

async fn summary(s: &Store, fork_cid: &str) -> offshoot_core::model::ForkSummary {
    s.get_channel(fork_cid).await.expect("get channel").expect("fork exists").fork.expect("a fork has a summary")
}

fn map_of(pairs: &[(&str, String)]) -> Map<String, Value> {
    pairs.iter().map(|(k, v)| (k.to_string(), Value::String(v.clone()))).collect()
}

#[tokio::test]
async fn a_fork_of_a_short_history_copies_what_a_client_sees_and_completes_at_once() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "src", &["amy", "ben"]).await;
        let amy = user("amy");
        let with_file = NewMessage {
            attachments: vec![json!({"type": "file", "asset_url": "http://x/f"})],
            custom: json!({"k": 1}).as_object().cloned().expect("object"),
            ..msg_at("m0", "first", BASE_TS)
        };
        s.send_message(&src.cid, &with_file, &amy).await.expect("send");
        s.send_message(&src.cid, &msg_at("m1", "second", BASE_TS + MS), &user("bot")).await.expect("send");
        s.send_message(&src.cid, &reply_at("ra", "m1", "in thread", BASE_TS + MS + MS / 2), &amy).await.expect("reply");
        s.send_message(&src.cid, &msg_at("del", "deleted", BASE_TS + 2 * MS), &amy).await.expect("send");
        s.delete_message("del", false, None).await.expect("delete");
        s.upsert_users(&[crate::support::user_input("troll")]).await.expect("upsert troll");
        s.set_ban("troll", true, true).await.expect("shadow ban");
        s.send_message(&src.cid, &msg_at("sh", "shadowed", BASE_TS + 2 * MS + MS / 2), &user("troll")).await.expect("send shadowed");
        let quoting = NewMessage { quoted_message_id: Some("m0".into()), ..msg_at("q", "quoting m0", BASE_TS + 3 * MS) };
        s.send_message(&src.cid, &quoting, &amy).await.expect("send quote");
        s.send_message(&src.cid, &reply_at("ra2", "m1", "after the point", BASE_TS + 3 * MS + MS / 2), &amy).await.expect("reply");
        s.send_message(&src.cid, &msg_at("after", "after the point", BASE_TS + 4 * MS), &amy).await.expect("send");
        s.add_reaction("m1", &Reaction { kind: "like".into(), score: 1, ..Default::default() }, false, &amy).await.expect("react");
        s.update_message("m1", &amy, |m| {
            m.pinned = true;
            m.pinned_at = Some(BASE_TS);
            Ok(())
        })
        .await
        .expect("pin");
        let source_view = ids_seen_by(s, &src.cid, &Viewer::Server).await;
        let seq = s.last_event_seq().await.expect("seq");

        let req = ForkRequest {
            created_by_id: Some("amy".into()),
            custom: json!({"branch": true}).as_object().cloned().expect("object"),
            ..request(&src.cid, "q", "f1")
        };
        let out = s.create_fork(&req).await.expect("fork");
        let fc = "agent:f1";
        assert!(out.created);
        assert_eq!(out.channel.cid, fc);
        assert_eq!(out.channel.custom, req.custom);
        assert_eq!(out.channel.created_by_id.as_deref(), Some("amy"));
        assert_eq!(out.channel.fork.as_ref(), Some(&out.fork), "the channel carries the summary");
        let f = &out.fork;
        assert_eq!((f.channel_cid.as_str(), f.source_channel_cid.as_str(), f.source_message_id.as_str()), (fc, "agent:src", "q"));
        assert_eq!(f.status, ForkStatus::Completed, "nothing was left to copy");
        assert_eq!(f.task_id, None, "a fork finished synchronously has no task");
        assert_eq!(f.copied_message_count, 4);
        assert!(!f.truncated);
        assert_eq!(f.oldest_source_message_id, None);
        assert_eq!(f.failed_reason, None);
        let expected_map =
            map_of(&[("m0", copy_id(fc, "m0")), ("m1", copy_id(fc, "m1")), ("ra", copy_id(fc, "ra")), ("q", copy_id(fc, "q"))]);
        assert_eq!(out.message_id_map, expected_map, "deleted, shadowed and later messages are not copied");

        // The copies.
        assert_eq!(ids_seen_by(s, fc, &Viewer::Server).await, vec![copy_id(fc, "m0"), copy_id(fc, "m1"), copy_id(fc, "q")]);
        let c0 = stored(s, &copy_id(fc, "m0")).await;
        let src0 = stored(s, "m0").await;
        assert_eq!((c0.cid.as_str(), c0.source_cid.as_deref(), c0.source_message_id.as_deref()), (fc, Some("agent:src"), Some("m0")));
        assert_eq!(
            (c0.text.as_str(), c0.user_id.as_str(), c0.created_at, c0.updated_at),
            (src0.text.as_str(), "amy", src0.created_at, src0.updated_at)
        );
        assert_eq!((c0.attachments.len(), c0.custom.get("k")), (1, Some(&json!(1))), "attachments and custom data are copied");
        let c1 = stored(s, &copy_id(fc, "m1")).await;
        assert_eq!(c1.reply_count, 1, "reply_count counts the copied replies");
        assert!(!c1.pinned && c1.pinned_at.is_none(), "pins are not copied");
        assert!(c1.reaction_counts.is_empty(), "reactions are not copied");
        let cra = stored(s, &copy_id(fc, "ra")).await;
        assert_eq!((cra.kind.as_str(), cra.parent_id.clone()), ("reply", Some(copy_id(fc, "m1"))));
        let cq = stored(s, &copy_id(fc, "q")).await;
        assert_eq!(cq.quoted_message_id, Some(copy_id(fc, "m0")));
        assert_eq!(cq.quoted_message.map(|m| m.id), Some(copy_id(fc, "m0")), "the quote resolves to the copy");
        assert_eq!(ids_seen_by(s, &src.cid, &Viewer::Server).await, source_view, "the source is not changed");

        // Members default to the source's.
        let members: Vec<String> = s.members(fc, 10, 0).await.expect("members").into_iter().map(|m| m.user_id).collect();
        assert_eq!(members, strings(&["amy", "ben"]));

        let unread: Vec<i64> =
            s.member_read_states(&out.channel, 10).await.expect("read states").iter().map(|r| r.unread_messages).collect();
        assert_eq!(unread, vec![0, 0], "copied history predates the members joining, so it is not unread");

        // The lookup.
        let lookup = s.fork_message_ids(fc, &strings(&["m0", "ra", "after", "del", "unknown"])).await.expect("lookup");
        assert_eq!(lookup, map_of(&[("m0", copy_id(fc, "m0")), ("ra", copy_id(fc, "ra"))]));
        assert!(s.fork_message_ids(fc, &[]).await.expect("empty lookup").is_empty());

        // Events: created once, notified per member, forked on both channels.
        let events = events_since(s, seq).await;
        assert_eq!(
            kinds(&events),
            strings(&[
                "channel.created",
                "notification.added_to_channel",
                "notification.added_to_channel",
                "channel.forked",
                "channel.forked"
            ])
        );
        assert_eq!(events[0].event.cid.as_deref(), Some(fc));
        assert_eq!(events[1].audience.users, strings(&["amy"]));
        assert_eq!(events[2].audience.users, strings(&["ben"]));
        assert_eq!(events[3].event.cid.as_deref(), Some("agent:src"));
        assert_eq!(
            events[3].audience,
            Audience { watchers_of: Some("agent:src".into()), users: vec![], webhooks: true, ..Default::default() }
        );
        assert_eq!(events[4].event.cid.as_deref(), Some(fc));
        assert_eq!(
            events[4].audience,
            Audience { watchers_of: Some(fc.into()), users: strings(&["amy", "ben"]), webhooks: false, ..Default::default() },
            "the fork's channel.forked is WebSocket only"
        );
        for e in &events[3..] {
            let fork = e.event.fork.as_ref().expect("channel.forked carries the summary");
            assert_eq!((fork.status, fork.channel_cid.as_str()), (ForkStatus::Completed, fc));
            assert_eq!(e.event.user.as_ref().map(|u| u.id.as_str()), Some("amy"));
        }

        assert_eq!(s.list_forks(&src.cid, 10, 0).await.expect("list forks"), vec![f.clone()]);
        assert!(s.list_forks(fc, 10, 0).await.expect("list forks of the fork").is_empty());
        assert!(backfilling(s).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_fork_may_leave_out_attachments_and_name_its_own_members_and_team() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = channel_of(s, "agent", "att", "owner", &["amy"]).await;
        s.update_channel(&src.cid, &ChannelUpdate { team: Some("red".into()), ..Default::default() }, None).await.expect("set team");
        let m = NewMessage { attachments: vec![json!({"type": "image"})], ..msg("img", "picture") };
        s.send_message(&src.cid, &m, &user("amy")).await.expect("send");
        let req = ForkRequest { exclude_attachments: true, members: Some(vec![member("cat")]), ..request(&src.cid, "img", "noatt") };
        let out = s.create_fork(&req).await.expect("fork");
        assert_eq!(out.channel.team.as_deref(), Some("red"), "the team defaults to the source's");
        assert_eq!(out.channel.created_by_id.as_deref(), Some("owner"), "the creator defaults to the source's");
        assert!(stored(s, &copy_id("agent:noatt", "img")).await.attachments.is_empty());
        let members: Vec<String> = s.members("agent:noatt", 10, 0).await.expect("members").into_iter().map(|m| m.user_id).collect();
        assert_eq!(members, strings(&["cat"]));
        assert!(s.get_user("cat").await.expect("get").is_some(), "named members are created on first sight");
        let with_team = ForkRequest { team: Some("blue".into()), ..request(&src.cid, "img", "teamed") };
        assert_eq!(s.create_fork(&with_team).await.expect("fork").channel.team.as_deref(), Some("blue"));
    })
    .await;
}

#[tokio::test]
async fn a_fork_of_a_rewound_and_truncated_source_copies_only_the_visible_messages() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "rws", &[]).await;
        seed(s, &src.cid, "amy", "v", 5, BASE_TS).await;
        s.rewind_channel(&src.cid, "v00002", "v00004", false, None).await.expect("rewind");
        s.truncate_channel(&src.cid, Some(BASE_TS), false, None, None).await.expect("truncate");
        s.send_message(&src.cid, &msg("v5", "after the rewind"), &user("amy")).await.expect("send");
        let out = fork(s, &src.cid, "v5", "rwf").await;
        let fc = "agent:rwf";
        let mut copied: Vec<&String> = out.message_id_map.keys().collect();
        copied.sort();
        assert_eq!(copied, vec!["v00001", "v00002", "v5"], "hidden and truncated messages are not copied");
        assert_eq!(ids_seen_by(s, fc, &Viewer::Server).await, vec![copy_id(fc, "v00001"), copy_id(fc, "v00002"), copy_id(fc, "v5")]);
        assert!(
            s.get_message(&copy_id(fc, "v00003"), &Viewer::Server).await.expect("get").is_none(),
            "the fork holds no hidden messages of its own"
        );
        assert_eq!(out.fork.status, ForkStatus::Completed);
        assert_kind(s.create_fork(&request(&src.cid, "v00003", "rwf2")).await, ErrorKind::Input);
        assert_kind(s.create_fork(&request(&src.cid, "v00000", "rwf3")).await, ErrorKind::Input);
    })
    .await;
}

#[tokio::test]
async fn a_longer_history_backfills_page_by_page_to_the_exact_count_without_duplicates() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "long", &["amy"]).await;
        let top = seed(s, &src.cid, "amy", "m", 130, BASE_TS).await;
        let mut sent = top.clone();
        // One reply to each of the 30 oldest messages, three to m00120.
        for (i, parent) in top.iter().enumerate().take(30) {
            let id = format!("r{i:05}");
            s.send_message(&src.cid, &reply_at(&id, parent, "reply", BASE_TS + i as i64 * MS + MS / 2), &user("bot")).await.expect("reply");
            sent.push(id);
        }
        for j in 0..3 {
            let id = format!("late{j}");
            s.send_message(&src.cid, &reply_at(&id, "m00120", "reply", BASE_TS + 120 * MS + (j + 1) * MS / 4), &user("bot"))
                .await
                .expect("reply");
            sent.push(id);
        }
        s.delete_message("m00010", false, None).await.expect("delete");
        let eligible = 130 - 1 + 30 - 1 + 3; // m00010 and its reply are not copied

        let out = fork(s, &src.cid, "m00129", "lf").await;
        let fc = "agent:lf";
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        assert_eq!(out.fork.copied_message_count, 103, "the newest page: 100 top-level messages and their 3 replies");
        assert_eq!(out.message_id_map.len(), 103);
        assert!(out.message_id_map.iter().all(|(k, v)| v.as_str() == Some(copy_id(fc, k).as_str())));
        let task_id = out.fork.task_id.clone().expect("a backfilling fork has a task");
        let task = s.task(&task_id).await.expect("task").expect("task exists");
        assert_eq!(task.status, "pending");
        assert_eq!(task.result["fork_channel_cid"], json!(fc));
        assert_eq!(backfilling(s).await, strings(&[fc]));
        assert!(s.task("no-such-task").await.expect("task").is_none());

        // While it copies: no rewind, no fork of the fork, no version 5 ids.
        let last_copy = copy_id(fc, "m00129");
        let e = assert_kind(s.rewind_channel(fc, &last_copy, &last_copy, false, None).await, ErrorKind::ForkInProgress);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_in_progress"));
        let e = assert_kind(s.create_fork(&request(fc, &last_copy, "lf2")).await, ErrorKind::ForkInProgress);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_in_progress"));
        let v5 = copy_id("agent:elsewhere", "x");
        let e = assert_kind(s.send_message(fc, &msg(&v5, "reserved"), &user("amy")).await, ErrorKind::ForkMessageIdReserved);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_message_id_reserved"));
        s.send_message(fc, &msg("own-1", "a message of the fork's own"), &user("amy")).await.expect("other ids are accepted");

        // A retry while backfilling returns the fork as it is, with the first page's map.
        let retry = fork(s, &src.cid, "m00129", "lf").await;
        assert!(!retry.created);
        assert_eq!(retry.message_id_map, out.message_id_map);
        assert_eq!(retry.fork.status, ForkStatus::Backfilling);

        assert_eq!(s.backfill_step(fc, 20).await.expect("step"), BackfillStep::More);
        let running = s.task(&task_id).await.expect("task").expect("task exists");
        assert_eq!(running.status, "running");
        assert_eq!(summary(s, fc).await.total_message_count, Some(eligible), "the first step plans the total");
        let seq = s.last_event_seq().await.expect("seq");
        let more = backfill_to_end(s, fc, 20).await;
        assert!(more >= 2, "a 20-message page needs several steps, got {more} more");

        let done = summary(s, fc).await;
        assert_eq!(done.status, ForkStatus::Completed);
        assert_eq!((done.copied_message_count, done.total_message_count), (eligible, Some(eligible)));
        assert!(!done.truncated);
        assert_eq!(done.oldest_source_message_id, None);
        assert_eq!(done.task_id.as_deref(), Some(task_id.as_str()), "the task stays readable");
        let finished = s.task(&task_id).await.expect("task").expect("task exists");
        assert_eq!(finished.status, "completed");
        assert_eq!(finished.result["copied_message_count"], json!(eligible));
        assert_eq!(finished.result["total_message_count"], json!(eligible));
        assert!(finished.error.is_none());

        let lookup = s.fork_message_ids(fc, &sent).await.expect("lookup");
        assert_eq!(lookup.len() as i64, eligible, "every eligible message has exactly one copy");
        assert!(!lookup.contains_key("m00010") && !lookup.contains_key("r00010"));
        assert!(lookup.iter().all(|(k, v)| v.as_str() == Some(copy_id(fc, k).as_str())));
        let fork_channel = s.get_channel(fc).await.expect("get").expect("exists");
        assert_eq!(fork_channel.message_count, eligible + 1, "the copies and the fork's own message, no duplicates");
        assert_eq!(stored(s, &copy_id(fc, "m00000")).await.reply_count, 1);
        assert_eq!(stored(s, &copy_id(fc, "m00120")).await.reply_count, 3);
        let oldest = s
            .channel_messages(
                &fork_channel,
                &Viewer::Server,
                &Page { limit: 2, dir: PageDir::After { id: copy_id(fc, "m00000"), inclusive: true } },
            )
            .await
            .expect("page");
        assert_eq!(
            oldest.iter().map(|m| m.source_message_id.clone().unwrap_or_default()).collect::<Vec<_>>(),
            strings(&["m00000", "m00001"]),
            "older pages read in order"
        );

        let events = events_since(s, seq).await;
        assert_eq!(
            kinds(&events),
            strings(&["channel.forked", "channel.forked"]),
            "channel.forked is written once per channel when the backfill ends"
        );
        assert_eq!(events[1].event.fork.as_ref().map(|f| f.copied_message_count), Some(eligible));
        assert!(backfilling(s).await.is_empty());

        // Running it again is a no-op.
        let end = s.last_event_seq().await.expect("seq");
        assert_eq!(s.backfill_step(fc, 20).await.expect("step after done"), BackfillStep::Done);
        assert_eq!(s.last_event_seq().await.expect("seq"), end, "no second channel.forked");
        assert_eq!(summary(s, fc).await, done);
        assert_eq!(s.backfill_step("agent:no-such-fork", 20).await.expect("step"), BackfillStep::Gone);

        // Finished: version 5 ids are accepted again, and the fork may be forked and rewound.
        s.send_message(fc, &msg(&v5, "now allowed"), &user("amy")).await.expect("v5 id after the fork finished");
        fork(s, fc, &last_copy, "lf2").await;
        s.rewind_channel(fc, &last_copy, &v5, false, None).await.expect("rewind the finished fork");
    })
    .await;
}

#[tokio::test]
async fn a_fork_of_more_than_10000_messages_keeps_the_newest_10000_and_is_marked_truncated() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let (ids, out) = fork_of_seeded(s, "huge", MAX_COPIED as usize + 10, "hf").await;
        let fc = "agent:hf";
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        backfill_to_end(s, fc, BACKFILL_PAGE).await;
        let done = summary(s, fc).await;
        assert_eq!(done.status, ForkStatus::Completed);
        assert!(done.truncated, "more than 10,000 messages up to the fork point");
        assert_eq!(done.copied_message_count, MAX_COPIED);
        assert_eq!(done.total_message_count, Some(MAX_COPIED));
        assert_eq!(done.oldest_source_message_id.as_deref(), Some(ids[10].as_str()), "the oldest message the fork holds");
        let lookup = s.fork_message_ids(fc, &ids[8..12]).await.expect("lookup");
        assert_eq!(lookup.keys().cloned().collect::<Vec<_>>(), ids[10..12].to_vec(), "older history stays in the source only");
        let task = s.task(done.task_id.as_deref().expect("task")).await.expect("task").expect("exists");
        assert_eq!(task.result["truncated"], json!(true));
        assert_eq!(s.get_channel(fc).await.expect("get").expect("exists").message_count, MAX_COPIED);
    })
    .await;
}

/// The cap holds when the source changes under a backfill: messages imported (server-side
/// `created_at`) into the history the backfill has not reached yet are copied in their place,
/// the fork still holds only the newest 10,000, and the import that pushed the history past the
/// cap after the plan found it under makes the fork truncated, naming its oldest copy's source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_imported_below_a_backfills_cursor_never_push_it_past_the_cap() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let (ids, out) = fork_of_seeded(s, "grow", MAX_COPIED as usize, "gr").await;
        let fc = "agent:gr";
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        assert_eq!(s.backfill_step(fc, BACKFILL_PAGE).await.expect("backfill step"), BackfillStep::More);
        assert!(!summary(s, fc).await.truncated, "planned with exactly 10,000 eligible messages");
        // Three messages between the 101st and the 102nd oldest, far below the cursor.
        let amy = user("amy");
        for k in 0..3 {
            let at = BASE_TS + 100 * MS + 1 + k;
            s.send_message("agent:grow", &msg_at(&format!("imp{k}"), "imported", at), &amy).await.expect("import a message");
        }
        // The rest by two workers of their own stores at once: the page the cap cuts is taken
        // under the fork's locks like every other, by whichever worker gets there.
        race(&ctx.url, 2, |store, _| async move { backfill_to_end(&store, "agent:gr", 500).await }).await;
        let done = summary(s, fc).await;
        assert_eq!(done.status, ForkStatus::Completed);
        assert_eq!(done.copied_message_count, MAX_COPIED, "never more than the cap");
        assert_eq!(s.get_channel(fc).await.expect("get").expect("exists").message_count, MAX_COPIED);
        assert!(done.truncated, "10,003 eligible messages: the oldest three stay in the source");
        assert_eq!(done.oldest_source_message_id.as_deref(), Some(ids[3].as_str()));
        let asked: Vec<String> = vec![ids[2].clone(), ids[3].clone(), "imp0".into(), "imp2".into()];
        let lookup = s.fork_message_ids(fc, &asked).await.expect("lookup");
        assert_eq!(lookup.keys().cloned().collect::<Vec<_>>(), asked[1..].to_vec(), "the imports copied, the oldest three not");
        let task = s.task(done.task_id.as_deref().expect("task")).await.expect("task").expect("exists");
        assert_eq!(task.result["truncated"], json!(true));
    })
    .await;
}

/// Exactly 10,000 messages up to the fork point: every one is copied, and nothing is cut off.
#[tokio::test]
async fn a_fork_of_exactly_10000_messages_copies_them_all_and_is_not_truncated() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let (ids, _) = fork_of_seeded(s, "exact", MAX_COPIED as usize, "ex").await;
        let fc = "agent:ex";
        backfill_to_end(s, fc, BACKFILL_PAGE).await;
        let done = summary(s, fc).await;
        assert_eq!(done.status, ForkStatus::Completed);
        assert!(!done.truncated, "10,000 messages fit under the cap");
        assert_eq!((done.copied_message_count, done.total_message_count), (MAX_COPIED, Some(MAX_COPIED)));
        assert_eq!(done.oldest_source_message_id, None, "only a capped fork names its oldest source message");
        let lookup = s.fork_message_ids(fc, &ids[..2]).await.expect("lookup");
        assert_eq!(lookup.keys().cloned().collect::<Vec<_>>(), ids[..2].to_vec(), "the oldest messages are copied");
    })
    .await;
}

#[tokio::test]
async fn a_retry_returns_the_existing_fork_and_another_message_into_the_same_target_conflicts() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "retry", &["amy"]).await;
        seed(s, &src.cid, "amy", "m", 3, BASE_TS).await;
        let first = fork(s, &src.cid, "m00001", "rf").await;
        let seq = s.last_event_seq().await.expect("seq");
        let again = fork(s, &src.cid, "m00001", "rf").await;
        assert!(first.created && !again.created);
        assert_eq!(again.message_id_map, first.message_id_map);
        assert_eq!(again.fork, first.fork);
        assert_eq!(s.last_event_seq().await.expect("seq"), seq, "a retry writes no events");

        let e = assert_kind(s.create_fork(&request(&src.cid, "m00002", "rf")).await, ErrorKind::ForkTargetConflict);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_target_conflict"));
        assert_eq!(e.fields.get("source_channel_cid").map(String::as_str), Some("agent:retry"));
        assert_eq!(e.fields.get("source_message_id").map(String::as_str), Some("m00001"));

        agent_channel(s, "plain", &[]).await;
        let e = assert_kind(s.create_fork(&request(&src.cid, "m00002", "plain")).await, ErrorKind::ForkTargetExists);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_target_exists"));
        assert_eq!(s.list_forks(&src.cid, 10, 0).await.expect("forks").len(), 1, "refused forks leave nothing behind");
        assert!(s.get_channel("agent:rf2").await.expect("get").is_none());
    })
    .await;
}

#[tokio::test]
async fn a_fork_point_must_be_a_visible_top_level_message_of_an_agent_channel() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "pts", &[]).await;
        seed(s, &src.cid, "amy", "m", 2, BASE_TS).await;
        s.send_message(&src.cid, &reply_at("r", "m00000", "reply", BASE_TS + MS / 2), &user("amy")).await.expect("reply");
        s.send_message(&src.cid, &msg_at("gone", "deleted", BASE_TS + 5 * MS), &user("amy")).await.expect("send");
        s.delete_message("gone", false, None).await.expect("delete");
        let other = agent_channel(s, "pts-other", &[]).await;
        s.send_message(&other.cid, &msg("foreign", "x"), &user("amy")).await.expect("send");
        for bad in ["r", "gone", "missing", "foreign"] {
            assert_kind(s.create_fork(&request(&src.cid, bad, &format!("t-{bad}"))).await, ErrorKind::Input);
        }
        let messaging = channel_of(s, "messaging", "chat", "owner", &[]).await;
        s.send_message(&messaging.cid, &msg("mm", "x"), &user("amy")).await.expect("send");
        assert_kind(s.create_fork(&request(&messaging.cid, "mm", "t-messaging")).await, ErrorKind::Input);
        assert_kind(s.create_fork(&request("agent:missing", "m00000", "t-missing")).await, ErrorKind::NotFound);
        s.delete_channel(&other.cid, false, None).await.expect("delete");
        assert_kind(s.create_fork(&request(&other.cid, "foreign", "t-deleted")).await, ErrorKind::NotFound);
        assert!(s.list_forks(&src.cid, 10, 0).await.expect("forks").is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_fork_point_that_shares_its_created_at_with_another_visible_message_is_ambiguous() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "amb", &[]).await;
        s.send_message(&src.cid, &msg_at("x", "twin one", BASE_TS), &user("amy")).await.expect("send");
        s.send_message(&src.cid, &msg_at("y", "twin two", BASE_TS), &user("amy")).await.expect("send");
        let e = assert_kind(s.create_fork(&request(&src.cid, "y", "ambf")).await, ErrorKind::ForkPointAmbiguous);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("fork_point_ambiguous"));
        assert!(s.get_channel("agent:ambf").await.expect("get").is_none());
        s.delete_message("x", false, None).await.expect("delete the twin");
        assert_eq!(fork(s, &src.cid, "y", "ambf").await.fork.status, ForkStatus::Completed, "a deleted twin is not visible");
    })
    .await;
}

#[tokio::test]
async fn a_source_has_at_most_100_forks_that_did_not_fail_and_a_hard_deleted_fork_frees_its_slot() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "many", &[]).await;
        s.send_message(&src.cid, &msg("m", "fork me often"), &user("amy")).await.expect("send");
        // A failed fork does not count.
        s.put_channel_type("agent", Some(3), &Map::new()).await.expect("lower the limit");
        assert_eq!(fork(s, &src.cid, "m", "failed").await.fork.status, ForkStatus::Failed);
        s.put_channel_type("agent", Some(5000), &Map::new()).await.expect("restore the limit");
        for i in 0..MAX_FORKS {
            fork(s, &src.cid, "m", &format!("f{i:03}")).await;
        }
        let e = assert_kind(s.create_fork(&request(&src.cid, "m", "one-too-many")).await, ErrorKind::TooManyForks);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("too_many_forks"));
        assert_eq!(e.fields.get("limit").map(String::as_str), Some("100"));

        let newest: Vec<String> = s.list_forks(&src.cid, 3, 0).await.expect("forks").into_iter().map(|f| f.channel_cid).collect();
        assert_eq!(newest, strings(&["agent:f099", "agent:f098", "agent:f097"]), "newest first");
        let paged: Vec<String> = s.list_forks(&src.cid, 2, 99).await.expect("forks").into_iter().map(|f| f.channel_cid).collect();
        assert_eq!(paged, strings(&["agent:f000", "agent:failed"]));

        s.delete_channel("agent:f050", false, None).await.expect("soft delete a fork");
        assert_kind(s.create_fork(&request(&src.cid, "m", "one-too-many")).await, ErrorKind::TooManyForks);
        s.delete_channel("agent:f050", true, None).await.expect("hard delete a fork");
        assert_eq!(s.list_forks(&src.cid, 200, 0).await.expect("forks").len(), 100);
        let out = fork(s, &src.cid, "m", "one-too-many").await;
        assert!(out.created, "the freed slot is taken");
    })
    .await;
}

#[tokio::test]
async fn a_source_message_over_the_size_limit_fails_the_fork_with_message_too_large() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "big", &["amy"]).await;
        s.send_message(&src.cid, &msg_at("long", "written under a larger limit", BASE_TS), &user("amy")).await.expect("send");
        s.send_message(&src.cid, &msg_at("short", "fits", BASE_TS + MS), &user("amy")).await.expect("send");
        s.put_channel_type("agent", Some(10), &Map::new()).await.expect("lower the limit");
        let seq = s.last_event_seq().await.expect("seq");
        let out = fork(s, &src.cid, "short", "bigf").await;
        assert!(out.created, "a failed fork is an answer, not an error");
        let f = &out.fork;
        assert_eq!(f.status, ForkStatus::Failed);
        assert_eq!(f.failed_reason.as_deref(), Some(FAILED_TOO_LARGE));
        assert_eq!(f.copied_message_count, 1, "what was copied before the failure stays");
        assert_eq!(f.task_id, None);
        assert_eq!(
            s.fork_message_ids("agent:bigf", &strings(&["long", "short"])).await.expect("lookup"),
            map_of(&[("short", copy_id("agent:bigf", "short"))])
        );
        assert_eq!(
            kinds(&events_since(s, seq).await).iter().filter(|k| *k == "channel.forked").count(),
            2,
            "a failed fork is finished too"
        );
        let retry = fork(s, &src.cid, "short", "bigf").await;
        assert_eq!((retry.created, retry.fork.status), (false, ForkStatus::Failed), "a retry returns it as it is");
        // A failed fork is an ordinary channel.
        s.send_message("agent:bigf", &msg(&copy_id("agent:x", "y"), "any id"), &user("amy")).await.expect("send into a failed fork");
    })
    .await;
}

/// The same in a backfill page, which inserts its copies as if no id were taken and, when the
/// key refuses one, undoes the insert and copies again up to the taken id: the copies newer
/// than it stay, once each.
#[tokio::test]
async fn a_copy_id_held_by_another_message_fails_the_fork_in_a_backfill_page_keeping_the_newer_copies() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "taken-page", &[]).await;
        let ids = seed(s, &src.cid, "amy", "p", 130, BASE_TS).await;
        // Another channel's message holds the id the copy of p00005 would get: in the backfill,
        // not in the newest page the request copies.
        let other = agent_channel(s, "taken-elsewhere", &[]).await;
        let squatter = copy_id("agent:taken-page-fork", &ids[5]);
        s.send_message(&other.cid, &msg(&squatter, "I was here first"), &user("amy")).await.expect("send");
        let out = fork(s, &src.cid, &ids[129], "taken-page-fork").await;
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        backfill_to_end(s, "agent:taken-page-fork", 50).await;
        let f = summary(s, "agent:taken-page-fork").await;
        assert_eq!(f.status, ForkStatus::Failed);
        assert_eq!(f.failed_reason.as_deref(), Some(FAILED_ID_TAKEN));
        assert_eq!(f.copied_message_count, 124, "p00129 down to p00006 were copied before the taken id");
        let found = s.fork_message_ids("agent:taken-page-fork", &ids).await.expect("lookup");
        assert_eq!(found.len(), 124, "each copy once");
        assert!(!found.contains_key(&ids[5]) && found.contains_key(&ids[6]));
        assert_eq!(stored(s, &squatter).await.cid, other.cid, "the other message is untouched");
    })
    .await;
}

#[tokio::test]
async fn a_copy_id_held_by_another_message_fails_the_fork_with_fork_message_id_taken() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "taken-src", &[]).await;
        s.send_message(&src.cid, &msg_at("a0", "first", BASE_TS), &user("amy")).await.expect("send");
        // A message that already holds the id the copy of a0 would get in agent:taken.
        let squatter = copy_id("agent:taken", "a0");
        s.send_message(&src.cid, &msg_at(&squatter, "squatter", BASE_TS + MS), &user("amy")).await.expect("send");
        let out = fork(s, &src.cid, &squatter, "taken").await;
        assert_eq!(out.fork.status, ForkStatus::Failed);
        assert_eq!(out.fork.failed_reason.as_deref(), Some(FAILED_ID_TAKEN));
        assert_eq!(out.fork.copied_message_count, 1);
        assert_eq!(stored(s, &squatter).await.cid, src.cid, "the squatter is untouched");
        // Another target id gives other copy ids and succeeds.
        assert_eq!(fork(s, &src.cid, &squatter, "taken2").await.fork.status, ForkStatus::Completed);
    })
    .await;
}

#[tokio::test]
async fn a_backfill_whose_source_was_hard_deleted_ends_with_what_was_copied() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "vanish", &["amy"]).await;
        let ids = seed(s, &src.cid, "amy", "m", 120, BASE_TS).await;
        let out = fork(s, &src.cid, &ids[119], "orphan").await;
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        s.delete_channel(&src.cid, true, None).await.expect("hard delete the source");
        let seq = s.last_event_seq().await.expect("seq");
        assert_eq!(s.backfill_step("agent:orphan", 50).await.expect("step"), BackfillStep::Done);
        let f = summary(s, "agent:orphan").await;
        assert_eq!((f.status, f.copied_message_count), (ForkStatus::Completed, 100));
        let events = events_since(s, seq).await;
        assert_eq!(kinds(&events), strings(&["channel.forked"]), "only the fork is left to announce it");
        assert!(events[0].audience.webhooks, "with the source gone, webhooks hear it from the fork");
        assert_eq!(s.list_forks(&src.cid, 10, 0).await.expect("forks").len(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_backfill_whose_source_was_soft_deleted_finishes_normally_and_tells_webhooks_from_the_fork() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "soft", &["amy"]).await;
        let ids = seed(s, &src.cid, "amy", "m", 110, BASE_TS).await;
        fork(s, &src.cid, &ids[109], "softf").await;
        s.delete_channel(&src.cid, false, None).await.expect("soft delete the source");
        let seq = s.last_event_seq().await.expect("seq");
        backfill_to_end(s, "agent:softf", 50).await;
        let f = summary(s, "agent:softf").await;
        assert_eq!((f.status, f.copied_message_count, f.total_message_count), (ForkStatus::Completed, 110, Some(110)));
        let events = events_since(s, seq).await;
        let forked: Vec<(Option<String>, bool)> = events.iter().map(|e| (e.event.cid.clone(), e.audience.webhooks)).collect();
        assert_eq!(
            forked,
            vec![(Some(src.cid.clone()), true), (Some("agent:softf".to_string()), true)],
            "the fork's channel.forked goes to webhooks too"
        );
    })
    .await;
}

#[tokio::test]
async fn rewinding_the_source_while_a_fork_backfills_keeps_copied_pages_and_skips_the_hidden_rest() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "moving", &[]).await;
        let ids = seed(s, &src.cid, "amy", "m", 130, BASE_TS).await;
        let out = fork(s, &src.cid, &ids[129], "mf").await;
        assert_eq!(out.fork.copied_message_count, 100);
        // Hides m00011..m00129 in the source: the first page was copied already, m00011..m00029 were not.
        s.rewind_channel(&src.cid, &ids[10], &ids[129], false, None).await.expect("rewind the source");
        backfill_to_end(s, "agent:mf", 7).await;
        let f = summary(s, "agent:mf").await;
        assert_eq!((f.status, f.copied_message_count), (ForkStatus::Completed, 111));
        let lookup = s.fork_message_ids("agent:mf", &ids).await.expect("lookup");
        let expected: Vec<String> = ids[..=10].iter().chain(&ids[30..]).cloned().collect();
        let mut got: Vec<String> = lookup.keys().cloned().collect();
        got.sort();
        assert_eq!(got, expected);
        assert_eq!(ids_seen_by(s, "agent:mf", &Viewer::Server).await.len(), 111, "the fork's copies are not hidden by the source's rewind");
    })
    .await;
}

#[tokio::test]
async fn a_source_with_more_than_100_members_must_name_the_forks_members() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let names: Vec<String> = (0..101).map(|i| format!("u{i:03}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let src = agent_channel(s, "crowd", &refs).await;
        s.send_message(&src.cid, &msg("m", "hello all"), &user("u000")).await.expect("send");
        let e = assert_kind(s.create_fork(&request(&src.cid, "m", "crowdf")).await, ErrorKind::Input);
        assert!(e.message.contains("100"), "{e}");
        let named = ForkRequest { members: Some(vec![member("u000"), member("u001")]), ..request(&src.cid, "m", "crowdf") };
        let out = s.create_fork(&named).await.expect("fork with named members");
        assert_eq!(out.channel.member_count, 2);
    })
    .await;
}

/// Guarded on PostgreSQL by the source channel's row lock and, independently, by the target's
/// primary key with `create_fork` looking again after the conflict (either one suffices; with
/// both removed the loser fails), on SQLite by `BEGIN IMMEDIATE`. Two stores on separate
/// pools, released by a barrier, for several rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_identical_fork_requests_racing_create_one_fork() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let src = agent_channel(&s, "race", &["amy"]).await;
        let ids = seed(&s, &src.cid, "amy", "m", 5, BASE_TS).await;
        let rounds = 6;
        for round in 0..rounds {
            let req = request(&src.cid, &ids[4], &format!("racef{round}"));
            let results = race(&ctx.url, 2, |store, _| {
                let req = req.clone();
                async move { store.create_fork(&req).await }
            })
            .await;
            let [a, b]: [ForkOutcome; 2] = results
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("round {round}: both requests succeed: {e:?}")))
                .collect::<Vec<_>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!());
            assert_eq!([a.created, b.created].iter().filter(|c| **c).count(), 1, "round {round}: exactly one request creates the fork");
            assert_eq!(a.fork, b.fork);
            assert_eq!(a.message_id_map, b.message_id_map);
        }
        assert_eq!(s.list_forks(&src.cid, 10, 0).await.expect("forks").len(), rounds);
    })
    .await;
}

/// Guarded on PostgreSQL by the locks `backfill_step` takes (the fork's channel row, then the
/// fork row), on SQLite by `BEGIN IMMEDIATE`. Two workers on separate pools (two processes), released by a barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_backfilling_one_fork_copy_each_message_once() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let src = agent_channel(&s, "twice", &[]).await;
        let ids = seed(&s, &src.cid, "amy", "m", 260, BASE_TS).await;
        fork(&s, &src.cid, &ids[259], "twicef").await;
        let steps = race(&ctx.url, 2, |store, _| async move { backfill_to_end(&store, "agent:twicef", 15).await }).await;
        assert!(steps.iter().sum::<usize>() >= 1, "the workers copied pages: {steps:?}");
        let f = summary(&s, "agent:twicef").await;
        assert_eq!(f.status, ForkStatus::Completed);
        assert_eq!((f.copied_message_count, f.total_message_count), (260, Some(260)));
        assert_eq!(s.fork_message_ids("agent:twicef", &ids).await.expect("lookup").len(), 260);
        let forked = kinds(&events_since(&s, 0).await).iter().filter(|k| *k == "channel.forked").count();
        assert_eq!(forked, 2, "channel.forked is written once per channel, not once per worker");
    })
    .await;
}

#[tokio::test]
async fn a_fork_status_this_version_does_not_know_is_an_error_not_backfilling() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = channel_of(s, "agent", "odd", "owner", &["amy"]).await;
        s.send_message(&src.cid, &msg("p", "point"), &user("amy")).await.expect("send");
        s.create_fork(&request(&src.cid, "p", "odd-fork")).await.expect("fork");
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&ctx.url).await.expect("connect");
        sqlx::query("UPDATE fork SET status = 'paused' WHERE cid = 'agent:odd-fork'").execute(&pool).await.expect("update");
        pool.close().await;
        let e = s.get_channel("agent:odd-fork").await.expect_err("an unknown status does not read as backfilling");
        assert!(e.to_string().contains("paused"), "{e}");
        assert!(backfilling(s).await.is_empty(), "and is never resumed as one");
    })
    .await;
}

/// The cids of the forks still copying, oldest first.
async fn backfilling(s: &Store) -> Vec<String> {
    s.backfilling_progress().await.expect("backfilling forks").into_iter().map(|(cid, _)| cid).collect()
}

/// A send that waits for its channel's lock reads the channel's fork summary and its author as
/// the writer that held the lock left them, not as they were when the send's statement began:
/// on PostgreSQL a statement sees the database as of its start, so these are read by the
/// statement after the lock (`channels::channel_extras`), never in the locking `UPDATE`.
/// Another connection holds the fork channel's row lock (as a backfill page does, on SQLite the
/// database's write lock), changes the fork's progress and shadow-bans the author, and commits
/// while the send waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_waited_for_its_channels_lock_sees_what_the_holder_committed() {
    use sqlx::{Connection, Executor};
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = channel_of(s, "agent", "waitsrc", "owner", &["amy"]).await;
        s.send_message(&src.cid, &msg("w-p", "point"), &user("amy")).await.expect("send");
        fork(s, &src.cid, "w-p", "waitfork").await;
        let cid = "agent:waitfork";
        sqlx::any::install_default_drivers();
        let mut other = sqlx::AnyConnection::connect(&ctx.url).await.expect("connect");
        match s.backend() {
            offshoot_store::Backend::Postgres => {
                other.execute("BEGIN").await.expect("begin");
                other.execute("SELECT cid FROM channel WHERE cid = 'agent:waitfork' FOR UPDATE").await.expect("lock the channel");
            }
            offshoot_store::Backend::Sqlite => {
                other.execute("BEGIN IMMEDIATE").await.expect("take the write lock");
            }
        }
        let before = events_since(s, 0).await.last().map_or(0, |e| e.seq);
        let send = tokio::spawn({
            let store = s.clone();
            async move { store.send_message(cid, &msg("w-1", "sent while the channel is locked"), &user("amy")).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!send.is_finished(), "the send did not wait for the lock: {:?}", send.await);
        other.execute("UPDATE fork SET copied_message_count = 4242 WHERE cid = 'agent:waitfork'").await.expect("progress");
        other.execute("UPDATE app_user SET shadow_banned = TRUE WHERE id = 'amy'").await.expect("shadow-ban");
        other.execute("COMMIT").await.expect("release");
        let sent = send.await.expect("join").expect("the send succeeds once the lock is free");
        assert!(sent.shadowed, "the author as the lock's holder left it: shadow-banned");
        let note = events_since(s, before)
            .await
            .into_iter()
            .find(|e| e.event.kind == "notification.message_new")
            .expect("notification.message_new");
        let summary = note.event.channel.and_then(|c| c.fork).expect("the channel's fork summary");
        assert_eq!(summary.copied_message_count, 4242, "the fork summary as the lock's holder left it");
    })
    .await;
}

/// Two processes (stores) at once over the same three channels: the source of a backfilling
/// fork, the fork and a third channel. Both send to all three and edit a message in each (the
/// source's one is also being copied), while one of them runs the fork's backfill page by page.
/// Send groups, update groups and backfill pages each take their channels' locks first, in cid
/// order (the crate's lock order), so on PostgreSQL none waits for another in a cycle, and
/// nothing is lost: every send stored and counted, each edit's last value kept, the copy exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_edits_and_backfill_pages_of_two_stores_over_the_same_channels_neither_deadlock_nor_lose_writes() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "mix-src", &["amy", "ben"]).await;
        let other = agent_channel(s, "mix-other", &["amy", "ben"]).await;
        let seeded = seed(s, &src.cid, "amy", "mx", 300, BASE_TS).await;
        s.send_message(&other.cid, &msg("mix-edit-other", "0"), &user("amy")).await.expect("send");
        let out = fork(s, &src.cid, "mx00299", "mixf").await;
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        let fc = out.channel.cid.clone();
        s.send_message(&fc, &msg("mix-edit-fork", "0"), &user("amy")).await.expect("send to the fork");
        let count_before = |cid: &str| {
            let cid = cid.to_string();
            async move { s.get_channel(&cid).await.expect("read").expect("exists").message_count }
        };
        // The fork ends with every copy and its own message, whatever the backfill had copied.
        let counts = [count_before(&src.cid).await, 300 + 1, count_before(&other.cid).await];
        let cids = vec![src.cid.clone(), fc.clone(), other.cid.clone()];
        let edited = ["mx00005", "mix-edit-fork", "mix-edit-other"];
        let rounds = 10;
        let fork_cid = fc.clone();
        let pages = race(&ctx.url, 2, move |store, i| {
            let (cids, fc) = (cids.clone(), fork_cid.clone());
            async move {
                let backfill = async {
                    let mut pages = 0;
                    if i == 0 {
                        loop {
                            pages += 1;
                            match store.backfill_step(&fc, 20).await.expect("backfill page") {
                                BackfillStep::More => {}
                                BackfillStep::Done | BackfillStep::Gone => break,
                            }
                        }
                    }
                    pages
                };
                let sends = futures_util::future::join_all(
                    (0..rounds).flat_map(|r| cids.iter().enumerate().map(move |(c, cid)| (r, c, cid.clone())).collect::<Vec<_>>()).map(
                        |(r, c, cid)| {
                            let store = store.clone();
                            async move {
                                store
                                    .send_message(&cid, &msg(&format!("mix-{i}-{r}-{c}"), "x"), &user("ben"))
                                    .await
                                    .expect("every send is stored")
                            }
                        },
                    ),
                );
                let edits = futures_util::future::join_all(edited.iter().map(|id| {
                    let store = store.clone();
                    async move {
                        for r in 0..rounds {
                            let text = format!("{i}-{r}");
                            store
                                .update_message(id, &user("amy"), move |m| {
                                    m.text = text.clone();
                                    Ok(())
                                })
                                .await
                                .expect("every edit is applied");
                        }
                    }
                }));
                let (pages, _, _) = tokio::join!(backfill, sends, edits);
                pages
            }
        })
        .await;
        assert!(pages[0] > 2, "the backfill ran in several pages meanwhile: {pages:?}");
        for (k, cid) in [&src.cid, &fc, &other.cid].into_iter().enumerate() {
            let ch = s.get_channel(cid).await.expect("read").expect("exists");
            assert_eq!(ch.message_count, counts[k] + 2 * rounds as i64, "{cid}: every send counted");
            for i in 0..2 {
                for r in 0..rounds {
                    stored(s, &format!("mix-{i}-{r}-{k}")).await;
                }
            }
        }
        let last = [format!("0-{}", rounds - 1), format!("1-{}", rounds - 1)];
        for id in edited {
            let text = stored(s, id).await.text;
            assert!(last.contains(&text), "{id}: the last edit of one of the two stores is kept, got {text:?}");
        }
        let done = summary(s, &fc).await;
        assert_eq!(done.status, ForkStatus::Completed);
        assert_eq!(done.copied_message_count, 300);
        let copies = s.fork_message_ids(&fc, &seeded).await.expect("lookup");
        assert_eq!(copies.len(), 300, "every source message copied once");
    })
    .await;
}

/// A backfill's plan (tens of milliseconds of a database connection) waits for a turn among the
/// process's background work, so forks starting at once plan one after another. On SQLite only
/// the plan takes a turn (its pages queue on the write lock), so there the test fails without
/// it; on PostgreSQL the page takes one as well, and the test checks the step still waits.
#[tokio::test]
async fn a_backfill_plans_only_in_a_background_turn() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let src = agent_channel(s, "turns-src", &["amy"]).await;
        let ids = seed(s, &src.cid, "amy", "t", 150, BASE_TS).await;
        let out = fork(s, &src.cid, ids.last().expect("seeded"), "turns-dst").await;
        assert_eq!(out.fork.status, ForkStatus::Backfilling);
        let turns = s.hold_background_turns().await;
        let step = tokio::spawn({
            let s = s.clone();
            async move { s.backfill_step("agent:turns-dst", 20).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!step.is_finished(), "the first step plans, and waits for a turn while every turn is taken");
        drop(turns);
        assert_eq!(step.await.expect("step").expect("step"), BackfillStep::More);
    })
    .await;
}
