//! The auth layer's error: etcd's auth errors and the failures under them.

use crate::store::StoreError;

/// Why an auth check or change refused a request: etcd's auth errors, with
/// etcd's messages (`api/` gives each etcd's gRPC code), or the failure of
/// what the check had to read or write.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// `etcdserver: root user does not exist`
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    /// `etcdserver: root user does not have root role`
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    /// `etcdserver: user name already exists`
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    /// `etcdserver: user name is empty`
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    /// `etcdserver: user name not found`
    #[error("etcdserver: user name not found")]
    UserNotFound,
    /// `etcdserver: role name already exists`
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    /// `etcdserver: role name not found`
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    /// `etcdserver: role name is empty`
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    /// `etcdserver: authentication failed, invalid user ID or password`
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    /// `etcdserver: permission not given`
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    /// `etcdserver: permission denied`
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    /// `etcdserver: role is not granted to the user`
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    /// `etcdserver: permission is not granted to the role`
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    /// `etcdserver: authentication is not enabled`
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    /// `etcdserver: invalid auth token`
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    /// `etcdserver: invalid auth management`
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    /// etcd has no gRPC mapping for this one, so it reaches clients as
    /// Unknown with the auth package's own text.
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// A JWT token issued before the last auth change (etcd 3.5: Unknown).
    #[error("auth: revision in header is old")]
    OldRevision,
    /// The same, as etcd 3.6 and later answer it (their gRPC mapping,
    /// rpctypes.ErrGRPCAuthOldRevision).
    #[error("etcdserver: revision of auth store is old")]
    OldRevisionGrpc,
    /// Authenticate with only a JWT public key (etcd: Unknown).
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    /// Hashing or checking a password, or signing a token, failed.
    #[error("{0}")]
    Password(String),
    /// The store failed while a check read a lease's keys, or a change
    /// read or wrote the auth records.
    #[error(transparent)]
    Store(#[from] StoreError),
}
