//! Fork planning: page sizes, limits, and the size rules a copy must meet.

use crate::model::Message;

/// Top-level messages in the newest page copied by the fork request.
pub const PAGE_TOP_LEVEL: i64 = 100;
/// Replies of those messages in the newest page.
pub const PAGE_REPLIES: i64 = 100;
/// At most this many messages are copied into one fork.
pub const MAX_COPIED: i64 = 10_000;
/// At most this many forks that did not fail per source.
pub const MAX_FORKS: i64 = 100;
/// At most this many members named in a fork request (or inherited from the source).
pub const MAX_MEMBERS: usize = 100;
/// At most this many ids per message-id lookup.
pub const MAX_LOOKUP: usize = 1_000;
/// Messages copied per background transaction.
pub const BACKFILL_PAGE: i64 = 1_000;

/// Size limits of agent channels a copy must meet (`message_too_large` otherwise).
#[derive(Debug, Clone, Copy)]
pub struct SizeLimits {
    pub max_text_chars: i64,
    pub max_custom_bytes: usize,
    pub max_attachments: usize,
}

pub const MAX_CUSTOM_BYTES: usize = 5 * 1024;
pub const MAX_ATTACHMENTS: usize = 30;

impl SizeLimits {
    pub fn for_max_message_length(max_text_chars: i64) -> Self {
        SizeLimits { max_text_chars, max_custom_bytes: MAX_CUSTOM_BYTES, max_attachments: MAX_ATTACHMENTS }
    }

    /// Whether `m` fits. Attachments only count when they are copied.
    pub fn fits(&self, m: &Message, with_attachments: bool) -> bool {
        let custom = serde_json::to_vec(&m.custom).map(|v| v.len()).unwrap_or(usize::MAX);
        self.fits_sizes(m.text.chars().count() as i64, custom, if with_attachments { m.attachments.len() } else { 0 })
    }

    /// The same rule on sizes: text in characters, custom data in bytes, copied attachments.
    pub fn fits_sizes(&self, text_chars: i64, custom_bytes: usize, attachments: usize) -> bool {
        text_chars <= self.max_text_chars && custom_bytes <= self.max_custom_bytes && attachments <= self.max_attachments
    }
}

pub const FAILED_ID_TAKEN: &str = "fork_message_id_taken";
pub const FAILED_TOO_LARGE: &str = "message_too_large";
/// `failed_reason` of a fork whose backfill kept failing (a database error on every attempt)
/// until the worker gave up.
pub const FAILED_BACKFILL_ERROR: &str = "backfill_error";
