-- The index of a channel's pins also holds each pin's `created_at`, as on PostgreSQL (its
-- 0013_pinned_index_created_at.sql, which says why): both engines keep the same schema. SQLite's
-- pin reads name this index (`pins_sql`) and use it as before, now with the truncation's
-- `created_at > …` checked in the index.
DROP INDEX message_pinned;
CREATE INDEX message_pinned ON message (cid, pinned_at, created_at) WHERE pinned = TRUE;
