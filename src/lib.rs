//! cetera: an etcd v3 API server whose data lives in a relational database.
//!
//! Layers, top to bottom: `api` (one module per etcd gRPC service) calls the
//! `store` (etcd's semantics: revisions, txns, compaction), which runs on a
//! `backend` (one module per SQL dialect). `server` wires them together.

pub mod api;
pub mod auth;
pub mod backend;
pub mod config;
pub mod metrics;
pub mod migrate;
/// The generated etcd v3 and peer protocol types, from the `cetera-proto` crate.
pub use cetera_proto as proto;
pub mod raft;
pub mod restore;
pub mod server;
pub mod store;
pub mod watch;
