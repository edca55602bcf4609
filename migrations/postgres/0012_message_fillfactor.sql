-- Room on each page of messages for new versions of their rows. An agent streams its answer
-- by rewriting the message twenty times a second; a new version that fits on its page is a
-- heap-only update (no index entries), one that does not is written elsewhere with a new entry
-- in every index of the table. With full pages 41% of a streamed answer's updates went to other
-- pages (BENCHMARKS.md, eleventh session). Pages written from now on keep a fifth free.
ALTER TABLE message SET (fillfactor = 80);
