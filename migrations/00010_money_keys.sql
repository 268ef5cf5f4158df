-- +goose Up
-- With every refund named (00009), refunds is keyed by refund_id, and a
-- payment is owed back at most once: (provider, payment_id) is unique,
-- while rows from before the ledger, whose provider is NULL, are not held
-- to it. A payment_id pays at most one order.
ALTER TABLE refunds
    DROP PRIMARY KEY,
    MODIFY refund_id CHAR(26) CHARACTER SET ascii NOT NULL,
    ADD PRIMARY KEY (refund_id),
    ADD UNIQUE KEY uq_refunds_payment (provider, payment_id),
    ADD KEY ix_refunds_order (order_id),
    ADD KEY ix_refunds_state (state, refund_id);
ALTER TABLE orders ADD UNIQUE KEY uq_orders_payment (payment_id);

-- +goose Down
ALTER TABLE orders DROP INDEX uq_orders_payment;
ALTER TABLE refunds
    DROP INDEX ix_refunds_state,
    DROP INDEX ix_refunds_order,
    DROP INDEX uq_refunds_payment,
    DROP PRIMARY KEY,
    MODIFY refund_id CHAR(26) CHARACTER SET ascii NULL,
    ADD PRIMARY KEY (order_id, payment_id);
