//! What kine's rows mean in etcd's terms (k3s-io/kine v0.16.4,
//! pkg/logstructured/logstructured.go, pkg/logstructured/sqllog/sql.go,
//! pkg/server/compact.go), turned into cetera's log rows one by one, in id
//! order.
//!
//! - A row with `created = 1` starts the key over: create revision = its id,
//!   version 1 (kine stores 0 in its create_revision column; its reads put
//!   the id there). Another row that is not a deletion is a put on the
//!   key: create revision from the column, version one more than before.
//!   A row with `deleted = 1` is a deletion.
//! - Versions: kine stores none (it reports 0). They are counted here as
//!   etcd counts them. Where kine's compaction removed the start of a key's
//!   history (its oldest row left is a put that is not a create), that row
//!   is given version 2, the fewest puts its history allows (its create,
//!   then itself), and counting goes on from there.
//! - kine's bookkeeping is left out: gap rows (`gap-<id>`, written by the
//!   watch poller over revisions whose insert failed), the `compact_rev_key`
//!   rows holding kine's compact revision, and the `/registry/health` key
//!   kine creates (value `{"health":"true"}`) every time it starts. Their
//!   revisions stay, without changes, as revisions whose changes were
//!   compacted away do in etcd.
//! - kine keeps the apiserver's own `compact_rev_key` under
//!   `compact_rev_key_apiserver`, its value prefixed with the version the
//!   apiserver compares ("3|1234"): it becomes `compact_rev_key` again with
//!   that value and version, as kine presents it to clients.
//! - Leases: kine's lease column holds the TTL a key was written with
//!   (kine's LeaseGrant answers ID = TTL). The lease field is kept as it
//!   is, and the import grants one real lease per distinct TTL among the
//!   live keys, with that id and TTL (see `kine::lease_rows`).

use std::collections::HashMap;

use super::kine_source::KineRow;
use crate::backend::LogEntry;
use crate::proto::mvccpb::KeyValue;

/// kine's own compact revision key.
pub(crate) const COMPACT_KEY: &[u8] = b"compact_rev_key";
/// Where kine keeps the apiserver's `compact_rev_key`.
const APISERVER_COMPACT_KEY: &[u8] = b"compact_rev_key_apiserver";
/// The key kine creates at every start (pkg/server/types.go HealthKey)...
pub(crate) const HEALTH_KEY: &[u8] = b"/registry/health";
/// ...with this value (HealthVal).
const HEALTH_VALUE: &[u8] = br#"{"health":"true"}"#;

/// Why a row was left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bookkeeping {
    /// A gap row.
    Gap,
    /// kine's compact revision row.
    CompactRevision,
    /// kine's health key.
    Health,
}

/// What one kine row becomes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Converted {
    /// A row of cetera's log.
    Entry(LogEntry),
    /// kine's bookkeeping, left out.
    Left(Bookkeeping),
}

/// A key's state after the rows seen so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyState {
    /// The id of the key's last kept row.
    pub last: i64,
    /// False after a deletion.
    pub live: bool,
    /// Create revision and version of the live key.
    pub create_revision: i64,
    /// The version.
    pub version: i64,
    /// The lease field (kine's TTL) of the live key.
    pub lease: i64,
}

/// Converts kine rows, fed in id order, into cetera's log rows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Converter {
    keys: HashMap<Vec<u8>, KeyState>,
}

impl Converter {
    /// The state of every key seen so far (deleted ones included).
    pub(crate) fn keys(&self) -> &HashMap<Vec<u8>, KeyState> {
        &self.keys
    }

    /// Converts the next row.
    pub(crate) fn convert(&mut self, row: KineRow) -> Converted {
        if let Some(left) = bookkeeping(&row) {
            return Converted::Left(left);
        }
        let KineRow {
            id,
            mut name,
            created,
            deleted,
            create_revision,
            lease,
            mut value,
            ..
        } = row;
        let mut told_version = None;
        if name == APISERVER_COMPACT_KEY {
            name = COMPACT_KEY.to_vec();
            if !deleted {
                let (version, decoded) = decode_version(&value);
                told_version = Some(version);
                value = decoded;
            }
        }
        let before = self.keys.get(&name).copied().filter(|state| state.live);
        if deleted {
            self.keys.insert(
                name.clone(),
                KeyState {
                    last: id,
                    live: false,
                    create_revision: 0,
                    version: 0,
                    lease: 0,
                },
            );
            return Converted::Entry(LogEntry {
                kv: KeyValue {
                    key: name,
                    mod_revision: id,
                    ..Default::default()
                },
                sub: 0,
                deleted: true,
            });
        }
        let (create_revision, counted) = match before {
            _ if created => (id, 1),
            Some(state) => {
                let create = if create_revision > 0 {
                    create_revision
                } else {
                    state.create_revision
                };
                (create, state.version + 1)
            }
            // The start of the key's history was compacted away.
            None => (
                if create_revision > 0 && create_revision < id {
                    create_revision
                } else {
                    id
                },
                2,
            ),
        };
        let version = told_version.unwrap_or(counted).max(1);
        let lease = lease.max(0);
        self.keys.insert(
            name.clone(),
            KeyState {
                last: id,
                live: true,
                create_revision,
                version,
                lease,
            },
        );
        Converted::Entry(LogEntry {
            kv: KeyValue {
                key: name,
                create_revision,
                mod_revision: id,
                version,
                value,
                lease,
            },
            sub: 0,
            deleted: false,
        })
    }

    /// The log row the live key `state` was last written with, rebuilt
    /// from `row` (the kine row `state.last`).
    pub(crate) fn live_entry(key: &[u8], state: &KeyState, row: KineRow) -> KeyValue {
        let value = if row.name == APISERVER_COMPACT_KEY {
            decode_version(&row.value).1
        } else {
            row.value
        };
        KeyValue {
            key: key.to_vec(),
            create_revision: state.create_revision,
            mod_revision: state.last,
            version: state.version,
            value,
            lease: state.lease,
        }
    }
}

/// Whether `row` is kine's bookkeeping rather than a client's change.
fn bookkeeping(row: &KineRow) -> Option<Bookkeeping> {
    // kine's Fill names a gap row after its own id (generic.go).
    if row.deleted && row.name.strip_prefix(b"gap-") == Some(row.id.to_string().as_bytes()) {
        return Some(Bookkeeping::Gap);
    }
    if row.name == COMPACT_KEY {
        return Some(Bookkeeping::CompactRevision);
    }
    // Only kine's own create at start; a client's writes of the key stay.
    if row.name == HEALTH_KEY && row.created && row.value == HEALTH_VALUE && row.lease == 0 {
        return Some(Bookkeeping::Health);
    }
    None
}

/// The version and value kine encodes in `compact_rev_key_apiserver` (its
/// pkg/server/compact.go DecodeVersion): "version|value", or, from older
/// kine releases, a bare number, read as the version with value "0".
fn decode_version(stored: &[u8]) -> (i64, Vec<u8>) {
    let parse = |bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse::<i64>().ok())
            .unwrap_or(0)
    };
    match stored.iter().position(|&b| b == b'|') {
        Some(bar) => (parse(&stored[..bar]), stored[bar + 1..].to_vec()),
        None => (parse(stored), b"0".to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, name: &str, created: bool, deleted: bool, create: i64, value: &str) -> KineRow {
        KineRow {
            id,
            name: name.into(),
            created,
            deleted,
            create_revision: create,
            prev_revision: 0,
            lease: 0,
            value: value.into(),
        }
    }

    fn entry(converted: Converted) -> LogEntry {
        match converted {
            Converted::Entry(entry) => entry,
            other => panic!("left out: {other:?}"),
        }
    }

    #[test]
    fn creates_updates_and_deletes_count_versions_as_etcd() {
        let mut c = Converter::default();
        let kv = entry(c.convert(row(3, "/a", true, false, 0, "1"))).kv;
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (3, 3, 1));
        let kv = entry(c.convert(row(4, "/a", false, false, 3, "2"))).kv;
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (3, 4, 2));
        let gone = entry(c.convert(row(5, "/a", false, true, 0, "")));
        assert!(gone.deleted);
        assert_eq!(gone.kv.mod_revision, 5);
        let kv = entry(c.convert(row(6, "/a", true, false, 0, "3"))).kv;
        assert_eq!((kv.create_revision, kv.version), (6, 1));
    }

    #[test]
    fn a_key_whose_create_was_compacted_starts_at_version_two() {
        let mut c = Converter::default();
        let kv = entry(c.convert(row(40, "/b", false, false, 12, "x"))).kv;
        assert_eq!((kv.create_revision, kv.version), (12, 2));
        let kv = entry(c.convert(row(41, "/b", false, false, 12, "y"))).kv;
        assert_eq!((kv.create_revision, kv.version), (12, 3));
    }

    #[test]
    fn bookkeeping_is_left_out() {
        let mut c = Converter::default();
        let gap = row(7, "gap-7", false, true, 0, "");
        assert_eq!(c.convert(gap), Converted::Left(Bookkeeping::Gap));
        // Not a gap: a key of that shape with another id, or not deleted.
        assert!(matches!(
            c.convert(row(8, "gap-7", false, true, 0, "")),
            Converted::Entry(_)
        ));
        assert_eq!(
            c.convert(row(1, "compact_rev_key", true, false, 0, "")),
            Converted::Left(Bookkeeping::CompactRevision)
        );
        assert_eq!(
            c.convert(row(
                2,
                "/registry/health",
                true,
                false,
                0,
                r#"{"health":"true"}"#
            )),
            Converted::Left(Bookkeeping::Health)
        );
        assert!(matches!(
            c.convert(row(9, "/registry/health", true, false, 0, "mine")),
            Converted::Entry(_)
        ));
    }

    #[test]
    fn the_apiservers_compact_key_gets_its_name_value_and_version_back() {
        let mut c = Converter::default();
        let kv = entry(c.convert(row(10, "compact_rev_key_apiserver", true, false, 0, "1|9"))).kv;
        assert_eq!(
            (kv.key.as_slice(), kv.value.as_slice(), kv.version),
            (&b"compact_rev_key"[..], &b"9"[..], 1)
        );
        let kv = entry(c.convert(row(
            20,
            "compact_rev_key_apiserver",
            false,
            false,
            10,
            "2|19",
        )))
        .kv;
        assert_eq!(
            (kv.value.as_slice(), kv.version, kv.create_revision),
            (&b"19"[..], 2, 10)
        );
        assert_eq!(decode_version(b"7"), (7, b"0".to_vec()));
    }
}
