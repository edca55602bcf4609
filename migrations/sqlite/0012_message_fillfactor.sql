-- PostgreSQL leaves room for updated rows on its message pages from here (its
-- 0012_message_fillfactor.sql); SQLite has no such setting. Kept so both engines have the same
-- versions.
SELECT 1;
