//! The worker role: the fork backfill and webhook delivery, both driven by the database (the
//! fork table is the backfill's durable queue, the event outbox is the webhooks').
//!
//! Why not apalis: a backfill's state (status, cursor, counts) already lives in the `fork` row
//! and must be written in the same transaction as each page; a separate job table would be a
//! second source of truth that can disagree with it (a job missing for a backfilling fork is
//! exactly the failure DESIGN.md asks us to repair). Polling the fork table makes "re-enqueue
//! forks whose job went missing" the normal path rather than a repair.
//!
//! Depends on `offshoot-core` and `offshoot-store`; must not depend on axum, the API or ws.

pub mod backfill;
pub mod webhooks;
