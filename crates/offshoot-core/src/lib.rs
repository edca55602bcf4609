//! The Offshoot domain: ids and their validation, timestamps, the chat model, the error kinds
//! of the Stream wire protocol, permission rules, Query Channels / Query Users filters, and fork
//! planning (page sizes, the cap, copy ids, size limits).
//!
//! This crate does no I/O. It must not depend on axum, sqlx, tokio or any transport or storage
//! crate; everything else depends on it.
//!
//! The model's structs (`model.rs`) spell out Stream's field lists one by one; the
//! `duplicates` tool lists the shared runs of fields between them, which are data, not logic.

pub mod auth;
pub mod error;
pub mod fork;
pub mod ids;
pub mod jobs;
pub mod model;
pub mod perm;
pub mod query;
pub mod render;
pub mod search;
pub mod time;
pub mod token;
pub mod wire;

pub use error::{Error, ErrorKind};
