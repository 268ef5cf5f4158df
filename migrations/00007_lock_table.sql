-- +goose Up
-- shop_locks is the MySQL lock's table (SHOP_LOCK_MODE=mysql, see
-- internal/lock, mysql.go): one row per key that has ever been locked.
--
-- name       the key, compared byte for byte (VARBINARY: no collation folds
--            two keys into one, no trailing spaces are ignored).
-- owner      the holder's random token; '' when the key is free.
-- fence      the key's fencing counter: the token of its latest holder.
--            The row outlives its holders, and must: a row deleted on
--            release would start its counter again and hand out smaller
--            tokens than the writes they fence.
-- expires_at when the holder's lease runs out unless renewed, by MySQL's
--            clock in UTC (UTC_TIMESTAMP(6)): one clock judges every expiry,
--            whatever the session time zones of the clients.
CREATE TABLE shop_locks (
    name       VARBINARY(255) NOT NULL,
    owner      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    fence      BIGINT       NOT NULL DEFAULT 0,
    expires_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE shop_locks;
