//! `cetera-proto`: the wire protocol of cetera, as Rust types and gRPC stubs
//! generated at build time (prost messages, tonic clients and servers) from
//! the `.proto` files in this crate's `proto/`: etcd's v3.5 protocol (field
//! numbers as etcd's) and `ceterapb`, the peer service between the members of
//! a replicated cluster. `build.rs` compiles them with the pure-Rust `protox`,
//! so no system `protoc` is needed.
//!
//! The server re-exports this crate as `cetera::proto`; `cetera-bench` uses
//! its clients directly; `ops` builds the ops a Txn carries, for both and
//! for the server's tests. The packages are sibling modules so that
//! generated cross-package paths such as `super::mvccpb::KeyValue` resolve.

/// Stored key-values and watch events.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// Users, roles and permissions.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// The KV, Watch, Lease, Cluster, Maintenance and Auth services.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The Lock service.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// The Election service.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// cetera's peer service between the members of a replicated cluster.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod ceterapb {
    tonic::include_proto!("ceterapb");
}

/// Builders of the ops a Txn carries.
pub mod ops;
