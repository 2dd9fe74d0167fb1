//! Shared harness for the integration tests: starts the cetera binary and real etcd
//! (the oracle: 3.7.3, or 3.5.1 with `CETERA_TEST_ETCD=3.5`) as child processes on free local ports, waits until they answer gRPC, finds
//! the reference etcdctl binaries, and compares cetera with etcd step by step.
//!
//! # Layout
//!
//! - `process`: a server child process with its log, free ports, readiness, signals.
//! - `cetera_server`: [`Cetera`], the server under test on a fresh datastore.
//! - `etcd_server`: [`Etcd`], the reference etcd (the oracle), one member.
//! - `reference_binaries`: which etcd is the oracle; where etcd, etcdctl and etcdutl
//!   3.7/3.5 and etcdctl 3.4 are; skip or fail without them.
//! - `etcdctl`: running etcdctl, and normalizing its output for comparison.
//! - `client`: a gRPC [`channel`] to a server, and [`ClientTls`] for TLS servers.
//! - `watch_stream`: [`WatchStream`], a raw Watch stream with queued requests.
//! - `show`: one-line text forms of keys, events and responses ([`show_kv`], ...).
//! - `differential`: [`differential`] runs a scenario on etcd and cetera; [`Side`].
//! - `kv_fixtures`: puts, deletions, compactions and reads of test data over the KV client.
//! - `datastore`: the backend of a run (CETERA_TEST_BACKEND) and fresh databases.
//! - `cluster`: a replicated cetera cluster, with fault proxies between members.
//! - `etcd_cluster`: a real etcd cluster of N members.
//! - `fault_proxy`: a TCP proxy that can cut, block or slow a link.
//! - `http`: plain HTTP/1.1 GETs, for metrics and health endpoints.
//! - `certs`: test CA and certificates.
//! - `linearizability`: a linearizability checker for recorded histories.
//! - `migration`: helpers of the `cetera migrate` tests.
//!
//! The items tests use most are re-exported here, so `use common::{Cetera, Etcd}` works.

// Every test crate includes this module and uses only part of it (hence also the
// `unused_imports` allowance on the re-exports below).
#![allow(dead_code)]

pub mod certs;
pub mod cetera_server;
pub mod client;
pub mod cluster;
pub mod datastore;
pub mod differential;
pub mod etcd_cluster;
pub mod etcd_server;
pub mod etcdctl;
pub mod fault_proxy;
pub mod http;
pub mod kv_fixtures;
pub mod linearizability;
pub mod migration;
pub mod process;
pub mod reference_binaries;
pub mod show;
pub mod watch_stream;

#[allow(unused_imports)]
pub use self::{
    cetera_server::{Cetera, cluster_mode},
    client::{ClientTls, channel},
    differential::{Side, WAIT, differential, self_check},
    etcd_server::{Etcd, progress_notify_interval_flag},
    etcdctl::{normalize_etcdctl, run_etcdctl, run_etcdctl_with_stdin},
    process::free_port,
    reference_binaries::{Oracle, etcd_bin, etcdctl_34, etcdctl_35, in_ci, oracle},
    show::{header_rev, outcome, show, show_event, show_kv, show_watch_response},
    watch_stream::WatchStream,
};
