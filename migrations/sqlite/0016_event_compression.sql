-- PostgreSQL compresses events again from here (its 0016_event_compression.sql); SQLite stores
-- them uncompressed, so nothing changes. Kept so both engines have the same versions.
SELECT 1;
