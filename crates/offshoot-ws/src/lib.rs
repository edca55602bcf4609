//! The WebSocket role: Stream's `/connect` (legacy dialect, what JS `stream-chat` uses) and
//! `/api/v2/connect` (v2 dialect), the registry of open connections and the channels they
//! watch, and the fan-out of the transactional event outbox to them.
//!
//! The outbox is the only source of events. [`Hub::run`] follows it from its newest event at
//! start-up, woken in-process after every commit that wrote events and polling for events
//! written by other processes, and pushes each event to the connections its audience names. (The
//! store hands it the events this process just committed from memory, not read back from the
//! table: `offshoot-store`'s `events.rs`.)
//! Every connection has a bounded queue: one that falls behind is closed (the client reconnects
//! and re-queries its channels), never buffered without limit, and never slows the others.
//!
//! Presence and watcher counts hold across processes: every connection and watch is also
//! recorded in the store (`offshoot-store`'s `presence.rs`) under this process's instance id,
//! renewed by a heartbeat; [`Hub::run`] also removes the records of instances whose heartbeat
//! stopped, and its own records of connections it no longer holds.
//!
//! Depends on `offshoot-core` and `offshoot-store`; must not depend on `offshoot-api` or
//! `offshoot-worker` (the API reaches the registry through core's [`Watchers`] trait).

mod auth;
mod conn;

use axum::extract::ws::Utf8Bytes;
use axum::routing::get;
use axum::Router;
use offshoot_core::model::{Event, OutboxEvent, UnreadCounts, Watchers, UNWATCH_EVENT, WATCH_EVENT};
use offshoot_core::render::{self, Dialect};
use offshoot_store::Store;
use secrecy::SecretString;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events queued per connection before it counts as too slow and is closed.
const QUEUE_CAPACITY: usize = 1024;
/// Events read from the outbox per query.
const BATCH: i64 = 500;
/// How often this process renews its instance heartbeat and looks for dead instances.
const INSTANCE_HEARTBEAT: Duration = Duration::from_secs(5);
/// An instance silent for this long is dead; its connections and watches are removed.
const INSTANCE_TTL: Duration = Duration::from_secs(20);

/// The connection registry and the outbox fan-out. One per process running the ws role.
pub struct Hub {
    store: Store,
    /// This process's id in the store's presence records.
    instance: String,
    api_key: String,
    api_secret: SecretString,
    registry: RwLock<Registry>,
    /// Cancelled when [`Hub::run`] stops: every connection then closes with "going away".
    closing: CancellationToken,
    /// The cap on open connections of this process; new ones beyond it are refused.
    max_connections: usize,
    /// Connections holding a slot (upgraded or being upgraded).
    open: AtomicUsize,
    /// Per-user connection cap and per-connection client event rate (`conn.rs`).
    client_limits: RwLock<conn::ClientLimits>,
}

pub use conn::{ClientLimits, DEFAULT_CLIENT_EVENTS_PER_MINUTE, DEFAULT_CONNECTIONS_PER_USER};

/// Default of [`Hub::with_max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// A place under the connection cap, held for the life of one connection.
pub(crate) struct ConnSlot(Arc<Hub>);

impl ConnSlot {
    pub(crate) fn acquire(hub: &Arc<Hub>) -> Option<ConnSlot> {
        hub.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < hub.max_connections).then_some(n + 1)).ok().map(|_| {
            metrics::gauge!("offshoot_ws_connections").increment(1.0);
            ConnSlot(hub.clone())
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!("offshoot_ws_connections").decrement(1.0);
    }
}

#[derive(Default)]
struct Registry {
    conns: HashMap<String, Conn>,
    /// cid -> ids of the connections watching it.
    watchers: HashMap<String, HashSet<String>>,
    /// user id -> ids of that user's connections.
    by_user: HashMap<String, HashSet<String>>,
}

struct Conn {
    user_id: String,
    dialect: Dialect,
    queue: mpsc::Sender<Utf8Bytes>,
    watching: HashSet<String>,
    /// Ends the connection's task (it fell behind).
    kick: CancellationToken,
}

impl Registry {
    fn insert(&mut self, id: String, conn: Conn) {
        self.by_user.entry(conn.user_id.clone()).or_default().insert(id.clone());
        self.conns.insert(id, conn);
    }

    fn remove(&mut self, id: &str) -> Option<Conn> {
        let conn = self.conns.remove(id)?;
        for cid in &conn.watching {
            remove_from(&mut self.watchers, cid, id);
        }
        remove_from(&mut self.by_user, &conn.user_id, id);
        Some(conn)
    }

    /// Distinct users watching `cid` on this process.
    fn watcher_count(&self, cid: &str) -> usize {
        let Some(ids) = self.watchers.get(cid) else {
            return 0;
        };
        ids.iter().filter_map(|id| self.conns.get(id)).map(|c| c.user_id.as_str()).collect::<HashSet<_>>().len()
    }
}

fn remove_from(map: &mut HashMap<String, HashSet<String>>, key: &str, id: &str) {
    if let Some(set) = map.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

impl Hub {
    pub fn new(store: Store, api_key: String, api_secret: SecretString) -> Arc<Hub> {
        Self::with_max_connections(store, api_key, api_secret, DEFAULT_MAX_CONNECTIONS)
    }

    /// A hub that refuses connections beyond `max_connections` (503, Stream code 71).
    pub fn with_max_connections(store: Store, api_key: String, api_secret: SecretString, max_connections: usize) -> Arc<Hub> {
        // The gauge is on `/metrics` from the start (0 until a client connects), not only once
        // one has.
        metrics::gauge!("offshoot_ws_connections").increment(0.0);
        Arc::new(Hub {
            store,
            instance: uuid::Uuid::new_v4().to_string(),
            api_key,
            api_secret,
            registry: RwLock::default(),
            closing: CancellationToken::new(),
            max_connections,
            open: AtomicUsize::new(0),
            client_limits: RwLock::new(conn::ClientLimits::default()),
        })
    }

    /// `GET /connect` (legacy) and `GET /api/v2/connect` (v2).
    pub fn router(self: Arc<Self>) -> Router {
        Router::new().route("/connect", get(conn::connect_legacy)).route("/api/v2/connect", get(conn::connect_v2)).with_state(self)
    }

    /// Follows the outbox and fans events out until `shutdown`; then closes every connection
    /// and removes this process's presence records (announcing who went offline).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let presence = tokio::spawn(self.clone().keep_presence(shutdown.clone()));
        self.follow_outbox(&shutdown).await;
        self.closing.cancel();
        let _ = presence.await;
        // The sessions remove their own records as they end; wait for them (bounded), then
        // remove whatever is left.
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while self.connection_count() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if let Err(e) = self.store.sweep_instance(&self.instance).await {
            tracing::warn!(error = %e, "removing this process's presence records failed; another process removes them later");
        }
        tracing::info!("websocket fan-out stopped");
    }

    /// The instance heartbeat: renews this process's record, removes dead instances' records
    /// and its own records of connections it no longer holds (a failed removal at close).
    async fn keep_presence(self: Arc<Self>, shutdown: CancellationToken) {
        if let Err(e) = self.store.register_instance(&self.instance).await {
            tracing::warn!(error = %e, "registering the websocket instance failed; retrying at the next heartbeat");
        }
        // SQLite serves one process (crate doc of offshoot-store): every other instance on the
        // file is a previous run of this server, dead.
        let mut first = self.store.backend() == offshoot_store::Backend::Sqlite;
        loop {
            if let Err(e) = self.beat(first).await {
                tracing::warn!(error = %e, "the websocket instance heartbeat failed");
            }
            first = false;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(INSTANCE_HEARTBEAT) => {}
            }
        }
    }

    async fn beat(&self, all_others_dead: bool) -> Result<(), offshoot_store::StoreError> {
        if !self.store.beat_instance(&self.instance).await? {
            // Taken for dead (this process could not reach the database for a while): its
            // records are gone, so its clients must reconnect to be recorded again.
            tracing::warn!("this websocket instance was taken for dead; closing its connections");
            self.store.register_instance(&self.instance).await?;
            for conn in self.read().conns.values() {
                conn.kick.cancel();
            }
        }
        let before = if all_others_dead { i64::MAX } else { offshoot_core::time::now() - INSTANCE_TTL.as_nanos() as i64 };
        for dead in self.store.dead_instances(&self.instance, before).await? {
            tracing::info!(instance = %dead, "removing the presence records of a dead websocket instance");
            self.store.sweep_instance(&dead).await?;
        }
        let recorded = self.store.instance_connections(&self.instance).await?;
        let stale: Vec<String> = {
            let reg = self.read();
            recorded.into_iter().filter(|id| !reg.conns.contains_key(id)).collect()
        };
        for id in stale {
            self.store.close_connection(&id).await?;
        }
        Ok(())
    }

    async fn follow_outbox(&self, shutdown: &CancellationToken) {
        let mut cursor: Option<i64> = None;
        let mut outbox = self.store.follow_outbox("reading the event outbox");
        while outbox.next(shutdown.cancelled()).await {
            let read = match cursor {
                None => self.store.last_event_seq().await.map(|seq| {
                    offshoot_store::set_consumer_cursor("websocket", seq);
                    cursor = Some(seq)
                }),
                Some(ref mut seq) => self.catch_up(seq).await,
            };
            outbox.read(read);
        }
    }

    /// Pushes every event after `seq` and moves `seq` past them.
    async fn catch_up(&self, seq: &mut i64) -> Result<(), offshoot_store::StoreError> {
        loop {
            let batch = self.store.events_after(*seq, BATCH).await?;
            for ev in &batch {
                self.dispatch(ev);
                *seq = ev.seq;
            }
            offshoot_store::set_consumer_cursor("websocket", *seq);
            if offshoot_store::outbox_rows(&batch) < BATCH {
                return Ok(());
            }
        }
    }

    /// Queues one event on every connection its audience names (each at most once). Never
    /// waits: a connection whose queue is full is closed instead.
    fn dispatch(&self, ev: &OutboxEvent) {
        if ev.event.kind.is_empty() {
            return;
        }
        // Watches registered by an API process that does not hold the connection.
        if ev.event.kind == WATCH_EVENT || ev.event.kind == UNWATCH_EVENT {
            let conn = ev.event.extra.get("connection_id").and_then(|v| v.as_str());
            let owner = ev.event.extra.get("user_id").and_then(|v| v.as_str());
            if let (Some(conn), Some(cid)) = (conn, ev.event.cid.as_deref()) {
                if ev.event.kind == WATCH_EVENT {
                    self.watch(conn, owner, cid);
                } else {
                    self.unwatch(conn, owner, cid);
                }
            }
            return;
        }
        let mut dropped = Vec::new();
        {
            let reg = self.read();
            let mut targets: Vec<&String> = Vec::new();
            if let Some(ids) = ev.audience.watchers_of.as_deref().and_then(|cid| reg.watchers.get(cid)) {
                targets.extend(ids);
            }
            for user in &ev.audience.users {
                if let Some(ids) = reg.by_user.get(user) {
                    targets.extend(ids);
                }
            }
            // Named connections held by this process (the others are another process's).
            targets.extend(ev.audience.connections.iter().filter_map(|id| reg.conns.get_key_value(id).map(|(k, _)| k)));
            let mut seen = HashSet::with_capacity(targets.len());
            targets.retain(|id| seen.insert(*id));
            if let Some(cid) = &ev.audience.except_watchers_of {
                targets.retain(|id| reg.conns.get(*id).is_none_or(|c| !c.watching.contains(cid)));
            }
            let mut rendered: [Option<Utf8Bytes>; 2] = [None, None];
            for id in targets {
                let Some(conn) = reg.conns.get(id) else {
                    continue;
                };
                if !visible_to(&ev.event, &conn.user_id) {
                    continue;
                }
                let slot = match conn.dialect {
                    Dialect::Legacy => 0,
                    Dialect::V2 => 1,
                };
                let plain = rendered[slot].get_or_insert_with(|| render_event(&reg, conn.dialect, &ev.event));
                let text = match ev.audience.unread.get(&conn.user_id) {
                    Some(u) => with_unread(plain.as_str(), u),
                    None => plain.clone(),
                };
                match conn.queue.try_send(text) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        metrics::counter!("offshoot_ws_clients_dropped_slow_total").increment(1);
                        tracing::warn!(connection_id = %id, user_id = %conn.user_id, "websocket client too slow; closing its connection");
                        dropped.push(id.clone());
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => dropped.push(id.clone()),
                }
            }
        }
        for id in dropped {
            self.disconnect(&id);
        }
    }

    #[cfg(test)]
    fn register(&self, id: String, conn: Conn) {
        self.write().insert(id, conn);
    }

    /// Removes a connection and all its watches, and tells its task to end.
    fn disconnect(&self, id: &str) {
        if let Some(conn) = self.write().remove(id) {
            conn.kick.cancel();
        }
    }

    /// Number of open connections on this process.
    pub fn connection_count(&self) -> usize {
        self.read().conns.len()
    }

    // A panic while the lock is held cannot leave the maps half-updated in a way that matters
    // more than losing every connection would, so a poisoned lock is used as it is.
    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchers for Hub {
    fn watch(&self, connection_id: &str, owner: Option<&str>, cid: &str) -> bool {
        let mut reg = self.write();
        let Some(conn) = reg.conns.get_mut(connection_id) else {
            return false;
        };
        if owner.is_some_and(|o| o != conn.user_id) {
            tracing::warn!(connection_id, user_id = owner, "refused to watch another user's connection");
            return true;
        }
        conn.watching.insert(cid.to_string());
        reg.watchers.entry(cid.to_string()).or_default().insert(connection_id.to_string());
        true
    }

    fn unwatch(&self, connection_id: &str, owner: Option<&str>, cid: &str) -> bool {
        let mut reg = self.write();
        let local = match reg.conns.get_mut(connection_id) {
            Some(conn) if owner.is_some_and(|o| o != conn.user_id) => {
                tracing::warn!(connection_id, user_id = owner, "refused to stop another user's connection watching");
                return true;
            }
            Some(conn) => {
                conn.watching.remove(cid);
                true
            }
            None => false,
        };
        remove_from(&mut reg.watchers, cid, connection_id);
        local
    }
}

impl Hub {
    /// Distinct users watching `cid` through this process (the store counts every process's).
    pub fn local_watcher_count(&self, cid: &str) -> usize {
        self.read().watcher_count(cid)
    }
}

/// Whether a user may see an event. Shadowed messages are seen by their author only;
/// a message with restricted visibility by the users it names and its author.
fn visible_to(event: &Event, user_id: &str) -> bool {
    let Some(m) = &event.message else { return true };
    if m.shadowed {
        return m.user_id == user_id;
    }
    if !m.restricted_visibility.is_empty() {
        return m.user_id == user_id || m.restricted_visibility.iter().any(|u| u == user_id);
    }
    true
}

fn render_event(reg: &Registry, dialect: Dialect, event: &Event) -> Utf8Bytes {
    // The watcher count is known here, not where the event was written; counted only for the
    // events that carry it (it walks the channel's watchers).
    let watcher_count = match event.cid.as_deref() {
        Some(cid) if render::counts_watchers(event) => reg.watcher_count(cid) as i64,
        _ => 0,
    };
    let out = render::EventOut { dialect, event, watcher_count };
    Utf8Bytes::from(serde_json::to_string(&out).expect("an event serialises: its keys are strings"))
}

/// The rendered event (a JSON object's text) with one recipient's unread counters appended as
/// members of the object: no second rendering per recipient.
fn with_unread(plain: &str, u: &UnreadCounts) -> Utf8Bytes {
    match plain.strip_suffix('}') {
        Some(head) => {
            let sep = if head.ends_with('{') { "" } else { "," };
            Utf8Bytes::from(format!(
                "{head}{sep}\"total_unread_count\":{t},\"unread_count\":{t},\"unread_channels\":{c}}}",
                t = u.total,
                c = u.channels
            ))
        }
        None => Utf8Bytes::from(plain.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offshoot_core::model::{Audience, Message};
    use serde_json::Value;

    fn message_event(author: &str, shadowed: bool, restricted: &[&str]) -> Event {
        Event {
            kind: "message.new".into(),
            cid: Some("agent:c1".into()),
            message: Some(Message {
                id: "m1".into(),
                cid: "agent:c1".into(),
                user_id: author.into(),
                shadowed,
                restricted_visibility: restricted.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn shadowed_messages_are_visible_to_their_author_only() {
        let e = message_event("alice", true, &[]);
        assert!(visible_to(&e, "alice"));
        assert!(!visible_to(&e, "bob"));
    }

    #[test]
    fn restricted_messages_are_visible_to_the_named_users_and_the_author() {
        let e = message_event("alice", false, &["bob"]);
        assert!(visible_to(&e, "alice"));
        assert!(visible_to(&e, "bob"));
        assert!(!visible_to(&e, "carol"));
        assert!(visible_to(&message_event("alice", false, &[]), "carol"));
    }

    async fn hub() -> (Arc<Hub>, tempdir::Dir) {
        let dir = tempdir::Dir::new();
        let store = Store::connect(&dir.url()).await.unwrap();
        (Hub::new(store, "k".into(), SecretString::from("s")), dir)
    }

    fn conn(hub: &Hub, id: &str, user: &str, capacity: usize) -> (mpsc::Receiver<Utf8Bytes>, CancellationToken) {
        let (tx, rx) = mpsc::channel(capacity);
        let kick = CancellationToken::new();
        hub.register(
            id.into(),
            Conn { user_id: user.into(), dialect: Dialect::Legacy, queue: tx, watching: HashSet::new(), kick: kick.clone() },
        );
        (rx, kick)
    }

    fn outbox(event: Event, audience: Audience) -> OutboxEvent {
        OutboxEvent { seq: 1, event, audience }
    }

    #[tokio::test]
    async fn an_event_reaches_watchers_and_named_users_once_each() {
        let (hub, _dir) = hub().await;
        let (mut a, _) = conn(&hub, "a", "alice", 8);
        let (mut b, _) = conn(&hub, "b", "bob", 8);
        let (mut c, _) = conn(&hub, "c", "carol", 8);
        assert!(hub.watch("a", Some("alice"), "agent:c1"));
        assert!(!hub.watch("nope", None, "agent:c1"));
        let audience = Audience {
            watchers_of: Some("agent:c1".into()),
            users: vec!["alice".into(), "bob".into()],
            webhooks: false,
            ..Default::default()
        };
        hub.dispatch(&outbox(message_event("alice", false, &[]), audience));
        let text = a.try_recv().unwrap();
        let v: Value = serde_json::from_str(text.as_str()).unwrap();
        assert_eq!(v["type"], "message.new");
        assert_eq!(v["watcher_count"], 1);
        assert!(a.try_recv().is_err(), "alice is a watcher and named, but gets the event once");
        assert!(b.try_recv().is_ok());
        assert!(c.try_recv().is_err());
    }

    #[tokio::test]
    async fn each_recipient_gets_its_own_unread_counters_and_notifications_skip_watchers() {
        let (hub, _dir) = hub().await;
        let (mut a, _) = conn(&hub, "a", "alice", 8);
        let (mut b, _) = conn(&hub, "b", "bob", 8);
        hub.watch("a", None, "agent:c1");
        let mut unread = std::collections::BTreeMap::new();
        unread.insert("alice".to_string(), UnreadCounts { total: 3, channels: 2 });
        let audience = Audience { watchers_of: Some("agent:c1".into()), users: vec!["bob".into()], unread, ..Default::default() };
        hub.dispatch(&outbox(message_event("carol", false, &[]), audience));
        let va: Value = serde_json::from_str(a.try_recv().unwrap().as_str()).unwrap();
        assert_eq!(
            (va["total_unread_count"].clone(), va["unread_count"].clone(), va["unread_channels"].clone()),
            (3.into(), 3.into(), 2.into())
        );
        assert_eq!(va["type"], "message.new", "the rest of the event is intact: {va}");
        let vb: Value = serde_json::from_str(b.try_recv().unwrap().as_str()).unwrap();
        assert!(vb.get("total_unread_count").is_none(), "bob has no counters in this event: {vb}");

        let mut note = message_event("carol", false, &[]);
        note.kind = "notification.message_new".into();
        let audience =
            Audience { users: vec!["alice".into(), "bob".into()], except_watchers_of: Some("agent:c1".into()), ..Default::default() };
        hub.dispatch(&outbox(note, audience));
        assert!(a.try_recv().is_err(), "alice watches the channel: she heard message.new instead");
        assert_eq!(serde_json::from_str::<Value>(b.try_recv().unwrap().as_str()).unwrap()["type"], "notification.message_new");
    }

    #[tokio::test]
    async fn a_connection_whose_queue_is_full_is_dropped_and_its_watches_removed() {
        let (hub, _dir) = hub().await;
        let (_slow, kick) = conn(&hub, "slow", "alice", 1);
        let (mut fast, _) = conn(&hub, "fast", "bob", 8);
        hub.watch("slow", None, "agent:c1");
        hub.watch("fast", None, "agent:c1");
        let audience = Audience { watchers_of: Some("agent:c1".into()), ..Default::default() };
        for _ in 0..3 {
            hub.dispatch(&outbox(message_event("bob", false, &[]), audience.clone()));
        }
        assert!(kick.is_cancelled());
        assert_eq!(hub.local_watcher_count("agent:c1"), 1);
        assert_eq!(hub.connection_count(), 1);
        for _ in 0..3 {
            assert!(fast.try_recv().is_ok());
        }
    }

    #[tokio::test]
    async fn a_user_cannot_watch_or_unwatch_with_another_users_connection() {
        let (hub, _dir) = hub().await;
        let (_a, _) = conn(&hub, "a", "alice", 8);
        assert!(hub.watch("a", Some("mallory"), "agent:c1"), "the connection is here: nothing to relay");
        assert_eq!(hub.local_watcher_count("agent:c1"), 0, "mallory cannot subscribe alice's connection");
        assert!(hub.watch("a", Some("alice"), "agent:c1"));
        assert!(hub.unwatch("a", Some("mallory"), "agent:c1"));
        assert_eq!(hub.local_watcher_count("agent:c1"), 1, "mallory cannot unsubscribe alice's connection");
        assert!(hub.unwatch("a", None, "agent:c1"), "server-side requests may");
        assert_eq!(hub.local_watcher_count("agent:c1"), 0);
    }

    /// A throw-away SQLite file for unit tests (removed on drop).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!("offshoot-ws-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn url(&self) -> String {
                format!("sqlite://{}?mode=rwc", self.0.join("t.db").display())
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
