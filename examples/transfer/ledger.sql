-- ledger.sql - the "ledger" database of examples/transfer (after `txc-db-migrate URL rm`).
CREATE TABLE IF NOT EXISTS ledger (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account_id int NOT NULL,
  amount     numeric(12,2) NOT NULL,
  memo       text
);
