//! `StreamRange` on SQLite: each chunk walks the key index on from just
//! after the last key handed out (a lookup in memory, not a new SQL query
//! over the keys) and fetches its rows by id, at the stream's revision. A
//! chunk holds the index's lock only while it walks its own keys, and the
//! database only while it reads its rows (`SqliteRead::let_go`), so a long
//! stream, or one waiting for a slow client, never stalls the writer. Every
//! chunk sees the same revision: log rows do not change, and compaction
//! past the revision fails the stream (`Compacted`), as it would the index.

use crate::backend::range_stream::{RangeRows, StreamRange};
use crate::backend::sqlite::SqliteRead;
use crate::backend::{BackendResult, KeyRange, ReadAt, ReadTxn};
use crate::proto::mvccpb::KeyValue;

impl StreamRange for SqliteRead {
    type Rows<'a> = KeysetRows<'a>;

    async fn range_rows<'a>(
        &'a mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<KeysetRows<'a>> {
        Ok(KeysetRows {
            txn: self,
            next: Some(range.clone()),
            at,
            left: (limit > 0).then_some(limit),
            keys_only,
        })
    }
}

/// The rest of a range, read a chunk at a time from where the last chunk ended.
pub struct KeysetRows<'a> {
    txn: &'a mut SqliteRead,
    /// What is left of the range; None once it is exhausted.
    next: Option<KeyRange>,
    at: ReadAt,
    /// Rows still allowed by the caller's limit, if it gave one.
    left: Option<usize>,
    keys_only: bool,
}

impl RangeRows for KeysetRows<'_> {
    async fn next_chunk(&mut self, n: usize) -> BackendResult<Vec<KeyValue>> {
        let n = self.left.map_or(n, |left| left.min(n));
        let Some(range) = self.next.as_mut().filter(|_| n > 0) else {
            return Ok(Vec::new());
        };
        let kvs = self.txn.range(range, self.at, n, self.keys_only).await?;
        // The stream now waits for its client.
        self.txn.let_go()?;
        if let Some(left) = &mut self.left {
            *left -= kvs.len();
        }
        match kvs.last() {
            Some(last) if kvs.len() == n => {
                // The smallest key after `last`.
                range.start.clear();
                range.start.extend_from_slice(&last.key);
                range.start.push(0);
            }
            _ => self.next = None,
        }
        Ok(kvs)
    }
}
