//! A user's merged key permissions and etcd's rules for checking a key or a
//! range against them (server/auth/range_perm_cache.go).
//!
//! Intervals use etcd's "bytes affine" order: an empty end sorts after every
//! key, so `[key, "")` is open-ended. A permission whose range_end is "\0" is
//! open-ended too; one without a range_end covers exactly its key.

use std::cmp::Ordering;

use crate::proto::authpb::{Permission, permission::Type};

/// A half-open interval `[begin, end)` where an empty `end` is +infinity.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Interval {
    begin: Vec<u8>,
    end: Vec<u8>,
}

/// etcd's BytesAffineComparable: the empty byte string is the largest value.
fn affine_cmp(a: &[u8], b: &[u8]) -> Ordering {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.cmp(b),
    }
}

impl Interval {
    fn point(key: &[u8]) -> Self {
        let mut end = key.to_vec();
        end.push(0);
        Interval {
            begin: key.to_vec(),
            end,
        }
    }

    fn intersects(&self, other: &Interval) -> bool {
        affine_cmp(&self.begin, &other.end) == Ordering::Less
            && affine_cmp(&other.begin, &self.end) == Ordering::Less
    }
}

/// True for etcd's "\0" range end, which means "every key from `key` on".
fn is_open_ended(range_end: &[u8]) -> bool {
    range_end == [0]
}

/// The read and write intervals one user holds through all its roles.
#[derive(Clone, Debug, Default)]
pub struct MergedPermissions {
    read: Vec<Interval>,
    write: Vec<Interval>,
}

/// What an operation needs on a key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Range, watch, compares, prev_kv.
    Read,
    /// Put and DeleteRange.
    Write,
}

impl MergedPermissions {
    /// Merges the permissions of every role in `roles`.
    pub fn merge<'a>(roles: impl IntoIterator<Item = &'a Permission>) -> Self {
        let mut merged = MergedPermissions::default();
        for perm in roles {
            let interval = if perm.range_end.is_empty() {
                Interval::point(&perm.key)
            } else {
                let end = if is_open_ended(&perm.range_end) {
                    Vec::new()
                } else {
                    perm.range_end.clone()
                };
                Interval {
                    begin: perm.key.clone(),
                    end,
                }
            };
            match Type::try_from(perm.perm_type) {
                Ok(Type::Readwrite) => {
                    merged.read.push(interval.clone());
                    merged.write.push(interval);
                }
                Ok(Type::Read) => merged.read.push(interval),
                Ok(Type::Write) => merged.write.push(interval),
                Err(_) => {}
            }
        }
        for list in [&mut merged.read, &mut merged.write] {
            list.sort_by(|a, b| affine_cmp(&a.begin, &b.begin));
        }
        merged
    }

    /// Whether `access` is granted on `key` (no range_end) or on the whole
    /// range `[key, range_end)`, as etcd decides it.
    pub fn allows(&self, access: Access, key: &[u8], range_end: &[u8]) -> bool {
        let intervals = match access {
            Access::Read => &self.read,
            Access::Write => &self.write,
        };
        if range_end.is_empty() {
            // A single key: some permission must contain it.
            let point = Interval::point(key);
            return intervals.iter().any(|i| i.intersects(&point));
        }
        let wanted = Interval {
            begin: key.to_vec(),
            end: if is_open_ended(range_end) {
                Vec::new()
            } else {
                range_end.to_vec()
            },
        };
        // The permissions meeting the range must cover it without a gap.
        let mut covered_to: Option<&[u8]> = None;
        let mut first_begin: Option<&[u8]> = None;
        for interval in intervals.iter().filter(|i| i.intersects(&wanted)) {
            match covered_to {
                None => {
                    first_begin = Some(&interval.begin);
                    covered_to = Some(&interval.end);
                }
                Some(end) => {
                    if affine_cmp(end, &interval.begin) == Ordering::Less {
                        return false;
                    }
                    if affine_cmp(&interval.end, end) == Ordering::Greater {
                        covered_to = Some(&interval.end);
                    }
                }
            }
        }
        match (first_begin, covered_to) {
            (Some(begin), Some(end)) => {
                affine_cmp(end, &wanted.end) != Ordering::Less
                    && affine_cmp(begin, &wanted.begin) != Ordering::Greater
            }
            _ => false,
        }
    }
}

/// etcd's rule for a permission's range (3.5 `isValidPermissionRange`): a
/// key, and either no range end, one after the key, or "\0".
pub fn is_valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    range_end.is_empty() || affine_cmp(key, range_end) == Ordering::Less || is_open_ended(range_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(key: &str, end: &str, t: Type) -> Permission {
        Permission {
            perm_type: t as i32,
            key: key.into(),
            range_end: end.into(),
        }
    }

    #[test]
    fn single_key_permission_covers_only_that_key() {
        let p = MergedPermissions::merge(&[perm("foo", "", Type::Read)]);
        assert!(p.allows(Access::Read, b"foo", b""));
        assert!(!p.allows(Access::Read, b"foo1", b""));
        assert!(!p.allows(Access::Write, b"foo", b""));
        // A from-key range starting at the key is more than the key.
        assert!(!p.allows(Access::Read, b"foo", b"\0"));
        assert!(!p.allows(Access::Read, b"foo", b"fop"));
        assert!(p.allows(Access::Read, b"foo", b"foo\0"));
    }

    #[test]
    fn prefix_and_open_ended_permissions() {
        let p = MergedPermissions::merge(&[
            perm("a/", "a0", Type::Readwrite),
            perm("m", "\0", Type::Write),
        ]);
        assert!(p.allows(Access::Read, b"a/x", b""));
        assert!(p.allows(Access::Read, b"a/", b"a0"));
        assert!(p.allows(Access::Read, b"a/b", b"a/c"));
        assert!(!p.allows(Access::Read, b"a/", b"a1"));
        assert!(p.allows(Access::Write, b"zzz", b""));
        assert!(p.allows(Access::Write, b"m", b"\0"));
        assert!(!p.allows(Access::Write, b"l", b"\0"));
        assert!(!p.allows(Access::Read, b"m", b""));
    }

    #[test]
    fn adjacent_permissions_cover_their_union() {
        let p = MergedPermissions::merge(&[perm("a", "c", Type::Read), perm("c", "e", Type::Read)]);
        assert!(p.allows(Access::Read, b"b", b"d"));
        let gap =
            MergedPermissions::merge(&[perm("a", "c", Type::Read), perm("d", "e", Type::Read)]);
        assert!(!gap.allows(Access::Read, b"b", b"d\0"));
    }

    #[test]
    fn permission_ranges() {
        assert!(is_valid_permission_range(b"a", b""));
        assert!(is_valid_permission_range(b"a", b"b"));
        assert!(is_valid_permission_range(b"a", b"\0"));
        assert!(!is_valid_permission_range(b"b", b"a"));
        assert!(!is_valid_permission_range(b"", b""));
    }
}
