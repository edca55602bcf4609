-- A streamed answer rewrites its message's text and html up to twenty times a second, each
-- time whole, and each update's event carries the message again: once an answer reaches a few
-- KB every write compressed three copies of it with pglz, about a tenth of the database's time
-- under streaming load (BENCHMARKS.md, eleventh session). lz4 compresses them for a fraction of
-- that. A server built without lz4 keeps pglz: the change is skipped, nothing else depends on it.
DO $$
BEGIN
    ALTER TABLE message ALTER COLUMN text SET COMPRESSION lz4, ALTER COLUMN html SET COMPRESSION lz4;
    ALTER TABLE event ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: message text and events stay compressed with pglz';
END
$$;
