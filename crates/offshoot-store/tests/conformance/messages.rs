//! Messages: sending, threads, quotes, pagination, visibility, edits, deletes, reactions, pins,
//! threads, truncation and rewind.

use crate::support::{
    agent_channel, assert_kind, events_since, ids_seen_by, kinds, msg, msg_at, race, reply, reply_at, seed, user, viewer, with_store,
    BASE_TS, MS,
};
use offshoot_core::model::{Message, NewMessage, Reaction, Viewer};
use offshoot_core::{Error, ErrorKind};
use offshoot_store::{is_visible, Editor, Page, PageDir};
use serde_json::json;

fn page(limit: i64, dir: PageDir) -> Page {
    Page { limit, dir }
}

fn ids(msgs: &[Message]) -> Vec<String> {
    msgs.iter().map(|m| m.id.clone()).collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn reaction(kind: &str, score: i64) -> Reaction {
    Reaction { kind: kind.into(), score, ..Default::default() }
}

async fn stored(s: &offshoot_store::Store, id: &str) -> Message {
    s.get_message(id, &Viewer::Server).await.expect("get message").expect("message exists").0
}

#[tokio::test]
async fn sending_a_reply_bumps_the_parents_reply_count_and_the_channels_counters() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "send", &["amy"]).await;
        let parent = s.send_message(&ch.cid, &msg("p1", "question"), &user("amy")).await.expect("send parent");
        assert_eq!((parent.kind.as_str(), parent.cid.as_str(), parent.user_id.as_str()), ("regular", "agent:send", "amy"));
        assert_eq!(parent.user.as_ref().and_then(|u| u.name.as_deref()), Some("amy name"), "the author is hydrated");
        let r = s.send_message(&ch.cid, &reply("r1", "p1", "answer"), &user("bot")).await.expect("send reply");
        assert_eq!(r.kind, "reply", "a regular message in a thread becomes a reply");
        assert_eq!(r.parent_id.as_deref(), Some("p1"));
        assert!(s.get_user("bot").await.expect("get user").is_some(), "an unknown author is created on first sight");

        let p = stored(s, "p1").await;
        assert_eq!(p.reply_count, 1);
        let participants: Vec<String> = p.thread_participants.iter().map(|u| u.id.clone()).collect();
        assert_eq!(participants, strings(&["bot"]));
        let replies = s.replies(&p, None, &Viewer::Server, &page(10, PageDir::Latest)).await.expect("replies");
        assert_eq!(ids(&replies), strings(&["r1"]));
        assert_eq!(
            ids_seen_by(s, &ch.cid, &Viewer::Server).await,
            strings(&["p1"]),
            "a reply not shown in the channel stays in its thread"
        );

        let shown = NewMessage { show_in_channel: true, ..reply("r2", "p1", "also in the channel") };
        s.send_message(&ch.cid, &shown, &user("amy")).await.expect("send shown reply");
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, strings(&["p1", "r2"]));
        assert_eq!(stored(s, "p1").await.reply_count, 2);

        let generated = s.send_message(&ch.cid, &msg("", "no id"), &user("amy")).await.expect("send without id");
        assert!(!generated.id.is_empty(), "a missing id is generated");
        let channel = s.get_channel(&ch.cid).await.expect("get").expect("exists");
        assert_eq!(channel.message_count, 4);
        assert_eq!(channel.last_message_at, Some(generated.created_at));
        assert_kind(s.send_message("agent:none", &msg("x", "x"), &user("amy")).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn a_message_id_that_exists_anywhere_is_rejected() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let a = agent_channel(s, "dup-a", &[]).await;
        let b = agent_channel(s, "dup-b", &[]).await;
        s.send_message(&a.cid, &msg("dup", "first"), &user("amy")).await.expect("send");
        let e = assert_kind(s.send_message(&a.cid, &msg("dup", "second"), &user("amy")).await, ErrorKind::Input);
        assert!(e.message.contains("already exists"), "{e}");
        assert_kind(s.send_message(&b.cid, &msg("dup", "elsewhere"), &user("amy")).await, ErrorKind::Input);
        assert_eq!(stored(s, "dup").await.text, "first", "the first message is untouched");
    })
    .await;
}

#[tokio::test]
async fn a_reply_to_a_reply_or_to_a_message_of_another_channel_is_rejected() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "nest", &[]).await;
        let other = agent_channel(s, "nest-other", &[]).await;
        s.send_message(&ch.cid, &msg("top", "top"), &user("amy")).await.expect("send");
        s.send_message(&ch.cid, &reply("r1", "top", "reply"), &user("amy")).await.expect("reply");
        assert_kind(s.send_message(&ch.cid, &reply("r2", "r1", "reply to reply"), &user("amy")).await, ErrorKind::MultipleNesting);
        assert_kind(s.send_message(&other.cid, &reply("r3", "top", "cross-channel"), &user("amy")).await, ErrorKind::Input);
        assert_kind(s.send_message(&ch.cid, &reply("r4", "missing", "no parent"), &user("amy")).await, ErrorKind::Input);
        assert!(s.get_message("r2", &Viewer::Server).await.expect("get").is_none(), "nothing was stored");
        assert_eq!(stored(s, "top").await.reply_count, 1);
    })
    .await;
}

#[tokio::test]
async fn a_quoted_message_comes_back_inside_the_quoting_message_until_it_is_deleted() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "quote", &[]).await;
        s.send_message(&ch.cid, &msg("q", "quoted"), &user("amy")).await.expect("send");
        let quoting = NewMessage { quoted_message_id: Some("q".into()), ..msg("qq", "quoting") };
        let m = s.send_message(&ch.cid, &quoting, &user("ben")).await.expect("send quoting");
        let q = m.quoted_message.as_ref().expect("quoted message is hydrated");
        assert_eq!((q.id.as_str(), q.text.as_str()), ("q", "quoted"));
        assert_eq!(q.user.as_ref().map(|u| u.id.as_str()), Some("amy"));
        let bad = NewMessage { quoted_message_id: Some("nope".into()), ..msg("qx", "bad quote") };
        assert_kind(s.send_message(&ch.cid, &bad, &user("ben")).await, ErrorKind::Input);
        s.delete_message("q", false, None).await.expect("delete quoted");
        let m = stored(s, "qq").await;
        assert_eq!(m.quoted_message_id.as_deref(), Some("q"));
        assert!(m.quoted_message.is_none(), "a deleted quote is not shown");
    })
    .await;
}

#[tokio::test]
async fn channel_messages_page_latest_before_after_and_around_inclusively_and_exclusively() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "pages", &[]).await;
        let all = seed(s, &ch.cid, "amy", "m", 10, BASE_TS).await;
        let other = agent_channel(s, "pages-other", &[]).await;
        s.send_message(&other.cid, &msg("foreign", "x"), &user("amy")).await.expect("send");
        let ch = s.get_channel(&ch.cid).await.expect("get").expect("exists");
        let run = |dir: PageDir, limit: i64| {
            let ch = ch.clone();
            async move { ids(&s.channel_messages(&ch, &Viewer::Server, &page(limit, dir)).await.expect("page")) }
        };
        let range = |a: usize, b: usize| all[a..b].to_vec();
        let at = |id: &str| id.to_string();
        assert_eq!(run(PageDir::Latest, 3).await, range(7, 10), "the newest page, oldest first");
        assert_eq!(run(PageDir::Latest, 100).await, all);
        assert_eq!(run(PageDir::Before { id: at("m00005"), inclusive: false }, 3).await, range(2, 5));
        assert_eq!(run(PageDir::Before { id: at("m00005"), inclusive: true }, 3).await, range(3, 6));
        assert_eq!(run(PageDir::Before { id: at("m00001"), inclusive: false }, 3).await, range(0, 1));
        assert_eq!(run(PageDir::After { id: at("m00005"), inclusive: false }, 3).await, range(6, 9));
        assert_eq!(run(PageDir::After { id: at("m00005"), inclusive: true }, 3).await, range(5, 8));
        assert_eq!(run(PageDir::After { id: at("m00008"), inclusive: false }, 3).await, range(9, 10));
        assert_eq!(run(PageDir::Around { id: at("m00005") }, 4).await, range(4, 8));
        assert_eq!(run(PageDir::Around { id: at("m00000") }, 4).await, range(0, 4), "around the oldest fills from after it");
        assert!(run(PageDir::Before { id: at("unknown"), inclusive: false }, 3).await.is_empty());
        assert!(
            run(PageDir::After { id: at("foreign"), inclusive: false }, 3).await.is_empty(),
            "an anchor from another channel matches nothing"
        );

        // Replies page the same way.
        s.send_message(&ch.cid, &msg_at("t", "thread", BASE_TS + 100 * MS), &user("amy")).await.expect("send");
        for i in 0..5 {
            s.send_message(&ch.cid, &reply_at(&format!("t{i}"), "t", "r", BASE_TS + (101 + i) * MS), &user("amy")).await.expect("reply");
        }
        let parent = stored(s, "t").await;
        let replies = |dir: PageDir| {
            let parent = parent.clone();
            async move { ids(&s.replies(&parent, None, &Viewer::Server, &page(2, dir)).await.expect("replies")) }
        };
        assert_eq!(replies(PageDir::Latest).await, strings(&["t3", "t4"]));
        assert_eq!(replies(PageDir::Before { id: at("t3"), inclusive: false }).await, strings(&["t1", "t2"]));
        assert_eq!(replies(PageDir::After { id: at("t1"), inclusive: true }).await, strings(&["t1", "t2"]));
        assert!(
            replies(PageDir::After { id: at("m00001"), inclusive: true }).await.is_empty(),
            "an anchor outside the thread matches nothing"
        );
    })
    .await;
}

#[tokio::test]
async fn shadowed_messages_are_seen_only_by_their_author_and_the_server() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "shadow", &["amy", "troll"]).await;
        s.send_message(&ch.cid, &msg("ok", "fine"), &user("amy")).await.expect("send");
        s.set_ban("troll", true, true).await.expect("shadow ban");
        let m = s.send_message(&ch.cid, &msg("sh", "spam"), &user("troll")).await.expect("send shadowed");
        assert!(m.shadowed);
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, strings(&["ok", "sh"]));
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("troll")).await, strings(&["ok", "sh"]));
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("amy")).await, strings(&["ok"]));
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Anonymous { id: "anon".into() }).await, strings(&["ok"]));
        let (m, hidden) = s.get_message("sh", &viewer("amy")).await.expect("get").expect("stored");
        assert!(!hidden);
        assert!(is_visible(&m, hidden, None, &Viewer::Server));
        assert!(is_visible(&m, hidden, None, &viewer("troll")));
        assert!(!is_visible(&m, hidden, None, &viewer("amy")));
    })
    .await;
}

#[tokio::test]
async fn restricted_visibility_shows_a_message_only_to_the_listed_users_the_author_and_the_server() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "restricted", &["amy", "ben", "cat"]).await;
        s.send_message(&ch.cid, &msg("all", "for everyone"), &user("amy")).await.expect("send");
        let secret = NewMessage { restricted_visibility: strings(&["ben"]), ..msg("rv", "for ben") };
        let m = s.send_message(&ch.cid, &secret, &user("amy")).await.expect("send restricted");
        assert_eq!(m.restricted_visibility, strings(&["ben"]));
        // A user id that is a prefix or pattern of the listed one must not match.
        let tricky = NewMessage { restricted_visibility: strings(&["b_n%"]), ..msg("rv2", "for a pattern-like id") };
        s.send_message(&ch.cid, &tricky, &user("amy")).await.expect("send restricted");
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, strings(&["all", "rv", "rv2"]));
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("amy")).await, strings(&["all", "rv", "rv2"]), "the author sees it");
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("ben")).await, strings(&["all", "rv"]), "a listed user sees it");
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("cat")).await, strings(&["all"]));
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("b_n%")).await, strings(&["all", "rv2"]));
        assert!(is_visible(&m, false, None, &viewer("ben")));
        assert!(!is_visible(&m, false, None, &viewer("cat")));
        assert!(!is_visible(&m, true, None, &Viewer::Server), "hidden by a rewind: seen by nobody");
        assert!(!is_visible(&m, false, Some(m.created_at), &Viewer::Server), "truncated at its creation: seen by nobody");
        assert!(is_visible(&m, false, Some(m.created_at - 1), &viewer("ben")));
    })
    .await;
}

#[tokio::test]
async fn update_message_applies_the_closure_and_stores_nothing_when_it_fails() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "edit", &[]).await;
        let original = s.send_message(&ch.cid, &msg("e1", "draft"), &user("amy")).await.expect("send");
        let edited = s
            .update_message("e1", &user("amy"), |m| {
                m.text = "final".into();
                m.custom.insert("k".into(), json!(1));
                m.attachments = vec![json!({"type": "image"})];
                Ok(())
            })
            .await
            .expect("edit");
        assert_eq!(edited.text, "final");
        assert!(edited.message_text_updated_at.is_some(), "a text edit is recorded");
        assert!(edited.updated_at >= original.updated_at);
        let again = stored(s, "e1").await;
        assert_eq!((again.text.as_str(), again.custom.get("k"), again.attachments.len()), ("final", Some(&json!(1)), 1));

        let custom_only = s
            .update_message("e1", &user("amy"), |m| {
                m.custom.insert("k".into(), json!(2));
                Ok(())
            })
            .await
            .expect("edit custom");
        assert_eq!(custom_only.message_text_updated_at, again.message_text_updated_at, "no text change, no new text timestamp");

        let failed = s
            .update_message("e1", &user("amy"), |m| {
                m.text = "lost".into();
                Err(Error::new(ErrorKind::MessageTooLong, "too long"))
            })
            .await;
        assert_kind(failed, ErrorKind::MessageTooLong);
        assert_eq!(stored(s, "e1").await.text, "final", "a failing closure changes nothing");
        assert_kind(s.update_message("nope", &user("amy"), |_| Ok(())).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn a_soft_delete_keeps_the_message_as_deleted_and_a_hard_delete_removes_it() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "del", &[]).await;
        s.send_message(&ch.cid, &msg("p", "parent"), &user("amy")).await.expect("send");
        s.send_message(&ch.cid, &reply("r1", "p", "one"), &user("amy")).await.expect("reply");
        s.send_message(&ch.cid, &reply("r2", "p", "two"), &user("amy")).await.expect("reply");
        s.add_reaction("r2", &reaction("like", 1), false, &user("ben")).await.expect("react");

        let soft = s.delete_message("r1", false, Some(&user("amy"))).await.expect("soft delete");
        assert_eq!(soft.kind, "deleted");
        assert!(soft.deleted_at.is_some());
        let kept = stored(s, "r1").await;
        assert_eq!((kept.kind.as_str(), kept.deleted_at), ("deleted", soft.deleted_at));
        assert_eq!(stored(s, "p").await.deleted_reply_count, 1);
        let seq = s.last_event_seq().await.expect("seq");
        s.delete_message("r1", false, None).await.expect("soft delete again");
        assert_eq!(s.last_event_seq().await.expect("seq"), seq, "deleting a deleted message announces nothing");
        assert_eq!(stored(s, "p").await.deleted_reply_count, 1, "and counts nothing");

        let hard = s.delete_message("r2", true, None).await.expect("hard delete");
        assert_eq!(hard.id, "r2");
        assert!(s.get_message("r2", &Viewer::Server).await.expect("get").is_none());
        assert_eq!(stored(s, "p").await.reply_count, 1, "a hard-deleted reply no longer counts");
        s.send_message(&ch.cid, &msg("r2", "id reused"), &user("amy")).await.expect("the id is free again");
        assert!(stored(s, "r2").await.reaction_counts.is_empty(), "its reactions went with it");
        assert_kind(s.delete_message("nope", true, None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn reactions_are_counted_replaced_made_unique_and_removed() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "react", &["amy", "ben"]).await;
        s.send_message(&ch.cid, &msg("m", "react to me"), &user("amy")).await.expect("send");
        s.add_reaction("m", &reaction("like", 1), false, &user("amy")).await.expect("like");
        s.add_reaction("m", &reaction("love", 1), false, &user("amy")).await.expect("love");
        let (m, r) = s.add_reaction("m", &reaction("like", 3), false, &user("ben")).await.expect("ben likes");
        assert_eq!((r.kind.as_str(), r.user_id.as_str(), r.score), ("like", "ben", 3));
        assert_eq!(m.reaction_counts.get("like"), Some(&json!(2)));
        assert_eq!(m.reaction_counts.get("love"), Some(&json!(1)));
        assert_eq!(m.reaction_scores.get("like"), Some(&json!(4)));
        let (m, _) = s.get_message("m", &viewer("amy")).await.expect("get").expect("exists");
        let mut own: Vec<String> = m.own_reactions.iter().map(|r| r.kind.clone()).collect();
        own.sort();
        assert_eq!(own, strings(&["like", "love"]));
        assert_eq!(m.latest_reactions.len(), 3);

        // The same type again replaces the score.
        let (m, _) = s.add_reaction("m", &reaction("like", 5), false, &user("ben")).await.expect("ben likes harder");
        assert_eq!(m.reaction_counts.get("like"), Some(&json!(2)));
        assert_eq!(m.reaction_scores.get("like"), Some(&json!(6)));

        // enforce_unique: amy's earlier reactions are replaced by the new one.
        let (m, r) = s.add_reaction("m", &reaction("wow", 1), true, &user("amy")).await.expect("unique");
        assert_eq!(r.kind, "wow");
        assert_eq!(m.reaction_counts.get("love"), None);
        assert_eq!(m.reaction_counts.get("like"), Some(&json!(1)));
        assert_eq!(m.reaction_counts.get("wow"), Some(&json!(1)));

        let (m, r) = s.remove_reaction("m", "like", &user("ben")).await.expect("remove");
        assert_eq!((r.kind.as_str(), r.user_id.as_str()), ("like", "ben"));
        assert_eq!(m.reaction_counts.len(), 1);
        assert_eq!(m.reaction_counts.get("wow"), Some(&json!(1)));
        assert_kind(s.remove_reaction("m", "like", &user("ben")).await, ErrorKind::NotFound);
        assert_kind(s.add_reaction("nope", &reaction("like", 1), false, &user("ben")).await, ErrorKind::NotFound);
        assert_kind(s.remove_reaction("nope", "like", &user("ben")).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn pinned_messages_lists_visible_pins_newest_pin_first() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "pins", &["amy"]).await;
        let first =
            s.send_message(&ch.cid, &NewMessage { pinned: true, ..msg("p1", "pinned on send") }, &user("amy")).await.expect("send pinned");
        assert!(first.pinned && first.pinned_at.is_some());
        assert_eq!(first.pinned_by_id.as_deref(), Some("amy"));
        s.send_message(&ch.cid, &msg("p2", "pinned later"), &user("amy")).await.expect("send");
        s.send_message(&ch.cid, &msg("n", "never pinned"), &user("amy")).await.expect("send");
        let later = first.pinned_at.expect("pinned_at") + 1_000_000;
        s.update_message("p2", &user("amy"), move |m| {
            m.pinned = true;
            m.pinned_at = Some(later);
            m.pinned_by_id = Some("amy".into());
            Ok(())
        })
        .await
        .expect("pin");
        let ch = s.get_channel(&ch.cid).await.expect("get").expect("exists");
        assert_eq!(ids(&s.pinned_messages(&ch, &viewer("amy"), 10).await.expect("pins")), strings(&["p2", "p1"]));
        assert_eq!(ids(&s.pinned_messages(&ch, &Viewer::Server, 1).await.expect("pins")), strings(&["p2"]));
        s.delete_message("p2", false, None).await.expect("delete");
        assert_eq!(ids(&s.pinned_messages(&ch, &Viewer::Server, 10).await.expect("pins")), strings(&["p1"]), "deleted pins are left out");
    })
    .await;
}

#[tokio::test]
async fn query_threads_returns_parents_with_their_latest_replies_in_channels_the_user_may_read() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let a = agent_channel(s, "th-a", &["amy"]).await;
        let b = agent_channel(s, "th-b", &["ben"]).await;
        s.send_message(&a.cid, &msg_at("pa", "thread a", BASE_TS), &user("amy")).await.expect("send");
        s.send_message(&a.cid, &msg_at("lonely", "no replies", BASE_TS + MS), &user("amy")).await.expect("send");
        for i in 0..3 {
            s.send_message(&a.cid, &reply_at(&format!("ra{i}"), "pa", "r", BASE_TS + (10 + i) * MS), &user("amy")).await.expect("reply");
        }
        s.send_message(&b.cid, &msg_at("pb", "thread b", BASE_TS + 2 * MS), &user("ben")).await.expect("send");
        s.send_message(&b.cid, &reply_at("rb0", "pb", "r", BASE_TS + 20 * MS), &user("ben")).await.expect("reply");

        let summary = |threads: Vec<(Message, Vec<Message>, offshoot_core::model::Channel)>| {
            threads.into_iter().map(|(p, rs, ch)| (p.id, ids(&rs), ch.cid)).collect::<Vec<_>>()
        };
        let all = summary(s.query_threads(&Viewer::Server, None, 10, 2).await.expect("threads"));
        assert_eq!(
            all,
            vec![
                ("pb".to_string(), strings(&["rb0"]), "agent:th-b".to_string()),
                ("pa".to_string(), strings(&["ra1", "ra2"]), "agent:th-a".to_string())
            ],
            "newest parent first, with the latest replies oldest first"
        );
        let amy = summary(s.query_threads(&viewer("amy"), None, 10, 5).await.expect("threads"));
        assert_eq!(
            amy,
            vec![("pa".to_string(), strings(&["ra0", "ra1", "ra2"]), "agent:th-a".to_string())],
            "a user sees threads of their channels only"
        );
        let admin = Viewer::User { id: "root".into(), role: "admin".into() };
        assert_eq!(s.query_threads(&admin, None, 10, 1).await.expect("threads").len(), 2, "an admin sees every channel");
        let only_b = summary(s.query_threads(&Viewer::Server, Some(std::slice::from_ref(&b.cid)), 10, 1).await.expect("threads"));
        assert_eq!(only_b.into_iter().map(|t| t.0).collect::<Vec<_>>(), strings(&["pb"]));
        assert!(s.query_threads(&Viewer::Server, Some(&[]), 10, 1).await.expect("threads").is_empty());
        assert_eq!(s.query_threads(&Viewer::Server, None, 1, 1).await.expect("threads").len(), 1, "limit applies");
    })
    .await;
}

#[tokio::test]
async fn a_soft_truncate_hides_older_messages_and_adds_the_system_message() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "trunc", &["amy"]).await;
        seed(s, &ch.cid, "amy", "m", 4, BASE_TS).await;
        // Truncating at a past instant hides only what is older.
        let (partial, sys) =
            s.truncate_channel(&ch.cid, Some(BASE_TS + MS + MS / 2), false, Some(&user("owner")), None).await.expect("truncate at a point");
        assert!(sys.is_none());
        assert_eq!(partial.truncated_at, Some(BASE_TS + MS + MS / 2));
        assert_eq!(partial.truncated_by_id.as_deref(), Some("owner"));
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, strings(&["m00002", "m00003"]));

        let note = NewMessage { user_id: "owner".into(), ..msg("", "the channel was cleared") };
        let (ch2, sys) = s.truncate_channel(&ch.cid, None, false, Some(&user("owner")), Some(&note)).await.expect("truncate now");
        let sys = sys.expect("a system message");
        assert_eq!(sys.kind, "system");
        assert_eq!(sys.text, "the channel was cleared");
        assert!(sys.created_at > ch2.truncated_at.expect("truncated_at"), "the system message is after the truncation");
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, vec![sys.id.clone()]);
        assert!(s.get_message("m00000", &Viewer::Server).await.expect("get").is_some(), "a soft truncate keeps the rows");
        s.send_message(&ch.cid, &msg("after", "new"), &user("amy")).await.expect("send");
        assert_eq!(ids_seen_by(s, &ch.cid, &viewer("amy")).await, vec![sys.id, "after".to_string()]);
        assert_kind(s.truncate_channel("agent:none", None, false, None, None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn a_hard_truncate_deletes_older_messages() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "htrunc", &[]).await;
        seed(s, &ch.cid, "amy", "h", 3, BASE_TS).await;
        s.add_reaction("h00000", &reaction("like", 1), false, &user("amy")).await.expect("react");
        let (_, sys) = s.truncate_channel(&ch.cid, Some(BASE_TS + MS), true, None, None).await.expect("hard truncate");
        assert!(sys.is_none());
        assert!(s.get_message("h00000", &Viewer::Server).await.expect("get").is_none());
        assert!(s.get_message("h00001", &Viewer::Server).await.expect("get").is_none(), "the boundary itself is included");
        assert!(s.get_message("h00002", &Viewer::Server).await.expect("get").is_some());
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, strings(&["h00002"]));
        s.send_message(&ch.cid, &msg("h00000", "reused"), &user("amy")).await.expect("a hard-truncated id is free again");
    })
    .await;
}

/// a0..a4 at BASE+0..4 ms, with replies ra1 (1.5 ms) and rlate (3.5 ms) to a1, r2 (2.5 ms) to
/// a2 and r4 (4.5 ms) to a4.
async fn rewind_fixture(s: &offshoot_store::Store) -> String {
    let ch = agent_channel(s, "rw", &["amy"]).await;
    seed(s, &ch.cid, "amy", "a", 5, BASE_TS).await;
    for (id, parent, at) in [("ra1", "a00001", 1.5), ("r2", "a00002", 2.5), ("rlate", "a00001", 3.5), ("r4", "a00004", 4.5)] {
        s.send_message(&ch.cid, &reply_at(id, parent, "r", BASE_TS + (at * MS as f64) as i64), &user("amy")).await.expect("reply");
    }
    ch.cid
}

#[tokio::test]
async fn a_rewind_hides_later_messages_and_replies_from_every_read() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let cid = rewind_fixture(s).await;
        assert_eq!(stored(s, "a00001").await.reply_count, 2);
        let seq = s.last_event_seq().await.expect("seq");
        let ch = s.rewind_channel(&cid, "a00002", "a00004", false, Some(&user("owner"))).await.expect("rewind");
        assert_eq!(ch.cid, cid);
        assert_eq!(ids_seen_by(s, &cid, &Viewer::Server).await, strings(&["a00000", "a00001", "a00002"]));
        assert_eq!(ids_seen_by(s, &cid, &viewer("amy")).await, strings(&["a00000", "a00001", "a00002"]));
        for id in ["a00003", "a00004", "r2", "rlate", "r4"] {
            let (_, hidden) = s.get_message(id, &Viewer::Server).await.expect("get").expect("rows are kept");
            assert!(hidden, "{id} is hidden");
        }
        assert!(!s.get_message("ra1", &Viewer::Server).await.expect("get").expect("kept").1);
        let a1 = stored(s, "a00001").await;
        assert_eq!(a1.reply_count, 1, "reply counts only count what is still visible");
        assert_eq!(ids(&s.replies(&a1, None, &Viewer::Server, &page(10, PageDir::Latest)).await.expect("replies")), strings(&["ra1"]));
        assert_eq!(stored(s, "a00002").await.reply_count, 0);
        assert_eq!(kinds(&events_since(s, seq).await), strings(&["channel.rewound"]));

        // Hidden messages cannot be edited, deleted or reacted to.
        assert_kind(s.update_message("a00003", &user("amy"), |_| Ok(())).await, ErrorKind::NotFound);
        assert_kind(s.delete_message("a00003", false, None).await, ErrorKind::NotFound);
        assert_kind(s.add_reaction("a00003", &reaction("like", 1), false, &user("amy")).await, ErrorKind::NotFound);
        assert_kind(s.send_message(&cid, &reply("late", "a00004", "to a hidden parent"), &user("amy")).await, ErrorKind::Input);
        // The conversation goes on from the rewind point.
        s.send_message(&cid, &msg("b", "new branch"), &user("amy")).await.expect("send after rewind");
        assert_eq!(ids_seen_by(s, &cid, &Viewer::Server).await, strings(&["a00000", "a00001", "a00002", "b"]));
    })
    .await;
}

#[tokio::test]
async fn an_inclusive_rewind_hides_the_rewind_point_too() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let cid = rewind_fixture(s).await;
        s.rewind_channel(&cid, "a00001", "a00004", true, None).await.expect("rewind inclusive");
        assert_eq!(ids_seen_by(s, &cid, &Viewer::Server).await, strings(&["a00000"]));
        assert!(s.get_message("a00001", &Viewer::Server).await.expect("get").expect("kept").1);
        assert!(s.get_message("ra1", &Viewer::Server).await.expect("get").expect("kept").1, "replies of a hidden parent are hidden");
    })
    .await;
}

#[tokio::test]
async fn a_rewind_with_a_stale_expected_last_message_is_a_rewind_conflict() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let cid = rewind_fixture(s).await;
        let e = assert_kind(s.rewind_channel(&cid, "a00001", "a00003", false, None).await, ErrorKind::RewindConflict);
        assert_eq!(e.fields.get("reason").map(String::as_str), Some("rewind_conflict"));
        assert_eq!(ids_seen_by(s, &cid, &Viewer::Server).await.len(), 5, "a refused rewind hides nothing");
        s.rewind_channel(&cid, "a00003", "a00004", false, None).await.expect("rewind");
        // a00004 is hidden now, so it is no longer the newest visible message.
        assert_kind(s.rewind_channel(&cid, "a00001", "a00004", false, None).await, ErrorKind::RewindConflict);
        s.rewind_channel(&cid, "a00001", "a00003", false, None).await.expect("rewind with the current newest");
        // The rewind point must be a visible top-level message of the channel.
        assert_kind(s.rewind_channel(&cid, "ra1", "a00001", false, None).await, ErrorKind::Input);
        assert_kind(s.rewind_channel(&cid, "a00003", "a00001", false, None).await, ErrorKind::Input);
        assert_kind(s.rewind_channel("agent:none", "a00001", "a00001", false, None).await, ErrorKind::NotFound);
    })
    .await;
}

/// Guarded on PostgreSQL by the channel row lock every message write takes first and,
/// independently, by the primary key with its violation mapped to a client error (either one
/// suffices; with both removed the loser gets a database error), and on SQLite by `BEGIN
/// IMMEDIATE` (a deferred transaction that read before the winner wrote cannot write at all).
/// Two stores on separate pools, released by a barrier, for several rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_sends_of_one_message_id_store_one_message() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let ch = agent_channel(&s, "race", &[]).await;
        let rounds = 8;
        for round in 0..rounds {
            let id = format!("same{round}");
            let results = race(&ctx.url, 2, |store, i| {
                let (cid, id) = (ch.cid.clone(), id.clone());
                async move { store.send_message(&cid, &msg(&id, &format!("contender {i}")), &user("amy")).await }
            })
            .await;
            assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "round {round}: one send wins: {results:?}");
            for r in results {
                if let Err(e) = r {
                    assert_eq!(offshoot_core::Error::from(e).kind, ErrorKind::Input, "round {round}: the loser gets a client error");
                }
            }
        }
        let expected: Vec<String> = (0..rounds).map(|r| format!("same{r}")).collect();
        assert_eq!(ids_seen_by(&s, &ch.cid, &Viewer::Server).await, expected);
        assert_eq!(s.get_channel(&ch.cid).await.expect("get").expect("exists").message_count, rounds as i64);
    })
    .await;
}

/// The same id sent at once into two channels: the channel locks do not serialise the two
/// sends, so only the message insert (`ON CONFLICT (id) DO NOTHING`, which waits for the other
/// transaction's row on PostgreSQL) decides. One wins; the loser gets a client error and its
/// channel keeps no trace of it (its counter bump rolls back with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_sends_of_one_message_id_into_two_channels_store_one_message() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let chans = [agent_channel(&s, "race-a", &[]).await.cid, agent_channel(&s, "race-b", &[]).await.cid];
        let rounds = 8;
        for round in 0..rounds {
            let id = format!("twin{round}");
            let results = race(&ctx.url, 2, |store, i| {
                let (cid, id) = (chans[i].clone(), id.clone());
                async move { store.send_message(&cid, &msg(&id, &format!("contender {i}")), &user("amy")).await }
            })
            .await;
            assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "round {round}: one send wins: {results:?}");
            for r in results {
                if let Err(e) = r {
                    assert_eq!(offshoot_core::Error::from(e).kind, ErrorKind::Input, "round {round}: the loser gets a client error");
                }
            }
        }
        let mut total = 0;
        for cid in &chans {
            let seen = ids_seen_by(&s, cid, &Viewer::Server).await.len();
            let counted = s.get_channel(cid).await.expect("get").expect("exists").message_count;
            assert_eq!(counted, seen as i64, "{cid}: message_count counts only the sends that won");
            total += seen;
        }
        assert_eq!(total, rounds, "one message per id across both channels");
    })
    .await;
}

/// Partial updates of one message from two stores at once: each locks the channel through the
/// message in one statement and reads the message under that lock, so neither overwrites the
/// other's change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_partial_updates_of_one_message_lose_no_update() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let ch = agent_channel(&s, "race-upd", &["amy"]).await;
        s.send_message(&ch.cid, &msg("upd", "v"), &user("amy")).await.expect("send");
        let rounds = 6;
        for _ in 0..rounds {
            let results = race(&ctx.url, 2, |store, i| async move {
                store
                    .update_message("upd", &user("amy"), move |m| {
                        m.text.push_str(&i.to_string());
                        Ok(())
                    })
                    .await
            })
            .await;
            assert!(results.iter().all(|r| r.is_ok()), "both updates apply: {results:?}");
        }
        let text = stored(&s, "upd").await.text;
        assert_eq!(text.len(), 1 + 2 * rounds, "every update kept: {text:?}");
        assert_eq!(text.matches('0').count(), rounds, "{text:?}");
        assert_eq!(text.matches('1').count(), rounds, "{text:?}");
    })
    .await;
}

/// Statements one send of a plain message sends in `cid`.
async fn send_statements(s: &offshoot_store::Store, cid: &str, id: &str) -> u64 {
    let (sent, statements) = offshoot_store::count_statements(s.send_message(cid, &msg(id, "hello"), &user("amy"))).await;
    sent.expect("send");
    statements
}

/// A send is a fixed number of statements: they do not grow with the channel's members (unread
/// counters, recipients' totals, watchers are each one statement) or with its history.
#[tokio::test]
async fn a_send_sends_the_same_number_of_statements_in_a_small_channel_and_a_big_one() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let small = agent_channel(s, "stmt-small", &["amy", "ben"]).await;
        let many: Vec<String> = (0..20).map(|i| format!("member{i:02}")).collect();
        let mut members: Vec<&str> = many.iter().map(String::as_str).collect();
        members.push("amy");
        let big = agent_channel(s, "stmt-big", &members).await;
        crate::support::seed(s, &big.cid, "ben", "stmt-history", 200, crate::support::BASE_TS).await;
        // A first send in each warms the caches (app settings, channel types).
        send_statements(s, &small.cid, "stmt-warm-small").await;
        send_statements(s, &big.cid, "stmt-warm-big").await;
        let few = send_statements(s, &small.cid, "stmt-s").await;
        let lots = send_statements(s, &big.cid, "stmt-b").await;
        assert!(few > 0, "statements are counted");
        assert_eq!(few, lots, "a send's statements grow with the channel's members or history");
    })
    .await;
}

/// The statements of one plain send and one partial update, pinned: each is a round trip, and
/// those of the write's transaction are made while it holds its channel's lock (and, on
/// PostgreSQL, the last of them with the outbox lock), so one more is one more wait for every
/// writer queued behind it. A send: the channel update that locks and returns the channel with
/// its watcher count, its fork summary, creator and the author (read after the lock), the
/// message insert (which also checks the id), the unread counters, the recipients' totals, the
/// events. A partial update: the channel locked through the message, the message,
/// its update, its reactions, its users, the event (and on PostgreSQL without the listener,
/// the channel types, which give the change its channel's limits).
#[tokio::test]
async fn a_send_and_a_partial_update_send_a_fixed_number_of_statements() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "stmt-fixed", &["amy", "ben", "cy"]).await;
        send_statements(s, &ch.cid, "stmt-fixed-warm").await;
        // On PostgreSQL the channel types are cached only while the notification listener
        // runs (`cache.rs`), which this suite does not start: one more read of them.
        let types = u64::from(s.backend() == offshoot_store::Backend::Postgres);
        assert_eq!(send_statements(s, &ch.cid, "stmt-fixed-send").await, 6 + types, "statements of one send");
        let (updated, statements) = offshoot_store::count_statements(s.update_message("stmt-fixed-send", &user("amy"), |m| {
            m.text = "hello again".into();
            Ok(())
        }))
        .await;
        assert_eq!(updated.expect("update").text, "hello again");
        assert_eq!(statements, 6 + types, "statements of one partial update");
    })
    .await;
}

/// A send reads its author and its channel's creator with the channel's fork summary, in one
/// statement (as JSON, `rows::user_json`): both must come out exactly as a plain read of the
/// user gives them, every field, and an author that does not exist yet is created.
#[tokio::test]
async fn a_send_carries_its_author_and_its_channels_creator_exactly_as_stored() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let mut custom = serde_json::Map::new();
        custom.insert("color".into(), json!("red"));
        custom.insert("nested".into(), json!({"a": [1, 2], "quote": "say \"hi\""}));
        let rich = offshoot_store::UserInput {
            id: "rich".into(),
            role: Some("admin".into()),
            name: Some("Rich O'Brien".into()),
            language: Some("fr".into()),
            teams: Some(vec!["red".into(), "blue".into()]),
            custom: custom.clone(),
            ..Default::default()
        };
        let plain = offshoot_store::UserInput { id: "plain".into(), invisible: Some(true), ..Default::default() };
        // After the channel: making it upserts its creator and members plainly.
        let ch = crate::support::channel_of(s, "agent", "users-json", "rich", &["plain"]).await;
        s.upsert_users(&[rich, plain]).await.expect("upsert");
        let before = events_since(s, 0).await.last().map_or(0, |e| e.seq);
        let sent = s.send_message(&ch.cid, &msg("uj-1", "hello"), &user("plain")).await.expect("send");
        let stored_plain = s.get_user("plain").await.expect("read").expect("exists");
        assert_eq!(sent.user.as_ref(), Some(&stored_plain), "the author as stored");
        assert!(stored_plain.invisible);
        let note = events_since(s, before)
            .await
            .into_iter()
            .find(|e| e.event.kind == "notification.message_new")
            .expect("notification.message_new");
        let creator = note.event.channel.and_then(|c| c.created_by).expect("the channel's creator");
        assert_eq!(creator, s.get_user("rich").await.expect("read").expect("exists"), "the creator as stored");
        assert_eq!(creator.custom, custom);
        assert_eq!(creator.teams, vec!["red".to_string(), "blue".to_string()]);
        // An author nobody created yet is created by the send.
        let newcomer = s.send_message(&ch.cid, &msg("uj-2", "first words"), &user("newcomer")).await.expect("send as a new user");
        assert_eq!(newcomer.user.map(|u| u.id), Some("newcomer".to_string()));
        assert!(s.get_user("newcomer").await.expect("read").is_some(), "the author was created");
    })
    .await;
}

/// Updates that arrive together are written together (`batch.rs`): forty updates of ten
/// messages in four channels at once, four of them of one message each time in order, one
/// refused by its change and one naming no message. Each gets its own outcome, every other
/// update is kept, each is announced once with the message as it left it, and together they
/// take fewer statements than forty updates alone (six each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_that_arrive_together_are_written_together_each_with_its_own_outcome() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let mut ids = Vec::new();
        for c in 0..4 {
            let ch = agent_channel(s, &format!("grp-{c}"), &["amy"]).await;
            for m in 0..(if c == 0 { 1 } else { 3 }) {
                let id = format!("grp-{c}-{m}");
                s.send_message(&ch.cid, &msg(&id, ""), &user("amy")).await.expect("send");
                ids.push(id);
            }
        }
        let seq = s.last_event_seq().await.expect("seq");
        // Update k of message i appends "k,"; the message `grp-0-0` gets eleven, in order.
        let mut plan: Vec<(String, usize)> = Vec::new();
        for k in 0..38 {
            let id = if k % 4 == 0 { ids[0].clone() } else { ids[1 + k % 9].clone() };
            plan.push((id, k));
        }
        plan.push(("grp-nope".into(), 38));
        plan.push((ids[5].clone(), 39));
        let amy = user("amy");
        let (outcomes, statements) = offshoot_store::count_statements(futures_util::future::join_all(plan.iter().map(|(id, k)| {
            let k = *k;
            s.update_message(id, &amy, move |m| {
                if k == 39 {
                    return Err(Error::input("refused"));
                }
                m.text.push_str(&format!("{k},"));
                Ok(())
            })
        })))
        .await;
        let mut outcomes = outcomes;
        assert_kind(outcomes.pop().expect("update 39"), ErrorKind::Input);
        assert_kind(outcomes.pop().expect("update 38"), ErrorKind::NotFound);
        let mut expected: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        for ((id, k), outcome) in plan.iter().zip(&outcomes).take(38) {
            let text = expected.entry(id.clone()).or_default();
            text.push_str(&format!("{k},"));
            let m = outcome.as_ref().expect("update applied");
            assert_eq!(&m.text, text, "update {k} answers the message as it left it");
            assert_eq!(m.user.as_ref().map(|u| u.id.as_str()), Some("amy"), "hydrated");
        }
        for (id, text) in &expected {
            assert_eq!(&stored(s, id).await.text, text, "every update of {id} kept, in order");
        }
        let updates: Vec<_> = events_since(s, seq).await.into_iter().filter(|e| e.event.kind == "message.updated").collect();
        assert_eq!(updates.len(), 38, "one event per applied update");
        let first: Vec<String> =
            updates.iter().filter_map(|e| e.event.message.as_ref()).filter(|m| m.id == ids[0]).map(|m| m.text.clone()).collect();
        let mut want = String::new();
        let mut steps = Vec::new();
        for k in (0..38).step_by(4) {
            want.push_str(&format!("{k},"));
            steps.push(want.clone());
        }
        assert_eq!(first, steps, "the updates of one message are announced in order, each with its own text");
        assert!(statements < 40 * 6, "updates that arrived together were written together: {statements} statements");
    })
    .await;
}

/// A group whose transaction fails as a whole is written again update by update: the others
/// are kept. On PostgreSQL a text with a NUL character is refused by the database itself (it
/// fails the group's transaction); SQLite stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_the_database_refuses_is_written_again_update_by_update() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "grp-nul", &["amy"]).await;
        for i in 0..8 {
            s.send_message(&ch.cid, &msg(&format!("nul-{i}"), "v"), &user("amy")).await.expect("send");
        }
        let amy = user("amy");
        let ids: Vec<String> = (0..8).map(|i| format!("nul-{i}")).collect();
        for _ in 0..3 {
            let outcomes = futures_util::future::join_all(ids.iter().enumerate().map(|(i, id)| {
                s.update_message(id, &amy, move |m| {
                    m.text = if i == 3 { "a\0b".into() } else { format!("{i}!") };
                    Ok(())
                })
            }))
            .await;
            for (i, outcome) in outcomes.iter().enumerate() {
                if i == 3 {
                    let refused = s.backend() == offshoot_store::Backend::Postgres;
                    assert_eq!(outcome.is_err(), refused, "the NUL text: {outcome:?}");
                } else {
                    assert_eq!(outcome.as_ref().expect("kept").text, format!("{i}!"));
                    assert_eq!(stored(s, &format!("nul-{i}")).await.text, format!("{i}!"));
                }
            }
        }
    })
    .await;
}

/// An edit announces who made it as stored: the message's author when the request names nobody,
/// the user it names, a placeholder for a user that does not exist; and the change sees the
/// message's channel as locked, with its type's settings (a server-side partial update checks
/// the text's length against them).
#[tokio::test]
async fn an_edit_announces_its_editor_as_stored_and_sees_its_channel_with_its_type() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        s.put_channel_type("agent", Some(4321), &Default::default()).await.expect("channel type");
        let ch = agent_channel(s, "editors", &["amy", "ben"]).await;
        s.send_message(&ch.cid, &msg("ed-1", "v"), &user("amy")).await.expect("send");
        let cases = [
            (Editor::Author, "amy", Some("amy name")),
            (Editor::Named("ben".into()), "ben", Some("ben name")),
            (Editor::Named("amy".into()), "amy", Some("amy name")),
            (Editor::Named("nobody".into()), "nobody", None),
            (Editor::User(user("cy")), "cy", None),
        ];
        for (editor, id, name) in cases {
            let seq = s.last_event_seq().await.expect("seq");
            let m = s
                .edit_message("ed-1", editor, |m, ch| {
                    m.text = format!("{} {}", ch.cid, ch.max_message_length());
                    Ok(())
                })
                .await
                .expect("edit");
            assert_eq!(m.text, "agent:editors 4321", "the change sees its channel and its type");
            assert_eq!(m.user.as_ref().and_then(|u| u.name.as_deref()), Some("amy name"), "the message keeps its author");
            let events = events_since(s, seq).await;
            assert_eq!(kinds(&events), vec!["message.updated"]);
            let by = events[0].event.user.clone().expect("the event names its editor");
            assert_eq!((by.id.as_str(), by.name.as_deref()), (id, name), "the editor as stored");
        }
    })
    .await;
}

/// A message in a deleted channel, or before its channel's truncation, cannot be changed: it
/// is not found, alone or in a group (the store checks it under the channel's lock, since a
/// server-side partial update reads nothing before), and its neighbours' updates are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_a_deleted_channel_or_before_a_truncation_cannot_be_changed() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let gone = agent_channel(s, "ed-gone", &["amy"]).await;
        s.send_message(&gone.cid, &msg("ed-gone-1", "v"), &user("amy")).await.expect("send");
        s.delete_channel(&gone.cid, false, None).await.expect("delete channel");
        let cut = agent_channel(s, "ed-cut", &["amy"]).await;
        s.send_message(&cut.cid, &msg_at("ed-old", "v", BASE_TS), &user("amy")).await.expect("send");
        s.send_message(&cut.cid, &msg_at("ed-new", "v", BASE_TS + 10 * MS), &user("amy")).await.expect("send");
        s.truncate_channel(&cut.cid, Some(BASE_TS + 5 * MS), false, None, None).await.expect("truncate");
        for round in 0..3 {
            let ids = ["ed-gone-1", "ed-old", "ed-new", "ed-gone-1", "ed-old", "ed-new"];
            let outcomes = futures_util::future::join_all(ids.iter().map(|id| {
                s.edit_message(id, Editor::Author, move |m, _| {
                    m.text.push('+');
                    Ok(())
                })
            }))
            .await;
            for (id, outcome) in ids.iter().zip(outcomes) {
                if *id == "ed-new" {
                    outcome.expect("a visible message is changed");
                } else {
                    assert_kind(outcome, ErrorKind::NotFound);
                }
            }
            assert_eq!(stored(s, "ed-new").await.text, format!("v{}", "+".repeat(2 * (round + 1))));
        }
        for id in ["ed-gone-1", "ed-old"] {
            assert_eq!(stored(s, id).await.text, "v", "{id} is unchanged");
        }
    })
    .await;
}

/// In a group, the rows of plain updates are written together, and an update that changes who
/// sees a message (here: restricting it to one reader) is written after every update that
/// arrived before it and before every one after: nothing is lost, each message ends as its last
/// update left it, and the restriction holds for the channel's other members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_every_change_around_one_that_restricts_a_message() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "grp-vis", &["amy", "ben", "cy"]).await;
        let ids: Vec<String> = (0..4).map(|i| format!("vis-{i}")).collect();
        for id in &ids {
            s.send_message(&ch.cid, &msg(id, ""), &user("amy")).await.expect("send");
        }
        let amy = user("amy");
        for round in 0..3 {
            // Six updates of each message, interleaved; the third of `vis-1` restricts it to ben.
            let plan: Vec<(usize, usize)> = (0..6).flat_map(|k| (0..ids.len()).map(move |i| (i, k))).collect();
            let outcomes = futures_util::future::join_all(plan.iter().map(|&(i, k)| {
                s.update_message(&ids[i], &amy, move |m| {
                    m.text.push_str(&format!("{k},"));
                    if i == 1 && k == 2 {
                        m.restricted_visibility = vec!["ben".to_string()];
                    }
                    Ok(())
                })
            }))
            .await;
            for o in outcomes {
                o.expect("every update applies");
            }
            let once = "0,1,2,3,4,5,";
            for id in &ids {
                assert_eq!(stored(s, id).await.text, once.repeat(round + 1), "round {round}: every update of {id} kept, in order");
            }
            assert_eq!(stored(s, &ids[1]).await.restricted_visibility, vec!["ben".to_string()]);
            assert!(!ids_seen_by(s, &ch.cid, &viewer("cy")).await.contains(&ids[1]), "cy no longer sees the restricted message");
            assert!(ids_seen_by(s, &ch.cid, &viewer("ben")).await.contains(&ids[1]), "ben does");
        }
    })
    .await;
}

/// A change that panics fails the group it is written in (its update gets an unavailable error
/// and nothing of it is written), not the queue: updates that arrived while it was written, and
/// wait behind it, are written without another update arriving to start a writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_panics_fails_its_group_and_the_queue_goes_on() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "grp-panic", &["amy"]).await;
        let ids: Vec<String> = (0..6).map(|i| format!("panic-{i}")).collect();
        for id in &ids {
            s.send_message(&ch.cid, &msg(id, "v"), &user("amy")).await.expect("send");
        }
        let amy = user("amy");
        let first = s.update_message(&ids[0], &amy, |_| {
            // Holds the writer while the others arrive.
            std::thread::sleep(std::time::Duration::from_millis(300));
            panic!("a change that panics")
        });
        let later = async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            futures_util::future::join_all(ids[1..].iter().map(|id| {
                s.update_message(id, &amy, |m| {
                    m.text = "changed".into();
                    Ok(())
                })
            }))
            .await
        };
        let (first, later) = tokio::time::timeout(std::time::Duration::from_secs(20), async { tokio::join!(first, later) })
            .await
            .expect("the updates behind the failed group were written");
        assert!(matches!(first, Err(offshoot_store::StoreError::Unavailable(_))), "{first:?}");
        assert_eq!(stored(s, &ids[0]).await.text, "v", "nothing of the failed group is written");
        for (id, outcome) in ids[1..].iter().zip(later) {
            assert_eq!(outcome.expect("written").text, "changed", "{id}");
            assert_eq!(stored(s, id).await.text, "changed", "{id}");
        }
    })
    .await;
}

/// Two processes (stores) write groups of updates at once, each group spanning the same four
/// channels, one walking them forwards and the other backwards: each group locks its channels
/// in one statement in cid order (the crate's lock order), so neither waits for the other in a
/// cycle, and no update is lost. Each store has its own queue and writers, so on PostgreSQL up
/// to four groups run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_from_two_stores_over_the_same_channels_neither_deadlock_nor_lose_updates() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let mut ids = Vec::new();
        for c in 0..4 {
            let ch = agent_channel(&s, &format!("grp-race-{c}"), &["amy"]).await;
            for m in 0..3 {
                let id = format!("grp-race-{c}-{m}");
                s.send_message(&ch.cid, &msg(&id, ""), &user("amy")).await.expect("send");
                ids.push(id);
            }
        }
        let rounds = 5;
        for round in 0..rounds {
            let ids = ids.clone();
            let results = race(&ctx.url, 2, move |store, i| {
                let mut order = ids.clone();
                if i == 1 {
                    order.reverse();
                }
                async move {
                    let amy = user("amy");
                    let updates = order.iter().map(|id| {
                        store.update_message(id, &amy, move |m| {
                            m.text.push_str(&format!("{i}"));
                            Ok(())
                        })
                    });
                    futures_util::future::join_all(updates).await
                }
            })
            .await;
            for outcome in results.into_iter().flatten() {
                outcome.unwrap_or_else(|e| panic!("round {round}: every update applies: {e:?}"));
            }
        }
        for id in &ids {
            let text = stored(&s, id).await.text;
            assert_eq!(text.len(), 2 * rounds, "{id}: every update kept: {text:?}");
            assert_eq!(text.matches('0').count(), rounds, "{id}: {text:?}");
        }
    })
    .await;
}

/// Sends that arrive together are written together (`batch.rs`, `sends.rs`): forty sends to
/// four channels at once, among them one whose id is taken, one to a channel that does not
/// exist, one replying to a message that does not exist, one repeating the id of another send
/// of the group, and a reply to and a quote of messages of the group. Each refused send gets
/// the error it gets alone and writes nothing; every other send is stored once, announced once
/// (with its notification), counted once on its channel, unread once for the other member, and
/// the replies on their parent. Then forty more, none refused, take fewer statements together
/// than ten sends alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_that_arrive_together_are_written_together_each_with_its_own_outcome() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let mut cids = Vec::new();
        for c in 0..4 {
            cids.push(agent_channel(s, &format!("sgrp-{c}"), &["amy", "ben"]).await.cid);
        }
        s.send_message(&cids[0], &msg("sgrp-taken", "first"), &user("amy")).await.expect("send");
        let seq = s.last_event_seq().await.expect("seq");
        // Send `twice` repeats the id of send 2 in its channel: whichever is written first is kept
        // (on PostgreSQL two groups run at once), the other refused. The reply is not shown in the
        // channel, so it is unread for nobody.
        let (taken, missing_channel, orphan, twice, reply_in_group, quote_in_group) = (13, 21, 34, 36, 38, 39);
        let plan: Vec<(String, NewMessage)> = (0..40)
            .map(|k| {
                let cid = match k {
                    k if k == missing_channel => "agent:sgrp-none".to_string(),
                    k if k == twice => cids[2].clone(),
                    k => cids[k % 4].clone(),
                };
                let mut new = msg(&format!("sgrp-m-{k}"), &format!("m{k}"));
                if k == taken {
                    new.id = "sgrp-taken".into();
                }
                if k == orphan {
                    new.parent_id = Some("sgrp-nobody".into());
                }
                if k == twice {
                    new.id = "sgrp-m-2".into();
                }
                if k == reply_in_group {
                    new.parent_id = Some("sgrp-m-2".into());
                }
                if k == quote_in_group {
                    new.quoted_message_id = Some("sgrp-m-3".into());
                }
                (cid, new)
            })
            .collect();
        let outcomes = futures_util::future::join_all(plan.iter().enumerate().map(|(k, (cid, new))| async move {
            let author = user(if k % 2 == 0 { "amy" } else { "ben" });
            s.send_message(cid, new, &author).await
        }))
        .await;
        let loser = if outcomes[2].is_ok() { twice } else { 2 };
        let refused = [taken, orphan, loser, missing_channel];
        let mut sent = 0;
        for (k, outcome) in outcomes.into_iter().enumerate() {
            match k {
                k if k == taken || k == orphan || k == loser => drop(assert_kind(outcome, ErrorKind::Input)),
                k if k == missing_channel => drop(assert_kind(outcome, ErrorKind::NotFound)),
                k => {
                    let m = outcome.unwrap_or_else(|e| panic!("send {k}: {e:?}"));
                    assert_eq!(m.text, format!("m{k}"));
                    assert_eq!(stored(s, &m.id).await.cid, plan[k].0, "send {k} stored in its channel");
                    sent += 1;
                }
            }
        }
        assert_eq!(stored(s, "sgrp-taken").await.text, "first", "the taken id keeps its message");
        let winner = if loser == 2 { twice } else { 2 };
        assert_eq!(stored(s, "sgrp-m-2").await.text, format!("m{winner}"), "the repeated id keeps the message written");
        assert_eq!(stored(s, "sgrp-m-2").await.reply_count, 1, "the reply in the group counted on its parent");
        assert_eq!(stored(s, "sgrp-m-38").await.parent_id.as_deref(), Some("sgrp-m-2"));
        assert_eq!(stored(s, "sgrp-m-39").await.quoted_message_id.as_deref(), Some("sgrp-m-3"));
        let mut counted = 0;
        for cid in &cids {
            let ch = s.get_channel(cid).await.expect("read").expect("exists");
            let kept = (0..40).filter(|k| plan[*k].0 == *cid && !refused.contains(k)).count() as i64;
            let before = i64::from(cid == &cids[0]);
            assert_eq!(ch.message_count, kept + before, "{cid}: each kept send counted once");
            counted += kept;
        }
        assert_eq!(counted, sent);
        // Amy sent the even ones (and the first), Ben the odd ones: each unread for the other.
        let by = |even: bool| (0..40).filter(|k| !refused.contains(k) && *k != reply_in_group && (k % 2 == 0) == even).count() as i64;
        assert_eq!(s.unread_counts("ben").await.expect("counts").total, by(true) + 1, "ben's unread");
        assert_eq!(s.unread_counts("amy").await.expect("counts").total, by(false), "amy's unread");
        let events = events_since(s, seq).await;
        let news = events.iter().filter(|e| e.event.kind == "message.new").count() as i64;
        let notes = events.iter().filter(|e| e.event.kind == "notification.message_new").count() as i64;
        assert_eq!((news, notes), (sent, sent), "each kept send announced once, with its notification");
        let (lone, alone) = offshoot_store::count_statements(s.send_message(&cids[1], &msg("sgrp-lone", "ok"), &user("amy"))).await;
        lone.expect("send");
        let (outcomes, statements) = offshoot_store::count_statements(futures_util::future::join_all((0..40).map(|k| {
            let cid = &cids[k % 4];
            async move { s.send_message(cid, &msg(&format!("sgrp-ok-{k}"), "ok"), &user("amy")).await }
        })))
        .await;
        for outcome in outcomes {
            outcome.expect("send");
        }
        assert!(statements < 10 * alone, "sends that arrived together were written together: {statements} statements, {alone} alone");
    })
    .await;
}

/// Sends of one group that name each other (each a reply to the other) are left out of the group
/// and written alone after it (`sends.rs`): neither exists when the other is checked, so both are
/// refused and nothing of them is written, while the plain sends around them are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_of_one_group_that_name_each_other_are_refused_and_the_others_kept() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "sgrp-cycle", &["amy"]).await;
        let mut plan: Vec<NewMessage> = (0..6).map(|k| msg(&format!("sgrp-cycle-{k}"), "plain")).collect();
        plan[2].parent_id = Some("sgrp-cycle-3".into());
        plan[3].parent_id = Some("sgrp-cycle-2".into());
        let amy = user("amy");
        let outcomes = futures_util::future::join_all(plan.iter().map(|new| s.send_message(&ch.cid, new, &amy))).await;
        for (k, outcome) in outcomes.into_iter().enumerate() {
            if k == 2 || k == 3 {
                assert_kind(outcome, ErrorKind::Input);
                assert!(s.get_message(&format!("sgrp-cycle-{k}"), &Viewer::Server).await.expect("read").is_none(), "{k} not written");
            } else {
                outcome.unwrap_or_else(|e| panic!("send {k}: {e:?}"));
            }
        }
        assert_eq!(s.get_channel(&ch.cid).await.expect("read").expect("exists").message_count, 4);
    })
    .await;
}

/// Two processes (stores) send at once to the same four channels, one walking them forwards
/// and the other backwards: a group takes its channels' locks in cid order (the crate's lock
/// order), so no two groups wait for each other in a cycle, and every send is stored and
/// counted. Each store has its own queue and writers, so on PostgreSQL up to four groups run at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_groups_from_two_stores_over_the_same_channels_neither_deadlock_nor_lose_sends() {
    with_store(|ctx| async move {
        let s = ctx.store.clone();
        let mut cids = Vec::new();
        for c in 0..4 {
            cids.push(agent_channel(&s, &format!("sgrp-race-{c}"), &["amy", "ben"]).await.cid);
        }
        let rounds = 5;
        for round in 0..rounds {
            let cids = cids.clone();
            let results = race(&ctx.url, 2, move |store, i| {
                let mut order: Vec<String> = (0..3).flat_map(|_| cids.clone()).collect();
                if i == 1 {
                    order.reverse();
                }
                async move {
                    let sends = order.iter().enumerate().map(|(k, cid)| {
                        let store = store.clone();
                        async move { store.send_message(cid, &msg(&format!("sgrp-race-{round}-{i}-{k}"), "x"), &user("amy")).await }
                    });
                    futures_util::future::join_all(sends).await
                }
            })
            .await;
            for outcome in results.into_iter().flatten() {
                outcome.unwrap_or_else(|e| panic!("round {round}: every send is stored: {e:?}"));
            }
        }
        for cid in &cids {
            let ch = s.get_channel(cid).await.expect("read").expect("exists");
            assert_eq!(ch.message_count, 2 * 3 * rounds as i64, "{cid}: every send counted");
        }
    })
    .await;
}
