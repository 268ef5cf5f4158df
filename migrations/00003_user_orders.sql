-- +goose Up
-- user_orders counts each user's orders while SHOP_USER_LIMIT is on: the
-- order transaction locks the buyer's row, checks it against the limit and
-- adds the order to it (see internal/stock, userlimit.go). A row is made,
-- from the user's orders, before the user's first order under the limit;
-- a seed deletes the rows with the orders.
CREATE TABLE user_orders (
    user_id BIGINT NOT NULL,
    orders  INT    NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE user_orders;
