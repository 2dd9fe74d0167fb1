//! Counts of key ranges at a revision, remembered between reads so that the
//! pages of a List and repeated limited Ranges skip their COUNT query.
//!
//! A limited Range that has more keys must report how many keys its whole
//! range holds, which costs a scan of the range. The state at a revision
//! never changes once the revision exists, so the count of a range at a
//! revision is a fact that can be kept: a read at an unchanged current
//! revision reuses it, and a page that returned its first `n` keys up to key
//! `L` out of `C` also tells the count of the next page's range,
//! `[L + "\0", end)`, which is `C - n`: exactly what the apiserver asks next.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::backend::KeyRange;

/// Entries per generation; the cache holds at most twice this many.
const GENERATION_ENTRIES: usize = 512;

/// Ranges whose bounds together are longer than this are not kept, so that
/// the cache stays small whatever the keys.
const MAX_BOUND_BYTES: usize = 1024;

/// Range, revision -> count, bounded: when the newer generation is full it
/// becomes the older one and the older one is dropped, so recently used
/// counts (looked up or added) survive and old revisions fall away.
#[derive(Default)]
pub struct CountCache {
    generations: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    newer: HashMap<Entry, i64>,
    older: HashMap<Entry, i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Entry {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    revision: i64,
}

impl Entry {
    fn new(keys: &KeyRange, revision: i64) -> Option<Entry> {
        let bytes = keys.start.len() + keys.end.as_ref().map_or(0, Vec::len);
        (bytes <= MAX_BOUND_BYTES).then(|| Entry {
            start: keys.start.clone(),
            end: keys.end.clone(),
            revision,
        })
    }
}

impl CountCache {
    /// The number of keys in `keys` at `revision`, if known.
    pub fn get(&self, keys: &KeyRange, revision: i64) -> Option<i64> {
        let entry = Entry::new(keys, revision)?;
        let mut generations = self.lock();
        if let Some(&count) = generations.newer.get(&entry) {
            return Some(count);
        }
        let count = generations.older.remove(&entry)?;
        generations.add(entry, count);
        Some(count)
    }

    /// Remembers that `keys` holds `count` keys at `revision`, a revision
    /// that exists (committed, so its state can no longer change).
    pub fn insert(&self, keys: &KeyRange, revision: i64, count: i64) {
        if let Some(entry) = Entry::new(keys, revision) {
            self.lock().add(entry, count);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        // The maps hold no invariant a panic could break halfway.
        self.generations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Generations {
    fn add(&mut self, entry: Entry, count: i64) {
        if self.newer.len() >= GENERATION_ENTRIES && !self.newer.contains_key(&entry) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(entry, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(start: &str, end: &str) -> KeyRange {
        KeyRange {
            start: start.as_bytes().to_vec(),
            end: Some(end.as_bytes().to_vec()),
        }
    }

    #[test]
    fn a_count_is_kept_per_range_and_revision() {
        let cache = CountCache::default();
        cache.insert(&keys("a", "b"), 5, 10);
        assert_eq!(cache.get(&keys("a", "b"), 5), Some(10));
        assert_eq!(cache.get(&keys("a", "b"), 6), None);
        assert_eq!(cache.get(&keys("a", "c"), 5), None);
        let open = KeyRange {
            start: b"a".to_vec(),
            end: None,
        };
        assert_eq!(cache.get(&open, 5), None);
    }

    #[test]
    fn it_stays_bounded_and_keeps_what_is_used() {
        let cache = CountCache::default();
        cache.insert(&keys("used", "z"), 1, 7);
        for i in 0..5 * GENERATION_ENTRIES as i64 {
            cache.insert(&keys("a", "b"), 100 + i, i);
            // Looked up now and then, it survives every turnover.
            if i % (GENERATION_ENTRIES as i64 / 2) == 0 {
                assert_eq!(cache.get(&keys("used", "z"), 1), Some(7));
            }
        }
        let generations = cache.lock();
        assert!(generations.newer.len() + generations.older.len() <= 2 * GENERATION_ENTRIES);
        drop(generations);
        assert_eq!(cache.get(&keys("a", "b"), 100), None);
        assert_eq!(cache.get(&keys("used", "z"), 1), Some(7));
    }

    #[test]
    fn long_bounds_are_not_kept() {
        let cache = CountCache::default();
        let long = "k".repeat(MAX_BOUND_BYTES);
        cache.insert(&keys(&long, "z"), 1, 3);
        assert_eq!(cache.get(&keys(&long, "z"), 1), None);
    }
}
