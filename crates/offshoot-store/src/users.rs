//! Users, bans and channel types.

use crate::rows::{self, placeholders, USER_COLS};
use crate::{not_found, Result, Store};
use offshoot_core::model::{ChannelType, Custom, User};
use offshoot_core::time;
use sqlx::any::AnyRow;
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

impl Store {
    /// Creates or replaces users (custom data is replaced, not merged, as Stream's upsert does).
    pub async fn upsert_users(&self, users: &[UserInput]) -> Result<Vec<User>> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let mut out = Vec::with_capacity(users.len());
        for u in users {
            let existing: Option<AnyRow> = sqlx::query(AssertSqlSafe(format!("SELECT {USER_COLS} FROM app_user WHERE id = $1")))
                .bind(u.id.clone())
                .fetch_optional(&mut *tx.tx)
                .await?;
            let existing = existing.as_ref().map(rows::user).transpose()?;
            let user = User {
                id: u.id.clone(),
                role: u.role.clone().or_else(|| existing.as_ref().map(|e| e.role.clone())).unwrap_or_else(|| "user".into()),
                name: u.name.clone(),
                image: u.image.clone(),
                language: u.language.clone().or_else(|| existing.as_ref().and_then(|e| e.language.clone())),
                teams: u.teams.clone().or_else(|| existing.as_ref().map(|e| e.teams.clone())).unwrap_or_default(),
                custom: u.custom.clone(),
                banned: existing.as_ref().map(|e| e.banned).unwrap_or(false),
                shadow_banned: existing.as_ref().map(|e| e.shadow_banned).unwrap_or(false),
                invisible: u.invisible.or_else(|| existing.as_ref().map(|e| e.invisible)).unwrap_or(false),
                created_at: existing.as_ref().map(|e| e.created_at).unwrap_or(now),
                updated_at: now,
                deleted_at: None,
                last_active: existing.as_ref().and_then(|e| e.last_active),
            };
            write_user(&mut tx, &user, existing.is_some()).await?;
            out.push(user);
        }
        tx.commit(self).await?;
        Ok(out)
    }

    /// `set` / `unset` on one user. Known fields go to their columns, the rest to custom data.
    pub async fn partial_update_user(&self, id: &str, set: &Custom, unset: &[String]) -> Result<User> {
        let mut tx = self.begin().await?;
        let row: Option<AnyRow> = sqlx::query(AssertSqlSafe(format!("SELECT {USER_COLS} FROM app_user WHERE id = $1")))
            .bind(id.to_string())
            .fetch_optional(&mut *tx.tx)
            .await?;
        let Some(row) = row else { return not_found(format!("user with id {id:?} does not exist")) };
        let mut user = rows::user(&row)?;
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
        if serde_json::to_vec(&user.custom)?.len() > offshoot_core::fork::MAX_CUSTOM_BYTES {
            return crate::domain(offshoot_core::Error::input(format!(
                "user custom data would exceed {} bytes",
                offshoot_core::fork::MAX_CUSTOM_BYTES
            )));
        }
        user.updated_at = time::now();
        write_user(&mut tx, &user, true).await?;
        tx.commit(self).await?;
        Ok(user)
    }

    pub async fn get_user(&self, id: &str) -> Result<Option<User>> {
        let row: Option<AnyRow> = sqlx::query(AssertSqlSafe(format!("SELECT {USER_COLS} FROM app_user WHERE id = $1")))
            .bind(id.to_string())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(rows::user).transpose()
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
    pub async fn set_ban(&self, user_id: &str, shadow: bool, banned: bool) -> Result<()> {
        let mut tx = self.begin().await?;
        let sql = if shadow {
            "UPDATE app_user SET shadow_banned = $1, updated_at = $2 WHERE id = $3"
        } else {
            "UPDATE app_user SET banned = $1, updated_at = $2 WHERE id = $3"
        };
        let res = sqlx::query(sql).bind(banned).bind(time::now()).bind(user_id.to_string()).execute(&mut *tx.tx).await?;
        if res.rows_affected() == 0 {
            return not_found(format!("user with id {user_id:?} does not exist"));
        }
        tx.commit(self).await
    }

    pub async fn channel_type(&self, name: &str) -> Result<Option<ChannelType>> {
        let row: Option<AnyRow> =
            sqlx::query("SELECT name, max_message_length, extra, created_at, updated_at FROM channel_type WHERE name = $1")
                .bind(name.to_string())
                .fetch_optional(self.pool())
                .await?;
        row.as_ref().map(rows::channel_type).transpose()
    }

    pub async fn channel_types(&self) -> Result<Vec<ChannelType>> {
        let rows: Vec<AnyRow> =
            sqlx::query("SELECT name, max_message_length, extra, created_at, updated_at FROM channel_type ORDER BY name")
                .fetch_all(self.pool())
                .await?;
        rows.iter().map(rows::channel_type).collect()
    }

    /// Creates or updates a channel type.
    pub async fn put_channel_type(&self, name: &str, max_message_length: Option<i64>, extra: &Custom) -> Result<ChannelType> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let row: Option<AnyRow> =
            sqlx::query("SELECT name, max_message_length, extra, created_at, updated_at FROM channel_type WHERE name = $1")
                .bind(name.to_string())
                .fetch_optional(&mut *tx.tx)
                .await?;
        let ct = match row.as_ref().map(rows::channel_type).transpose()? {
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
                    .execute(&mut *tx.tx)
                    .await?;
                ct
            }
            None => {
                let ct = ChannelType {
                    name: name.to_string(),
                    max_message_length: max_message_length.unwrap_or(5000),
                    extra: extra.clone(),
                    created_at: now,
                    updated_at: now,
                };
                sqlx::query(
                    "INSERT INTO channel_type (name, max_message_length, extra, created_at, updated_at) VALUES ($1, $2, $3, $4, $4)",
                )
                .bind(name.to_string())
                .bind(ct.max_message_length)
                .bind(serde_json::to_string(&ct.extra)?)
                .bind(now)
                .execute(&mut *tx.tx)
                .await?;
                ct
            }
        };
        tx.commit(self).await?;
        Ok(ct)
    }
}

async fn write_user(tx: &mut crate::Tx, user: &User, exists: bool) -> Result<()> {
    let sql = if exists {
        "UPDATE app_user SET role = $2, name = $3, image = $4, language = $5, teams = $6, custom = $7, banned = $8, shadow_banned = $9, invisible = $10, created_at = $11, updated_at = $12 WHERE id = $1"
    } else {
        "INSERT INTO app_user (id, role, name, image, language, teams, custom, banned, shadow_banned, invisible, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    };
    sqlx::query(sql)
        .bind(user.id.clone())
        .bind(user.role.clone())
        .bind(user.name.clone())
        .bind(user.image.clone())
        .bind(user.language.clone())
        .bind(serde_json::to_string(&user.teams)?)
        .bind(serde_json::to_string(&user.custom)?)
        .bind(user.banned)
        .bind(user.shadow_banned)
        .bind(user.invisible)
        .bind(user.created_at)
        .bind(user.updated_at)
        .execute(&mut *tx.tx)
        .await?;
    Ok(())
}

pub(crate) async fn load_users(conn: &mut sqlx::AnyConnection, ids: &[String]) -> Result<HashMap<String, User>> {
    let mut ids: Vec<String> = ids.to_vec();
    ids.sort();
    ids.dedup();
    let mut out = HashMap::new();
    for chunk in ids.chunks(500) {
        let sql = format!("SELECT {USER_COLS} FROM app_user WHERE id IN ({})", placeholders(1, chunk.len()));
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        for row in q.fetch_all(&mut *conn).await? {
            let u = rows::user(&row)?;
            out.insert(u.id.clone(), u);
        }
    }
    Ok(out)
}
