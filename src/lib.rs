//! cetera: an etcd v3 API server whose data lives in a relational database.
//!
//! Layers, top to bottom: `api` (one module per etcd gRPC service) calls the
//! `store` (etcd's semantics: revisions, txns, compaction), which runs on a
//! `backend` (one module per SQL dialect). `server` wires them together.
//! Dependencies point down only: nothing below the store imports it, auth
//! or config.
//!
//! # Layout
//!
//! Public modules are what the `cetera` binary and the integration tests
//! use (the tests build fixtures through `backend`); the rest are private
//! to the crate.
//!
//! - [`server`]: opens the datastore, builds the store, serves the gRPC
//!   services until shutdown; client TLS, the gRPC metrics layer, and the
//!   HTTP server for /metrics and the health endpoints.
//! - [`config`]: the command line (etcd's and k3s's flag names); hands plain
//!   values down.
//! - `api`: one module per etcd service (KV, Watch, Lease, Maintenance,
//!   Cluster, Auth, Lock, Election): validation, limits, etcd's errors.
//! - `auth`: users, roles, permissions and tokens, and the checks the
//!   services make.
//! - `watch`: one Watch stream's session, with etcd's watcher rules.
//! - `raft`: replicated mode, the store as openraft's state machine.
//! - [`migrate`] and [`restore`]: the `cetera migrate` and `cetera restore`
//!   commands.
//! - `metrics`: the Prometheus registry the layers count in.
//! - `store`: etcd's semantics, written once: ranges, the writer, leases,
//!   compaction, alarms, hashes, the watch hub.
//! - [`backend`]: storage primitives per SQL dialect (SQLite, PostgreSQL,
//!   MySQL), snapshots copied through them, and opening any datastore.
//! - [`proto`]: the generated etcd v3 and peer protocol types.

pub(crate) mod api;
pub(crate) mod auth;
pub mod backend;
pub mod bbolt;
pub mod config;
pub(crate) mod metrics;
pub mod migrate;
/// The generated etcd v3 and peer protocol types, from the `cetera-proto` crate.
pub use cetera_proto as proto;
pub(crate) mod raft;
pub mod restore;
pub mod server;
pub(crate) mod store;
pub(crate) mod watch;
