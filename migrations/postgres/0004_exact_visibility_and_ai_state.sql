-- Restricted visibility as (message, user) rows: reads match a user exactly (the JSON column
-- stays for rendering). Matching the JSON text with LIKE let `_` in a user id match any
-- character, so restricted messages leaked into other users' unread counts.
CREATE TABLE message_restricted (
    message_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (message_id, user_id)
);
INSERT INTO message_restricted (message_id, user_id, created_at, updated_at)
SELECT m.id, r.value, m.created_at, m.created_at
FROM message m CROSS JOIN LATERAL jsonb_array_elements_text(m.restricted_visibility::jsonb) AS r(value)
WHERE m.restricted_visibility <> '[]'
ON CONFLICT DO NOTHING;

-- The AI state of messages being generated (ai_indicator.update / clear / stop), kept apart
-- from the outbox so that pruning old events never changes what `require_finished` sees.
CREATE TABLE ai_state (
    cid TEXT NOT NULL,
    message_id TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (cid, message_id)
);
