-- Leases with their deadlines, so a lease keeps its remaining time across a restart.
CREATE TABLE lease (
    id         BIGINT PRIMARY KEY,
    ttl        BIGINT NOT NULL,  -- granted TTL, seconds
    expires_at BIGINT NOT NULL   -- deadline, Unix milliseconds
);
CREATE INDEX lease_expires_at ON lease (expires_at);

-- The keys attached to a lease, for revoke, expiry and TimeToLive. Queries
-- repeat `lease <> 0` so that even a generic plan can use this partial index.
CREATE INDEX kv_lease ON kv (lease, key) WHERE lease <> 0;
