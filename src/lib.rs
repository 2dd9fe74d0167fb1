//! cetera: an etcd v3 API server whose data lives in a relational database.
//!
//! Layers, top to bottom: `api` (one module per etcd gRPC service) calls the
//! `store` (etcd's semantics: revisions, txns, compaction), which runs on a
//! `backend` (one module per SQL dialect). `server` wires them together.
//! Dependencies point down only: each module below imports only modules
//! listed after it (and `proto`), never one listed before it.
//!
//! # Layout
//!
//! The one map of the repository; README.md and ARCHITECTURE.md point here.
//! Public modules are what the `cetera` binary, the integration tests and
//! the fuzz targets use; the rest are private to the crate.
//!
//! - `src/main.rs`: the `cetera` binary: parses [`config`], then serves,
//!   migrates or restores.
//! - [`restore`] (`src/restore.rs`): `cetera restore FILE`, an etcd snapshot
//!   (through `migrate::etcd_snapshot`) or a cetera SQLite one.
//! - [`migrate`] (`src/migrate.rs`, `src/migrate/`): `cetera migrate` between
//!   datastores and its check; `etcd.rs` imports a live etcd, `export.rs`
//!   exports into one, `etcd_snapshot.rs` imports an etcd snapshot file,
//!   `kine.rs`, `kine_rows.rs`, `kine_source.rs` a kine datastore.
//! - [`server`] (`src/server/`): opens the datastore, builds the store,
//!   serves the gRPC services and the HTTP gateway until shutdown
//!   (`mod.rs`); the client listeners, one port for HTTP/2 and HTTP/1.1,
//!   and `--listen-metrics-urls` (`listeners.rs`); client TLS (`tls.rs`),
//!   the gRPC metrics layer (`grpc_metrics.rs`), the `:authority` repair
//!   (`authority.rs`), and the HTTP server for /metrics and the health
//!   endpoints (`metrics_server.rs`).
//! - `gateway` (`src/gateway/`): etcd's HTTP face on the client port: the
//!   grpc-gateway JSON routes (`mod.rs`), calling the `api` services in
//!   process, their JSON forms and errors (`json.rs`), and /version,
//!   /health, /metrics, /livez, /readyz (`endpoints.rs`). A transport, so it
//!   stands beside `api`, not inside it.
//! - `api` (`src/api/`): one module per etcd service (`kv`, `watch`, `lease`,
//!   `maintenance`, `cluster`, `auth`, `lock`, `election`): validation,
//!   limits, etcd's errors, header ids (`mod.rs`). Beside them:
//!   `prefix_queue.rs` (the waiting line of Lock and Election),
//!   `require_leader.rs` (etcd's `hasleader` metadata: calls and streams
//!   that fail on a member without a leader),
//!   `downgrade.rs` and `status_fields.rs` (what Maintenance answers per
//!   emulated version), `version.rs` (major.minor of a version),
//!   `go_decode.rs` (how a Go server reads a WatchRequest, and its error for one that does not decode).
//! - [`config`] (`src/config.rs`): the command line (etcd's and k3s's flag
//!   names); hands plain values down. `config/etcd.rs`: etcd's flags without
//!   effect, `ETCD_*` variables and `--config-file` YAML, read as etcd reads
//!   them.
//! - `auth` (`src/auth/`): users, roles, permissions (`perms.rs`), simple
//!   tokens (`tokens.rs`), JWT tokens (`jwt.rs`), the management calls (`manage.rs`) and the checks
//!   the services make (`mod.rs`), with etcd's auth errors (`error.rs`).
//! - `watch` (`src/watch/`): one Watch stream's session, with etcd's watcher
//!   rules (`session.rs`).
//! - `raft` (`src/raft/`): replicated mode, the store as openraft's state
//!   machine. Top-down, no file importing one above it: a member
//!   (`cluster.rs`) and the server side of its peer service (`peer.rs`);
//!   the parts, each working on the member's Raft node: joining and
//!   membership (`membership.rs`), leadership handover (`leadership.rs`),
//!   elections after a pre-vote (`election.rs`), lease calls for the
//!   leader (`leases.rs`), the probes of the other members (`prober.rs`),
//!   and the one loop that has the leader take a write, give a read index
//!   or answer a lease call, each with its own resend rules
//!   (`leader_call.rs`); the node and the state the parts share
//!   (`node.rs`); the leader's proposals gathered into entries
//!   (`proposer.rs`), a follower's sent to the leader together
//!   (`forwarder.rs`), the client side of the peer service (`network.rs`,
//!   each peer's reachability for the log in `reachability.rs`, a failed
//!   call in `peer_error.rs`), the state machine (`state_machine.rs`), the
//!   log (`log_store.rs`; `log_store/legacy.rs` carries an older cetera's
//!   SQLite log over); at the bottom openraft's types for cetera
//!   (`openraft_types.rs`) and its per-call reports (`openraft_reports.rs`),
//!   the log's entries (`proposal.rs`), a leader's refusals
//!   (`refusal.rs`), a member's addresses (`member.rs`). Both sides of the
//!   peer service count etcd's peer metrics.
//! - `store` (`src/store/`): etcd's semantics, written once. `mod.rs` is
//!   `Store`: reads on snapshots, writes as `request.rs`'s `WriteRequest`s
//!   through `routing.rs` (the replicated log, or the local writer) to
//!   `writer.rs` (group commit), which applies them with `apply.rs` and
//!   `apply/lease.rs`. Beside them: `range.rs`, `range_stream.rs`,
//!   `count_cache.rs` (reads), `alarm.rs` (quota and alarms),
//!   `lease_deadlines.rs` (keep-alives answered from memory),
//!   `leader_leases.rs` (a cluster leader's lease deadlines), `hub.rs` and
//!   `publisher.rs` (recent revisions for watchers), `history.rs` (older
//!   ones from the log), `hash.rs` (Hash, HashKV), `settings.rs` (identity,
//!   auth flags), `replica.rs` (the handle Raft works through), `error.rs`;
//!   `background/` (compactor, lease expirer, automatic compaction, the
//!   poller of other instances' commits); `conformance.rs` (tests: etcd's
//!   semantics, run on every dialect).
//! - [`bbolt`] (`src/bbolt/`): etcd's bbolt format: the file reader
//!   (`reader.rs`) and writer (`writer.rs`), etcd's bucket records
//!   (`records.rs`), the etcd snapshot the Snapshot RPC streams
//!   (`snapshot.rs`).
//! - [`backend`] (`src/backend/`): storage primitives (the `Backend`,
//!   `ReadTxn`, `WriteTxn` traits in `mod.rs`), one module per SQL dialect
//!   (`sqlite/`, with its record log in front, `postgres/`, `mysql/`); shared: row decoding (`rows.rs`),
//!   streamed ranges (`range_stream.rs`), other instances' commits
//!   (`changes.rs`), one-key Ranges gathered into few statements on the
//!   server databases (`key_reads.rs`), what a server database's write
//!   transaction read ahead or wrote (`read_ahead.rs`), what an endpoint names (`datastore.rs`), opening any
//!   datastore (`open.rs`), the settings rows (`settings.rs`), cetera's
//!   SQLite snapshots (`snapshot.rs`).
//! - `frame_file` (`src/frame_file.rs`): checksummed frames in a preallocated
//!   file reused in generations, etcd's WAL shape: the file under the SQLite
//!   record log and the Raft log.
//! - `metrics` (`src/metrics/`): the Prometheus registry every layer counts in
//!   (`mod.rs`), and the process metrics with CPU to the tick (`process.rs`).
//! - `go_duration` (`src/go_duration.rs`): Go's duration syntax, for the etcd
//!   flags written that way.
//! - [`proto`]: the generated etcd v3 and peer protocol types, from
//!   `crates/cetera-proto` (the `.proto` files, compiled by its `build.rs`
//!   with protox), with the Txn op builders (`proto::ops`) the server, the
//!   tests and the bench share.
//!
//! Outside `src/`: `migrations/` (the schema per dialect), `tests/`
//! (end-to-end and differential against real etcd; `tests/common/` starts
//! etcd and cetera side by side), `fuzz/` (cargo-fuzz targets for the bbolt
//! reader and the snapshot loader), `crates/cetera-bench` (the benchmark
//! client, on `cetera-proto` alone), `scripts/` (test dependencies, the
//! test command, the benchmark runners).

pub(crate) mod api;
pub(crate) mod auth;
pub mod backend;
pub mod bbolt;
pub mod config;
pub(crate) mod frame_file;
pub(crate) mod gateway;
pub(crate) mod go_duration;
pub(crate) mod metrics;
pub mod migrate;
/// The generated etcd v3 and peer protocol types, from the `cetera-proto` crate.
pub use cetera_proto as proto;
pub(crate) mod raft;
/// For the binary's log filter: openraft's reports of single failed calls.
pub use raft::is_per_call_report as is_openraft_per_call_report;
pub mod restore;
pub mod server;
pub(crate) mod store;
pub(crate) mod watch;
