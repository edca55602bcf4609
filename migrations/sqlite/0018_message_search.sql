-- Message search (docs/compatibility.md, "Search"): an FTS5 index of every message's text,
-- tokenised by unicode61 with diacritics removed (so "café" and "cafe" match), kept by triggers
-- in the transaction that writes the message: sends, edits, deletes, fork copies and backfill
-- pages alike. External content: the index holds no copy of the text; it is keyed by the
-- message row's rowid (never VACUUM the database, which may renumber those rowids; `rebuild`
-- below rebuilds the index from the table). PostgreSQL has its GIN index instead (its
-- 0018_message_search.sql).
CREATE VIRTUAL TABLE message_fts USING fts5(
    text,
    content = 'message',
    content_rowid = 'rowid',
    tokenize = 'unicode61 remove_diacritics 2'
);
INSERT INTO message_fts (message_fts) VALUES ('rebuild');

CREATE TRIGGER message_fts_insert AFTER INSERT ON message BEGIN
    INSERT INTO message_fts (rowid, text) VALUES (new.rowid, new.text);
END;

CREATE TRIGGER message_fts_delete AFTER DELETE ON message BEGIN
    INSERT INTO message_fts (message_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
END;

CREATE TRIGGER message_fts_update AFTER UPDATE OF text ON message WHEN old.text IS NOT new.text BEGIN
    INSERT INTO message_fts (message_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
    INSERT INTO message_fts (rowid, text) VALUES (new.rowid, new.text);
END;
