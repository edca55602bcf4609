-- A channel's pinned messages (every channel query and Query Channels reads them): without an
-- index the lookup walked every message of the channel; few messages are pinned, so the index
-- holds only those.
CREATE INDEX message_pinned ON message (cid, pinned_at) WHERE pinned = TRUE;
