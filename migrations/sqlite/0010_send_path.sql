-- The deleted channels. Every send reads its recipients' unread totals, which leave deleted
-- channels out: that check looked up the channel row of each of the recipients' memberships,
-- rows every send rewrites. This index holds only deleted channels, so the check reads an index
-- that is almost always empty (BENCHMARKS.md, tenth session).
CREATE INDEX channel_deleted ON channel (cid) WHERE deleted_at IS NOT NULL;
