-- +goose Up
-- catalog_epoch counts the resets of the catalog: every seed raises it in
-- its own transaction. What is built from the catalog's ids outside MySQL
-- (the product cache's Bloom filter) records the epoch it was built from,
-- and is known to be stale when that is not the current one — also when
-- the rebuild that should follow a seed failed (see internal/cache).
-- One row, id 1.
CREATE TABLE catalog_epoch (
    id    TINYINT NOT NULL,
    epoch BIGINT  NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT catalog_epoch_one_row CHECK (id = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT INTO catalog_epoch (id, epoch) VALUES (1, 0);

-- +goose Down
DROP TABLE catalog_epoch;
