//! The lease ids a server chooses (LeaseGrant with ID 0), made as etcd makes
//! them: etcd's LeaseGrant takes the next id of its request id generator
//! (pkg/idutil), whose 8 bytes are the low 2 bytes of the member id, the
//! time the generator started in Unix ms (5 bytes), and a counter (1 byte)
//! that carries into the time; the top bit is cleared so that the id is a
//! positive int64. So one server's ids increase, across restarts too (a
//! restarted server starts from a later millisecond, unless it handed out
//! more than 256 ids a millisecond before), and a Txn comparing a key's
//! LEASE with GREATER or LESS answers as on etcd.
//!
//! Two servers that could grant into one lease table get different
//! prefixes: the members of a cluster have their own member ids, as in
//! etcd; instances sharing a PostgreSQL or MySQL database share the member
//! id, so each one takes a number from the database when it opens
//! (`LEASE_ID_INSTANCES`) and adds it to the prefix; a restart takes the
//! next number, so the ids go on increasing there too (until the prefix
//! wraps, once in 32,768 starts). A clash that is left
//! (two prefixes alike, 1 in 65,536 for two members) is caught where the
//! grant is applied and the grant is retried with the next id
//! (`Store::lease_grant`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the timestamp (etcd's tsLen) and of the counter (cntLen).
const TIMESTAMP_BITS: u32 = 40;
const COUNTER_BITS: u32 = 8;
/// The part below the prefix: timestamp and counter.
const SUFFIX_BITS: u32 = TIMESTAMP_BITS + COUNTER_BITS;

/// One server's lease id generator.
#[derive(Debug)]
pub(super) struct LeaseIds {
    /// Added to the member id's low 2 bytes: 0 for a server that is its
    /// database's only writer, the instance's number on a shared database.
    instance: u16,
    /// Timestamp and counter of the last id handed out.
    suffix: AtomicU64,
}

impl LeaseIds {
    /// A generator started at `now_ms` (Unix ms).
    pub(super) fn new(instance: u16, now_ms: u64) -> Self {
        LeaseIds {
            instance,
            suffix: AtomicU64::new(low_bits(now_ms, TIMESTAMP_BITS) << COUNTER_BITS),
        }
    }

    /// The next id for a server whose member id is `member_id` (read at
    /// each grant: a joining member takes its id after it started).
    pub(super) fn next(&self, member_id: u64) -> i64 {
        let prefix = u64::from((member_id as u16).wrapping_add(self.instance)) << SUFFIX_BITS;
        loop {
            let suffix = self.suffix.fetch_add(1, Ordering::Relaxed) + 1;
            let id = (prefix | low_bits(suffix, SUFFIX_BITS)) & i64::MAX as u64;
            if id != 0 {
                return id as i64;
            }
        }
    }
}

/// The low `n` bits of `x`.
fn low_bits(x: u64, n: u32) -> u64 {
    x & (u64::MAX >> (64 - n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_etcds_layout_and_increase() {
        // etcd's generator for member 0x8e9e05c52164694d at 1 700 000 000 000 ms:
        // prefix 0x694d, then the time, then the counter from 1.
        let ids = LeaseIds::new(0, 1_700_000_000_000);
        let first = ids.next(0x8e9e_05c5_2164_694d);
        assert_eq!(
            first as u64,
            (0x694d << 48) | ((1_700_000_000_000 & 0xff_ffff_ffff) << 8) | 1
        );
        let second = ids.next(0x8e9e_05c5_2164_694d);
        assert_eq!(second, first + 1);
        // The counter carries into the time, as etcd's does.
        let many: Vec<i64> = (0..600).map(|_| ids.next(0x694d)).collect();
        assert!(many.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn ids_are_positive_and_a_restart_goes_on_above() {
        // A member id whose low 2 bytes have the top bit set: etcd clears it.
        let before = LeaseIds::new(0, 1_000);
        let last = (0..10).map(|_| before.next(0xffff)).last().unwrap();
        assert!(last > 0);
        let after = LeaseIds::new(0, 1_001);
        assert!(after.next(0xffff) > last);
    }

    #[test]
    fn instances_on_one_database_take_different_prefixes() {
        let a = LeaseIds::new(1, 5_000);
        let b = LeaseIds::new(2, 5_000);
        let from_a: Vec<i64> = (0..1000).map(|_| a.next(42)).collect();
        let from_b: Vec<i64> = (0..1000).map(|_| b.next(42)).collect();
        assert!(from_a.iter().all(|id| !from_b.contains(id)));
    }
}
