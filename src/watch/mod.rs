//! etcd's watch semantics: the per-stream session that applies etcd's rules
//! (start revisions, filters, compaction, progress, fragments) for the Watch
//! RPC, on the revisions the store's hub carries.

pub mod session;
