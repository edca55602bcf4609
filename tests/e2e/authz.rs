//! Who may call which write endpoint: a table of endpoint × role → allowed (200) or the exact
//! Stream error. Every cell runs on a fixture of its own, so a call that is (wrongly) allowed
//! cannot change what another cell sees.
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

const USERS: [&str; 4] = ["member", "stranger", "creator", "admin"];

async fn fixture(app: &TestApp, task: Option<String>) -> Fixture {
    let cid = format!("agent:{}", unique("authz"));
    app.channel(&cid, "creator", &["creator", "member"]).await;
    let theirs = app.say(&cid, "creator", "by the creator").await;
    let mine = app.say(&cid, "member", "by the member").await;
    Fixture { cid, theirs, mine, task }
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
    needs_task: bool,
    request: fn(&Fixture, Role) -> (reqwest::Method, String, Option<Value>),
    expect: fn(Role) -> Expect,
}

fn cases() -> Vec<Case> {
    use reqwest::Method as M;
    vec![
        Case {
            name: "update the channel (POST /channels/{type}/{id})",
            needs_task: false,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"data": {"color": "red"}}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "partially update the channel",
            needs_task: false,
            request: |f, _| (M::PATCH, channel_path(&f.cid), Some(json!({"set": {"color": "red"}}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "add members",
            needs_task: false,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"add_members": ["stranger"]}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "remove members",
            needs_task: false,
            request: |f, _| (M::POST, channel_path(&f.cid), Some(json!({"remove_members": ["member"]}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "truncate the channel",
            needs_task: false,
            request: |f, _| (M::POST, format!("{}/truncate", channel_path(&f.cid)), Some(json!({}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete the channel",
            needs_task: false,
            request: |f, _| (M::DELETE, channel_path(&f.cid), None),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete channels in bulk (POST /channels/delete)",
            needs_task: false,
            request: |f, _| (M::POST, "/channels/delete".into(), Some(json!({"cids": [f.cid]}))),
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "upsert users raising one's own role (POST /users)",
            needs_task: false,
            request: |_, r| (M::POST, "/users".into(), Some(json!({"users": {acting(r): {"id": acting(r), "role": "admin"}}}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "upsert another user (POST /users)",
            needs_task: false,
            request: |_, _| (M::POST, "/users".into(), Some(json!({"users": {"creator": {"id": "creator", "name": "renamed"}}}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "partially update one's own role (PATCH /users)",
            needs_task: false,
            request: |_, r| (M::PATCH, "/users".into(), Some(json!({"users": [{"id": acting(r), "set": {"role": "admin"}}]}))),
            expect: |r| if r == Server { Allowed } else { DENIED },
        },
        Case {
            name: "partially update another user (PATCH /users)",
            needs_task: false,
            request: |_, _| (M::PATCH, "/users".into(), Some(json!({"users": [{"id": "creator", "set": {"name": "renamed"}}]}))),
            expect: |r| if matches!(r, Creator | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "ban a user (POST /moderation/ban)",
            needs_task: false,
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
            needs_task: true,
            request: |f, _| (M::GET, format!("/tasks/{}", f.task.as_deref().expect("a task")), None),
            // Those who may fork may follow the fork's task.
            expect: |r| if matches!(r, Admin | Server) { Allowed } else { DENIED },
        },
        Case {
            name: "list a channel's forks (GET …/forks)",
            needs_task: false,
            request: |f, _| (M::GET, format!("{}/forks", channel_path(&f.cid)), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "edit another user's message (POST /messages/{id})",
            needs_task: false,
            request: |f, r| {
                (M::POST, format!("/messages/{}", f.theirs), Some(json!({"message": {"text": "edited"}, "user_id": acting(r)})))
            },
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "partially edit another user's message (PUT /messages/{id})",
            needs_task: false,
            request: |f, r| (M::PUT, format!("/messages/{}", f.theirs), Some(json!({"set": {"text": "edited"}, "user_id": acting(r)}))),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "delete another user's message (DELETE /messages/{id})",
            needs_task: false,
            request: |f, _| (M::DELETE, format!("/messages/{}", f.theirs), None),
            expect: |r| if matches!(r, Member | Stranger) { DENIED } else { Allowed },
        },
        Case {
            name: "react to a message",
            needs_task: false,
            request: |f, r| {
                (M::POST, format!("/messages/{}/reaction", f.mine), Some(json!({"reaction": {"type": "like", "user_id": acting(r)}})))
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "reply in a thread",
            needs_task: false,
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
            needs_task: false,
            request: |f, _| (M::GET, format!("/messages/{}/replies", f.mine), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "get a thread (GET /threads/{id})",
            needs_task: false,
            request: |f, r| (M::GET, format!("/threads/{}?user_id={}", f.mine, acting(r)), None),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "mark the channel read",
            needs_task: false,
            request: |f, r| (M::POST, format!("{}/read", channel_path(&f.cid)), Some(json!({"user_id": acting(r)}))),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "send an event",
            needs_task: false,
            request: |f, r| {
                (M::POST, format!("{}/event", channel_path(&f.cid)), Some(json!({"event": {"type": "typing.start", "user_id": acting(r)}})))
            },
            expect: |r| if r == Stranger { DENIED } else { Allowed },
        },
        Case {
            name: "stop watching",
            needs_task: false,
            request: |f, _| (M::POST, format!("{}/stop-watching", channel_path(&f.cid)), Some(json!({}))),
            expect: |r| if r == Stranger { DENIED } else { Allowed },
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
            let f = fixture(&app, case.needs_task.then(|| task.clone())).await;
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
