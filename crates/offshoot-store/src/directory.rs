//! The store as authentication reads it (`offshoot_core::auth::Directory`), for the REST API
//! and the WebSocket alike.

use crate::Store;
use offshoot_core::auth::Directory;
use offshoot_core::jobs::BoxFuture;
use offshoot_core::model::User;
use offshoot_core::Error;

impl Directory for Store {
    fn revoke_tokens_issued_before(&self) -> BoxFuture<'_, Result<Option<i64>, Error>> {
        Box::pin(async move { Ok(self.app_settings().await?.revoke_tokens_issued_before) })
    }

    fn user<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<User>, Error>> {
        Box::pin(async move { Ok(self.get_user(id).await?) })
    }
}
