-- The index of a channel's pins also holds each pin's `created_at`. Every read of pins asks for
-- pins after the channel's truncation (`created_at > …`), and without statistics (autovacuum
-- off, or not yet run on new rows) PostgreSQL answered that with the channel's `created_at`
-- index, walking every message of the channel to find its few pins: 3,000 rows for Query
-- Channels over 30 channels of 100 messages, a whole channel per read on a large one. With the
-- condition in the pins' own index the planner takes it, with or without statistics
-- (BENCHMARKS.md, fourteenth session). SQLite gets the same index (its 0013), which its pin reads
-- name in the query (`pins_sql`).
DROP INDEX message_pinned;
CREATE INDEX message_pinned ON message (cid, pinned_at, created_at) WHERE pinned = TRUE;
