//! App settings and channel types kept in memory: every request reads the settings (token
//! revocation) and every channel load its type's config, while both change rarely.
//!
//! Invalidation goes with the change notifications: a process that changes either clears its
//! own cache after the commit, and on PostgreSQL the changing transaction also sends
//! `NOTIFY offshoot_config`, which [`Store::relay_notifications`](crate::Store) hears in every
//! other process and clears theirs. On PostgreSQL the cache is used only while that listener is
//! connected (a notification missed while it was not could leave a stale value for ever); without
//! it every read goes to the database. On SQLite, which one process serves (see the crate doc),
//! the in-process invalidation is all there is.
//!
//! A read that raced an invalidation does not fill the cache: each fill carries the generation
//! it started under and is dropped when the generation moved on.

use crate::rows::{ChannelTypeRow, Json, CHANNEL_TYPE_COLS};
use crate::{counted, Result};
use offshoot_core::model::{AppSettings, ChannelType};
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) type ChannelTypes = Arc<HashMap<String, ChannelType>>;

#[derive(Default)]
struct Entries {
    generation: u64,
    settings: Option<AppSettings>,
    types: Option<ChannelTypes>,
}

pub(crate) struct ConfigCache {
    entries: Mutex<Entries>,
    usable: AtomicBool,
}

impl ConfigCache {
    /// `usable` from the start on SQLite; on PostgreSQL once the listener runs.
    pub(crate) fn new(usable: bool) -> ConfigCache {
        ConfigCache { entries: Mutex::new(Entries::default()), usable: AtomicBool::new(usable) }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets everything; fills that started before are dropped.
    pub(crate) fn invalidate(&self) {
        let mut e = self.entries();
        e.generation += 1;
        e.settings = None;
        e.types = None;
    }

    /// Whether reads may be answered from memory (the listener state on PostgreSQL).
    pub(crate) fn set_usable(&self, usable: bool) {
        self.invalidate();
        self.usable.store(usable, Ordering::SeqCst);
    }

    /// The cached value (if usable and present) and the generation a fill must carry.
    fn lookup<T>(&self, get: impl Fn(&Entries) -> Option<T>) -> (Option<T>, u64) {
        let e = self.entries();
        let hit = if self.usable.load(Ordering::SeqCst) { get(&e) } else { None };
        (hit, e.generation)
    }

    fn fill(&self, generation: u64, set: impl FnOnce(&mut Entries)) {
        let mut e = self.entries();
        if self.usable.load(Ordering::SeqCst) && e.generation == generation {
            set(&mut e);
        }
    }

    pub(crate) fn cached_settings(&self) -> Option<AppSettings> {
        self.lookup(|e| e.settings.clone()).0
    }

    pub(crate) fn cached_types(&self) -> Option<ChannelTypes> {
        self.lookup(|e| e.types.clone()).0
    }

    /// The app settings, from memory or read on `conn`.
    pub(crate) async fn settings(&self, conn: &mut AnyConnection) -> Result<AppSettings> {
        let (hit, generation) = self.lookup(|e| e.settings.clone());
        if let Some(s) = hit {
            return Ok(s);
        }
        let stored: Option<Json<AppSettings>> =
            sqlx::query_scalar("SELECT settings FROM app WHERE id = 1").fetch_optional(counted(&mut *conn)).await?;
        let settings = stored.map(|s| s.0).unwrap_or_default();
        self.fill(generation, |e| e.settings = Some(settings.clone()));
        Ok(settings)
    }

    /// Every channel type by name, from memory or read on `conn` (a handful of rows).
    pub(crate) async fn types(&self, conn: &mut AnyConnection) -> Result<ChannelTypes> {
        let (hit, generation) = self.lookup(|e| e.types.clone());
        if let Some(t) = hit {
            return Ok(t);
        }
        let rows: Vec<ChannelTypeRow> =
            sqlx::query_as(AssertSqlSafe(format!("SELECT {CHANNEL_TYPE_COLS} FROM channel_type"))).fetch_all(counted(&mut *conn)).await?;
        let types: ChannelTypes = Arc::new(rows.into_iter().map(ChannelType::from).map(|t| (t.name.clone(), t)).collect());
        self.fill(generation, |e| e.types = Some(types.clone()));
        Ok(types)
    }
}
