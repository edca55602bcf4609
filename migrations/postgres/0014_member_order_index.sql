-- A channel's members in the order every channel read lists them, `(created_at, user_id)`: the
-- reads of a channel's first members and of their read states (`LIMIT 100`) walked and sorted
-- every member of the channel through the key `(cid, user_id)`, 7.3 ms for a channel of 20,000
-- members against 0.37 ms through this index (BENCHMARKS.md, fourteenth session).
CREATE INDEX member_cid_created_at ON member (cid, created_at, user_id);
