-- Offshoot schema, SQLite. Timestamps are Unix nanoseconds; JSON is stored as text;
-- flags are INTEGER 0/1 (sqlx's Any driver cannot read SQLite BOOLEAN columns).
-- Keep in step with migrations/postgres/0001_init.sql (same tables, same columns).

CREATE TABLE app (
    id BIGINT PRIMARY KEY,
    api_key TEXT NOT NULL,
    api_secret TEXT NOT NULL,
    settings TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE app_user (
    id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    name TEXT,
    image TEXT,
    language TEXT,
    teams TEXT NOT NULL DEFAULT '[]',
    custom TEXT NOT NULL DEFAULT '{}',
    banned INTEGER NOT NULL DEFAULT 0,
    shadow_banned INTEGER NOT NULL DEFAULT 0,
    invisible INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    deleted_at BIGINT,
    last_active BIGINT
);

CREATE TABLE channel_type (
    name TEXT PRIMARY KEY,
    max_message_length BIGINT NOT NULL,
    extra TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

INSERT INTO channel_type (name, max_message_length, extra, created_at, updated_at) VALUES
    ('agent', 5000, '{}', 0, 0),
    ('messaging', 5000, '{}', 0, 0);

CREATE TABLE channel (
    cid TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    created_by_id TEXT,
    team TEXT,
    custom TEXT NOT NULL DEFAULT '{}',
    frozen INTEGER NOT NULL DEFAULT 0,
    disabled INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    deleted_at BIGINT,
    truncated_at BIGINT,
    truncated_by_id TEXT,
    last_message_at BIGINT,
    message_count BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX channel_created_at ON channel (created_at);

CREATE TABLE member (
    cid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    channel_role TEXT NOT NULL,
    custom TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (cid, user_id)
);
CREATE INDEX member_user_id ON member (user_id);

CREATE TABLE message (
    id TEXT PRIMARY KEY,
    cid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    type TEXT NOT NULL,
    text TEXT NOT NULL,
    html TEXT NOT NULL,
    mml TEXT,
    command TEXT,
    parent_id TEXT,
    show_in_channel INTEGER NOT NULL DEFAULT 0,
    quoted_message_id TEXT,
    attachments TEXT NOT NULL DEFAULT '[]',
    mentioned_users TEXT NOT NULL DEFAULT '[]',
    restricted_visibility TEXT NOT NULL DEFAULT '[]',
    silent INTEGER NOT NULL DEFAULT 0,
    i18n TEXT,
    custom TEXT NOT NULL DEFAULT '{}',
    shadowed INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    pinned_at BIGINT,
    pinned_by_id TEXT,
    pin_expires BIGINT,
    reply_count BIGINT NOT NULL DEFAULT 0,
    deleted_reply_count BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    deleted_at BIGINT,
    message_text_updated_at BIGINT,
    hidden_at BIGINT,
    source_cid TEXT,
    source_message_id TEXT
);
CREATE INDEX message_cid_created_at ON message (cid, created_at, id);
CREATE INDEX message_parent_id ON message (parent_id, created_at);
CREATE INDEX message_cid_source ON message (cid, source_message_id);

CREATE TABLE reaction (
    message_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    type TEXT NOT NULL,
    score BIGINT NOT NULL DEFAULT 1,
    custom TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (message_id, user_id, type)
);

CREATE TABLE channel_read (
    cid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    last_read BIGINT NOT NULL,
    last_read_message_id TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (cid, user_id)
);

-- One row per fork: its summary, its task and the backfill's progress cursor.
CREATE TABLE fork (
    cid TEXT PRIMARY KEY,
    source_cid TEXT NOT NULL,
    source_message_id TEXT NOT NULL,
    status TEXT NOT NULL,
    copied_message_count BIGINT NOT NULL DEFAULT 0,
    total_message_count BIGINT,
    truncated INTEGER NOT NULL DEFAULT 0,
    oldest_source_message_id TEXT,
    failed_reason TEXT,
    task_id TEXT UNIQUE,
    created_by_id TEXT,
    exclude_attachments INTEGER NOT NULL DEFAULT 0,
    point_created_at BIGINT NOT NULL,
    planned INTEGER NOT NULL DEFAULT 0,
    boundary_created_at BIGINT,
    boundary_id TEXT,
    cursor_created_at BIGINT,
    cursor_id TEXT,
    first_page_map TEXT NOT NULL DEFAULT '{}',
    lease_until BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX fork_source_cid ON fork (source_cid, created_at);
CREATE INDEX fork_status ON fork (status);

-- The transactional outbox: every announced change writes its event here in its own transaction.
CREATE TABLE event (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    type TEXT NOT NULL,
    cid TEXT,
    payload TEXT NOT NULL,
    audience TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- How far each consumer (webhook delivery) has read the outbox.
CREATE TABLE outbox_cursor (
    name TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- Webhook deliveries still to be attempted (retries with back-off).
CREATE TABLE webhook_delivery (
    id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    url TEXT NOT NULL,
    attempt BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX webhook_delivery_next ON webhook_delivery (next_attempt_at);
