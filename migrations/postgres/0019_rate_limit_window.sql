-- Rate-limit counts shared by several api processes: one row per key (endpoint and platform)
-- and one-minute window (its start, Unix seconds).
CREATE TABLE rate_limit_window (
    key TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (key, window_start)
);
