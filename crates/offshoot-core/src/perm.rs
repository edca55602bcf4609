//! Permission rules. Server-side requests and `admin` users may do everything; other users act
//! on channels they are members of; guests and anonymous users only read what they are in.

use crate::model::Viewer;

/// Capabilities Stream lists in `own_capabilities`, as far as Offshoot implements them.
pub fn own_capabilities(viewer: &Viewer, is_member: bool, kind: &str) -> Vec<&'static str> {
    let mut caps = Vec::new();
    let admin = viewer.is_admin();
    if admin || is_member {
        caps.extend([
            "read-events",
            "send-message",
            "send-reply",
            "quote-message",
            "send-reaction",
            "delete-own-message",
            "update-own-message",
            "pin-message",
            "typing-events",
            "upload-file",
        ]);
    }
    if admin {
        caps.extend([
            "update-channel",
            "delete-channel",
            "truncate-channel",
            "update-channel-members",
            "delete-any-message",
            "update-any-message",
        ]);
        if kind == "agent" {
            caps.extend(["fork-channel", "rewind-channel"]);
        }
    }
    caps
}

/// `ForkChannel` / `RewindChannel`: server-side and admins only.
pub fn may_fork_or_rewind(viewer: &Viewer) -> bool {
    viewer.is_admin()
}

pub fn may_read(viewer: &Viewer, is_member: bool) -> bool {
    viewer.is_admin() || is_member
}

pub fn may_write(viewer: &Viewer, is_member: bool) -> bool {
    match viewer {
        Viewer::Server => true,
        Viewer::User { role, .. } => role == "admin" || is_member,
        Viewer::Anonymous { .. } => false,
    }
}

/// Channel-wide changes (update, members, truncate, delete): admins, and users for channels they created.
pub fn may_manage_channel(viewer: &Viewer, created_by: Option<&str>) -> bool {
    match viewer {
        Viewer::Server => true,
        Viewer::User { id, role } => role == "admin" || created_by == Some(id.as_str()),
        Viewer::Anonymous { .. } => false,
    }
}
