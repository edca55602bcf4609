-- Live WebSocket connections and their watches, shared by every ws process on one database, so
-- presence (`online`), watcher counts and watcher lists hold across processes. Each ws process
-- is an instance with a heartbeat; the rows of an instance whose heartbeat stopped are removed
-- by the live instances (docs/compatibility.md, "Presence and watchers across processes").
CREATE TABLE ws_instance (
    id TEXT PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE ws_connection (
    id TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX ws_connection_user ON ws_connection (user_id);
CREATE INDEX ws_connection_instance ON ws_connection (instance_id);

CREATE TABLE ws_watch (
    connection_id TEXT NOT NULL,
    cid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    presence INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (connection_id, cid)
);
CREATE INDEX ws_watch_cid_user ON ws_watch (cid, user_id);
