-- Each member's unread messages in the channel, kept by the writes that change them (a new
-- message adds one for the members it is unread for; a read sets it to zero; deletes,
-- truncation, rewinds and visibility changes recount the channel), so `me`, read states and
-- the counters sent with events read member rows instead of counting messages.
ALTER TABLE member ADD COLUMN unread_count BIGINT NOT NULL DEFAULT 0;
UPDATE member SET unread_count = (
    SELECT COUNT(*) FROM message m
    JOIN channel c ON c.cid = m.cid
    WHERE m.cid = member.cid
      AND m.created_at > COALESCE((SELECT r.last_read FROM channel_read r WHERE r.cid = member.cid AND r.user_id = member.user_id), member.created_at)
      AND (c.truncated_at IS NULL OR m.created_at > c.truncated_at)
      AND m.user_id <> member.user_id AND m.hidden_at IS NULL AND m.deleted_at IS NULL AND m.shadowed = FALSE
      AND m.type NOT IN ('system', 'deleted', 'ephemeral', 'error') AND (m.parent_id IS NULL OR m.show_in_channel = TRUE)
      AND (m.restricted_visibility = '[]' OR EXISTS (SELECT 1 FROM message_restricted mr WHERE mr.message_id = m.id AND mr.user_id = member.user_id))
);
