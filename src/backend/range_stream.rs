//! Reading one range in chunks from one read transaction, for etcd 3.7's
//! RangeStream: the rows come from a single query streamed as the caller
//! takes them (where the database allows it), so memory holds a chunk, not
//! the result, and every chunk sees the transaction's snapshot.

use std::future::Future;

use super::{BackendResult, KeyRange, ReadAt, ReadTxn};
use crate::proto::mvccpb::KeyValue;

/// A read transaction that can hand out a range's rows a chunk at a time.
pub trait StreamRange: ReadTxn {
    /// The open rows; they borrow the transaction until dropped.
    type Rows<'a>: RangeRows
    where
        Self: 'a;

    /// The keys in `range` at `at`, ascending by key, at most `limit`
    /// (0 = all), to be taken with [`RangeRows::next_chunk`]. With
    /// `keys_only` the values may be left empty.
    fn range_rows<'a>(
        &'a mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> impl Future<Output = BackendResult<Self::Rows<'a>>> + Send;
}

/// The rows of one range, in key order.
pub trait RangeRows: Send {
    /// The next `n` rows (at least 1), fewer only when the range ends.
    fn next_chunk(&mut self, n: usize)
    -> impl Future<Output = BackendResult<Vec<KeyValue>>> + Send;
}
