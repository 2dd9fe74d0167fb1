-- Auth users and roles, each stored as etcd's authpb encoding, keyed by kind
-- ('user' or 'role') and name. Whether auth is enabled and the auth revision
-- are rows of `settings` (auth_enabled, auth_revision).
CREATE TABLE auth (
    kind   TEXT NOT NULL,
    name   BLOB NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (kind, name)
);
