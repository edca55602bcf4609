use offshoot_core::jobs::Jobs;
use offshoot_core::model::Watchers;
use offshoot_store::Store;
use secrecy::SecretString;
use std::sync::Arc;

/// What every handler can reach.
#[derive(Clone)]
pub struct ApiState {
    pub store: Store,
    pub api_key: Arc<str>,
    /// Signs and verifies tokens; never logged (`expose_secret` where it is used).
    pub api_secret: Arc<SecretString>,
    pub watchers: Arc<dyn Watchers>,
    /// The job queue: a fork that starts backfilling is queued right after its commit.
    pub jobs: Arc<dyn Jobs>,
    /// Request body limit (bytes); bigger bodies get Stream's 413.
    pub max_body: usize,
}

impl ApiState {
    pub fn new(store: Store, api_key: String, api_secret: SecretString, watchers: Arc<dyn Watchers>, jobs: Arc<dyn Jobs>) -> Self {
        ApiState { store, api_key: api_key.into(), api_secret: Arc::new(api_secret), watchers, jobs, max_body: crate::MAX_BODY }
    }
}
