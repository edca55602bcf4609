-- PostgreSQL compresses message text and events with lz4 from here (its 0011_lz4.sql); SQLite
-- stores them uncompressed, so nothing changes. Kept so both engines have the same versions.
SELECT 1;
