-- Message search (docs/compatibility.md, "Search"): a GIN index of every message's text as a
-- `simple` tsvector (lower-cased words, no stemming, no stop words) with diacritics removed (so
-- "café" and "cafe" match), kept by PostgreSQL in the transaction that writes the message:
-- sends, edits, deletes, fork copies and backfill pages alike. It indexes an expression, so the
-- message table keeps its columns; searches write the same expression,
-- `to_tsvector('simple'::regconfig, offshoot_search_text(m.text))`. SQLite has its FTS5 table
-- instead (its 0018_message_search.sql).
--
-- Diacritics are removed by the `unaccent` extension (trusted since PostgreSQL 13: the database
-- owner may create it) through an IMMUTABLE wrapper, which an index expression needs and
-- `unaccent(text)` is not. Where the extension cannot be created, the wrapper folds the Latin
-- letters with diacritics by `translate` instead.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS unaccent;
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'unaccent is not available (%): message search folds Latin diacritics with translate()', SQLERRM;
END
$$;

DO $$
DECLARE
    schema_name text;
BEGIN
    SELECT n.nspname INTO schema_name FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent';
    IF schema_name IS NOT NULL THEN
        EXECUTE format(
            'CREATE FUNCTION offshoot_search_text(t text) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE '
            'AS $f$ SELECT %I.unaccent(%L::regdictionary, t) $f$',
            schema_name, schema_name || '.unaccent');
    ELSE
        CREATE FUNCTION offshoot_search_text(t text) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        AS $f$ SELECT translate(t,
            'ÀÁÂÃÄÅàáâãäåÇçÈÉÊËèéêëÌÍÎÏìíîïÑñÒÓÔÕÖØòóôõöøÙÚÛÜùúûüÝýÿŠšŽžČčĆćĐđŁłŃńŚśŹźŻżĘęĄąŘřŤťĎďŇňŮů',
            'AAAAAAaaaaaaCcEEEEeeeeIIIIiiiiNnOOOOOOooooooUUUUuuuuYyySsZzCcCcDdLlNnSsZzZzEeAaRrTtDdNnUu') $f$;
    END IF;
END
$$;

CREATE INDEX message_search ON message USING gin (to_tsvector('simple'::regconfig, offshoot_search_text(text)));
