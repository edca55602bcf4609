-- AI-state lookups (`require_finished`) read a channel's newest events; pruning reads by age.
CREATE INDEX event_cid_seq ON event (cid, seq);
CREATE INDEX event_created_at ON event (created_at);
