use offshoot_core::model::Watchers;
use offshoot_store::Store;
use std::sync::Arc;
use tokio::sync::Notify;

/// What every handler can reach.
#[derive(Clone)]
pub struct ApiState {
    pub store: Store,
    pub api_key: Arc<str>,
    pub api_secret: Arc<str>,
    pub watchers: Arc<dyn Watchers>,
    /// Wakes the backfill worker when a fork starts backfilling.
    pub fork_wake: Arc<Notify>,
}

impl ApiState {
    pub fn new(store: Store, api_key: String, api_secret: String, watchers: Arc<dyn Watchers>, fork_wake: Arc<Notify>) -> Self {
        ApiState { store, api_key: api_key.into(), api_secret: api_secret.into(), watchers, fork_wake }
    }
}
