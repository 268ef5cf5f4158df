-- +goose Up
-- A product's sale window, in UTC: orders that arrive before sale_starts_at
-- or at or after sale_ends_at are refused. NULL leaves that side open.
ALTER TABLE products
    ADD COLUMN sale_starts_at DATETIME(6) NULL,
    ADD COLUMN sale_ends_at   DATETIME(6) NULL;

-- +goose Down
ALTER TABLE products
    DROP COLUMN sale_starts_at,
    DROP COLUMN sale_ends_at;
