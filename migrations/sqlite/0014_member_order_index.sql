-- A channel's members in the order every channel read lists them, as on PostgreSQL (its
-- 0014_member_order_index.sql, which says why).
CREATE INDEX member_cid_created_at ON member (cid, created_at, user_id);
