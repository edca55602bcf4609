-- A notification stored in the row of the event it repeats (a send's `notification.message_new`
-- beside its `message.new`, which it repeats with the channel): JSON, NULL when the row holds its
-- event alone. As two rows, every send stored its message twice, and the outbox was most of what
-- the database wrote under chat traffic (BENCHMARKS.md, twenty-third session).
ALTER TABLE event ADD COLUMN note TEXT;
