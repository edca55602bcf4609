//! The files job: frees the uploads no message refers to any more. The API queues one after
//! every write that can drop the last reference to a file (a hard delete of a message or a
//! channel, a hard truncate, the deletion of an upload still referred to), and the worker
//! queues one at start-up. Each run deletes the upload rows without a reference under their row
//! lock (`offshoot-store`'s `files.rs`) and then removes their objects from storage; it
//! collects everything it finds, so a lost push is made good by the next run. A row deleted
//! whose object removal failed leaves an object no row names (logged), never a row without its
//! object.

use crate::Shared;
use apalis::prelude::{BoxDynError, Data};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The apalis queue of files jobs.
pub const FILES_QUEUE: &str = "offshoot.files";

/// Uploads collected per statement.
const BATCH: i64 = 200;

/// A files job carries nothing: it collects every unreferenced upload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesJob {}

pub async fn run_job(_job: FilesJob, shared: Data<Arc<Shared>>) -> Result<(), BoxDynError> {
    crate::on_own_task(collect(Arc::clone(&shared))).await
}

/// Frees every upload no message refers to; returns how many.
pub async fn collect(shared: Arc<Shared>) -> Result<(), BoxDynError> {
    let Some(files) = shared.files.clone() else { return Ok(()) };
    let mut freed = 0usize;
    loop {
        let keys = shared.store.collect_unreferenced_uploads(BATCH).await.map_err(|e| Box::new(e) as BoxDynError)?;
        let n = keys.len();
        for key in keys {
            if let Err(e) = files.delete(&key).await {
                tracing::warn!(error = %e, key, "removing a freed upload from storage failed");
            }
        }
        freed += n;
        if (n as i64) < BATCH {
            break;
        }
    }
    if freed > 0 {
        tracing::info!(freed, "freed uploads no message refers to");
    }
    Ok(())
}
