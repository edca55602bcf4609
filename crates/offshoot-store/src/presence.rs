//! Presence and watchers, shared by every ws process on one database.
//!
//! Each ws process is an *instance* (`ws_instance`, with a heartbeat); each open WebSocket
//! connection is a `ws_connection` row of its instance, and each channel a connection watches
//! a `ws_watch` row (with whether the watch asked for `presence`). A user is online while they
//! have a connection row and are not invisible (`rows::USER_ONLINE`, read with every user); a
//! channel's watchers are the distinct users with a watch row on it. The rows of an instance
//! whose heartbeat stopped (a killed process) are removed by a live instance
//! ([`Store::sweep_instance`]), which announces what the dead process could not.
//!
//! **Locking.** A user's connection and watch rows are written only under that user's row lock
//! (step 5 of the crate doc's lock order, taken alone here), so "was this the first
//! connection / the last watch of this user" is decided by one transaction at a time, also
//! when the user's connections live on different processes. Events go through the outbox in the
//! same transaction: every ws process fans them out.
//!
//! Events: `user.presence.changed` (the user's first connection opened, their last closed) to
//! the connections that watch, with `presence: true`, a channel the user is a member of;
//! `user.watching.start` / `user.watching.stop` (a user's first watch of a channel began, their
//! last ended) to the channel's watchers. Invisible users emit no presence events.

use crate::rows::placeholders;
use crate::users::lock_user;
use crate::{counted, Result, Store, Tx};
use offshoot_core::model::{Audience, Event, User};
use offshoot_core::time::{self, Ts};
use sqlx::AssertSqlSafe;

impl Store {
    /// Records a ws instance (a process running the ws role) with a fresh heartbeat.
    pub async fn register_instance(&self, instance: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = time::now();
        sqlx::query("INSERT INTO ws_instance (id, heartbeat_at, created_at, updated_at) VALUES ($1, $2, $2, $2) ON CONFLICT (id) DO UPDATE SET heartbeat_at = $2, updated_at = $2")
            .bind(instance.to_string())
            .bind(now)
            .execute(counted(&mut *tx.tx))
            .await?;
        tx.commit(self).await
    }

    /// Renews an instance's heartbeat. False when its row is gone: another instance took it
    /// for dead and removed its connections, which must then be closed (their clients
    /// reconnect and watch again).
    pub async fn beat_instance(&self, instance: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let res = sqlx::query("UPDATE ws_instance SET heartbeat_at = $2, updated_at = $2 WHERE id = $1")
            .bind(instance.to_string())
            .bind(now)
            .execute(counted(&mut *tx.tx))
            .await?;
        tx.commit(self).await?;
        Ok(res.rows_affected() == 1)
    }

    /// Instances other than `except` whose last heartbeat is before `before`.
    pub async fn dead_instances(&self, except: &str, before: Ts) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT id FROM ws_instance WHERE id <> $1 AND heartbeat_at < $2 ORDER BY id")
            .bind(except.to_string())
            .bind(before)
            .fetch_all(counted(self.pool()))
            .await?)
    }

    /// Removes a dead instance: each of its users' connections and watches (one transaction per
    /// user, announcing who went offline and stopped watching), then the instance row.
    #[tracing::instrument(name = "store.sweep_instance", skip(self))]
    pub async fn sweep_instance(&self, instance: &str) -> Result<()> {
        loop {
            let users: Vec<String> =
                sqlx::query_scalar("SELECT DISTINCT user_id FROM ws_connection WHERE instance_id = $1 ORDER BY user_id LIMIT 100")
                    .bind(instance.to_string())
                    .fetch_all(counted(self.pool()))
                    .await?;
            if users.is_empty() {
                break;
            }
            for user_id in &users {
                self.retrying("sweep_instance", || async {
                    let mut tx = self.begin().await?;
                    let user = lock_user(&mut tx, user_id).await?;
                    let conns: Vec<String> = sqlx::query_scalar("SELECT id FROM ws_connection WHERE instance_id = $1 AND user_id = $2")
                        .bind(instance.to_string())
                        .bind(user_id.clone())
                        .fetch_all(counted(&mut *tx.tx))
                        .await?;
                    remove_connections(&mut tx, user_id, user, &conns).await?;
                    tx.commit(self).await
                })
                .await?;
            }
        }
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM ws_instance WHERE id = $1").bind(instance.to_string()).execute(counted(&mut *tx.tx)).await?;
        tx.commit(self).await
    }

    /// The connection ids an instance holds in the database.
    pub async fn instance_connections(&self, instance: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT id FROM ws_connection WHERE instance_id = $1")
            .bind(instance.to_string())
            .fetch_all(counted(self.pool()))
            .await?)
    }

    /// Records an open connection of `user_id` on `instance`. The user's first connection makes
    /// them online: `last_active` is set and, unless they are invisible, `user.presence.changed`
    /// is announced. Returns the user as stored afterwards (None for a user without a record:
    /// anonymous connections are counted as watchers but have no presence).
    #[tracing::instrument(name = "store.open_connection", skip(self))]
    pub async fn open_connection(&self, instance: &str, connection_id: &str, user_id: &str) -> Result<Option<User>> {
        self.retrying("open_connection", || async {
            let mut tx = self.begin().await?;
            let user = lock_user(&mut tx, user_id).await?;
            let now = time::now();
            sqlx::query("INSERT INTO ws_connection (id, instance_id, user_id, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) ON CONFLICT (id) DO NOTHING")
                .bind(connection_id.to_string())
                .bind(instance.to_string())
                .bind(user_id.to_string())
                .bind(now)
                .execute(counted(&mut *tx.tx))
                .await?;
            let Some(before) = user else {
                tx.commit(self).await?;
                return Ok(None);
            };
            let after = touch(&mut tx, user_id, now).await?;
            if connections_of(&mut tx, user_id).await? == 1 && !before.invisible {
                presence_changed(&mut tx, &after).await?;
            }
            tx.commit(self).await?;
            Ok(Some(after))
        })
        .await
    }

    /// Removes a closed connection and its watches: `user.watching.stop` for the channels the
    /// user no longer watches, and `user.presence.changed` when it was their last connection.
    #[tracing::instrument(name = "store.close_connection", skip(self))]
    pub async fn close_connection(&self, connection_id: &str) -> Result<()> {
        self.retrying("close_connection", || async {
            let mut tx = self.begin().await?;
            let Some(user_id) = connection_owner(&mut tx, connection_id).await? else {
                return Ok(());
            };
            let user = lock_user(&mut tx, &user_id).await?;
            remove_connections(&mut tx, &user_id, user, &[connection_id.to_string()]).await?;
            tx.commit(self).await
        })
        .await
    }

    /// Records that `connection_id` watches `cid` (with presence events when `presence`). The
    /// user's first watch of the channel announces `user.watching.start`. `owner` is the user
    /// the request acts for (None: server-side); a connection of another user is left alone.
    /// False when no such connection is open (on any process) or it is another user's.
    #[tracing::instrument(name = "store.watch_channel", skip(self))]
    pub async fn watch_channel(&self, connection_id: &str, owner: Option<&str>, cid: &str, presence: bool) -> Result<bool> {
        self.retrying("watch_channel", || async {
            let mut tx = self.begin().await?;
            let Some(user_id) = connection_owner(&mut tx, connection_id).await? else {
                return Ok(false);
            };
            if owner.is_some_and(|o| o != user_id) {
                return Ok(false);
            }
            let user = lock_user(&mut tx, &user_id).await?;
            // The connection may have closed while this waited for the lock.
            if connection_owner(&mut tx, connection_id).await?.is_none() {
                return Ok(false);
            }
            let first = !watches(&mut tx, cid, &user_id).await?;
            let now = time::now();
            sqlx::query("INSERT INTO ws_watch (connection_id, cid, user_id, presence, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (connection_id, cid) DO UPDATE SET presence = (ws_watch.presence OR $4), updated_at = $5")
                .bind(connection_id.to_string())
                .bind(cid.to_string())
                .bind(user_id.clone())
                .bind(presence)
                .bind(now)
                .execute(counted(&mut *tx.tx))
                .await?;
            if first {
                watching_event(&mut tx, "user.watching.start", cid, &user_id, user).await?;
            }
            tx.commit(self).await?;
            Ok(true)
        })
        .await
    }

    /// Ends a watch; the user's last watch of the channel announces `user.watching.stop`.
    #[tracing::instrument(name = "store.unwatch_channel", skip(self))]
    pub async fn unwatch_channel(&self, connection_id: &str, owner: Option<&str>, cid: &str) -> Result<()> {
        self.retrying("unwatch_channel", || async {
            let mut tx = self.begin().await?;
            let Some(user_id) = connection_owner(&mut tx, connection_id).await? else {
                return Ok(());
            };
            if owner.is_some_and(|o| o != user_id) {
                return Ok(());
            }
            let user = lock_user(&mut tx, &user_id).await?;
            let res = sqlx::query("DELETE FROM ws_watch WHERE connection_id = $1 AND cid = $2")
                .bind(connection_id.to_string())
                .bind(cid.to_string())
                .execute(counted(&mut *tx.tx))
                .await?;
            if res.rows_affected() > 0 && !watches(&mut tx, cid, &user_id).await? {
                watching_event(&mut tx, "user.watching.stop", cid, &user_id, user).await?;
            }
            tx.commit(self).await
        })
        .await
    }

    /// Distinct users watching `cid`, on every process.
    pub async fn watcher_count(&self, cid: &str) -> Result<i64> {
        let mut conn = self.pool().acquire().await?;
        watcher_count(&mut conn, cid).await
    }

    /// Distinct users watching each of `cids` (absent: none).
    pub async fn watcher_counts(&self, cids: &[String]) -> Result<std::collections::HashMap<String, i64>> {
        if cids.is_empty() {
            return Ok(Default::default());
        }
        let sql = format!("SELECT cid, COUNT(DISTINCT user_id) FROM ws_watch WHERE cid IN ({}) GROUP BY cid", placeholders(1, cids.len()));
        let mut q = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql));
        for c in cids {
            q = q.bind(c.clone());
        }
        Ok(q.fetch_all(counted(self.pool())).await?.into_iter().collect())
    }

    /// The users watching `cid` (by id), a page of them.
    pub async fn watchers(&self, cid: &str, limit: i64, offset: i64) -> Result<Vec<User>> {
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT DISTINCT user_id FROM ws_watch WHERE cid = $1 ORDER BY user_id LIMIT {} OFFSET {}",
            limit.clamp(0, 300),
            offset.clamp(0, 10_000)
        )))
        .bind(cid.to_string())
        .fetch_all(counted(self.pool()))
        .await?;
        let mut users = self.get_users(&ids).await?;
        Ok(ids.iter().map(|id| users.remove(id).unwrap_or_else(|| User::placeholder(id, "anonymous"))).collect())
    }
}

/// Distinct users watching `cid`.
pub(crate) async fn watcher_count(conn: &mut sqlx::AnyConnection, cid: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(DISTINCT user_id) FROM ws_watch WHERE cid = $1")
        .bind(cid.to_string())
        .fetch_one(counted(&mut *conn))
        .await?)
}

async fn connection_owner(tx: &mut Tx, connection_id: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT user_id FROM ws_connection WHERE id = $1")
        .bind(connection_id.to_string())
        .fetch_optional(counted(&mut *tx.tx))
        .await?)
}

async fn connections_of(tx: &mut Tx, user_id: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM ws_connection WHERE user_id = $1")
        .bind(user_id.to_string())
        .fetch_one(counted(&mut *tx.tx))
        .await?)
}

async fn watches(tx: &mut Tx, cid: &str, user_id: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ws_watch WHERE cid = $1 AND user_id = $2")
        .bind(cid.to_string())
        .bind(user_id.to_string())
        .fetch_one(counted(&mut *tx.tx))
        .await?;
    Ok(n > 0)
}

/// Sets the user's `last_active` and reads them back (with `online` as it now is).
async fn touch(tx: &mut Tx, user_id: &str, now: Ts) -> Result<User> {
    sqlx::query("UPDATE app_user SET last_active = $2 WHERE id = $1")
        .bind(user_id.to_string())
        .bind(now)
        .execute(counted(&mut *tx.tx))
        .await?;
    let user = crate::users::load_users(&mut tx.tx, &[user_id.to_string()]).await?.remove(user_id);
    user.ok_or_else(|| crate::StoreError::Domain(offshoot_core::Error::internal()))
}

/// Deletes `conns` (all `user_id`'s) and their watches, with the events that follow. The
/// user's row is locked (when it exists).
async fn remove_connections(tx: &mut Tx, user_id: &str, user: Option<User>, conns: &[String]) -> Result<()> {
    if conns.is_empty() {
        return Ok(());
    }
    let list = placeholders(1, conns.len());
    let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(format!(
        "SELECT DISTINCT cid FROM ws_watch WHERE connection_id IN ({list}) ORDER BY cid"
    )));
    for c in conns {
        q = q.bind(c.clone());
    }
    let watched = q.fetch_all(counted(&mut *tx.tx)).await?;
    for table_and_key in ["ws_watch WHERE connection_id", "ws_connection WHERE id"] {
        let mut q = sqlx::query(AssertSqlSafe(format!("DELETE FROM {table_and_key} IN ({list})")));
        for c in conns {
            q = q.bind(c.clone());
        }
        q.execute(counted(&mut *tx.tx)).await?;
    }
    // Users without a record (anonymous connections) have no presence, only watches.
    let after = match &user {
        Some(_) => Some(touch(tx, user_id, time::now()).await?),
        None => None,
    };
    for cid in &watched {
        if !watches(tx, cid, user_id).await? {
            watching_event(tx, "user.watching.stop", cid, user_id, after.clone()).await?;
        }
    }
    let (Some(before), Some(after)) = (user, after) else {
        return Ok(());
    };
    if connections_of(tx, user_id).await? == 0 && !before.invisible {
        presence_changed(tx, &after).await?;
    }
    Ok(())
}

/// `user.watching.start` / `.stop` on `cid`, to its watchers, with the new watcher count.
async fn watching_event(tx: &mut Tx, kind: &str, cid: &str, user_id: &str, user: Option<User>) -> Result<()> {
    let count = watcher_count(&mut tx.tx, cid).await?;
    let (channel_type, channel_id) = match cid.split_once(':') {
        Some((t, i)) => (Some(t.to_string()), Some(i.to_string())),
        None => (None, None),
    };
    let mut extra = offshoot_core::model::Custom::new();
    extra.insert("watcher_count".into(), count.into());
    let event = Event {
        kind: kind.to_string(),
        cid: Some(cid.to_string()),
        channel_type,
        channel_id,
        user: Some(user.unwrap_or_else(|| User::placeholder(user_id, "anonymous"))),
        extra,
        created_at: time::now(),
        ..Default::default()
    };
    tx.event(event, Audience { watchers_of: Some(cid.to_string()), ..Default::default() }).await
}

/// `user.presence.changed` for `user`, to the connections that watch with `presence: true` a
/// channel `user` is a member of (other than the user's own).
async fn presence_changed(tx: &mut Tx, user: &User) -> Result<()> {
    let connections: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT w.connection_id FROM ws_watch w JOIN member m ON m.cid = w.cid \
         WHERE m.user_id = $1 AND w.presence = TRUE AND w.user_id <> $1 ORDER BY w.connection_id",
    )
    .bind(user.id.clone())
    .fetch_all(counted(&mut *tx.tx))
    .await?;
    if connections.is_empty() {
        return Ok(());
    }
    let event = Event { kind: "user.presence.changed".into(), user: Some(user.clone()), created_at: time::now(), ..Default::default() };
    tx.event(event, Audience { connections, ..Default::default() }).await
}
