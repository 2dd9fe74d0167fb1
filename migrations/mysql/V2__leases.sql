-- Leases with their deadlines, so a lease keeps its remaining time across a restart.
CREATE TABLE lease (
    id         BIGINT NOT NULL PRIMARY KEY,
    ttl        BIGINT NOT NULL,  -- granted TTL, seconds
    expires_at BIGINT NOT NULL,  -- deadline, Unix milliseconds
    INDEX lease_expires_at (expires_at)
) ENGINE = InnoDB;

-- The keys attached to a lease, for revoke, expiry and TimeToLive. MySQL has
-- no partial indexes, so keys without a lease (0) are in it too.
CREATE INDEX kv_lease ON kv (lease, `key`);
