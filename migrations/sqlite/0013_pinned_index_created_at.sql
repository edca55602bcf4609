-- PostgreSQL adds `created_at` to its index of pins from here (its
-- 0013_pinned_index_created_at.sql); SQLite's pin reads name their index (`pins_sql`), so
-- nothing changes. Kept so both engines have the same versions.
SELECT 1;
