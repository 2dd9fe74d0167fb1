-- Auth users and roles, each stored as etcd's authpb encoding, keyed by kind
-- ('user' or 'role') and name. Whether auth is enabled and the auth revision
-- are rows of `settings` (auth_enabled, auth_revision).
CREATE TABLE auth (
    kind   VARCHAR(8) NOT NULL,
    name   VARBINARY(1024) NOT NULL,
    record LONGBLOB NOT NULL,
    PRIMARY KEY (kind, name)
) ENGINE = InnoDB;
