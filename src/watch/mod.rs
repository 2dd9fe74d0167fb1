//! etcd's watch semantics: the hub that carries committed revisions to
//! watchers, and the per-stream session that applies etcd's rules (start
//! revisions, filters, compaction, progress, fragments) for the Watch RPC.

pub mod hub;
pub mod session;
