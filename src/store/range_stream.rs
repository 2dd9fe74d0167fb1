//! etcd 3.7's RangeStream (`rangeStream` in server/etcdserver/v3_server.go
//! of etcd v3.7.1): a Range's result sent in chunks that, merged, equal the
//! Range. etcd reads each chunk with a Range of its own at the revision the
//! first one pinned; here the chunks come from one query in one read
//! transaction, so the revision is pinned by the snapshot and the count is
//! computed once, at the end, only when the limit cut the result.
//!
//! As etcd: the first chunk holds 10 keys, and each next one twice as many
//! while a chunk takes under half of --max-request-bytes (half as many above
//! twice that); `header`, `more` and `count` come on the last chunk only; a
//! compaction past the pinned revision ends the stream with the compacted
//! error. Custom sort orders and revision filters are refused by the API
//! layer, as etcd refuses them.

use std::future::Future;

use prost::Message;

use super::Store;
use super::error::{StoreError, StoreResult};
use super::range::{self, Counter, check_revision, key_range};
use crate::backend::range_stream::{RangeRows, StreamRange};
use crate::backend::{Backend, ReadAt, ReadTxn};
use crate::proto::etcdserverpb::range_request::SortTarget;
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use crate::proto::mvccpb::KeyValue;

/// Keys in a stream's first chunk (etcd's initialStreamChunkLimit).
pub const FIRST_CHUNK_KEYS: usize = 10;

/// Where a stream's chunks go (the gRPC stream, which completes the last
/// chunk's header with the ids).
pub trait ChunkSink: Send {
    /// Sends `chunk`; false once the client is gone.
    fn send(&mut self, chunk: RangeResponse) -> impl Future<Output = bool> + Send;
}

/// etcd's adjustChunkLimit: the keys for the chunk after one of `keys` keys
/// that took `bytes`, aiming at `target` bytes. Changing only outside
/// [target/2, 2 target] keeps it from flapping around the target.
pub fn next_chunk_keys(keys: usize, bytes: usize, target: usize) -> usize {
    let keys = if bytes < target / 2 {
        keys.saturating_mul(2)
    } else if bytes > target.saturating_mul(2) {
        keys / 2
    } else {
        keys
    };
    keys.max(1)
}

impl<B: Backend> Store<B> {
    /// etcd RangeStream: sends `req`'s result to `sink` in chunks aiming at
    /// `target_bytes` each (etcd's --max-request-bytes). Returns once the
    /// last chunk is sent or the client is gone; an error ends the stream.
    pub async fn range_stream(
        &self,
        req: &RangeRequest,
        target_bytes: usize,
        sink: &mut impl ChunkSink,
    ) -> StoreResult<()> {
        if !req.serializable {
            self.read_barrier().await?;
        }
        let mut txn = self.backend.read().await?;
        let revs = txn.revisions().await?;
        let keys = key_range(&req.key, &req.range_end);
        let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
        // A count, an empty interval: one chunk, as etcd sends. A target
        // other than KEY with order NONE means ascending by that target:
        // etcd sorts each chunk on its own (and continues after the key that
        // sorted last, repeating keys), so the chunks no longer merge into
        // the Range; here the Range is answered whole, as one chunk.
        if req.count_only || keys.is_empty() || target != SortTarget::Key {
            let resp = range::range(
                &mut txn,
                req,
                revs.current,
                revs.compact,
                Some(&self.counts),
            )
            .await?;
            sink.send(resp).await;
            return Ok(());
        }

        let revision = check_revision(req.revision, revs.current, revs.compact)?;
        let at = if revision == revs.current {
            ReadAt::Current
        } else {
            ReadAt::Revision(revision)
        };
        // A negative limit is no limit, for Range and here.
        let limit = usize::try_from(req.limit).unwrap_or(0);
        // One row past the limit tells whether the limit cut the range.
        let fetch = if limit > 0 { limit + 1 } else { 0 };
        let rows = txn.range_rows(&keys, at, fetch, req.keys_only).await?;
        let mut rows = Lookahead {
            rows,
            pending: None,
        };
        let mut chunk_keys = FIRST_CHUNK_KEYS;
        let mut sent = 0;
        loop {
            if limit > 0 {
                chunk_keys = chunk_keys.min(limit - sent);
            }
            if sent > 0 {
                self.check_not_compacted(revision)?;
            }
            let (mut kvs, more) = rows.take(chunk_keys).await?;
            sent += kvs.len();
            if req.keys_only {
                for kv in &mut kvs {
                    kv.value.clear();
                }
            }
            if more && (limit == 0 || sent < limit) {
                let chunk = RangeResponse {
                    kvs,
                    ..Default::default()
                };
                let bytes = chunk.encoded_len();
                if !sink.send(chunk).await {
                    return Ok(());
                }
                chunk_keys = next_chunk_keys(chunk_keys, bytes, target_bytes);
                continue;
            }
            drop(rows);
            let count = if more {
                // The limit cut the range: count it all, once.
                self.check_not_compacted(revision)?;
                Counter::plain(&keys, revision, at, Some(&self.counts))
                    .count(&mut txn)
                    .await?
            } else {
                sent as i64
            };
            sink.send(RangeResponse {
                header: Some(ResponseHeader {
                    revision: revs.current,
                    ..Default::default()
                }),
                kvs,
                more,
                count,
            })
            .await;
            return Ok(());
        }
    }

    /// Fails once a compaction passed `revision`, as each of etcd's chunk
    /// reads at the pinned revision would.
    fn check_not_compacted(&self, revision: i64) -> StoreResult<()> {
        if revision < self.revisions().compact {
            return Err(StoreError::Compacted);
        }
        Ok(())
    }
}

/// Rows read one ahead, so that a chunk knows whether it is the last.
struct Lookahead<R> {
    rows: R,
    pending: Option<KeyValue>,
}

impl<R: RangeRows> Lookahead<R> {
    /// The next `n` rows (n >= 1), and whether more follow.
    async fn take(&mut self, n: usize) -> StoreResult<(Vec<KeyValue>, bool)> {
        let mut kvs = Vec::with_capacity(n + 1);
        kvs.extend(self.pending.take());
        let wanted = n + 1 - kvs.len();
        kvs.extend(self.rows.next_chunk(wanted).await?);
        let more = kvs.len() > n;
        if more {
            self.pending = kvs.pop();
        }
        Ok((kvs, more))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_grow_and_shrink_as_etcds() {
        let target = 1000;
        assert_eq!(next_chunk_keys(10, 499, target), 20);
        assert_eq!(next_chunk_keys(10, 500, target), 10);
        assert_eq!(next_chunk_keys(10, 2000, target), 10);
        assert_eq!(next_chunk_keys(10, 2001, target), 5);
        assert_eq!(next_chunk_keys(1, 5000, target), 1);
    }
}
