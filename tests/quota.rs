//! The space quota (`--quota-backend-bytes`) and alarms, differential against real etcd
//! 3.5.1 run with the same small quota (see `common::differential`): a store filled
//! until refused raises NOSPACE with etcd's error; while alarmed, puts, txns with puts
//! and lease grants are refused while reads, deletes and compaction work; Alarm GET,
//! Status errors and `etcdctl alarm list / disarm` show the alarm as etcd does;
//! DEACTIVATE disarms it and the next write checks the space again. Also CORRUPT raised
//! by hand, which refuses every write. The servers' sizes differ (bbolt versus SQL
//! pages), so the number of writes before the refusal is not compared, only what
//! follows it. Member ids are shown as `<member>`.
//!
//! Cetera-only: alarms are kept in the database, so a second instance on the same
//! database refuses writes too; and compaction plus Defragment followed by a disarm
//! lets writes through again (skipped while Defragment is Unimplemented).

mod common;

use cetera::proto::etcdserverpb::alarm_request::AlarmAction;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::request_op::Request;
use cetera::proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, AlarmType, CompactionRequest, DefragmentRequest,
    DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, StatusRequest,
    TxnRequest, kv_client::KvClient, lease_client::LeaseClient,
};
use cetera::proto::ops;
use common::{Cetera, Side, differential, etcdctl_35, normalize_etcdctl, outcome, run_etcdctl};
use tonic::transport::Channel;

/// A quota a few hundred writes fill on every datastore: above what an empty
/// PostgreSQL or MySQL schema takes, small enough to fill in seconds.
const QUOTA: &str = "1000000";
/// Value size of the filling writes.
const BIG: usize = 4000;
/// Keys the filling writes cycle through, so the store's live data stays small and
/// the growth is history, as in a real overfull etcd.
const KEYS: usize = 20;
/// Time after which a store that still accepts the filling writes is a failure.
/// MariaDB reports table sizes from InnoDB's statistics, which it recalculates at
/// most every 10 s, so a fill there takes that long whatever its rate.
const FILL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Puts `value(i)` to the `KEYS` keys in turn until the server refuses a put:
/// returns that error, or `None` if it still accepted them at `FILL_DEADLINE`.
async fn fill_until_refused(
    kv: &mut KvClient<Channel>,
    value: impl Fn(usize) -> Vec<u8>,
) -> Option<tonic::Status> {
    let deadline = std::time::Instant::now() + FILL_DEADLINE;
    let mut i = 0;
    while std::time::Instant::now() < deadline {
        let put = PutRequest {
            key: format!("big/{:02}", i % KEYS).into(),
            value: value(i),
            ..Default::default()
        };
        if let Err(status) = kv.put(put).await {
            return Some(status);
        }
        i += 1;
    }
    None
}

/// `BIG` bytes that do not compress (PostgreSQL compresses large values, and a
/// compressible value would take many more writes to fill the quota), different for
/// each `seed`.
fn noise(seed: usize) -> Vec<u8> {
    let mut state = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..BIG)
        .map(|_| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn maintenance(s: &Side) -> MaintenanceClient<Channel> {
    MaintenanceClient::new(s.channel.clone())
}

/// Member ids replaced by `<member>`: they differ between servers.
async fn mask_member(s: &Side, text: &str) -> String {
    let status = maintenance(s)
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let member = status.header.expect("header").member_id;
    text.replace(&member.to_string(), "<member>")
        .replace(&format!("{member:x}"), "<member>")
}

fn show_alarms(r: &AlarmResponse) -> String {
    let alarms: Vec<String> = r
        .alarms
        .iter()
        .map(|a| {
            format!(
                "{}:{}",
                a.member_id,
                AlarmType::try_from(a.alarm).map_or("?", |t| t.as_str_name())
            )
        })
        .collect();
    format!("alarms=[{}]", alarms.join(" "))
}

/// Sends an Alarm request and records its outcome.
async fn alarm(s: &mut Side, step: &str, action: AlarmAction, member_id: u64, alarm: AlarmType) {
    let result = maintenance(s)
        .alarm(AlarmRequest {
            action: action as i32,
            member_id,
            alarm: alarm as i32,
        })
        .await;
    let text = outcome(result, show_alarms);
    let text = mask_member(s, &text).await;
    s.note(step, text);
}

/// Records Status's errors field.
async fn status_errors(s: &mut Side, step: &str) {
    let result = maintenance(s).status(StatusRequest {}).await;
    let text = outcome(result, |r| format!("errors={:?}", r.errors));
    let text = mask_member(s, &text).await;
    s.note(step, text);
}

/// Records a Txn's outcome (succeeded or the error) without revisions, which differ.
async fn txn(s: &mut Side, step: &str, request: TxnRequest) {
    let result = s.kv.txn(request).await;
    s.note(
        step,
        outcome(result, |r| format!("succeeded={}", r.succeeded)),
    );
}

/// Records a Put's outcome without the revision.
async fn put(s: &mut Side, step: &str, key: &str, value: &str) {
    let result =
        s.kv.put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .await;
    s.note(step, outcome(result, |_| "ok".to_string()));
}

async fn grant(s: &mut Side, step: &str) {
    let result = LeaseClient::new(s.channel.clone())
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await;
    s.note(step, outcome(result, |_| "granted".to_string()));
}

async fn count(s: &mut Side, step: &str, prefix: &str) {
    let result =
        s.kv.range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            count_only: true,
            ..Default::default()
        })
        .await;
    s.note(step, outcome(result, |r| format!("count={}", r.count)));
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

async fn delete_prefix(s: &mut Side, step: &str, prefix: &str) {
    let result =
        s.kv.delete_range(DeleteRangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            ..Default::default()
        })
        .await;
    s.note(step, outcome(result, |r| format!("deleted={}", r.deleted)));
}

async fn compact_now(s: &mut Side, step: &str) {
    let revision =
        s.kv.range(RangeRequest {
            key: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner()
        .header
        .expect("header")
        .revision;
    let result =
        s.kv.compact(CompactionRequest {
            revision,
            physical: true,
        })
        .await;
    s.note(step, outcome(result, |_| "compacted".to_string()));
}

/// Puts big values over `KEYS` keys until the server refuses one; records the refusal.
async fn fill(s: &mut Side, step: &str) {
    let refusal = fill_until_refused(&mut s.kv, |_| "x".repeat(BIG).into_bytes()).await;
    let note = match refusal {
        Some(status) => format!("ERR {:?}: {}", status.code(), status.message()),
        None => format!("still accepted after {FILL_DEADLINE:?}"),
    };
    s.note(step, note);
}

/// Runs etcdctl 3.5 and records its output with member ids masked.
async fn etcdctl(s: &mut Side, args: &[&str]) {
    let Some(etcdctl) = etcdctl_35() else {
        s.note(format!("etcdctl {args:?}"), "etcdctl missing");
        return;
    };
    let output = run_etcdctl(&etcdctl, &s.addr, args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = mask_member(s, &normalize_etcdctl(&text)).await;
    s.note(format!("etcdctl {args:?}"), text);
}

fn delete_only_txn() -> TxnRequest {
    TxnRequest {
        success: vec![RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: b"nothing".to_vec(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_matches_etcd() {
    let quota = ["--quota-backend-bytes", QUOTA];
    differential(&quota, &quota, async |s: &mut Side| {
        put(s, "put before any alarm", "a", "1").await;
        alarm(
            s,
            "alarm get (none raised)",
            AlarmAction::Get,
            0,
            AlarmType::None,
        )
        .await;
        status_errors(s, "status errors (none)").await;

        fill(s, "fill until refused").await;
        alarm(s, "alarm get all", AlarmAction::Get, 0, AlarmType::None).await;
        alarm(
            s,
            "alarm get NOSPACE",
            AlarmAction::Get,
            0,
            AlarmType::Nospace,
        )
        .await;
        alarm(
            s,
            "alarm get CORRUPT",
            AlarmAction::Get,
            0,
            AlarmType::Corrupt,
        )
        .await;
        status_errors(s, "status errors (alarmed)").await;
        etcdctl(s, &["alarm", "list"]).await;

        put(s, "small put while alarmed", "a", "2").await;
        txn(
            s,
            "txn with a put while alarmed",
            TxnRequest {
                success: vec![ops::put(b"a", b"3", 0)],
                ..Default::default()
            },
        )
        .await;
        txn(
            s,
            "txn with a put only in failure",
            TxnRequest {
                failure: vec![ops::put(b"a", b"3", 0)],
                ..Default::default()
            },
        )
        .await;
        grant(s, "lease grant while alarmed").await;
        count(s, "range while alarmed", "big/").await;
        delete_prefix(s, "delete while alarmed", "big/").await;
        compact_now(s, "compact while alarmed").await;
        put(
            s,
            "put after delete and compact, alarm still raised",
            "a",
            "4",
        )
        .await;
        alarm(
            s,
            "alarm activate NONE",
            AlarmAction::Activate,
            0,
            AlarmType::None,
        )
        .await;

        let member = member_id(s).await;
        alarm(
            s,
            "alarm deactivate",
            AlarmAction::Deactivate,
            member,
            AlarmType::Nospace,
        )
        .await;
        alarm(
            s,
            "alarm deactivate again",
            AlarmAction::Deactivate,
            member,
            AlarmType::Nospace,
        )
        .await;
        alarm(
            s,
            "alarm get after disarm",
            AlarmAction::Get,
            0,
            AlarmType::None,
        )
        .await;
        status_errors(s, "status errors after disarm").await;
        // The database did not shrink (neither bbolt nor SQL pages are given back by a
        // compaction), so the next big write finds it still full and raises the alarm again.
        fill(s, "big write after disarm, no defragment").await;
        alarm(
            s,
            "alarm get after the new refusal",
            AlarmAction::Get,
            0,
            AlarmType::None,
        )
        .await;
        etcdctl(s, &["alarm", "disarm"]).await;
        etcdctl(s, &["alarm", "list"]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_alarm_matches_etcd() {
    differential(&[], &[], async |s: &mut Side| {
        put(s, "put a", "a", "1").await;
        alarm(
            s,
            "activate CORRUPT for member 1234",
            AlarmAction::Activate,
            1234,
            AlarmType::Corrupt,
        )
        .await;
        alarm(
            s,
            "activate it again",
            AlarmAction::Activate,
            1234,
            AlarmType::Corrupt,
        )
        .await;
        alarm(s, "alarm get", AlarmAction::Get, 0, AlarmType::None).await;
        status_errors(s, "status errors").await;
        put(s, "put while corrupt", "a", "2").await;
        count(s, "range while corrupt", "a").await;
        txn(
            s,
            "read-only txn while corrupt",
            TxnRequest {
                success: vec![RequestOp {
                    request: Some(Request::RequestRange(RangeRequest {
                        key: b"a".to_vec(),
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            },
        )
        .await;
        txn(s, "delete-only txn while corrupt", delete_only_txn()).await;
        delete_prefix(s, "delete while corrupt", "a").await;
        grant(s, "lease grant while corrupt").await;
        compact_now(s, "compact while corrupt").await;
        alarm(
            s,
            "deactivate for another member",
            AlarmAction::Deactivate,
            99,
            AlarmType::Corrupt,
        )
        .await;
        alarm(
            s,
            "deactivate",
            AlarmAction::Deactivate,
            1234,
            AlarmType::Corrupt,
        )
        .await;
        put(s, "put after disarm", "a", "3").await;
        etcdctl(s, &["alarm", "list"]).await;
    })
    .await;
}

async fn member_id(s: &Side) -> u64 {
    maintenance(s)
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .header
        .expect("header")
        .member_id
}

/// Alarms are rows in the database: an alarm raised through one instance refuses
/// writes on another instance of the same database, and disarming it on the second
/// lets the first write again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_are_shared_by_instances_of_one_database() {
    if common::datastore::test_backend() == common::datastore::TestBackend::Sqlite {
        eprintln!(
            "needs CETERA_TEST_BACKEND=postgres or mysql (one SQLite file has one server); skipped on SQLite"
        );
        return;
    }
    let first = Cetera::start().await;
    let second = Cetera::start_on(first.datastore_endpoint()).await;
    let channel_1 = common::channel(&first.endpoint()).await;
    let channel_2 = common::channel(&second.endpoint()).await;
    let mut kv_1 = KvClient::new(channel_1.clone());
    let mut maintenance_2 = MaintenanceClient::new(channel_2.clone());
    let member = maintenance_2
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .member_id;
    let put = |value: &str| PutRequest {
        key: b"k".to_vec(),
        value: value.into(),
        ..Default::default()
    };
    kv_1.put(put("1")).await.expect("put before the alarm");
    MaintenanceClient::new(channel_1.clone())
        .alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: member,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .expect("raise NOSPACE on the first instance");
    let refused = KvClient::new(channel_2.clone())
        .put(put("2"))
        .await
        .expect_err("the second instance refuses the put");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "etcdserver: mvcc: database space exceeded"
    );
    let errors = maintenance_2
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .errors;
    // The servers emulate the oracle's release: 3.6 and later print the
    // alarm without 3.5's trailing space.
    let end = if common::oracle().is_36_or_later() {
        ""
    } else {
        " "
    };
    assert_eq!(
        errors,
        vec![format!("memberID:{member} alarm:NOSPACE{end}")]
    );
    let disarmed = maintenance_2
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id: member,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(disarmed.alarms.len(), 1);
    kv_1.put(put("3"))
        .await
        .expect("the first instance writes again");
}

/// etcd's way out of NOSPACE: delete, compact, defragment, disarm; then writes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_and_disarm_reenable_writes() {
    let server = Cetera::start_with(&["--quota-backend-bytes", QUOTA]).await;
    let channel = common::channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);
    let refused = fill_until_refused(&mut kv, noise).await;
    assert!(refused.is_some(), "the store never filled");
    common::kv_fixtures::delete_and_compact(&mut kv, "big/", "big0").await;
    match maintenance.defragment(DefragmentRequest {}).await {
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            eprintln!("skipped: Defragment is not implemented on this build");
            return;
        }
        result => {
            result.expect("defragment");
        }
    }
    let member = maintenance
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .member_id;
    maintenance
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id: member,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .unwrap();
    kv.put(PutRequest {
        key: b"big/00".to_vec(),
        value: noise(0),
        ..Default::default()
    })
    .await
    .expect("a write after defragment and disarm");
}

/// A size-limited tmpfs mounted on a temporary folder, unmounted when dropped.
struct SmallFileSystem {
    dir: tempfile::TempDir,
}

impl SmallFileSystem {
    /// Mounts a tmpfs of `size` (mount's syntax, e.g. `16m`); None (with a
    /// warning) where this process may not mount one (not root).
    fn mount(size: &str) -> Option<SmallFileSystem> {
        let dir = tempfile::Builder::new()
            .prefix("cetera-full-")
            .tempdir()
            .unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        if !mounted.is_ok_and(|status| status.success()) {
            eprintln!("WARNING: cannot mount a tmpfs (not root?): SKIPPING the full-disk test");
            return None;
        }
        Some(SmallFileSystem { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallFileSystem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A put of `size` bytes under `key`, as a code and message.
async fn put_outcome(kv: &mut KvClient<Channel>, key: &str, size: usize) -> (tonic::Code, String) {
    let put = PutRequest {
        key: key.as_bytes().to_vec(),
        value: vec![b'x'; size],
        ..Default::default()
    };
    match kv.put(put).await {
        Ok(_) => (tonic::Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

#[tokio::test]
async fn a_full_disk_raises_nospace_and_recovers_after_a_disarm() {
    // SQLite on a small file system; the other backends' disks are not ours to fill.
    if std::env::var("CETERA_TEST_BACKEND").is_ok_and(|b| b != "sqlite") {
        return;
    }
    let Some(disk) = SmallFileSystem::mount("16m") else {
        return;
    };
    // Room to free later, as an operator would.
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 2 << 20]).unwrap();
    let datastore = disk.path().join("state.db");
    let server = Cetera::start_on(&datastore.display().to_string()).await;
    let channel = common::channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let no_space = (
        tonic::Code::ResourceExhausted,
        "etcdserver: mvcc: database space exceeded".to_string(),
    );

    // Filled up: the datastore's "disk full" is etcd's NOSPACE.
    let mut written = 0;
    let refused = loop {
        let outcome = put_outcome(&mut kv, &format!("fill/{}", written % 50), 64 << 10).await;
        if outcome.0 != tonic::Code::Ok {
            break outcome;
        }
        written += 1;
        assert!(written < 1000, "16 MB took {written} writes of 64 KiB");
    };
    assert_eq!(refused, no_space, "after {written} writes");
    assert_eq!(put_outcome(&mut kv, "small", 1).await, no_space);
    let alarms = maintenance
        .alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: AlarmType::None as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let member_id = alarms.header.as_ref().unwrap().member_id;
    assert_eq!(alarms.alarms.len(), 1, "{alarms:?}");
    assert_eq!(alarms.alarms[0].alarm, AlarmType::Nospace as i32);
    assert_eq!(alarms.alarms[0].member_id, member_id);
    // Reads go on.
    let read = kv
        .range(RangeRequest {
            key: b"fill/".to_vec(),
            range_end: b"fill0".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.count, written.min(50) as i64);
    // Compact and Defragment answer within the client's deadline.
    let revision = read.header.unwrap().revision;
    let mut compact = tonic::Request::new(CompactionRequest {
        revision,
        physical: true,
    });
    compact.set_timeout(std::time::Duration::from_secs(10));
    let started = std::time::Instant::now();
    let compacted = kv.compact(compact).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(9));
    if let Err(status) = &compacted {
        assert_eq!(
            (status.code(), status.message().to_string()),
            no_space,
            "{status:?}"
        );
    }
    let mut defragment = tonic::Request::new(DefragmentRequest {});
    defragment.set_timeout(std::time::Duration::from_secs(10));
    let started = std::time::Instant::now();
    let defragmented = maintenance.defragment(defragment).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(9));
    if let Err(status) = &defragmented {
        assert_eq!(
            (status.code(), status.message().to_string()),
            no_space,
            "{status:?}"
        );
    }

    // Space freed and the alarm disarmed: writes go on, without a restart.
    std::fs::remove_file(&ballast).unwrap();
    assert_eq!(put_outcome(&mut kv, "small", 1).await, no_space);
    let disarmed = maintenance
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(disarmed.alarms.len(), 1, "{disarmed:?}");
    assert_eq!(
        put_outcome(&mut kv, "small", 1).await,
        (tonic::Code::Ok, String::new())
    );
    drop(server);
}
