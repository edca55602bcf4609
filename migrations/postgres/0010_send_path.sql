-- The deleted channels. Every send reads its recipients' unread totals, which leave deleted
-- channels out: that check looked up the channel row of each of the recipients' memberships,
-- rows every send rewrites. This index holds only deleted channels, so the check reads an index
-- that is almost always empty (BENCHMARKS.md, tenth session).
CREATE INDEX channel_deleted ON channel (cid) WHERE deleted_at IS NOT NULL;

-- Events stay in their row up to about 8 KB instead of 2 KB: a `notification.message_new`
-- (about 2.2 KB, it carries the channel) was compressed by every send's commit (pglz, a few
-- percent of the database's time under load), to be read back within milliseconds and pruned
-- within a day.
ALTER TABLE event SET (toast_tuple_target = 8160);
