//! The etcd gRPC services, one module per service. This layer validates
//! requests, enforces limits, fills response headers and turns store errors
//! into etcd's exact gRPC codes and messages; the etcd semantics live in
//! `crate::store`.

pub mod auth;
pub mod cluster;
mod downgrade;
pub mod election;
mod go_decode;
mod keys_only;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
mod prefix_queue;
pub mod require_leader;
mod status_fields;
mod version;
pub mod watch;

use std::sync::Arc;

use tonic::Extensions;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::auth::{AuthError, Caller};
use crate::proto::etcdserverpb::ResponseHeader;
use crate::store::{Identity, StoreError};

/// The raft term a single node reports: it never holds an election.
pub const RAFT_TERM: u64 = 1;

/// Settings every service needs.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    /// Cluster and member ids for response headers.
    pub identity: Identity,
    /// Largest accepted write request, in bytes.
    pub max_request_bytes: usize,
    /// Most ops in one Txn (per branch, and compares).
    pub max_txn_ops: usize,
    /// The etcd version reported by Status.
    pub version: String,
    /// etcd's --quota-backend-bytes as given (0: the default), for Status.
    pub quota_backend_bytes: i64,
    /// Member name reported by MemberList.
    pub name: String,
    /// Client URLs reported by MemberList.
    pub client_urls: Vec<String>,
    /// The peer URL a single server reports in MemberList: the one it would
    /// advertise as the founder of a cluster (`--advertise-peer-url`, else
    /// its `--peer-listen-address`).
    pub peer_url: String,
    /// Users, roles, tokens and the permission checks.
    pub auth: Arc<crate::auth::Auth>,
    /// The replicated cluster this server is a member of: set at start
    /// (`--cluster-init`, `--join`), or when a single server founds one on
    /// its first MemberAdd (see `crate::server::founding`).
    pub cluster: ClusterSlot,
}

/// Where a server finds the cluster it is a member of, once it is one.
pub type ClusterSlot = Arc<std::sync::OnceLock<Arc<crate::raft::Cluster>>>;

/// A slot holding `cluster`, if any.
pub fn cluster_slot(cluster: Option<Arc<crate::raft::Cluster>>) -> ClusterSlot {
    let slot = ClusterSlot::default();
    if let Some(cluster) = cluster {
        let _ = slot.set(cluster);
    }
    slot
}

impl ServerInfo {
    /// Completes a header the store started: ids, term, and the current
    /// revision where the store did not set one.
    pub fn fill(&self, header: &mut Option<ResponseHeader>, current_revision: i64) {
        let header = header.get_or_insert_with(Default::default);
        header.cluster_id = self.identity.cluster_id;
        header.member_id = self.identity.member_id;
        header.raft_term = self.raft_term();
        if header.revision == 0 {
            header.revision = current_revision;
        }
    }

    /// Whether the emulated etcd is 3.6 or later, whose checks and fields
    /// some answers follow.
    pub fn emulates_36(&self) -> bool {
        version::major_minor(&self.version).is_some_and(|v| v >= (3, 6))
    }

    /// Whether the emulated etcd is 3.7 or later, which reads keys-only
    /// ranges from its key index (see `keys_only`).
    pub fn emulates_37(&self) -> bool {
        version::major_minor(&self.version).is_some_and(|v| v >= (3, 7))
    }

    /// The Raft term: the cluster's, or a single node's constant one.
    pub fn raft_term(&self) -> u64 {
        self.cluster()
            .map_or(RAFT_TERM, |cluster| cluster.status().term)
    }

    /// The replicated cluster this server is a member of, if it is one.
    pub fn cluster(&self) -> Option<&Arc<crate::raft::Cluster>> {
        self.cluster.get()
    }

    /// The caller of a request, as etcd's AuthInfoFromCtx finds it: the
    /// user its token names (etcd's clients send it as `token`;
    /// `authorization`, with or without `Bearer `, is taken too, as etcd's
    /// gRPC gateway passes it on); without a token and with
    /// `--client-cert-auth`, the CommonName of the client certificate the
    /// connection was verified with (etcd's AuthInfoFromTLS), unless the
    /// request came through the gRPC gateway.
    pub fn caller(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Caller, Status> {
        let token = metadata
            .get("token")
            .or_else(|| metadata.get("authorization"))
            .and_then(|v| v.to_str().ok())
            .map(|token| token.strip_prefix("Bearer ").unwrap_or(token));
        Ok(self
            .auth
            .caller(token, || certificate_user(metadata, extensions))?)
    }

    /// The caller, who must carry a valid token whenever auth is enabled.
    pub fn require_user(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Caller, Status> {
        let caller = self.caller(metadata, extensions)?;
        self.auth.require_user(&caller)?;
        Ok(caller)
    }

    /// The caller, who must be an admin whenever auth is enabled (etcd's
    /// needAdminPermission).
    pub fn require_admin(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Caller, Status> {
        let caller = self.caller(metadata, extensions)?;
        self.auth.require_admin(&caller)?;
        Ok(caller)
    }

    /// A complete header at `revision`.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        let mut header = None;
        self.fill(&mut header, revision);
        header
    }
}

/// The CommonName of the client certificate a TLS connection was verified
/// with, as etcd's AuthInfoFromTLS reads it (an empty one included); `None`
/// on a plain connection, and for a request from the gRPC gateway, which
/// etcd marks with `grpcgateway-accept` and never logs in by certificate.
fn certificate_user(metadata: &MetadataMap, extensions: &Extensions) -> Option<String> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let certificates = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()?
        .peer_certs()?;
    let leaf = certificates.first()?;
    if metadata.contains_key("grpcgateway-accept") {
        tracing::warn!("ignoring common name in gRPC-gateway proxy request");
        return None;
    }
    let (_, certificate) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let common_name = certificate
        .subject()
        .iter_common_name()
        // Go's pkix.Name keeps the last CN of the subject.
        .last()
        .map_or(Some(String::new()), |name| {
            name.as_str().ok().map(str::to_string)
        })?;
    Some(common_name)
}

/// etcd's error strings, as clients match them.
pub mod errors {
    use super::*;

    /// A request without a key.
    pub fn empty_key() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: key is not provided")
    }
    /// A sort order or target that is not one of etcd's.
    pub fn invalid_sort_option() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: invalid sort option")
    }
    /// ignore_value/ignore_lease on a missing key, or an empty txn op.
    pub fn key_not_found() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: key not found")
    }
    /// ignore_value together with a value.
    pub fn value_provided() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: value is provided")
    }
    /// ignore_lease together with a lease.
    pub fn lease_provided() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: lease is provided")
    }
    /// More txn ops than --max-txn-ops.
    pub fn too_many_ops() -> Status {
        Status::new(
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request",
        )
    }
    /// A key written twice, or written and deleted, by one txn.
    pub fn duplicate_key() -> Status {
        Status::new(
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request",
        )
    }
    /// A write request over --max-request-bytes.
    pub fn request_too_large() -> Status {
        Status::new(Code::InvalidArgument, "etcdserver: request is too large")
    }

    /// grpc-go's (so etcd's) ResourceExhausted text for a message over the
    /// gRPC size limit, from tonic's `message` for it; `None` for other messages.
    pub fn message_too_large(message: &str) -> Option<String> {
        const TONIC_PREFIX: &str = "Error, decoded message length too large: found ";
        let numbers: Vec<&str> = message
            .strip_prefix(TONIC_PREFIX)?
            .split(|c: char| !c.is_ascii_digit())
            .filter(|n| !n.is_empty())
            .collect();
        let [found, limit] = numbers[..] else {
            return None;
        };
        Some(format!(
            "grpc: received message larger than max ({found} vs. {limit})"
        ))
    }

    /// `status` with tonic's error for an oversized message replaced by etcd's.
    pub fn etcd_transport_error(status: Status) -> Status {
        match message_too_large(status.message()) {
            Some(text) => Status::new(Code::ResourceExhausted, text),
            None => status,
        }
    }
}

impl From<AuthError> for Status {
    fn from(error: AuthError) -> Status {
        match error {
            AuthError::Store(error) => error.into(),
            error => Status::new(auth_error_code(&error), error.to_string()),
        }
    }
}

/// etcd's gRPC code for each auth error (its rpctypes table).
fn auth_error_code(error: &AuthError) -> Code {
    use AuthError::*;
    match error {
        RootUserNotExist | RootRoleNotExist | UserAlreadyExist | UserNotFound
        | RoleAlreadyExist | RoleNotFound | RoleNotGranted | PermissionNotGranted
        | AuthNotEnabled => Code::FailedPrecondition,
        UserEmpty | RoleEmpty | AuthFailed | PermissionNotGiven | InvalidAuthMgmt
        | OldRevisionGrpc => Code::InvalidArgument,
        PermissionDenied => Code::PermissionDenied,
        InvalidAuthToken => Code::Unauthenticated,
        // etcd has no gRPC mapping for these: Unknown, with the text. (A
        // store error is answered as the store's own, above.)
        NoPasswordUser | OldRevision | VerifyOnly | Password(_) | Store(_) => Code::Unknown,
    }
}

impl From<StoreError> for Status {
    fn from(error: StoreError) -> Status {
        match error {
            StoreError::Compacted => Status::new(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            StoreError::FutureRevision => Status::new(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            StoreError::KeyNotFound => errors::key_not_found(),
            StoreError::LeaseNotFound => {
                Status::new(Code::NotFound, "etcdserver: requested lease not found")
            }
            StoreError::LeaseExists => {
                Status::new(Code::FailedPrecondition, "etcdserver: lease already exists")
            }
            StoreError::LeaseTtlTooLarge => {
                Status::new(Code::OutOfRange, "etcdserver: too large lease TTL")
            }
            StoreError::KeyTooLong(limit) => Status::new(
                Code::InvalidArgument,
                format!("cetera: key is longer than the {limit} bytes this datastore can store"),
            ),
            StoreError::NoSpace => Status::new(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            StoreError::Corrupt => Status::new(Code::DataLoss, "etcdserver: corrupt cluster"),
            StoreError::UnknownAlarm(alarm) => Status::new(
                Code::InvalidArgument,
                format!("cetera: unknown alarm type {alarm}"),
            ),
            StoreError::Stopped => Status::new(Code::Unavailable, "etcdserver: server stopped"),
            StoreError::NoLeader => Status::new(Code::Unavailable, "etcdserver: no leader"),
            StoreError::AuthChanged => Status::new(
                Code::Aborted,
                "cetera: the auth state changed meanwhile; try again",
            ),
            StoreError::Timeout => Status::new(Code::Unavailable, "etcdserver: request timed out"),
            StoreError::LeaderChanged => {
                Status::new(Code::Unavailable, "etcdserver: leader changed")
            }
            StoreError::Internal(message) => {
                tracing::error!("internal error: {message}");
                Status::new(Code::Internal, format!("cetera: internal error: {message}"))
            }
            StoreError::Backend(error) if StoreError::is_database_unavailable(&error) => {
                tracing::warn!("database unavailable: {error:#}");
                Status::new(
                    Code::Unavailable,
                    format!("cetera: database unavailable: {error:#}"),
                )
            }
            StoreError::Backend(error) => {
                tracing::error!("database error: {error:#}");
                Status::new(Code::Unknown, format!("cetera: database error: {error:#}"))
            }
        }
    }
}
