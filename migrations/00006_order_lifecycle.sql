-- +goose Up
-- An order is a reservation until it is paid, or until it expires or is
-- cancelled and its unit goes back to the sale (see internal/stock,
-- lifecycle.go). Orders placed before this migration were final: they are
-- paid, with no payment id.
--
-- status     reserved → paid, or reserved → cancelled | expired; nothing else.
-- pay_by     the end of the payment window, by MySQL's clock; NULL when the
--            order was paid when placed.
-- paid_at    when /pay paid it (MySQL's clock), with payment_id, the
--            provider's reference; both NULL for an order paid when placed.
-- returned_at when its unit went back to the sale: set exactly on cancelled
--            and expired orders, in the transaction that returned the unit.
-- active_sku the SKU while the order is active (reserved or paid), NULL once
--            it is not: the unique key on (user_id, active_sku) is one
--            active order per user and SKU, and lets a buyer whose
--            reservation lapsed order the SKU again.
ALTER TABLE orders
    ADD COLUMN status ENUM('reserved', 'paid', 'cancelled', 'expired') NOT NULL DEFAULT 'paid',
    ADD COLUMN pay_by DATETIME(6) NULL,
    ADD COLUMN paid_at DATETIME(6) NULL,
    ADD COLUMN payment_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN returned_at DATETIME(6) NULL,
    ADD COLUMN active_sku BIGINT AS (IF(status IN ('reserved', 'paid'), sku_id, NULL)) STORED,
    ADD UNIQUE KEY uq_orders_user_active_sku (user_id, active_sku),
    DROP INDEX uq_orders_user_sku,
    -- The sweep: which SKUs have lapsed reservations, and which rows.
    ADD KEY ix_orders_lapsed (status, pay_by),
    ADD KEY ix_orders_sku_status (sku_id, status, pay_by),
    DROP INDEX ix_orders_sku;

-- refunds are payments that came after their order had expired or been
-- cancelled: money owed back, never dropped. A payment delivered again is
-- the same refund (the key).
CREATE TABLE refunds (
    order_id    BIGINT      NOT NULL,
    payment_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id     BIGINT      NOT NULL,
    sku_id      BIGINT      NOT NULL,
    reason      ENUM('order_expired', 'order_cancelled') NOT NULL,
    received_at DATETIME(6) NOT NULL,
    PRIMARY KEY (order_id, payment_id),
    KEY ix_refunds_received (received_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE refunds;
ALTER TABLE orders
    ADD KEY ix_orders_sku (sku_id),
    DROP INDEX ix_orders_sku_status,
    DROP INDEX ix_orders_lapsed,
    ADD UNIQUE KEY uq_orders_user_sku (user_id, sku_id),
    DROP INDEX uq_orders_user_active_sku,
    DROP COLUMN active_sku,
    DROP COLUMN returned_at,
    DROP COLUMN payment_id,
    DROP COLUMN paid_at,
    DROP COLUMN pay_by,
    DROP COLUMN status;
