//! Who may call which write endpoint: a table of endpoint × role → allowed (200) or the exact
//! Stream error. Every cell runs on a fixture of its own, so a call that is (wrongly) allowed
//! cannot change what another cell sees.
//!
//! The table is held against the router: every operation `offshoot_api::api_operations()` lists
//! must be classified in [`ROUTES`] (a write, which a case of [`cases`] must call, or a read that
//! names who may call it), so a new route cannot be left out unnoticed.
//!
//! The roles: `member` (a user in the channel), `stranger` (a user who is not), `creator`
//! (the user who created the channel, also a member), `admin` (a user with role admin, not a
//! member) and `server` (a server-side token).

use crate::helpers::*;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Member,
    Stranger,
    Creator,
    Admin,
    Server,
}
use Role::*;

const ROLES: [Role; 5] = [Member, Stranger, Creator, Admin, Server];

/// What a cell expects.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Ok,
    /// HTTP status and Stream error code.
    Err(u16, i64),
}
use Expect::Ok as Allowed;

/// `403`, code 17: Stream's "not allowed".
const DENIED: Expect = Expect::Err(403, 17);

/// A cell's own channel, its users' messages, and (when asked) a fork task.
struct Fixture {
    cid: String,
    /// A message by the creator.
    theirs: String,
    /// A message by the member.
    mine: String,
    task: Option<String>,
}

/// What a case needs besides the channel and its two messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    /// A fork task to read.
    Task,
    /// A `like` on the member's message by each user who may react (member, creator, admin).
    Likes,
}

const USERS: [&str; 4] = ["member", "stranger", "creator", "admin"];

async fn fixture(app: &TestApp, needs: Needs, task: &str) -> Fixture {
    let cid = format!("agent:{}", unique("authz"));
    app.channel(&cid, "creator", &["creator", "member"]).await;
    let theirs = app.say(&cid, "creator", "by the creator").await;
    let mine = app.say(&cid, "member", "by the member").await;
    if needs == Needs::Likes {
        for user in ["member", "creator", "admin"] {
            app.post(&format!("/messages/{mine}/reaction"), &app.server(), json!({"reaction": {"type": "like", "user_id": user}}))
                .await
                .ok();
        }
    }
    Fixture { cid, theirs, mine, task: (needs == Needs::Task).then(|| task.to_string()) }
}

/// A fork task (reading one changes nothing, so the cells share it): a fork of more than 100
/// messages has one.
async fn fork_task(app: &TestApp) -> String {
    let cid = format!("agent:{}", unique("authz-src"));
    app.channel(&cid, "creator", &["creator"]).await;
    let ids = app.seed(&cid, "creator", "authz-src", 101, past_ns(), 8).await;
    let r = app.fork(&cid, &ids[100], &unique("authz-fork")).await.ok();
    r["fork"]["task_id"].as_str().unwrap_or_else(|| panic!("a backfilling fork has a task: {r}")).to_string()
}

fn token(app: &TestApp, role: Role) -> String {
    match role {
        Member => app.user("member"),
        Stranger => app.user("stranger"),
        Creator => app.user("creator"),
        Admin => app.user("admin"),
        Server => app.server(),
    }
}

/// The user a server-side request names where it must name one.
fn acting(role: Role) -> &'static str {
    match role {
        Member | Server => "member",
        Stranger => "stranger",
        Creator => "creator",
        Admin => "admin",
    }
}

struct Case {
    name: &'static str,
    needs: Needs,
    request: fn(&Fixture, Role) -> (reqwest::Method, String, Option<Value>),
    expect: fn(Role) -> Expect,
}

fn cases() -> Vec<Case> {
    use reqwest::Method as M;
    vec![
        Case {
            name: "update the channel (POST /channels/{type}/{id})",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"data": {"color": "red"}}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "partially update the channel",
            needs: Needs::Nothing,
            request: |f, _| (M::PATCH, channel_path(&f.cid), Some(json!({"set": {"color": "red"}}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "add members",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"add_members": ["stranger"]}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "remove members",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"remove_members": ["member"]}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "truncate the channel",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, format!("{}/truncate", channel_path(&f.cid)), Some(json!({}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete the channel",
            needs: Needs::Nothing,
            request: |f, _| (M::DELETE, channel_path(&f.cid), None),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete channels in bulk (POST /channels/delete)",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, "/channels/delete".into(), Some(json!({"cids": [f.cid]}))),
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "upsert users raising one's own role (POST /users)",
            needs: Needs::Nothing,
            request: |_, r| (M::POST, "/users".into(), Some(json!({"users": {acting(r): {"id": acting(r), "role": "admin"}}}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "upsert another user (POST /users)",
            needs: Needs::Nothing,
            request: |_, _| (M::POST, "/users".into(), Some(json!({"users": {"creator": {"id": "creator", "name": "renamed"}}}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "partially update one's own role (PATCH /users)",
            needs: Needs::Nothing,
            request: |_, r| (M::PATCH, "/users".into(), Some(json!({"users": [{"id": acting(r), "set": {"role": "admin"}}]}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "partially update another user (PATCH /users)",
            needs: Needs::Nothing,
            request: |_, _| (M::PATCH, "/users".into(), Some(json!({"users": [{"id": "creator", "set": {"name": "renamed"}}]}))),
            expect: |r| if matches!(r, Creator | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "ban a user (POST /moderation/ban)",
            needs: Needs::Nothing,
            request: |_, r| {
                let mut body = json!({"target_user_id": "stranger"});
                if r == Server {
                    body["banned_by_id"] = json!("admin");
                }
                (M::POST, "/moderation/ban".into(), Some(body))
            },
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "read a fork task (GET /tasks/{id})",
            needs: Needs::Task,
            request: |f, _| (M::GET, format!("/tasks/{}", f.task.as_deref().expect("a task")), None),
            // Those who may fork may follow the fork's task.
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "list a channel's forks (GET …/forks)",
            needs: Needs::Nothing,
            request: |f, _| (M::GET, format!("{}/forks", channel_path(&f.cid)), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "edit another user's message (POST /messages/{id})",
            needs: Needs::Nothing,
            request: |f, r| {
                (M::POST, format!("/messages/{}", f.theirs), Some(json!({"message": {"text": "edited"}, "user_id": acting(r)})))
            },
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "partially edit another user's message (PUT /messages/{id})",
            needs: Needs::Nothing,
            request: |f, r| (M::PUT, format!("/messages/{}", f.theirs), Some(json!({"set": {"text": "edited"}, "user_id": acting(r)}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete another user's message (DELETE /messages/{id})",
            needs: Needs::Nothing,
            request: |f, _| (M::DELETE, format!("/messages/{}", f.theirs), None),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "react to a message",
            needs: Needs::Nothing,
            request: |f, r| {
                (M::POST, format!("/messages/{}/reaction", f.mine), Some(json!({"reaction": {"type": "like", "user_id": acting(r)}})))
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "reply in a thread",
            needs: Needs::Nothing,
            request: |f, r| {
                (
                    M::POST,
                    format!("{}/message", channel_path(&f.cid)),
                    Some(json!({"message": {"text": "re", "parent_id": f.mine, "user_id": acting(r)}})),
                )
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "read a thread's replies (GET /messages/{id}/replies)",
            needs: Needs::Nothing,
            request: |f, _| (M::GET, format!("/messages/{}/replies", f.mine), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "get a thread (GET /threads/{id})",
            needs: Needs::Nothing,
            request: |f, r| (M::GET, format!("/threads/{}?user_id={}", f.mine, acting(r)), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "mark the channel read",
            needs: Needs::Nothing,
            request: |f, r| (M::POST, format!("{}/read", channel_path(&f.cid)), Some(json!({"user_id": acting(r)}))),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "send an event",
            needs: Needs::Nothing,
            request: |f, r| {
                (M::POST, format!("{}/event", channel_path(&f.cid)), Some(json!({"event": {"type": "typing.start", "user_id": acting(r)}})))
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "stop watching",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, format!("{}/stop-watching", channel_path(&f.cid)), Some(json!({}))),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "send a message (POST …/message)",
            needs: Needs::Nothing,
            request: |f, r| {
                (M::POST, format!("{}/message", channel_path(&f.cid)), Some(json!({"message": {"text": "hi", "user_id": acting(r)}})))
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "get (or create) and watch the channel (POST …/query)",
            needs: Needs::Nothing,
            request: |f, _| (M::POST, format!("{}/query", channel_path(&f.cid)), Some(json!({"state": true}))),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "get or create a distinct channel of oneself and the creator (POST /channels/{type}/query)",
            needs: Needs::Nothing,
            request: |_, r| {
                let mut data = json!({"members": [acting(r), "creator"]});
                if r == Server {
                    data["created_by_id"] = json!(acting(r));
                }
                (M::POST, "/channels/agent/query".into(), Some(json!({"data": data})))
            },
            expect: |_| Allowed,
        },
        Case {
            name: "rewind the channel (POST …/rewind)",
            needs: Needs::Nothing,
            request: |f, _| {
                let body = json!({"message_id": f.theirs, "expected_last_message_id": f.mine, "inclusive": false});
                (M::POST, format!("{}/rewind", channel_path(&f.cid)), Some(body))
            },
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "fork the channel (POST …/fork)",
            needs: Needs::Nothing,
            request: |f, _| {
                let target = format!("{}-fork", f.cid.trim_start_matches("agent:"));
                (M::POST, format!("{}/fork", channel_path(&f.cid)), Some(json!({"message_id": f.mine, "channel": {"id": target}})))
            },
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "delete one's own reaction (DELETE /messages/{id}/reaction/{type})",
            needs: Needs::Likes,
            request: |f, r| {
                let query = if r == Server { format!("?user_id={}", acting(r)) } else { String::new() };
                (M::DELETE, format!("/messages/{}/reaction/like{query}", f.mine), None)
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "broadcast an ephemeral update of another user's message (PATCH /messages/{id}/ephemeral)",
            needs: Needs::Nothing,
            request: |f, _| (M::PATCH, format!("/messages/{}/ephemeral", f.theirs), Some(json!({"set": {"text": "thinking…"}}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "query threads (POST /threads)",
            needs: Needs::Nothing,
            request: |_, r| (M::POST, "/threads".into(), Some(json!({"user_id": acting(r)}))),
            expect: |_| Allowed,
        },
        Case {
            name: "update the app settings (PATCH /app)",
            needs: Needs::Nothing,
            request: |_, _| (M::PATCH, "/app".into(), Some(json!({"fork_enabled": true}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "create or update a channel type (PUT /channeltypes/{name})",
            needs: Needs::Nothing,
            request: |_, _| (M::PUT, "/channeltypes/agent".into(), Some(json!({"max_message_length": 5000}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "create a guest user (POST /guest)",
            needs: Needs::Nothing,
            request: |_, _| (M::POST, "/guest".into(), Some(json!({"user": {"id": "visitor"}}))),
            expect: |_| Allowed,
        },
        Case {
            name: "replay dead-lettered deliveries (POST /webhooks/dead_letters/replay)",
            needs: Needs::Nothing,
            request: |_, _| (M::POST, "/webhooks/dead_letters/replay".into(), Some(json!({"all": true}))),
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "lift a user's bans (DELETE /moderation/ban)",
            needs: Needs::Nothing,
            request: |_, _| (M::DELETE, "/moderation/ban?target_user_id=stranger".into(), None),
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
    ]
}

#[tokio::test]
async fn every_write_endpoint_allows_exactly_the_roles_stream_allows_and_refuses_the_others_with_code_17() {
    let app = TestApp::spawn().await;
    app.users(&USERS).await;
    app.user_with_role("admin", "admin").await;
    let task = fork_task(&app).await;
    let mut failures = Vec::new();
    for case in cases() {
        for role in ROLES {
            let f = fixture(&app, case.needs, &task).await;
            let (method, path, body) = (case.request)(&f, role);
            let r = app.call(method.clone(), &path, &token(&app, role), body).await;
            let expected = (case.expect)(role);
            let ok = match expected {
                Expect::Ok => r.status == 200,
                Expect::Err(status, code) => {
                    r.status == status
                        && r.body["code"] == json!(code)
                        && r.body["StatusCode"] == json!(status)
                        && r.body["details"].is_array()
                }
            };
            if !ok {
                failures.push(format!("{} as {role:?} ({method} {path}): expected {expected:?}, got {} {}", case.name, r.status, r.body));
            }
            // Users are shared by every cell: undo what an allowed user change did.
            if path == "/users" && r.status == 200 {
                app.user_with_role(acting(role), if acting(role) == "admin" { "admin" } else { "user" }).await;
                app.user_with_role("creator", "user").await;
            }
            if path == "/moderation/ban" && r.status == 200 {
                app.delete("/moderation/ban?target_user_id=stranger", &app.server()).await.ok();
            }
        }
    }
    assert!(failures.is_empty(), "{} of the cells differ:\n{}", failures.len(), failures.join("\n"));
}

// --- the table held against the router ---------------------------------------------------------

/// How an operation of the router is authorised, for [`ROUTES`].
#[derive(Debug, Clone, Copy)]
enum Class {
    /// It changes something: a case of [`cases`] must call it, one cell per role.
    Write,
    /// It changes nothing stored; the text says who may call it (a case of [`cases`] may check it
    /// as well).
    Read(&'static str),
    /// A write whose cells per role live in the named test file, because the table cannot build
    /// its request (a multipart upload).
    WriteTestedIn(&'static str),
}
use Class::{Read, Write, WriteTestedIn};

/// Every operation of the API, by method and path in the legacy dialect (its `/api/v2/chat` and
/// `/api/v2` mirrors are the same operation; parameter names do not matter). Entries for
/// routes the router does not serve are allowed, so a route can be classified before it lands.
const ROUTES: &[(&str, &str, Class)] = &[
    ("POST", "/channels", Read("any user; the answer holds only channels the caller may read")),
    ("POST", "/channels/delete", Write),
    ("POST", "/channels/{type}/query", Write),
    ("POST", "/channels/{type}/{id}/query", Write),
    ("GET", "/channels/{type}/{id}", Read("members, admins and server-side")),
    ("POST", "/channels/{type}/{id}", Write),
    ("PATCH", "/channels/{type}/{id}", Write),
    ("DELETE", "/channels/{type}/{id}", Write),
    ("POST", "/channels/{type}/{id}/message", Write),
    ("POST", "/channels/{type}/{id}/truncate", Write),
    ("POST", "/channels/{type}/{id}/rewind", Write),
    ("POST", "/channels/{type}/{id}/read", Write),
    ("POST", "/channels/{type}/{id}/event", Write),
    ("POST", "/channels/{type}/{id}/stop-watching", Write),
    ("POST", "/channels/{type}/{id}/fork", Write),
    ("POST", "/channels/{type}/{id}/fork/message_ids", Read("members, admins and server-side")),
    ("GET", "/channels/{type}/{id}/forks", Read("members, admins and server-side")),
    ("GET", "/channels/{type}/{id}/lineage", Read("members, admins and server-side; channels the caller may not read are named only")),
    ("POST", "/channels/{type}/{id}/file", WriteTestedIn("tests/e2e/files.rs")),
    ("DELETE", "/channels/{type}/{id}/file", WriteTestedIn("tests/e2e/files.rs")),
    ("POST", "/channels/{type}/{id}/image", WriteTestedIn("tests/e2e/files.rs")),
    ("DELETE", "/channels/{type}/{id}/image", WriteTestedIn("tests/e2e/files.rs")),
    ("GET", "/uploads/{key}", Read("anyone holding a signed URL: the signature is the authorisation")),
    ("GET", "/search", Read("any user; the answer holds only messages of channels the caller may read")),
    ("GET", "/console", Read("anyone: the page holds no data; it calls the API with the token it is given")),
    ("GET", "/messages/{id}", Read("members, admins and server-side")),
    ("POST", "/messages/{id}", Write),
    ("PUT", "/messages/{id}", Write),
    ("DELETE", "/messages/{id}", Write),
    ("PATCH", "/messages/{id}/ephemeral", Write),
    ("GET", "/messages/{id}/replies", Read("members, admins and server-side")),
    ("POST", "/messages/{id}/reaction", Write),
    ("DELETE", "/messages/{id}/reaction/{type}", Write),
    ("GET", "/messages/{id}/reactions", Read("members, admins and server-side")),
    ("POST", "/threads", Read("any user; the answer holds only the caller's threads")),
    ("GET", "/threads/{id}", Read("members, admins and server-side")),
    ("GET", "/channeltypes", Read("any user")),
    ("GET", "/channeltypes/{name}", Read("any user")),
    ("PUT", "/channeltypes/{name}", Write),
    ("POST", "/users", Write),
    ("PATCH", "/users", Write),
    ("GET", "/users", Read("any user")),
    ("GET", "/app", Read("server-side: the full settings; users: what a client needs")),
    ("PATCH", "/app", Write),
    ("POST", "/guest", Write),
    ("GET", "/tasks/{id}", Read("admins and server-side")),
    ("GET", "/jobs", Read("admins and server-side")),
    ("GET", "/rate_limits", Read("server-side only")),
    ("GET", "/webhooks/dead_letters", Read("admins and server-side")),
    ("POST", "/webhooks/dead_letters/replay", Write),
    ("POST", "/moderation/ban", Write),
    ("DELETE", "/moderation/ban", Write),
];

/// `path` without its dialect prefix, its query, and the names of its parameters:
/// `/api/v2/chat/channels/{type}/{id}` → `/channels/{}/{}`.
fn route_shape(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let path = path.strip_prefix("/api/v2/chat").or_else(|| path.strip_prefix("/api/v2")).unwrap_or(path);
    path.split('/').map(|s| if s.starts_with('{') && s.ends_with('}') { "{}" } else { s }).collect::<Vec<_>>().join("/")
}

/// The served route (shape) a concrete request path goes to: the template whose literal
/// segments all match, preferring the most literal segments (`/channels/delete` over
/// `/channels/{}/{}`).
fn served_route<'a>(method: &str, path: &str, routes: &'a [(String, String)]) -> Option<&'a (String, String)> {
    let shape = route_shape(path);
    let segments: Vec<&str> = shape.split('/').collect();
    routes
        .iter()
        .filter(|(m, shape)| {
            let t: Vec<&str> = shape.split('/').collect();
            m == method && t.len() == segments.len() && t.iter().zip(&segments).all(|(t, s)| *t == "{}" || t == s)
        })
        .max_by_key(|(_, shape)| shape.split('/').filter(|s| *s != "{}").count())
}

#[test]
fn every_route_of_the_router_is_classified_and_every_write_route_has_a_case() {
    let served: Vec<(String, String)> = {
        let mut v: Vec<(String, String)> =
            offshoot_api::api_operations().iter().map(|(m, p)| (m.as_str().to_string(), route_shape(p))).collect();
        v.sort();
        v.dedup();
        v
    };
    assert!(served.len() >= 40, "the router lists its operations: {served:?}");
    let class_of = |m: &str, shape: &str| ROUTES.iter().find(|(rm, rp, _)| *rm == m && route_shape(rp) == shape).map(|(_, _, c)| *c);

    // The routes the cases call, found the way the router finds them.
    let f = Fixture { cid: "agent:c".into(), theirs: "t".into(), mine: "m".into(), task: Some("task".into()) };
    let mut called = std::collections::HashSet::new();
    let mut problems = Vec::new();
    for case in cases() {
        for role in ROLES {
            let (method, path, _) = (case.request)(&f, role);
            match served_route(method.as_str(), &path, &served) {
                Some(route) => {
                    called.insert(route.clone());
                }
                None => problems.push(format!("the case {:?} calls {method} {path}, which the router does not serve", case.name)),
            }
        }
    }
    for (m, shape) in &served {
        match class_of(m, shape) {
            None => problems.push(format!(
                "{m} {shape} is served but not classified: add it to ROUTES in tests/e2e/authz.rs as Write (and add a case to \
                 cases() with the roles that may call it: member, stranger, creator, admin, server) or as Read(\"who may \
                 call it\") if it changes nothing stored"
            )),
            Some(Write) if !called.contains(&(m.clone(), shape.clone())) => problems.push(format!(
                "{m} {shape} is a write route but no case calls it: add a case to cases() in tests/e2e/authz.rs saying which \
                 roles may call it (member, stranger, creator, admin, server) and the error the others get"
            )),
            Some(WriteTestedIn(file)) => {
                let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
                if !path.exists() {
                    problems.push(format!("{m} {shape} is a write whose per-role cells are in {file}, which does not exist"));
                }
            }
            Some(Read(who)) if who.trim().is_empty() => problems.push(format!("{m} {shape} is a read: say who may call it")),
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
