//! etcd's bbolt format, in one place: the reader of bbolt files (`reader`),
//! the writer of them (`writer`), the records etcd 3.5 keeps in its buckets
//! (`records`: the `key` bucket's revision keys and KeyValues, which rows of
//! the log it holds after compaction, the `lease` bucket's leasepb.Lease),
//! and the etcd v3 snapshot built of them (`snapshot`). The store's Snapshot
//! RPC and HashKV, `cetera migrate --from etcd-snapshot://` and `cetera
//! restore` use it; it reads the store only through `crate::backend`.

pub mod reader;
pub mod records;
pub mod snapshot;
pub mod writer;

pub use self::reader::{Db, is_bbolt};
