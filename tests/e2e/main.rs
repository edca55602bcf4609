//! The black-box end-to-end suite: a real Offshoot server per test (in-process on
//! `127.0.0.1:0`, or the `offshoot` binary for the crash test), a fresh database per test, driven
//! over HTTP like a Stream client.
//!
//! Run it on both backends (the process tests build the `offshoot` binary themselves, so they
//! never run an old one):
//!
//! ```text
//! OFFSHOOT_TEST_BACKEND=sqlite   cargo test -p offshoot-tests --test e2e
//! OFFSHOOT_TEST_BACKEND=postgres cargo test -p offshoot-tests --test e2e -- --include-ignored   # OFFSHOOT_TEST_PG_URL
//! ```
//!
//! Tests that need several processes on one database are PostgreSQL only: they carry
//! `#[ignore = "PostgreSQL only: …"]` (reported as ignored on SQLite) and fail if run there.

mod helpers;

mod auth;
mod authz;
mod chat;
mod cli;
mod concurrency;
mod dialects;
mod fidelity;
mod files;
mod fork;
mod hardening;
mod lineage;
mod operating;
mod presence;
mod process;
mod rate_limits;
mod scale_out;
mod search;
mod visibility;
mod webhooks;
mod worker;
mod ws;
