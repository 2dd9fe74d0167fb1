//! The requests that write and read test data over the raw KV client: puts,
//! range deletions, compactions, and reads of one key or of every key.

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, DeleteRangeResponse, PutRequest, RangeRequest,
    RangeResponse,
};
use tonic::transport::Channel;

/// A Put of `key=value` under `lease` (0: none).
pub fn put_request(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..Default::default()
    }
}

/// A Range of every key (`[\0, \0)`) at `revision` (0: the current one).
pub fn range_all(revision: i64) -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision,
        ..Default::default()
    }
}

/// Reads `key` at the current revision; panics on an error.
pub async fn get(kv: &mut KvClient<Channel>, key: &str) -> RangeResponse {
    kv.range(RangeRequest {
        key: key.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Deletes `[key, range_end)` (one key when `range_end` is empty); panics on an error.
pub async fn delete_range(
    kv: &mut KvClient<Channel>,
    key: &str,
    range_end: &str,
) -> DeleteRangeResponse {
    kv.delete_range(DeleteRangeRequest {
        key: key.into(),
        range_end: range_end.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Compacts at `revision`, waiting for the physical compaction; panics on an error.
pub async fn compact(kv: &mut KvClient<Channel>, revision: i64) {
    kv.compact(CompactionRequest {
        revision,
        physical: true,
    })
    .await
    .unwrap();
}

/// Deletes `[key, range_end)`, then compacts physically at the deletion's revision, so
/// that the deleted keys' history is gone; returns the deletion's response.
pub async fn delete_and_compact(
    kv: &mut KvClient<Channel>,
    key: &str,
    range_end: &str,
) -> DeleteRangeResponse {
    let deleted = delete_range(kv, key, range_end).await;
    compact(kv, deleted.header.as_ref().unwrap().revision).await;
    deleted
}
