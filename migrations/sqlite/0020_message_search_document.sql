-- Message search indexes each message's channel with its text (docs/performance.md, "Message
-- search"): the FTS5 table `message_search` has two columns, the text (tokenised by unicode61
-- with diacritics removed, as in 0018_message_search.sql) and the channel's cid as one token
-- (its bytes in hex, a single run of letters and digits). A search matches its words in the
-- text and any of the searched channels' tokens in the channel, so FTS5 intersects the two in
-- the index and only the hits in those channels are read from the message table.
--
-- Contentless: the index holds no copy of either column and is kept by the triggers below in
-- the transaction that writes the message (sends, edits, deletes, fork copies and backfill pages
-- alike), keyed by the message row's rowid (never VACUUM the database, which may renumber those
-- rowids). PostgreSQL keeps its GIN index of a generated column instead (its
-- 0020_message_search_document.sql).
DROP TRIGGER message_fts_insert;
DROP TRIGGER message_fts_delete;
DROP TRIGGER message_fts_update;
DROP TABLE message_fts;

CREATE VIRTUAL TABLE message_search USING fts5(
    text,
    cid,
    content = '',
    tokenize = 'unicode61 remove_diacritics 2'
);
INSERT INTO message_search (rowid, text, cid) SELECT rowid, text, hex(cid) FROM message;

CREATE TRIGGER message_search_insert AFTER INSERT ON message BEGIN
    INSERT INTO message_search (rowid, text, cid) VALUES (new.rowid, new.text, hex(new.cid));
END;

CREATE TRIGGER message_search_delete AFTER DELETE ON message BEGIN
    INSERT INTO message_search (message_search, rowid, text, cid) VALUES ('delete', old.rowid, old.text, hex(old.cid));
END;

CREATE TRIGGER message_search_update AFTER UPDATE OF text, cid ON message
WHEN old.text IS NOT new.text OR old.cid IS NOT new.cid BEGIN
    INSERT INTO message_search (message_search, rowid, text, cid) VALUES ('delete', old.rowid, old.text, hex(old.cid));
    INSERT INTO message_search (rowid, text, cid) VALUES (new.rowid, new.text, hex(new.cid));
END;
