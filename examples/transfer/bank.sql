-- bank.sql - the "bank" database of examples/transfer (after `txc-db-migrate URL rm`).
CREATE TABLE IF NOT EXISTS account (
  id      int PRIMARY KEY,
  balance numeric(12,2) NOT NULL CHECK (balance >= 0)
);
INSERT INTO account VALUES (1, 100.00) ON CONFLICT (id) DO NOTHING;
