//! Channels, members, read state, deletion and Query Channels.

use crate::support::{agent_channel, assert_kind, channel_of, ids_seen_by, member, msg, reply, user, user_input, with_store};
use offshoot_core::model::{NewMessage, Reaction, Viewer};
use offshoot_core::query::{channel_sort_field, parse_filter, parse_sort, ChannelSortField, Sort};
use offshoot_core::ErrorKind;
use offshoot_store::{ChannelFilter, ChannelUpdate, MemberInput, NewChannel, Page, PageDir, ReadMark, StatePart, Store};
use serde_json::{json, Map, Value};

fn custom(v: Value) -> Map<String, Value> {
    v.as_object().expect("an object").clone()
}

#[tokio::test]
async fn create_channel_creates_once_and_then_returns_the_existing_channel_unchanged() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        s.upsert_users(&[user_input("owner"), user_input("amy"), user_input("ben")]).await.expect("upsert");
        let new = NewChannel {
            kind: "agent".into(),
            id: "c1".into(),
            created_by_id: Some("owner".into()),
            team: Some("red".into()),
            custom: custom(json!({"topic": "first"})),
            members: vec![
                member("owner"),
                member("amy"),
                MemberInput { user_id: "ben".into(), channel_role: Some("channel_admin".into()), custom: custom(json!({"x": 1})) },
            ],
        };
        let (ch, created) = s.create_channel(&new).await.expect("create");
        assert!(created);
        assert_eq!(ch.cid, "agent:c1");
        assert_eq!((ch.kind.as_str(), ch.id.as_str()), ("agent", "c1"));
        assert_eq!(ch.team.as_deref(), Some("red"));
        assert_eq!(ch.custom, custom(json!({"topic": "first"})));
        assert_eq!(ch.member_count, 3);
        assert_eq!(ch.created_by.as_ref().map(|u| u.id.as_str()), Some("owner"));
        assert_eq!(ch.config.as_ref().map(|c| c.max_message_length), Some(5000));
        assert!(ch.fork.is_none());
        assert_eq!(s.get_channel("agent:c1").await.expect("get").expect("exists"), ch);

        let again = NewChannel { custom: custom(json!({"topic": "second"})), members: vec![member("zed")], ..new.clone() };
        let (same, created) = s.create_channel(&again).await.expect("get-or-create");
        assert!(!created, "the second call finds the channel");
        assert_eq!(same, ch, "get-or-create neither changes data nor adds members");
        assert!(!s.is_member("agent:c1", "zed").await.expect("is member"));

        let members = s.members("agent:c1", 10, 0).await.expect("members");
        let roles: Vec<(&str, &str)> = members.iter().map(|m| (m.user_id.as_str(), m.channel_role.as_str())).collect();
        assert_eq!(
            roles,
            vec![("amy", "channel_member"), ("ben", "channel_admin"), ("owner", "channel_moderator")],
            "the creator moderates; ordered by created_at, user_id"
        );
        assert!(members.iter().all(|m| m.user.is_some()), "members carry their users");
        assert_eq!(members[1].custom, custom(json!({"x": 1})));
        assert_eq!(
            s.members("agent:c1", 1, 1).await.expect("page").into_iter().map(|m| m.user_id).collect::<Vec<_>>(),
            vec!["ben".to_string()]
        );
        assert!(s.is_member("agent:c1", "amy").await.expect("is member"));
        assert!(s.get_channel("agent:none").await.expect("get").is_none());
    })
    .await;
}

#[tokio::test]
async fn update_channel_replaces_custom_data_and_sets_team_and_frozen() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "up", &[]).await;
        let actor = user("owner");
        let change =
            ChannelUpdate { custom: Some(custom(json!({"b": 2}))), team: Some("green".into()), frozen: Some(true), ..Default::default() };
        let (updated, _) = s.update_channel(&ch.cid, &change, Some(&actor)).await.expect("update");
        assert_eq!(updated.custom, custom(json!({"b": 2})));
        assert_eq!(updated.team.as_deref(), Some("green"));
        assert!(updated.frozen);
        assert!(updated.updated_at >= ch.updated_at);
        let (untouched, _) = s.update_channel(&ch.cid, &ChannelUpdate::default(), None).await.expect("update nothing");
        assert_eq!(
            (untouched.custom.clone(), untouched.team.clone(), untouched.frozen),
            (custom(json!({"b": 2})), Some("green".to_string()), true)
        );
        assert_eq!(s.get_channel(&ch.cid).await.expect("get").expect("exists").custom, custom(json!({"b": 2})));
        assert_kind(s.update_channel("agent:none", &ChannelUpdate::default(), None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn a_partial_channel_update_sets_and_unsets_and_refuses_read_only_fields() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "pu", &[]).await;
        let change = ChannelUpdate { custom: Some(custom(json!({"keep": 1, "drop": 2}))), ..Default::default() };
        s.update_channel(&ch.cid, &change, None).await.expect("update");
        let set = custom(json!({"team": "blue", "disabled": true, "frozen": true, "color": "red"}));
        let after = s.partial_update_channel(&ch.cid, &set, &["drop".to_string()], None).await.expect("partial update");
        assert_eq!(after.custom, custom(json!({"keep": 1, "color": "red"})));
        assert_eq!(after.team.as_deref(), Some("blue"));
        assert!(after.disabled && after.frozen);
        let after = s.partial_update_channel(&ch.cid, &Map::new(), &["team".to_string(), "color".to_string()], None).await.expect("unset");
        assert_eq!(after.team, None);
        assert_eq!(after.custom, custom(json!({"keep": 1})));
        for field in ["cid", "created_by_id", "members", "truncated_at"] {
            let e = assert_kind(s.partial_update_channel(&ch.cid, &custom(json!({field: "x"})), &[], None).await, ErrorKind::Input);
            assert!(e.message.contains(field), "{e}");
        }
        assert_eq!(
            s.get_channel(&ch.cid).await.expect("get").expect("exists").custom,
            custom(json!({"keep": 1})),
            "refused updates change nothing"
        );
        assert_kind(s.partial_update_channel("agent:none", &Map::new(), &[], None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn add_members_adds_only_new_members_and_remove_members_removes_them() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "mem", &["amy"]).await;
        s.upsert_users(&[user_input("ben"), user_input("cat")]).await.expect("upsert");
        let seq = s.last_event_seq().await.expect("seq");
        let after = s.add_members(&ch.cid, &[member("ben"), member("amy"), member("cat")], Some(&user("owner"))).await.expect("add");
        assert_eq!(after.member_count, 3);
        let added = crate::support::events_since(s, seq).await;
        let added_ids: Vec<String> = added
            .iter()
            .filter(|e| e.event.kind == "member.added")
            .filter_map(|e| e.event.member.as_ref().map(|m| m.user_id.clone()))
            .collect();
        assert_eq!(added_ids, vec!["ben".to_string(), "cat".to_string()], "amy was a member already: no event for her");

        let after = s.remove_members(&ch.cid, &["amy".to_string(), "ghost".to_string()], None).await.expect("remove");
        assert_eq!(after.member_count, 2);
        assert!(!s.is_member(&ch.cid, "amy").await.expect("is member"));
        assert!(s.is_member(&ch.cid, "ben").await.expect("is member"));
        assert_kind(s.add_members("agent:none", &[member("ben")], None).await, ErrorKind::NotFound);
        assert_kind(s.remove_members("agent:none", &["ben".to_string()], None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn a_soft_deleted_channel_is_hidden_and_refuses_messages_and_comes_back_empty_when_recreated() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "sd", &["amy"]).await;
        s.send_message(&ch.cid, &msg("old", "before the delete"), &user("amy")).await.expect("send");
        let deleted = s.delete_channel(&ch.cid, false, Some(&user("owner"))).await.expect("soft delete");
        assert!(deleted.deleted_at.is_some());
        let stored = s.get_channel(&ch.cid).await.expect("get").expect("soft-deleted channels are still stored");
        assert!(stored.deleted_at.is_some());
        assert!(
            s.query_channels(&ChannelFilter { limit: 10, ..Default::default() }).await.expect("query").is_empty(),
            "query_channels leaves deleted channels out"
        );
        assert_kind(s.send_message(&ch.cid, &msg("late", "after"), &user("amy")).await, ErrorKind::NotFound);

        let (back, created) = s
            .create_channel(&NewChannel {
                kind: "agent".into(),
                id: "sd".into(),
                created_by_id: Some("owner".into()),
                members: vec![member("ben")],
                ..Default::default()
            })
            .await
            .expect("re-create");
        assert!(created, "re-creating a soft-deleted channel counts as a creation");
        assert!(back.deleted_at.is_none());
        assert!(back.truncated_at.is_some(), "the old history hides behind truncated_at");
        assert_eq!(back.member_count, 1);
        assert!(!s.is_member(&ch.cid, "amy").await.expect("is member"), "old members are gone");
        assert!(ids_seen_by(s, &ch.cid, &Viewer::Server).await.is_empty(), "old messages stay hidden");
        s.send_message(&ch.cid, &msg("new", "after re-creation"), &user("ben")).await.expect("send after re-creation");
        assert_eq!(ids_seen_by(s, &ch.cid, &Viewer::Server).await, vec!["new".to_string()]);
    })
    .await;
}

#[tokio::test]
async fn a_hard_deleted_channel_loses_its_messages_reactions_members_and_read_state() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "hd", &["amy"]).await;
        let m = s.send_message(&ch.cid, &msg("hd1", "hi"), &user("amy")).await.expect("send");
        s.add_reaction(&m.id, &offshoot_core::model::Reaction { kind: "like".into(), score: 1, ..Default::default() }, false, &user("amy"))
            .await
            .expect("react");
        s.mark_read(&ch.cid, &user("amy"), Some(&m.id)).await.expect("read");
        s.delete_channel(&ch.cid, true, None).await.expect("hard delete");
        assert!(s.get_channel(&ch.cid).await.expect("get").is_none());
        assert!(s.get_message(&m.id, &Viewer::Server).await.expect("get message").is_none());
        assert!(s.members(&ch.cid, 10, 0).await.expect("members").is_empty());
        assert!(s.read_states(&ch.cid).await.expect("read states").is_empty());
        // The id is free again: a new channel and a new message may take it.
        agent_channel(s, "hd", &[]).await;
        let again = s.send_message(&ch.cid, &msg("hd1", "again"), &user("owner")).await.expect("the message id is free again");
        assert!(again.reaction_counts.is_empty(), "no reaction survived the delete");
        assert_kind(s.delete_channel("agent:none", true, None).await, ErrorKind::NotFound);
    })
    .await;
}

fn mark(user_id: &str, last_read: i64, message_id: Option<&str>) -> ReadMark {
    ReadMark { user_id: user_id.into(), last_read, last_read_message_id: message_id.map(str::to_string) }
}

#[tokio::test]
async fn mark_read_records_the_read_state_per_user() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "rd", &["amy", "ben"]).await;
        let m = s.send_message(&ch.cid, &msg("r1", "hi"), &user("amy")).await.expect("send");
        let t1 = s.mark_read(&ch.cid, &user("ben"), None).await.expect("read");
        let t2 = s.mark_read(&ch.cid, &user("amy"), Some(&m.id)).await.expect("read");
        assert_eq!(s.read_states(&ch.cid).await.expect("states"), vec![mark("amy", t2, Some("r1")), mark("ben", t1, None)]);
        let t3 = s.mark_read(&ch.cid, &user("ben"), Some("r1")).await.expect("read again");
        assert!(t3 >= t1);
        assert_eq!(s.read_states(&ch.cid).await.expect("states")[1], mark("ben", t3, Some("r1")), "a second read updates the row");
        assert_kind(s.mark_read("agent:none", &user("ben"), None).await, ErrorKind::NotFound);
    })
    .await;
}

#[tokio::test]
async fn member_read_states_count_the_visible_messages_of_others_since_the_last_read() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "unread", &["amy", "ben"]).await;
        let joined: Vec<i64> = s.members(&ch.cid, 10, 0).await.expect("members").iter().map(|m| m.created_at).collect();
        s.send_message(&ch.cid, &msg("a1", "one"), &user("amy")).await.expect("send");
        s.send_message(&ch.cid, &msg("a2", "two"), &user("amy")).await.expect("send");
        s.send_message(&ch.cid, &msg("b1", "from ben"), &user("ben")).await.expect("send");
        // None of these count for ben.
        s.send_message(&ch.cid, &NewMessage { kind: "system".into(), ..msg("sys", "system") }, &user("owner")).await.expect("send");
        s.send_message(&ch.cid, &crate::support::reply("r", "a1", "thread only"), &user("amy")).await.expect("reply");
        s.send_message(&ch.cid, &msg("d", "deleted"), &user("amy")).await.expect("send");
        s.delete_message("d", false, None).await.expect("delete");
        s.send_message(&ch.cid, &NewMessage { restricted_visibility: vec!["amy".into()], ..msg("rv", "not for ben") }, &user("owner"))
            .await
            .expect("send");

        let ch = s.get_channel(&ch.cid).await.expect("get").expect("exists");
        let states = s.member_read_states(&ch, 10).await.expect("read states");
        let summary: Vec<(String, i64, Option<String>, i64)> =
            states.iter().map(|r| (r.user_id.clone(), r.last_read, r.last_read_message_id.clone(), r.unread_messages)).collect();
        assert_eq!(
            summary,
            vec![("amy".to_string(), joined[0], None, 2), ("ben".to_string(), joined[1], None, 2)],
            "without a read, a member has read up to joining; amy does not count her own messages but the one restricted to her"
        );

        let at = s.mark_read(&ch.cid, &user("ben"), Some("rv")).await.expect("read");
        s.send_message(&ch.cid, &msg("a3", "three"), &user("amy")).await.expect("send");
        let ben = s.member_read_states(&ch, 10).await.expect("read states").remove(1);
        assert_eq!((ben.last_read, ben.last_read_message_id.as_deref(), ben.unread_messages), (at, Some("rv"), 1));
        assert_eq!(s.member_read_states(&ch, 1).await.expect("read states").len(), 1, "limit applies");
    })
    .await;
}

/// A delete takes the message out of exactly the counters it was in: not of its author, a
/// member who read past it, a member it was restricted away from, or anyone for a thread-only
/// reply or a message deleted before.
#[tokio::test]
async fn deleting_a_message_takes_it_out_of_exactly_the_counters_it_was_in() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let ch = agent_channel(s, "uncount", &["amy", "ben", "cat"]).await;
        let counters = || async {
            let ch = s.get_channel(&ch.cid).await.expect("get").expect("exists");
            let states = s.member_read_states(&ch, 10).await.expect("read states");
            states.iter().map(|r| (r.user_id.clone(), r.unread_messages)).collect::<std::collections::BTreeMap<_, _>>()
        };
        let expect = |amy: i64, ben: i64, cat: i64| {
            [("amy".to_string(), amy), ("ben".to_string(), ben), ("cat".to_string(), cat)]
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        for id in ["a1", "a2", "a3"] {
            s.send_message(&ch.cid, &msg(id, id), &user("amy")).await.expect("send");
        }
        s.send_message(&ch.cid, &NewMessage { restricted_visibility: vec!["ben".into()], ..msg("rv", "for ben") }, &user("owner"))
            .await
            .expect("send");
        s.send_message(&ch.cid, &crate::support::reply("r1", "a1", "thread only"), &user("amy")).await.expect("reply");
        s.send_message(&ch.cid, &NewMessage { show_in_channel: true, ..crate::support::reply("rs", "a1", "shown") }, &user("amy"))
            .await
            .expect("reply");
        s.send_message(&ch.cid, &msg("b1", "from ben"), &user("ben")).await.expect("send");
        s.mark_read(&ch.cid, &user("cat"), None).await.expect("read");
        assert_eq!(counters().await, expect(1, 5, 0));

        let steps: [(&str, bool, (i64, i64, i64)); 6] = [
            ("a1", false, (1, 4, 0)),
            ("rv", true, (1, 3, 0)),
            ("r1", false, (1, 3, 0)),
            ("rs", true, (1, 2, 0)),
            ("a1", true, (1, 2, 0)),
            ("b1", false, (0, 2, 0)),
        ];
        for (id, hard, (amy, ben, cat)) in steps {
            s.delete_message(id, hard, None).await.expect("delete");
            assert_eq!(counters().await, expect(amy, ben, cat), "after deleting {id} (hard: {hard})");
        }
        s.send_message(&ch.cid, &msg("a4", "four"), &user("amy")).await.expect("send");
        assert_eq!(counters().await, expect(0, 3, 1));
        s.delete_message("a4", false, None).await.expect("delete");
        assert_eq!(counters().await, expect(0, 2, 0), "a2 and a3 stay unread for ben");
    })
    .await;
}

#[tokio::test]
async fn query_channels_filters_sorts_and_pages() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        // Created in this order, so created_at ascends a1 < a2 < m1 < a3.
        channel_of(s, "agent", "a1", "owner", &["amy", "ben"]).await;
        channel_of(s, "agent", "a2", "other", &["amy"]).await;
        channel_of(s, "messaging", "m1", "owner", &["ben"]).await;
        channel_of(s, "agent", "a3", "owner", &[]).await;
        channel_of(s, "agent", "gone", "owner", &["amy"]).await;
        s.delete_channel("agent:gone", false, None).await.expect("delete");

        let q = |f: ChannelFilter| async move {
            s.query_channels(&ChannelFilter { limit: if f.limit == 0 { 100 } else { f.limit }, ..f })
                .await
                .expect("query")
                .into_iter()
                .map(|c| c.cid)
                .collect::<Vec<_>>()
        };
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            q(ChannelFilter::default()).await,
            strings(&["agent:a1", "agent:a2", "agent:a3", "messaging:m1"]),
            "default order is by cid"
        );
        assert_eq!(q(ChannelFilter { types: Some(strings(&["messaging"])), ..Default::default() }).await, strings(&["messaging:m1"]));
        assert_eq!(
            q(ChannelFilter { cids: Some(strings(&["agent:a2", "agent:gone", "agent:zz"])), ..Default::default() }).await,
            strings(&["agent:a2"])
        );
        assert_eq!(
            q(ChannelFilter { ids: Some(strings(&["a3", "m1"])), ..Default::default() }).await,
            strings(&["agent:a3", "messaging:m1"])
        );
        assert_eq!(
            q(ChannelFilter { ids: Some(vec![]), ..Default::default() }).await,
            Vec::<String>::new(),
            "an empty list matches nothing"
        );
        assert_eq!(q(ChannelFilter { created_by_ids: Some(strings(&["other"])), ..Default::default() }).await, strings(&["agent:a2"]));
        assert_eq!(
            q(ChannelFilter { members_any: Some(strings(&["amy", "ben"])), ..Default::default() }).await,
            strings(&["agent:a1", "agent:a2", "messaging:m1"])
        );
        assert_eq!(q(ChannelFilter { members_all: Some(strings(&["amy", "ben"])), ..Default::default() }).await, strings(&["agent:a1"]));
        assert_eq!(
            q(ChannelFilter { member_of: Some("ben".into()), types: Some(strings(&["agent"])), ..Default::default() }).await,
            strings(&["agent:a1"])
        );
        let newest_first = ChannelFilter { sort: vec![Sort { field: ChannelSortField::CreatedAt, desc: true }], ..Default::default() };
        assert_eq!(q(newest_first.clone()).await, strings(&["agent:a3", "messaging:m1", "agent:a2", "agent:a1"]));
        assert_eq!(q(ChannelFilter { limit: 2, offset: 1, ..newest_first.clone() }).await, strings(&["messaging:m1", "agent:a2"]));
        assert_eq!(q(ChannelFilter { limit: 2, offset: 3, ..newest_first }).await, strings(&["agent:a1"]));

        let full = s
            .query_channels(&ChannelFilter { cids: Some(strings(&["agent:a1"])), limit: 1, ..Default::default() })
            .await
            .expect("query")
            .remove(0);
        assert_eq!(full.member_count, 2);
        assert_eq!(full.created_by.map(|u| u.id), Some("owner".to_string()), "results are hydrated like get_channel");
        assert_eq!(full.config.map(|c| c.name), Some("agent".to_string()));
    })
    .await;
}

#[tokio::test]
async fn query_channels_takes_streams_operators_on_built_in_and_custom_fields() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        for (id, members, data) in [
            ("c1", vec!["amy", "ben"], json!({"name": "Rocket launch", "tier": 3, "vip": true, "region": "eu"})),
            ("c2", vec!["amy"], json!({"name": "Roadmap review", "tier": 1, "region": "us"})),
            ("c3", vec!["ben"], json!({"name": "Weekly sync", "tier": 2, "vip": false})),
            ("c4", vec![], json!({"name": "launch party"})),
        ] {
            let members: Vec<MemberInput> = members.iter().map(|u| member(u)).collect();
            s.create_channel(&NewChannel {
                kind: "agent".into(),
                id: id.into(),
                created_by_id: Some("owner".into()),
                custom: data.as_object().cloned().unwrap_or_default(),
                members,
                ..Default::default()
            })
            .await
            .expect("create");
        }
        s.partial_update_channel("agent:c3", &custom(json!({"frozen": true})), &[], None).await.expect("freeze");
        s.send_message("agent:c2", &msg("hello-c2", "hello"), &user("ben")).await.expect("send");

        let q = |filter: Value, sort: Value, user: Option<&'static str>| async move {
            let f = ChannelFilter {
                filter: Some(parse_filter(filter.as_object().expect("object")).expect("valid filter")),
                sort: parse_sort(Some(&sort), channel_sort_field).expect("valid sort"),
                user_id: user.map(str::to_string),
                limit: 100,
                ..Default::default()
            };
            s.query_channels(&f).await.expect("query").into_iter().map(|c| c.id).collect::<Vec<_>>()
        };
        let none = json!([]);
        assert_eq!(q(json!({"tier": {"$gte": 2}}), none.clone(), None).await, ["c1", "c3"]);
        assert_eq!(q(json!({"tier": {"$lt": 3}}), json!([{"field": "tier", "direction": -1}]), None).await, ["c3", "c2"]);
        assert_eq!(q(json!({"region": {"$in": ["eu", "us"]}}), none.clone(), None).await, ["c1", "c2"]);
        assert_eq!(q(json!({"region": {"$nin": ["eu"]}}), none.clone(), None).await, ["c2", "c3", "c4"]);
        assert_eq!(q(json!({"region": {"$ne": "eu"}}), none.clone(), None).await, ["c2", "c3", "c4"]);
        assert_eq!(q(json!({"vip": {"$exists": true}}), none.clone(), None).await, ["c1", "c3"]);
        assert_eq!(q(json!({"vip": true}), none.clone(), None).await, ["c1"]);
        assert_eq!(q(json!({"name": {"$autocomplete": "lau"}}), none.clone(), None).await, ["c1", "c4"]);
        assert_eq!(q(json!({"name": {"$autocomplete": "ro"}}), none.clone(), None).await, ["c1", "c2"]);
        assert_eq!(q(json!({"frozen": true}), none.clone(), None).await, ["c3"]);
        assert_eq!(q(json!({"frozen": {"$ne": true}}), none.clone(), None).await, ["c1", "c2", "c4"]);
        assert_eq!(q(json!({"$or": [{"tier": 1}, {"frozen": true}]}), none.clone(), None).await, ["c2", "c3"]);
        assert_eq!(q(json!({"$nor": [{"tier": 1}, {"frozen": true}]}), none.clone(), None).await, ["c1", "c4"]);
        assert_eq!(q(json!({"$and": [{"members": {"$in": ["amy"]}}, {"tier": {"$gt": 1}}]}), none.clone(), None).await, ["c1"]);
        assert_eq!(q(json!({"members": {"$nin": ["amy"]}}), none.clone(), None).await, ["c3", "c4"]);
        assert_eq!(q(json!({"members": {"$eq": ["amy", "ben"]}}), none.clone(), None).await, ["c1"]);
        assert_eq!(q(json!({"last_message_at": {"$exists": true}}), none.clone(), None).await, ["c2"]);
        assert_eq!(q(json!({"created_at": {"$gt": "2000-01-01T00:00:00Z"}, "id": {"$in": ["c4"]}}), none.clone(), None).await, ["c4"]);
        assert_eq!(q(json!({"member_count": {"$gte": 2}}), none.clone(), None).await, ["c1"]);
        assert_eq!(q(json!({"joined": true}), none.clone(), Some("ben")).await, ["c1", "c3"]);
        assert_eq!(q(json!({"joined": false}), none.clone(), Some("ben")).await, ["c2", "c4"]);
        assert_eq!(q(json!({"has_unread": true}), none.clone(), Some("amy")).await, ["c2"], "ben's message is unread for amy");
        assert_eq!(q(json!({"has_unread": true}), none.clone(), Some("ben")).await, Vec::<String>::new(), "his own message is not");
        assert_eq!(q(json!({"hidden": false}), none.clone(), None).await, ["c1", "c2", "c3", "c4"]);
        assert_eq!(
            q(json!({}), json!([{"field": "last_message_at", "direction": -1}, {"field": "id", "direction": -1}]), None).await,
            ["c2", "c4", "c3", "c1"],
            "NULLs last on both engines"
        );
        let err = s
            .query_channels(&ChannelFilter {
                filter: Some(parse_filter(json!({"joined": true}).as_object().expect("object")).expect("valid")),
                limit: 10,
                ..Default::default()
            })
            .await;
        assert_kind(err, ErrorKind::Input);
    })
    .await;
}

/// Creates `n` channels of the same shape: two members, a pinned message, a quote of it, a
/// reply in its thread, a reaction and a read mark.
async fn seed_channels(s: &Store, first: usize, n: usize) {
    for i in first..first + n {
        let ch = agent_channel(s, &format!("qc{i}"), &["amy", "ben"]).await;
        let top = format!("qc{i}-top");
        s.send_message(&ch.cid, &NewMessage { pinned: true, ..msg(&top, "pinned") }, &user("amy")).await.expect("send");
        let quote = NewMessage { quoted_message_id: Some(top.clone()), ..msg(&format!("qc{i}-quote"), "quoting") };
        s.send_message(&ch.cid, &quote, &user("ben")).await.expect("quote");
        s.send_message(&ch.cid, &reply(&format!("qc{i}-reply"), &top, "in the thread"), &user("ben")).await.expect("reply");
        s.add_reaction(&top, &Reaction { kind: "like".into(), score: 1, ..Default::default() }, false, &user("ben")).await.expect("react");
        s.mark_read(&ch.cid, &user("amy"), Some(&top)).await.expect("read");
    }
}

/// What Query Channels reads: the channels, then their states. Returns the statements sent.
async fn query_channels_statements(s: &Store, viewer: &Viewer, expected: usize) -> u64 {
    let ((), statements) = offshoot_store::count_statements(async {
        let f = ChannelFilter { member_of: viewer.user_id().map(str::to_string), limit: 100, ..Default::default() };
        let channels = s.query_channels(&f).await.expect("query channels");
        assert_eq!(channels.len(), expected);
        let states = s.channel_states(&channels, viewer, 25, 100).await.expect("channel states");
        for (ch, state) in channels.iter().zip(&states) {
            assert_eq!(state.messages.len(), 2, "{}: the pinned message and its quote", ch.cid);
            assert!(state.messages[1].quoted_message.is_some(), "the quote is filled in");
            assert_eq!(state.messages[0].reaction_counts.len(), 1, "the reaction is counted");
            assert_eq!(state.messages[0].thread_participants.len(), 1, "the thread has its participant");
            assert_eq!((state.pinned.len(), state.members.len(), state.reads.len()), (1, 2, 2));
            assert!(ch.config.is_some() && ch.created_by.is_some(), "the channel is hydrated");
        }
    })
    .await;
    statements
}

#[tokio::test]
async fn query_channels_sends_the_same_number_of_statements_for_two_channels_and_for_eight() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        for viewer in [Viewer::Server, crate::support::viewer("amy")] {
            seed_channels(s, 0, 2).await;
            let few = query_channels_statements(s, &viewer, 2).await;
            seed_channels(s, 2, 6).await;
            let many = query_channels_statements(s, &viewer, 8).await;
            assert!(few > 0, "statements are counted");
            assert_eq!(few, many, "the statements of a Query Channels call grow with its channels ({viewer:?})");
            for i in 0..8 {
                s.delete_channel(&format!("agent:qc{i}"), true, None).await.expect("clean up");
            }
        }
    })
    .await;
}

/// What Query Threads reads for `viewer`, who sees `expected` threads. Returns the statements sent.
async fn query_threads_statements(s: &Store, viewer: &Viewer, expected: usize) -> u64 {
    let ((), statements) = offshoot_store::count_statements(async {
        let threads = s.query_threads(viewer, None, 100, 5).await.expect("query threads");
        assert_eq!(threads.len(), expected);
        for (parent, replies, ch) in &threads {
            assert_eq!(parent.cid, ch.cid);
            assert_eq!(replies.len(), 1, "{}: its one reply", ch.cid);
            assert_eq!(replies[0].parent_id.as_deref(), Some(parent.id.as_str()));
            assert_eq!(parent.reaction_counts.len(), 1, "the parent is hydrated");
            assert!(ch.config.is_some() && ch.created_by.is_some(), "the channel is hydrated");
        }
    })
    .await;
    statements
}

#[tokio::test]
async fn query_threads_sends_the_same_number_of_statements_for_two_threads_and_for_eight() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        for viewer in [Viewer::Server, crate::support::viewer("amy")] {
            seed_channels(s, 0, 2).await;
            let few = query_threads_statements(s, &viewer, 2).await;
            seed_channels(s, 2, 6).await;
            let many = query_threads_statements(s, &viewer, 8).await;
            assert!(few > 0, "statements are counted");
            assert_eq!(few, many, "the statements of a Query Threads call grow with its threads ({viewer:?})");
            for i in 0..8 {
                s.delete_channel(&format!("agent:qc{i}"), true, None).await.expect("clean up");
            }
        }
    })
    .await;
}

/// One channel read with `channel_states` and with `channel_state` (the single-channel path)
/// gives the same state, with each channel's own truncation and each viewer's visibility.
#[tokio::test]
async fn channel_states_and_channel_state_agree() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        seed_channels(s, 0, 3).await;
        // qc1 is truncated (a later message stays); qc2 has a message amy may not see.
        s.truncate_channel("agent:qc1", None, false, None, None).await.expect("truncate");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        s.send_message("agent:qc1", &msg("qc1-after", "after the truncation"), &user("ben")).await.expect("send");
        let secret = NewMessage { restricted_visibility: vec!["ben".into()], ..msg("qc2-secret", "for ben") };
        s.send_message("agent:qc2", &secret, &user("ben")).await.expect("send");
        // qc0 gets a message with every optional part, and text that JSON must escape: the
        // batch reads its rows as JSON built by the database, the single state as columns.
        let odd = "quote \" backslash \\ newline \n tab \t nul-free unicode é ✓ 🦀 </script>";
        let full = NewMessage {
            html: format!("<p>{odd}</p>"),
            mml: Some(format!("<mml>{odd}</mml>")),
            command: Some("giphy".into()),
            attachments: vec![json!({"type": "image", "title": odd, "nested": {"n": [1, 2.5, -3, 9007199254740993_i64, null, true]}})],
            mentioned_users: vec!["ben".into()],
            silent: true,
            i18n: Some(Map::from_iter([("fr_text".to_string(), json!(odd)), ("language".to_string(), json!("en"))])),
            custom: Map::from_iter([("k".to_string(), json!({"deep": [odd, 0, false]})), ("big".to_string(), json!(i64::MAX))]),
            pinned: true,
            pin_expires: Some(4_102_444_800_000_000_000),
            ..msg("qc0-full", odd)
        };
        s.send_message("agent:qc0", &full, &user("ben")).await.expect("send");
        let shown = NewMessage { show_in_channel: true, quoted_message_id: Some("qc0-full".into()), ..reply("qc0-shown", "qc0-full", odd) };
        s.send_message("agent:qc0", &shown, &user("amy")).await.expect("send");
        let channels = s.query_channels(&ChannelFilter { limit: 10, ..Default::default() }).await.expect("query");
        for viewer in [crate::support::viewer("amy"), crate::support::viewer("ben"), Viewer::Server] {
            let batch = s.channel_states(&channels, &viewer, 25, 100).await.expect("batch");
            for (ch, state) in channels.iter().zip(batch) {
                let one = s.channel_state(ch, &viewer, &Page { limit: 25, dir: PageDir::Latest }, 100).await.expect("one");
                assert_eq!(format!("{state:?}"), format!("{one:?}"), "{} for {viewer:?}", ch.cid);
                let ids: Vec<&str> = state.messages.iter().map(|m| m.id.as_str()).collect();
                match ch.id.as_str() {
                    "qc1" => assert_eq!(ids, ["qc1-after"], "only what follows the truncation"),
                    "qc2" => assert_eq!(ids.contains(&"qc2-secret"), viewer.user_id() != Some("amy"), "{viewer:?}: {ids:?}"),
                    "qc0" => {
                        assert_eq!(ids[2..], ["qc0-full", "qc0-shown"]);
                        assert_eq!(state.messages[2].custom["k"]["deep"][0], json!(odd));
                        assert_eq!(state.messages[2].attachments[0]["nested"]["n"][3], json!(9007199254740993_i64));
                        assert_eq!(state.pinned.len(), 2, "both pins");
                        // The same message read by id, as columns (`get_message`).
                        let (by_id, _) = s.get_message("qc0-full", &viewer).await.expect("get").expect("stored");
                        assert_eq!(format!("{:?}", state.messages[2]), format!("{by_id:?}"), "{viewer:?}");
                    }
                    _ => assert_eq!(ids.len(), 2),
                }
            }
        }
    })
    .await;
}

/// Query Channels reads the pins of its channels through the index of pins, not by walking
/// each channel's messages, on tables without statistics (written just now, as with autovacuum
/// off or not yet run): the read asks for each channel's pins after its truncation
/// (`created_at > …`), which the statement cannot know in advance, and without the pins index
/// both engines answer that with the channels' `created_at` index (docs/performance.md, "Query
/// Channels"). Each channel's pins are still its own, after its own truncation.
#[tokio::test]
async fn query_channels_reads_pins_through_the_index_of_pins_without_statistics() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let start = offshoot_core::time::now() - 3_600_000_000_000;
        // Enough messages that walking them is what PostgreSQL's guess prefers without
        // statistics (its guesses follow the table's size on disk).
        for i in 0..3 {
            let ch = agent_channel(s, &format!("pidx{i}"), &["amy"]).await;
            for chunk in 0..10 {
                let sent = futures_util::future::join_all((0..100).map(|j| {
                    let n = chunk * 100 + j;
                    let new = crate::support::msg_at(&format!("pidx{i}-{n:04}"), &format!("message {n}"), start + n * 1_000_000);
                    let cid = ch.cid.clone();
                    async move { s.send_message(&cid, &new, &user("amy")).await }
                }))
                .await;
                assert!(sent.iter().all(Result::is_ok), "sends: {sent:?}");
            }
            let pin = NewMessage { pinned: true, ..msg(&format!("pidx{i}-pin"), "pinned") };
            s.send_message(&ch.cid, &pin, &user("amy")).await.expect("send pinned");
        }
        // The first channel is truncated after its pin: no pin is left to show there.
        s.truncate_channel("agent:pidx0", None, false, None, None).await.expect("truncate");
        let channels = s.query_channels(&ChannelFilter { limit: 10, ..Default::default() }).await.expect("query");
        assert_eq!(channels.len(), 3);
        for viewer in [crate::support::viewer("amy"), Viewer::Server] {
            for (ch, state) in channels.iter().zip(s.channel_states(&channels, &viewer, 25, 100).await.expect("states")) {
                let pins: Vec<&str> = state.pinned.iter().map(|m| m.id.as_str()).collect();
                let expected = format!("{}-pin", ch.id);
                assert_eq!(pins, if ch.id == "pidx0" { vec![] } else { vec![expected.as_str()] }, "{viewer:?}");
            }
            let plan = s.channel_states_plan(StatePart::Pins, &channels, &viewer, 100).await.expect("plan");
            assert!(plan.contains("message_pinned"), "the pins' index is not used for {viewer:?}:\n{plan}");
            assert!(!plan.contains("message_cid_created_at"), "the channels' messages are walked for {viewer:?}:\n{plan}");
        }
    })
    .await;
}

/// A channel's first members, and their read states, are read in order through the index
/// `member_cid_created_at` (migration 0014), not by walking and sorting every member of the
/// channel; on tables written just now, without statistics. Checked on a channel of 1,500
/// members beside two small ones: the first 100 members in `(created_at, user_id)` order.
#[tokio::test]
async fn channel_reads_take_their_first_members_through_the_member_order_index() {
    with_store(|ctx| async move {
        let s = &ctx.store;
        let big = agent_channel(s, "mbig", &["amy"]).await;
        for chunk in 0..15 {
            let members: Vec<MemberInput> = (0..100).map(|j| member(&format!("m{:05}", chunk * 100 + j))).collect();
            s.add_members(&big.cid, &members, None).await.expect("add members");
        }
        agent_channel(s, "msmall0", &["amy", "ben"]).await;
        agent_channel(s, "msmall1", &["ben"]).await;
        let channels = s.query_channels(&ChannelFilter { limit: 10, ..Default::default() }).await.expect("query");
        assert_eq!(channels.len(), 3);
        let states = s.channel_states(&channels, &Viewer::Server, 25, 100).await.expect("states");
        for (ch, state) in channels.iter().zip(&states) {
            let all = s.members(&ch.cid, 2_000, 0).await.expect("members");
            let first: Vec<&str> = all.iter().take(100).map(|m| m.user_id.as_str()).collect();
            assert_eq!(state.members.iter().map(|m| m.user_id.as_str()).collect::<Vec<_>>(), first, "{}", ch.cid);
            assert_eq!(state.reads.iter().map(|r| r.user_id.as_str()).collect::<Vec<_>>(), first, "{}", ch.cid);
        }
        assert_eq!(states.iter().map(|st| st.members.len()).max(), Some(100));
        for part in [StatePart::Members, StatePart::ReadStates] {
            let plan = s.channel_states_plan(part, &channels, &Viewer::Server, 100).await.expect("plan");
            assert!(plan.contains("member_cid_created_at"), "{part:?} does not read members in order:\n{plan}");
        }
    })
    .await;
}
