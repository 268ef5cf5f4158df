-- +goose Up
-- Money (see docs/payments.md): what a product costs and in which currency,
-- what each order owes, every payment the provider reports, and refunds
-- that are paid back. Amounts are integers in the currency's minor unit.
--
-- products.currency  three letters, upper-case. Products from before get
--                    USD; shop migrate then gives SHOP_CURRENCY to any
--                    product that has none.
-- orders.amount_cents, orders.currency
--                    what the order owes, copied from its product by the
--                    order's own INSERT; a later price change leaves it.
--                    NULL on orders paid or ended before amounts: "before
--                    amounts", which shop verify exempts.
-- orders.payment_intent, client_secret, checkout_key
--                    the Stripe PaymentIntent of a checkout, stored once
--                    (payment_intent IS NULL), and the Idempotency-Key its
--                    creation was sent with.
-- catalog_epoch.seeded_at
--                    when the last seed reset the catalog, by MySQL's
--                    clock. A seed deletes the orders and keeps the
--                    payments ledger and the settled refunds: what they
--                    say of orders from before it is history, which shop
--                    verify does not hold to the orders now.
ALTER TABLE catalog_epoch ADD COLUMN seeded_at DATETIME(6) NULL;

ALTER TABLE products
    ADD COLUMN currency CHAR(3) CHARACTER SET ascii NULL AFTER price_cents;
UPDATE products SET currency = 'USD';

ALTER TABLE orders
    ADD COLUMN amount_cents BIGINT NULL,
    ADD COLUMN currency CHAR(3) CHARACTER SET ascii NULL,
    ADD COLUMN payment_intent VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN client_secret VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN checkout_key CHAR(26) CHARACTER SET ascii NULL;

-- A reservation owes its product's price; orders paid or ended before
-- amounts keep NULL.
UPDATE orders o JOIN products p ON p.id = o.sku_id
    SET o.amount_cents = p.price_cents, o.currency = p.currency
    WHERE o.status = 'reserved';

-- payments is the ledger: every payment the provider reported, once
-- (provider, payment_id), with what it did. orders.payment_id and
-- refunds (provider, payment_id) refer to it.
--
-- order_id    the order the event named; it may not exist (unknown_order).
-- event_id    the provider's event (Stripe) or message id (webhook-id).
-- received_at when it came, by MySQL's clock: it decides whether it was in
--             time.
-- outcome     applied: it paid its order; owed: a refund returns it;
--             conflict: its payment_id is already on another order, from
--             before the ledger, and nothing was done (logged at error).
CREATE TABLE payments (
    provider     VARCHAR(16) CHARACTER SET ascii NOT NULL,
    payment_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id     BIGINT      NOT NULL,
    amount_cents BIGINT      NOT NULL,
    currency     CHAR(3) CHARACTER SET ascii NOT NULL,
    event_id     VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    received_at  DATETIME(6) NOT NULL,
    outcome      ENUM('applied', 'owed', 'conflict') NOT NULL,
    PRIMARY KEY (provider, payment_id),
    KEY ix_payments_order (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- refunds gains what paying one back needs. Rows from before the ledger
-- keep provider, amount_cents and currency NULL.
--
-- refund_id          a ULID: the refund's name everywhere, and the
--                    Idempotency-Key towards the provider. 00009 fills it
--                    for rows from before; 00010 makes it the key.
-- state              owed → requested → refunded, or failed.
-- provider_refund_id the provider's reference, set when refunded.
-- claimed_until      a refunder's lease on the row while it asks the
--                    provider; attempts and last_error what it met.
ALTER TABLE refunds
    MODIFY reason ENUM('order_expired', 'order_cancelled', 'amount_mismatch', 'duplicate_payment', 'unknown_order') NOT NULL,
    MODIFY user_id BIGINT NULL,
    MODIFY sku_id BIGINT NULL,
    ADD COLUMN refund_id CHAR(26) CHARACTER SET ascii NULL FIRST,
    ADD COLUMN provider VARCHAR(16) CHARACTER SET ascii NULL AFTER refund_id,
    ADD COLUMN amount_cents BIGINT NULL,
    ADD COLUMN currency CHAR(3) CHARACTER SET ascii NULL,
    ADD COLUMN state ENUM('owed', 'requested', 'refunded', 'failed') NOT NULL DEFAULT 'owed',
    ADD COLUMN provider_refund_id VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN settled_at DATETIME(6) NULL,
    ADD COLUMN claimed_until DATETIME(6) NULL,
    ADD COLUMN attempts INT NOT NULL DEFAULT 0,
    ADD COLUMN last_error VARCHAR(255) NULL;

-- One payment_id on several orders (a buyer's word was once enough): the
-- first to be paid keeps it, the later ones owe it back and let it go.
INSERT INTO refunds (order_id, payment_id, user_id, sku_id, reason, received_at)
    SELECT o.id, o.payment_id, o.user_id, o.sku_id, 'duplicate_payment', COALESCE(o.paid_at, o.created_at)
    FROM orders o
    WHERE o.payment_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM orders f
        WHERE f.payment_id = o.payment_id
          AND (f.paid_at < o.paid_at OR (f.paid_at = o.paid_at AND f.id < o.id)));
UPDATE orders o JOIN refunds r
    ON r.order_id = o.id AND r.payment_id = o.payment_id AND r.reason = 'duplicate_payment'
    SET o.payment_id = NULL;

-- +goose Down
UPDATE orders o JOIN refunds r ON r.order_id = o.id AND r.reason = 'duplicate_payment'
    SET o.payment_id = r.payment_id;
DELETE FROM refunds WHERE reason NOT IN ('order_expired', 'order_cancelled');
ALTER TABLE refunds
    DROP COLUMN last_error,
    DROP COLUMN attempts,
    DROP COLUMN claimed_until,
    DROP COLUMN settled_at,
    DROP COLUMN provider_refund_id,
    DROP COLUMN state,
    DROP COLUMN currency,
    DROP COLUMN amount_cents,
    DROP COLUMN provider,
    DROP COLUMN refund_id,
    MODIFY sku_id BIGINT NOT NULL,
    MODIFY user_id BIGINT NOT NULL,
    MODIFY reason ENUM('order_expired', 'order_cancelled') NOT NULL;
DROP TABLE payments;
ALTER TABLE orders
    DROP COLUMN checkout_key,
    DROP COLUMN client_secret,
    DROP COLUMN payment_intent,
    DROP COLUMN currency,
    DROP COLUMN amount_cents;
ALTER TABLE products DROP COLUMN currency;
ALTER TABLE catalog_epoch DROP COLUMN seeded_at;
