//! Lease deadlines in a cluster, kept as etcd's lessor keeps them: by the
//! leader alone, in memory. A keep-alive moves a lease's deadline on the
//! leader without a write (a follower asks the leader, `LeaseCall`), so it
//! costs no entry in the replicated log and no fsync on any member, and it
//! is answered while a slow disk holds writes up. The database keeps each
//! lease's deadline from its grant: a lower bound of the real one.
//!
//! A member that becomes leader knows no keep-alive its predecessor
//! answered; as etcd's Promote, it gives every lease granted before then a
//! full TTL from its promotion, and an election timeout more
//! (`PROMOTION_EXTEND`). Any deadline the old leader promised (its
//! keep-alive time + TTL, before the new leader's election) is earlier, so
//! no lease expires before a keep-alive said it would.

use std::collections::HashMap;
use std::sync::Mutex;

use super::apply::lease_deadline;
use super::routing::Leadership;
use crate::backend::LeaseRow;

/// What a new leader adds to every older lease's TTL (ms): etcd's election
/// timeout, as its Promote adds.
const PROMOTION_EXTEND_MS: i64 = 1_000;

/// How long (ms) a renewed deadline that passed is remembered: past it,
/// the lease expired (or was revoked through another member) and the
/// entry only takes room.
const FORGET_AFTER_MS: i64 = 60_000;

/// The leader's view of the leases' deadlines (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct LeaderLeases {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The leadership the renewals below belong to.
    leadership: Option<Leadership>,
    /// Deadlines keep-alives in this leadership moved, by lease id.
    renewed: HashMap<i64, i64>,
}

impl Inner {
    /// Notes that this member leads in `leadership`: a new term starts
    /// without the old one's renewals.
    fn lead(&mut self, leadership: Leadership) {
        if self.leadership != Some(leadership) {
            self.leadership = Some(leadership);
            self.renewed.clear();
        }
    }

    /// The deadline of `lease` (as the database holds it) on this leader.
    fn deadline(&self, lease: &LeaseRow) -> i64 {
        let promoted_at = self.leadership.map_or(i64::MIN, |l| l.since_ms);
        // Granted or last stored before the promotion: a full TTL from it.
        let stored_from = lease
            .expires_at
            .saturating_sub(lease.ttl.saturating_mul(1000));
        let promoted = if stored_from < promoted_at {
            lease_deadline(promoted_at + PROMOTION_EXTEND_MS, lease.ttl)
        } else {
            i64::MIN
        };
        let renewed = self.renewed.get(&lease.id).copied().unwrap_or(i64::MIN);
        lease.expires_at.max(promoted).max(renewed)
    }
}

impl LeaderLeases {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("leader leases poisoned")
    }

    /// The deadline (Unix ms) of `lease` on this member, leading in
    /// `leadership`.
    pub(crate) fn deadline(&self, leadership: Leadership, lease: &LeaseRow) -> i64 {
        let mut inner = self.inner();
        inner.lead(leadership);
        inner.deadline(lease)
    }

    /// A keep-alive of `lease` at `now_ms`, leading in `leadership`: its TTL
    /// once renewed, or `None` when its deadline passed (its expiry is on
    /// the way; etcd answers such a keep-alive as one of an unknown lease).
    pub(crate) fn renew(
        &self,
        leadership: Leadership,
        now_ms: i64,
        lease: &LeaseRow,
    ) -> Option<i64> {
        let mut inner = self.inner();
        inner.lead(leadership);
        if inner.deadline(lease) <= now_ms {
            return None;
        }
        inner
            .renewed
            .insert(lease.id, lease_deadline(now_ms, lease.ttl));
        Some(lease.ttl)
    }

    /// Of `leases` (every lease the database holds), those whose deadline
    /// passed at `now_ms`, at most `limit`, soonest first; forgets renewals
    /// long past.
    pub(crate) fn expired(
        &self,
        leadership: Leadership,
        now_ms: i64,
        leases: &[LeaseRow],
        limit: usize,
    ) -> Vec<i64> {
        let mut inner = self.inner();
        inner.lead(leadership);
        inner
            .renewed
            .retain(|_, deadline| *deadline > now_ms - FORGET_AFTER_MS);
        let mut expired: Vec<(i64, i64)> = leases
            .iter()
            .map(|lease| (inner.deadline(lease), lease.id))
            .filter(|(deadline, _)| *deadline <= now_ms)
            .collect();
        expired.sort_unstable();
        expired.into_iter().take(limit).map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: i64, ttl: i64, from_ms: i64) -> LeaseRow {
        LeaseRow {
            id,
            ttl,
            expires_at: lease_deadline(from_ms, ttl),
        }
    }

    fn leading(term: u64, since_ms: i64) -> Leadership {
        Leadership { term, since_ms }
    }

    #[test]
    fn a_keep_alive_moves_the_deadline_until_it_passed() {
        let leases = LeaderLeases::default();
        let term = leading(1, 0);
        let granted = lease(1, 2, 1_000);
        assert_eq!(leases.deadline(term, &granted), 3_000);
        assert_eq!(leases.renew(term, 2_500, &granted), Some(2));
        assert_eq!(leases.deadline(term, &granted), 4_500);
        assert_eq!(
            leases.expired(term, 4_000, &[granted], 10),
            Vec::<i64>::new()
        );
        assert_eq!(leases.expired(term, 4_500, &[granted], 10), vec![1]);
        // Expired: no keep-alive brings it back.
        assert_eq!(leases.renew(term, 4_600, &granted), None);
    }

    #[test]
    fn a_new_term_gives_older_leases_a_full_ttl_and_more() {
        let leases = LeaderLeases::default();
        let old = lease(1, 10, 0);
        leases.renew(leading(1, 0), 5_000, &old);
        assert_eq!(leases.deadline(leading(1, 0), &old), 15_000);
        // Another term (this member lost and won again): renewals of the
        // old term are forgotten, every older lease gets TTL + extension.
        let again = leading(3, 7_000);
        assert_eq!(leases.deadline(again, &old), 7_000 + 1_000 + 10_000);
        // A lease granted since counts from its grant.
        let new = lease(2, 10, 7_500);
        assert_eq!(leases.deadline(again, &new), 17_500);
    }

    #[test]
    fn expired_are_soonest_first_and_bounded() {
        let leases = LeaderLeases::default();
        let rows = [lease(1, 5, 100), lease(2, 2, 100), lease(3, 3, 100)];
        assert_eq!(leases.expired(leading(1, 0), 10_000, &rows, 2), vec![2, 3]);
    }
}
