-- Webhook deliveries moved to the job queue (apalis) with 0005; nothing has read or written
-- this table since, so rows in it are leftovers of a version before that move.
DROP INDEX IF EXISTS webhook_delivery_next;
DROP TABLE IF EXISTS webhook_delivery;
