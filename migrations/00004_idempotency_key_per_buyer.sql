-- +goose Up
-- An idempotency key belongs to its buyer: two buyers may use the same key,
-- and neither learns that the other did. The key is compared exactly, byte
-- for byte as the service compares it (utf8mb4_bin), not case-blind as the
-- table's default collation would.
ALTER TABLE orders
    MODIFY idempotency_key VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    DROP INDEX uq_orders_idempotency_key,
    ADD UNIQUE KEY uq_orders_user_idempotency_key (user_id, idempotency_key);

-- +goose Down
ALTER TABLE orders
    DROP INDEX uq_orders_user_idempotency_key,
    MODIFY idempotency_key VARCHAR(64) NULL,
    ADD UNIQUE KEY uq_orders_idempotency_key (idempotency_key);
