use offshoot_core::jobs::Jobs;
use offshoot_core::model::Watchers;
use offshoot_store::Store;
use secrecy::SecretString;
use std::sync::Arc;

/// What every handler can reach. Handed to each request as a clone, so it is one shared
/// pointer: cloning the store and the rest field by field was about 1.7 % of the server's CPU
/// under an agent's stream (docs/performance.md, "Agent streaming").
#[derive(Clone)]
pub struct ApiState(Arc<Shared>);

/// The fields of [`ApiState`].
pub struct Shared {
    pub store: Store,
    pub api_key: Arc<str>,
    /// Signs and verifies tokens; never logged (`expose_secret` where it is used).
    pub api_secret: Arc<SecretString>,
    pub watchers: Arc<dyn Watchers>,
    /// The job queue: a fork that starts backfilling is queued right after its commit.
    pub jobs: Arc<dyn Jobs>,
    /// Request body limit (bytes); bigger bodies get Stream's 413.
    pub max_body: usize,
    /// The rate limits of this process (`ratelimit.rs`); off unless set by
    /// [`ApiState::with_rate_limits`].
    pub rate_limits: Arc<crate::ratelimit::RateLimiter>,
    /// File storage and link signing; `None` turns the upload routes off.
    pub uploads: Option<Arc<crate::files::Uploads>>,
}

impl ApiState {
    pub fn new(store: Store, api_key: String, api_secret: SecretString, watchers: Arc<dyn Watchers>, jobs: Arc<dyn Jobs>) -> Self {
        Self::with_max_body(store, api_key, api_secret, watchers, jobs, crate::MAX_BODY)
    }

    /// [`ApiState::new`] with a request body limit other than the default.
    pub fn with_max_body(
        store: Store,
        api_key: String,
        api_secret: SecretString,
        watchers: Arc<dyn Watchers>,
        jobs: Arc<dyn Jobs>,
        max_body: usize,
    ) -> Self {
        ApiState(Arc::new(Shared {
            store,
            api_key: api_key.into(),
            api_secret: Arc::new(api_secret),
            watchers,
            jobs,
            max_body,
            rate_limits: Arc::new(crate::ratelimit::RateLimiter::off()),
            uploads: None,
        }))
    }

    /// This state with `limits` (before it is shared with the router).
    pub fn with_rate_limits(mut self, limits: Arc<crate::ratelimit::RateLimiter>) -> Self {
        Arc::get_mut(&mut self.0).expect("the state is not shared yet").rate_limits = limits;
        self
    }

    /// This state with uploads stored in `files`, at most `max_bytes` a file, links signed with
    /// the API secret and starting with `public_url` (else the request's `Host`). Call it
    /// before the state is cloned.
    pub fn with_uploads(mut self, files: offshoot_files::Files, max_bytes: u64, public_url: Option<String>) -> Self {
        use secrecy::ExposeSecret;
        let signer = offshoot_files::Signer::new(self.api_secret.expose_secret().as_bytes());
        let shared = Arc::get_mut(&mut self.0).expect("with_uploads is called before the state is shared");
        shared.uploads = Some(Arc::new(crate::files::Uploads { files, signer, max_bytes, public_url }));
        self
    }
}

impl std::ops::Deref for ApiState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}
