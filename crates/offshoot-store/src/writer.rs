//! SQLite's one writer, shared by this process's write transactions in two classes: requests
//! (every API and WebSocket write) and background pages (fork backfills). A background page
//! takes the lock only when no request is waiting for it, so a request waits for at most the
//! one page in progress instead of queueing behind every backfill's next page
//! (docs/performance.md, "SQLite writer and backfill pages"). A background page that has waited
//! [`BACKGROUND_PATIENCE`] takes its turn anyway, so a steady stream of requests cannot starve a
//! backfill.
//!
//! The lock also counts the requests that had to wait for it ([`WriteLock::request_waits`]):
//! a backfill page that no request waited for may stay large, one that delayed a request
//! makes the next one smaller (the worker's page sizing), and it keeps when a request last took
//! it ([`WriteLock::since_last_request`]): a backfill that starts while requests are writing starts
//! with a small page.
//!
//! PostgreSQL has no such lock: its writers meet on row locks only.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};

/// How long a background page defers to waiting requests before it queues like one.
pub const BACKGROUND_PATIENCE: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub(crate) struct WriteLock {
    lock: Arc<Mutex<()>>,
    /// Requests waiting for the lock.
    waiting: AtomicUsize,
    /// Woken when the last waiting request has taken the lock.
    none_waiting: Notify,
    /// Requests so far that found the lock taken.
    waits: AtomicU64,
    /// When a request last took the lock (Unix nanoseconds; 0: never).
    last_request_at: AtomicI64,
    /// Pauses of background pages in force ([`WriteLock::pause_background`]).
    paused: AtomicUsize,
    /// Woken when the last pause ends.
    resumed: Notify,
}

/// Holds background pages back for as long as it lives ([`WriteLock::pause_background`]).
pub(crate) struct Paused<'a>(&'a WriteLock);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        if self.0.paused.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.resumed.notify_waiters();
        }
    }
}

/// Counts one waiting request for as long as it waits (also when its future is dropped).
struct Waiting<'a>(&'a WriteLock);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_waiting.notify_waiters();
        }
    }
}

impl WriteLock {
    /// The lock for a request's transaction: in arrival order among requests, ahead of any
    /// background page that has not started.
    pub(crate) async fn request(&self) -> OwnedMutexGuard<()> {
        let guard = match self.lock.clone().try_lock_owned() {
            Ok(free) => free,
            Err(_) => {
                self.waits.fetch_add(1, Ordering::AcqRel);
                self.waiting.fetch_add(1, Ordering::AcqRel);
                let _waiting = Waiting(self);
                self.lock.clone().lock_owned().await
            }
        };
        self.last_request_at.store(offshoot_core::time::now(), Ordering::Release);
        guard
    }

    /// How long ago a request last took the lock, if one has.
    pub(crate) fn since_last_request(&self) -> Option<Duration> {
        let at = Some(self.last_request_at.load(Ordering::Acquire)).filter(|&t| t > 0)?;
        Some(Duration::from_nanos(offshoot_core::time::now().saturating_sub(at).max(0) as u64))
    }

    /// Whether a request is waiting for the lock now.
    pub(crate) fn requests_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// How many requests so far found the lock taken and waited.
    pub(crate) fn request_waits(&self) -> u64 {
        self.waits.load(Ordering::Acquire)
    }

    /// Holds background pages back until the returned guard is dropped: a page that has not
    /// taken the lock waits (its patience starts again after the pause); one that holds it
    /// finishes. Requests are not held back. While requests are writing, the SQLite WAL's
    /// restart pauses the backfills while it catches the WAL up, so that what it then copies
    /// holding the lock is only what requests wrote meanwhile (`checkpoint_round`).
    pub(crate) fn pause_background(&self) -> Paused<'_> {
        self.paused.fetch_add(1, Ordering::AcqRel);
        Paused(self)
    }

    /// The lock for a background page: once no request waits, or after [`BACKGROUND_PATIENCE`];
    /// never during a pause ([`WriteLock::pause_background`]).
    pub(crate) async fn background(&self) -> OwnedMutexGuard<()> {
        self.take_background(true).await
    }

    /// The lock for the holder of a pause, as a background page takes it but not held back by
    /// pauses.
    pub(crate) async fn background_while_paused(&self, _pause: &Paused<'_>) -> OwnedMutexGuard<()> {
        self.take_background(false).await
    }

    async fn take_background(&self, heed_pauses: bool) -> OwnedMutexGuard<()> {
        let mut deadline = tokio::time::Instant::now() + BACKGROUND_PATIENCE;
        loop {
            // Created before the checks, so a wake-up between a check and its wait is kept.
            let none_waiting = self.none_waiting.notified();
            let resumed = self.resumed.notified();
            let paused = || heed_pauses && self.paused.load(Ordering::Acquire) > 0;
            if paused() {
                resumed.await;
                deadline = tokio::time::Instant::now() + BACKGROUND_PATIENCE;
                continue;
            }
            if self.waiting.load(Ordering::Acquire) == 0 {
                let guard = self.lock.clone().lock_owned().await;
                // A request that arrived while this one queued goes first (it waits for no
                // page: the lock is handed to it now); so does a pause that began meanwhile.
                if paused() {
                    drop(guard);
                    continue;
                }
                if self.waiting.load(Ordering::Acquire) == 0 || tokio::time::Instant::now() >= deadline {
                    return guard;
                }
                drop(guard);
                continue;
            }
            if tokio::time::timeout_at(deadline, none_waiting).await.is_err() {
                return self.lock.clone().lock_owned().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[tokio::test]
    async fn a_waiting_request_goes_before_a_background_page() {
        let w = Arc::new(WriteLock::default());
        let held = w.request().await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let bg = {
            let (w, order) = (w.clone(), order.clone());
            tokio::spawn(async move {
                let _g = w.background().await;
                order.lock().expect("order").push("background");
            })
        };
        tokio::task::yield_now().await;
        let req = {
            let (w, order) = (w.clone(), order.clone());
            tokio::spawn(async move {
                let _g = w.request().await;
                order.lock().expect("order").push("request");
            })
        };
        // Both are waiting (the background page queued first).
        while w.waiting.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        req.await.expect("request");
        bg.await.expect("background");
        assert_eq!(*order.lock().expect("order"), ["request", "background"]);
    }

    #[tokio::test]
    async fn a_paused_background_page_waits_for_the_pause_while_requests_and_the_pauser_write() {
        let w = Arc::new(WriteLock::default());
        let pause = w.pause_background();
        let bg = {
            let w = w.clone();
            tokio::spawn(async move { drop(w.background().await) })
        };
        // Long past the page's patience, the lock free all along: the page still waits.
        tokio::time::sleep(BACKGROUND_PATIENCE + Duration::from_millis(50)).await;
        assert!(!bg.is_finished(), "a background page took the lock during a pause");
        drop(w.request().await);
        drop(w.background_while_paused(&pause).await);
        assert!(!bg.is_finished(), "the pause still holds the page back");
        drop(pause);
        tokio::time::timeout(Duration::from_secs(5), bg).await.expect("the page went once the pause ended").expect("page");
    }

    #[tokio::test]
    async fn only_a_request_that_finds_the_lock_taken_counts_as_a_wait() {
        let w = Arc::new(WriteLock::default());
        drop(w.request().await);
        drop(w.background().await);
        assert_eq!(w.request_waits(), 0, "free lock: no wait");
        let page = w.background().await;
        let req = {
            let w = w.clone();
            tokio::spawn(async move { drop(w.request().await) })
        };
        while w.waiting.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(w.request_waits(), 1, "a request behind a page waits");
        drop(page);
        req.await.expect("request");
        assert_eq!(w.request_waits(), 1);
    }

    #[tokio::test]
    async fn a_background_page_is_not_starved_by_a_stream_of_requests() {
        let w = Arc::new(WriteLock::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut requests = Vec::new();
        for _ in 0..4 {
            let (w, stop) = (w.clone(), stop.clone());
            requests.push(tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let _g = w.request().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let got = tokio::time::timeout(BACKGROUND_PATIENCE * 8, w.background()).await;
        stop.store(true, Ordering::Release);
        assert!(got.is_ok(), "the background page got the lock despite the requests");
        drop(got);
        for r in requests {
            r.await.expect("request loop");
        }
    }
}
