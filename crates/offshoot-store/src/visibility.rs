//! The visibility rules every read of messages applies, as SQL conditions and on loaded
//! messages.

use crate::sql::Bind;
use offshoot_core::model::{Message, Viewer};

/// The SQL condition (on alias `m`) for messages `viewer` may see in a channel truncated at
/// `truncated_at`: not rewound, not truncated, shadowed only for their author, restricted
/// visibility only for the listed users and the author. Server-side sees all but hidden ones.
pub(crate) fn visible_to(viewer: &Viewer, truncated_at: Option<i64>, binds: &mut Vec<Bind>) -> String {
    binds.push(Bind::I(truncated_at.unwrap_or(i64::MIN)));
    let after = format!("${}", binds.len());
    visible_after(viewer, &after, binds)
}

/// [`visible_to`] with the truncation as SQL (`after`: a placeholder or a column).
pub(crate) fn visible_after(viewer: &Viewer, after: &str, binds: &mut Vec<Bind>) -> String {
    let mut sql = format!("m.hidden_at IS NULL AND m.created_at > {after}");
    if let Some(uid) = viewer.user_id() {
        binds.push(Bind::S(uid.to_string()));
        let u = binds.len();
        sql.push_str(&format!(
            " AND (m.shadowed = FALSE OR m.user_id = ${u}) AND (m.restricted_visibility = '[]' OR m.user_id = ${u} OR {})",
            restricted_to("m.id", &format!("${u}"))
        ));
    }
    sql
}

/// The SQL condition that the message `message_id` (a column) lists `user` (a column or a
/// placeholder) in its restricted visibility: an exact match on the (message, user) table.
pub(crate) fn restricted_to(message_id: &str, user: &str) -> String {
    format!("EXISTS (SELECT 1 FROM message_restricted mr WHERE mr.message_id = {message_id} AND mr.user_id = {user})")
}

/// Whether one loaded message is visible to `viewer` (the same rule as [`visible_to`]).
pub fn is_visible(m: &Message, hidden: bool, truncated_at: Option<i64>, viewer: &Viewer) -> bool {
    if hidden || truncated_at.is_some_and(|t| m.created_at <= t) {
        return false;
    }
    match viewer.user_id() {
        None => true,
        Some(uid) => {
            (!m.shadowed || m.user_id == uid)
                && (m.restricted_visibility.is_empty() || m.user_id == uid || m.restricted_visibility.iter().any(|r| r == uid))
        }
    }
}
