-- +goose Up
-- The transactional outbox (see docs/events.md): every change of an order
-- or a refund that systems downstream must hear of writes one row here, in
-- the transaction that makes the change; each replica's relay delivers the
-- rows at least once, in order per stream.
--
-- id            the outbox's order: within a stream, ids rise with sequence.
-- event_id      the event's name for good, the webhook-id of every attempt.
-- stream        what the sequence counts: order:<id>, the order's events and
--               its refunds'; refund:<refund_id>, a refund with no order;
--               payment:<provider>:<payment_id>, a conflict with no order.
-- sequence      the stream's count, from 1, kept on its row (orders.event_seq,
--               refunds.event_seq) so that it survives retention.
-- occurred_at   when the change was made, by MySQL's clock: the change's own
--               stamp (created_at, paid_at, returned_at, received_at, …).
-- data          the order's or refund's fields, as the event carries them:
--               JSON that MySQL's JSON_OBJECT built, so kept as text, with
--               no check to parse it again (JSON's own type parses every
--               value it stores, MariaDB's checks it: a quarter of an
--               event's cost).
-- state         pending → delivered, or pending → dead (undelivered for
--               SHOP_EVENTS_MAX_AGE) → pending again when redelivered.
-- aging_from    where its age counts from: occurred_at, or its redelivery.
-- next_at       not to be tried before (the backoff after a failed attempt).
-- claimed_until a relay's lease while it sends the event; claim names that
--               relay's claim, so that only it marks the row.
CREATE TABLE outbox (
    id            BIGINT       NOT NULL AUTO_INCREMENT,
    event_id      CHAR(36)     CHARACTER SET ascii NOT NULL,
    type          VARCHAR(32)  CHARACTER SET ascii NOT NULL,
    stream        VARCHAR(100) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sequence      BIGINT       NOT NULL,
    occurred_at   DATETIME(6)  NOT NULL,
    data          LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state         ENUM('pending', 'delivered', 'dead') NOT NULL DEFAULT 'pending',
    aging_from    DATETIME(6)  NOT NULL,
    next_at       DATETIME(6)  NOT NULL,
    claimed_until DATETIME(6)  NULL,
    claim         BIGINT       NULL,
    attempts      INT          NOT NULL DEFAULT 0,
    delivered_at  DATETIME(6)  NULL,
    last_error    VARCHAR(255) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_outbox_event (event_id),
    UNIQUE KEY uq_outbox_stream (stream, sequence),
    KEY ix_outbox_state (state, id),
    KEY ix_outbox_age (state, occurred_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- outbox_switch says whether events are on: one row, turned on by shop
-- migrate --events or by the first replica started with SHOP_EVENTS_URL, and
-- never off again. on_since is stamped after the switch committed: every
-- change stamped later was made by a transaction that saw it on.
CREATE TABLE outbox_switch (
    id       TINYINT     NOT NULL,
    enabled  BOOLEAN     NOT NULL DEFAULT FALSE,
    on_since DATETIME(6) NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT INTO outbox_switch (id, enabled) VALUES (1, FALSE);

-- event_seq is the last sequence number of the row's stream (0: none yet);
-- failed_at is when a refund failed, by MySQL's clock.
ALTER TABLE orders ADD COLUMN event_seq INT NOT NULL DEFAULT 0;
ALTER TABLE refunds
    ADD COLUMN event_seq INT NOT NULL DEFAULT 0,
    ADD COLUMN failed_at DATETIME(6) NULL;

-- +goose Down
ALTER TABLE refunds DROP COLUMN failed_at, DROP COLUMN event_seq;
ALTER TABLE orders DROP COLUMN event_seq;
DROP TABLE outbox_switch;
DROP TABLE outbox;
