-- +goose Up
CREATE TABLE products (
    id            BIGINT       NOT NULL,
    name          VARCHAR(200) NOT NULL,
    price_cents   BIGINT       NOT NULL,
    initial_stock INT          NOT NULL,
    stock         INT          NOT NULL,
    -- fence is the highest fencing token that has written this row; a write
    -- must carry a larger one (see internal/stock).
    fence         BIGINT       NOT NULL DEFAULT 0,
    updated_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE orders (
    id              BIGINT      NOT NULL AUTO_INCREMENT,
    sku_id          BIGINT      NOT NULL,
    user_id         BIGINT      NOT NULL,
    idempotency_key VARCHAR(64) NULL,
    fence           BIGINT      NOT NULL DEFAULT 0,
    created_at      DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uq_orders_user_sku (user_id, sku_id),
    UNIQUE KEY uq_orders_idempotency_key (idempotency_key),
    KEY ix_orders_sku (sku_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE orders;
DROP TABLE products;
