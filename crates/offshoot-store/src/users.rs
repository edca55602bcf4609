//! Users, bans and channel types.

use crate::cache::ChannelTypes;
use crate::query::{user_condition, user_order, SqlBuilder};
use crate::rows::{self, placeholders, ChannelTypeRow, UserRow, CHANNEL_TYPE_COLS, USER_COLS, USER_ONLINE};
use crate::sql::arguments;
use crate::{not_found, Result, Store, Tx};
use offshoot_core::model::{ChannelType, Custom, User};
use offshoot_core::query::{Filter, Sort, UserField, UserSortField};
use offshoot_core::time;
use sqlx::AssertSqlSafe;
use std::collections::HashMap;

/// A user as an upsert names it. Fields left `None` keep their stored value.
#[derive(Debug, Clone, Default)]
pub struct UserInput {
    pub id: String,
    pub role: Option<String>,
    pub name: Option<String>,
    pub image: Option<String>,
    pub language: Option<String>,
    pub teams: Option<Vec<String>>,
    pub invisible: Option<bool>,
    pub custom: Custom,
}

/// One entry of a partial user update: `set` / `unset` on the user `id`.
#[derive(Debug, Clone, Default)]
pub struct UserPatch {
    pub id: String,
    pub set: Custom,
    pub unset: Vec<String>,
}

impl Store {
    /// Creates or replaces users (custom data is replaced, not merged, as Stream's upsert does).
    /// Role, language, teams and `invisible` keep their stored value when not named; bans are
    /// never touched by an upsert. One transaction; rows are locked in id order.
    pub async fn upsert_users(&self, users: &[UserInput]) -> Result<Vec<User>> {
        self.retrying("upsert_users", || self.upsert_users_once(users)).await
    }

    async fn upsert_users_once(&self, users: &[UserInput]) -> Result<Vec<User>> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let mut order: Vec<&UserInput> = users.iter().collect();
        order.sort_by(|a, b| a.id.cmp(&b.id));
        let mut written: HashMap<String, User> = HashMap::new();
        for u in order {
            let fresh = User {
                id: u.id.clone(),
                role: u.role.clone().unwrap_or_else(|| "user".into()),
                name: u.name.clone(),
                image: u.image.clone(),
                language: u.language.clone(),
                teams: u.teams.clone().unwrap_or_default(),
                custom: u.custom.clone(),
                invisible: u.invisible.unwrap_or(false),
                created_at: now,
                updated_at: now,
                ..Default::default()
            };
            if insert_user(&mut tx, &fresh).await? {
                written.insert(fresh.id.clone(), fresh);
                continue;
            }
            let Some(mut user) = lock_user(&mut tx, &u.id).await? else {
                return not_found(format!("user with id {:?} was deleted while it was updated", u.id));
            };
            if let Some(r) = &u.role {
                user.role = r.clone();
            }
            user.name = u.name.clone();
            user.image = u.image.clone();
            if u.language.is_some() {
                user.language = u.language.clone();
            }
            if let Some(t) = &u.teams {
                user.teams = t.clone();
            }
            user.custom = u.custom.clone();
            if let Some(i) = u.invisible {
                user.invisible = i;
            }
            // `online` as read with the row; becoming invisible hides it at once.
            user.online &= !user.invisible;
            user.updated_at = now;
            update_user(&mut tx, &user).await?;
            written.insert(user.id.clone(), user);
        }
        tx.commit(self).await?;
        Ok(users.iter().filter_map(|u| written.get(&u.id).cloned()).collect())
    }

    /// `set` / `unset` on one user. Known fields go to their columns, the rest to custom data.
    pub async fn partial_update_user(&self, id: &str, set: &Custom, unset: &[String]) -> Result<User> {
        let patch = UserPatch { id: id.to_string(), set: set.clone(), unset: unset.to_vec() };
        let mut users = self.partial_update_users(std::slice::from_ref(&patch)).await?;
        Ok(users.pop().expect("one patch, one user"))
    }

    /// Partial updates of several users in one transaction; each row is locked (in id order)
    /// before it is read, so concurrent updates of different fields all survive.
    pub async fn partial_update_users(&self, patches: &[UserPatch]) -> Result<Vec<User>> {
        self.retrying("partial_update_users", || self.partial_update_users_once(patches)).await
    }

    async fn partial_update_users_once(&self, patches: &[UserPatch]) -> Result<Vec<User>> {
        let mut tx = self.begin().await?;
        let mut order: Vec<&UserPatch> = patches.iter().collect();
        order.sort_by(|a, b| a.id.cmp(&b.id));
        let mut written: HashMap<String, User> = HashMap::new();
        for p in order {
            let user = match written.remove(&p.id) {
                Some(u) => Some(u),
                None => lock_user(&mut tx, &p.id).await?,
            };
            let Some(mut user) = user else { return not_found(format!("user with id {:?} does not exist", p.id)) };
            apply_user_patch(&mut user, &p.set, &p.unset);
            user.online &= !user.invisible;
            if serde_json::to_vec(&user.custom)?.len() > offshoot_core::fork::MAX_CUSTOM_BYTES {
                return crate::domain(offshoot_core::Error::input(format!(
                    "user custom data would exceed {} bytes",
                    offshoot_core::fork::MAX_CUSTOM_BYTES
                )));
            }
            user.updated_at = time::now();
            update_user(&mut tx, &user).await?;
            written.insert(user.id.clone(), user);
        }
        tx.commit(self).await?;
        Ok(patches.iter().filter_map(|p| written.get(&p.id).cloned()).collect())
    }

    pub async fn get_user(&self, id: &str) -> Result<Option<User>> {
        let row: Option<UserRow> = sqlx::query_as(AssertSqlSafe(format!("SELECT {USER_COLS}, {USER_ONLINE} FROM app_user WHERE id = $1")))
            .bind(id.to_string())
            .fetch_optional(crate::counted(self.pool()))
            .await?;
        Ok(row.map(User::from))
    }

    /// Query Users: the users matching `filter`, in `sort` order (then by id).
    pub async fn query_users(
        &self,
        filter: &Filter<UserField>,
        sort: &[Sort<UserSortField>],
        limit: i64,
        offset: i64,
    ) -> Result<Vec<User>> {
        let mut b = SqlBuilder::new(self.backend(), Vec::new());
        let cond = user_condition(&mut b, filter)?;
        let order = user_order(&mut b, sort);
        let mut cols = USER_COLS.split(", ").map(|c| format!("u.{c}")).collect::<Vec<_>>().join(", ");
        cols.push_str(", ");
        cols.push_str(&USER_ONLINE.replace("app_user.", "u."));
        let sql = format!(
            "SELECT {cols} FROM app_user u WHERE {cond} ORDER BY {order} LIMIT {} OFFSET {}",
            limit.clamp(0, 100),
            offset.clamp(0, 10_000)
        );
        let rows: Vec<UserRow> =
            sqlx::query_as_with(AssertSqlSafe(sql), arguments(&b.binds)?).fetch_all(crate::counted(self.pool())).await?;
        Ok(rows::all(rows))
    }

    pub async fn get_users(&self, ids: &[String]) -> Result<HashMap<String, User>> {
        let mut conn = self.pool().acquire().await?;
        load_users(&mut conn, ids).await
    }

    /// Users with the given ids that do not exist.
    pub async fn missing_users(&self, ids: &[String]) -> Result<Vec<String>> {
        let found = self.get_users(ids).await?;
        Ok(ids.iter().filter(|id| !found.contains_key(*id)).cloned().collect())
    }

    /// App-wide ban (`shadow` bans shadow-ban instead: the user's messages are `shadowed`).
    /// One statement: a concurrent upsert never undoes it (upserts do not write these columns).
    pub async fn set_ban(&self, user_id: &str, shadow: bool, banned: bool) -> Result<()> {
        let sql = if shadow {
            "UPDATE app_user SET shadow_banned = $1, updated_at = $2 WHERE id = $3"
        } else {
            "UPDATE app_user SET banned = $1, updated_at = $2 WHERE id = $3"
        };
        self.retrying("set_ban", || async {
            let mut tx = self.begin().await?;
            let res =
                sqlx::query(sql).bind(banned).bind(time::now()).bind(user_id.to_string()).execute(crate::counted(&mut *tx.tx)).await?;
            if res.rows_affected() == 0 {
                return not_found(format!("user with id {user_id:?} does not exist"));
            }
            tx.commit(self).await
        })
        .await
    }

    /// Lifts both kinds of ban in one statement.
    pub async fn lift_bans(&self, user_id: &str) -> Result<()> {
        self.retrying("lift_bans", || async {
            let mut tx = self.begin().await?;
            let res = sqlx::query("UPDATE app_user SET banned = FALSE, shadow_banned = FALSE, updated_at = $1 WHERE id = $2")
                .bind(time::now())
                .bind(user_id.to_string())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
            if res.rows_affected() == 0 {
                return not_found(format!("user with id {user_id:?} does not exist"));
            }
            tx.commit(self).await
        })
        .await
    }

    pub async fn channel_type(&self, name: &str) -> Result<Option<ChannelType>> {
        Ok(self.channel_type_map().await?.get(name).cloned())
    }

    /// Every channel type, by name.
    pub async fn channel_types(&self) -> Result<Vec<ChannelType>> {
        let mut types: Vec<ChannelType> = self.channel_type_map().await?.values().cloned().collect();
        types.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(types)
    }

    /// The channel types, from memory when they are cached (`cache.rs`).
    pub(crate) async fn channel_type_map(&self) -> Result<ChannelTypes> {
        if let Some(t) = self.cache.cached_types() {
            return Ok(t);
        }
        let mut conn = self.pool().acquire().await?;
        self.cache.types(&mut conn).await
    }

    /// Creates or updates a channel type.
    pub async fn put_channel_type(&self, name: &str, max_message_length: Option<i64>, extra: &Custom) -> Result<ChannelType> {
        self.retrying("put_channel_type", || self.put_channel_type_once(name, max_message_length, extra)).await
    }

    async fn put_channel_type_once(&self, name: &str, max_message_length: Option<i64>, extra: &Custom) -> Result<ChannelType> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let row: Option<ChannelTypeRow> =
            sqlx::query_as(AssertSqlSafe(format!("SELECT {CHANNEL_TYPE_COLS} FROM channel_type WHERE name = $1{}", tx.for_update())))
                .bind(name.to_string())
                .fetch_optional(crate::counted(&mut *tx.tx))
                .await?;
        let ct = match row.map(ChannelType::from) {
            Some(mut ct) => {
                if let Some(m) = max_message_length {
                    ct.max_message_length = m;
                }
                for (k, v) in extra {
                    ct.extra.insert(k.clone(), v.clone());
                }
                ct.updated_at = now;
                sqlx::query("UPDATE channel_type SET max_message_length = $1, extra = $2, updated_at = $3 WHERE name = $4")
                    .bind(ct.max_message_length)
                    .bind(serde_json::to_string(&ct.extra)?)
                    .bind(now)
                    .bind(name.to_string())
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
                ct
            }
            None => {
                let ct = ChannelType {
                    name: name.to_string(),
                    max_message_length: max_message_length.unwrap_or(offshoot_core::model::DEFAULT_MAX_MESSAGE_LENGTH),
                    extra: extra.clone(),
                    created_at: now,
                    updated_at: now,
                };
                // A concurrent first PUT of the same name: the later one keeps the earlier's row.
                sqlx::query(
                    "INSERT INTO channel_type (name, max_message_length, extra, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) ON CONFLICT (name) DO NOTHING",
                )
                .bind(name.to_string())
                .bind(ct.max_message_length)
                .bind(serde_json::to_string(&ct.extra)?)
                .bind(now)
                .execute(crate::counted(&mut *tx.tx))
                .await?;
                ct
            }
        };
        self.commit_config_change(tx).await?;
        Ok(ct)
    }
}

/// Inserts a new user; false when the id exists already (nothing is written then).
async fn insert_user(tx: &mut crate::Tx, user: &User) -> Result<bool> {
    let q = sqlx::query(
        "INSERT INTO app_user (id, role, name, image, language, teams, custom, invisible, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) ON CONFLICT (id) DO NOTHING",
    );
    let res = bind_user_fields(q, user)?.bind(user.created_at).execute(crate::counted(&mut *tx.tx)).await?;
    Ok(res.rows_affected() == 1)
}

/// Binds `$1`…`$8` of a user write: the id and the fields an upsert or update may set, in the
/// order both statements name them.
fn bind_user_fields<'q>(
    q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    user: &User,
) -> Result<sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>> {
    Ok(q.bind(user.id.clone())
        .bind(user.role.clone())
        .bind(user.name.clone())
        .bind(user.image.clone())
        .bind(user.language.clone())
        .bind(serde_json::to_string(&user.teams)?)
        .bind(serde_json::to_string(&user.custom)?)
        .bind(user.invisible))
}

/// Reads a user and locks its row until the transaction ends.
pub(crate) async fn lock_user(tx: &mut crate::Tx, id: &str) -> Result<Option<User>> {
    let row: Option<UserRow> =
        sqlx::query_as(AssertSqlSafe(format!("SELECT {USER_COLS}, {USER_ONLINE} FROM app_user WHERE id = $1{}", tx.for_update())))
            .bind(id.to_string())
            .fetch_optional(crate::counted(&mut *tx.tx))
            .await?;
    Ok(row.map(User::from))
}

/// Writes the fields a user update may change. Bans, `created_at` and `last_active` are
/// written only by their own single statements, so no update can undo them.
async fn update_user(tx: &mut crate::Tx, user: &User) -> Result<()> {
    let q = sqlx::query(
        "UPDATE app_user SET role = $2, name = $3, image = $4, language = $5, teams = $6, custom = $7, invisible = $8, updated_at = $9 WHERE id = $1",
    );
    bind_user_fields(q, user)?.bind(user.updated_at).execute(crate::counted(&mut *tx.tx)).await?;
    Ok(())
}

fn apply_user_patch(user: &mut User, set: &Custom, unset: &[String]) {
    for (k, v) in set {
        match k.as_str() {
            "name" => user.name = v.as_str().map(str::to_string),
            "image" => user.image = v.as_str().map(str::to_string),
            "role" => {
                if let Some(r) = v.as_str() {
                    user.role = r.to_string()
                }
            }
            "language" => user.language = v.as_str().map(str::to_string),
            "invisible" => user.invisible = v.as_bool().unwrap_or(false),
            "teams" => user.teams = serde_json::from_value(v.clone()).unwrap_or_default(),
            "id" | "created_at" | "updated_at" | "banned" | "shadow_banned" => {}
            _ => {
                user.custom.insert(k.clone(), v.clone());
            }
        }
    }
    for k in unset {
        match k.as_str() {
            "name" => user.name = None,
            "image" => user.image = None,
            "language" => user.language = None,
            _ => {
                user.custom.remove(k);
            }
        }
    }
}

pub(crate) async fn load_users(conn: &mut sqlx::AnyConnection, ids: &[String]) -> Result<HashMap<String, User>> {
    let mut ids: Vec<String> = ids.to_vec();
    ids.sort();
    ids.dedup();
    let mut out = HashMap::new();
    for chunk in ids.chunks(500) {
        let sql = format!("SELECT {USER_COLS}, {USER_ONLINE} FROM app_user WHERE id IN ({})", placeholders(1, chunk.len()));
        let mut q = sqlx::query_as::<_, UserRow>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        for u in q.fetch_all(crate::counted(&mut *conn)).await?.into_iter().map(User::from) {
            out.insert(u.id.clone(), u);
        }
    }
    Ok(out)
}

/// Creates the user on first sight (server-side calls may name users they never upserted).
pub(crate) async fn ensure_user(tx: &mut Tx, user: &User) -> Result<User> {
    let role = if user.role.is_empty() { "user" } else { user.role.as_str() };
    let mut users = ensure_users(tx, std::slice::from_ref(&user.id), role).await?;
    match users.remove(&user.id) {
        Some(u) => Ok(u),
        None => not_found(format!("user {:?} was deleted while it was used", user.id)),
    }
}

/// The users `ids`, each created with `role` first when it does not exist: one read when they
/// all exist (a fork names its creator and every member).
pub(crate) async fn ensure_users(tx: &mut Tx, ids: &[String], role: &str) -> Result<HashMap<String, User>> {
    let mut users = load_users(&mut tx.tx, ids).await?;
    let mut missing: Vec<String> = ids.iter().filter(|id| !users.contains_key(*id)).cloned().collect();
    if missing.is_empty() {
        return Ok(users);
    }
    missing.sort();
    missing.dedup();
    let now = time::now();
    for chunk in missing.chunks(500) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("(${}, $1, $2, $2)", i + 3)).collect();
        let sql =
            format!("INSERT INTO app_user (id, role, created_at, updated_at) VALUES {} ON CONFLICT (id) DO NOTHING", values.join(", "));
        let mut q = sqlx::query(AssertSqlSafe(sql)).bind(role.to_string()).bind(now);
        for id in chunk {
            q = q.bind(id.clone());
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    users.extend(load_users(&mut tx.tx, &missing).await?);
    Ok(users)
}
