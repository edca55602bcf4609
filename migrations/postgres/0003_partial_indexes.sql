-- Most messages are top-level and not copies: index only the rows these lookups can match,
-- so inserts (the fork backfill above all) maintain fewer index entries.
DROP INDEX message_parent_id;
CREATE INDEX message_parent_id ON message (parent_id, created_at) WHERE parent_id IS NOT NULL;
DROP INDEX message_cid_source;
CREATE INDEX message_cid_source ON message (cid, source_message_id) WHERE source_message_id IS NOT NULL;
