-- Webhook deliveries given up after their retry window (or refused by the receiver with a 4xx),
-- kept with the exact body that was sent so an admin can replay them. Queued and retried
-- deliveries live in the job queue (apalis), not here.
CREATE TABLE webhook_dead_letter (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    event_type TEXT NOT NULL,
    event_seq BIGINT NOT NULL,
    body TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    last_error TEXT NOT NULL,
    first_attempt_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX webhook_dead_letter_created_at ON webhook_dead_letter (created_at);
