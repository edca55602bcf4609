-- Events are compressed again, now with lz4 (0011): a row longer than PostgreSQL's 2 KB
-- threshold has its payload, notification and audience compressed until it fits, instead of
-- being stored whole up to 8 KB (0010, when compressing them was pglz). A send's row is about
-- 3.5 KB of JSON, and the outbox was most of what the database wrote, and the kernel wrote back,
-- under chat traffic (BENCHMARKS.md, twenty-third session). A server without lz4 keeps the
-- rows whole: pglz would cost what 0010 measured.
DO $$
BEGIN
    IF (SELECT attcompression FROM pg_attribute WHERE attrelid = 'event'::regclass AND attname = 'payload') = 'l' THEN
        ALTER TABLE event ALTER COLUMN note SET COMPRESSION lz4, ALTER COLUMN audience SET COMPRESSION lz4;
        ALTER TABLE event RESET (toast_tuple_target);
    END IF;
END
$$;
