-- Leases with their deadlines, so a lease keeps its remaining time across a restart.
CREATE TABLE lease (
    id         INTEGER PRIMARY KEY,
    ttl        INTEGER NOT NULL,  -- granted TTL, seconds
    expires_at INTEGER NOT NULL   -- deadline, Unix milliseconds
);
CREATE INDEX lease_expires_at ON lease (expires_at);

-- The keys attached to a lease, for revoke, expiry and TimeToLive.
CREATE INDEX kv_lease ON kv (lease, key) WHERE lease != 0;
