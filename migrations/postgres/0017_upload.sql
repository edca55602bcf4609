-- Uploaded files (POST /channels/{type}/{id}/file and /image) and the messages that refer to
-- them. A file is removed from storage only when no message of any channel refers to it any
-- more: `referenced` is set once some message has referred to it (or its deletion was asked
-- while messages did), and the files job deletes each referenced upload without a reference
-- row (docs/compatibility.md, "File uploads").
CREATE TABLE upload (
    id TEXT PRIMARY KEY,
    object_key TEXT NOT NULL,
    cid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    size BIGINT NOT NULL,
    referenced BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE upload_ref (
    message_id TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (message_id, upload_id)
);

CREATE INDEX upload_ref_upload ON upload_ref (upload_id);
