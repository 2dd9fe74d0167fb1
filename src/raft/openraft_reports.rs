//! openraft's own reports of each failed call to a peer, which cetera's log
//! leaves out: openraft 0.9.25 logs every failed append or heartbeat to a
//! silent peer (`RPCError`, `error replication to target`, `update
//! progress error`, `heartbeat error`, many a second)
//! and every peer that missed a leadership check for a linearizable read
//! (`timeout while confirming leadership for read request`, one per read
//! and peer). The peer connections report the same condition once when it
//! starts and once when it ends (`reachability`).
//!
//! openraft is pinned exactly (`=0.9.25` in Cargo.toml), so its call sites
//! are named by module and line; tests/cluster.rs bounds the log lines a
//! partition makes, which fails if an upgrade moves them.

use tracing::{Level, Metadata};

/// The call sites: (target, level, line).
const PER_CALL: [(&str, Level, u32); 5] = [
    // `error replication to target=N` and `RPCError`: each failed append.
    ("openraft::replication", Level::WARN, 258),
    ("openraft::replication", Level::ERROR, 284),
    // `update progress error` and `heartbeat error`: each failed append or
    // heartbeat, as the leader's engine hears of it.
    (
        "openraft::engine::handler::replication_handler",
        Level::WARN,
        287,
    ),
    (
        "openraft::engine::handler::replication_handler",
        Level::WARN,
        294,
    ),
    // `timeout while confirming leadership for read request`.
    ("openraft::core::raft_core", Level::ERROR, 383),
];

/// Whether an event is one of openraft's reports of a single failed call.
pub fn is_per_call_report(metadata: &Metadata<'_>) -> bool {
    metadata.is_event()
        && PER_CALL.iter().any(|(target, level, line)| {
            metadata.target() == *target
                && metadata.level() == level
                && metadata.line() == Some(*line)
        })
}
