//! The HashKV of each compaction's revision, taken just before the
//! compaction removed that history, as etcd 3.6 and later keep it (the
//! hash storage of server/storage/mvcc/hash.go, which its compact-hash
//! corruption check compares across members): HashKV at one of those
//! revisions answers the kept digest rather than refusing the revision as
//! compacted. Like etcd's, the digests live in memory, the latest
//! [`KEPT`] of them, and are gone after a restart.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::hash::KvHash;

/// How many digests are kept (etcd's hashStorageMaxSize).
const KEPT: usize = 10;

/// The digests of the latest compactions, by revision.
#[derive(Default)]
pub struct CompactionHashes(Mutex<VecDeque<KvHash>>);

impl CompactionHashes {
    /// Keeps `hashed`, the digest at a compaction's revision taken before
    /// it, dropping the oldest beyond [`KEPT`].
    pub fn record(&self, hashed: KvHash) {
        let mut kept = self.0.lock().expect("compaction hashes lock");
        kept.retain(|h| h.revision != hashed.revision);
        let at = kept.partition_point(|h| h.revision < hashed.revision);
        kept.insert(at, hashed);
        while kept.len() > KEPT {
            kept.pop_front();
        }
    }

    /// The digest kept for `revision`, if any.
    pub fn at(&self, revision: i64) -> Option<KvHash> {
        let kept = self.0.lock().expect("compaction hashes lock");
        kept.iter().find(|h| h.revision == revision).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashed(revision: i64) -> KvHash {
        KvHash {
            hash: revision as u32,
            current: revision,
            compact: -1,
            revision,
        }
    }

    #[test]
    fn keeps_the_latest_ten_by_revision() {
        let kept = CompactionHashes::default();
        for revision in (1..=12).rev() {
            kept.record(hashed(revision));
        }
        assert_eq!(kept.at(5), Some(hashed(5)));
        kept.record(hashed(13));
        assert_eq!(kept.at(3), None, "the oldest goes first");
        assert_eq!(kept.at(13), Some(hashed(13)));
        assert_eq!(kept.at(0), None);
    }
}
