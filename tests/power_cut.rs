//! Crash safety against a power cut, which kill -9 cannot test: a killed
//! process leaves its writes in the page cache, so a missing fdatasync goes
//! unseen. Here cetera runs on a FUSE file system ([`fs::PowerCutFs`]) that
//! drops every write not yet synced when the power is cut; under load the
//! power is cut at random moments, cetera starts again on what survived, and
//! every acknowledged write, revision, lease grant and compaction must still
//! be there.
//!
//! Needs /dev/fuse and root (to mount without fusermount): skipped with a
//! warning elsewhere, an error under CI=true.

mod common;
#[path = "power_cut/fs.rs"]
mod fs;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::Cluster;
use common::datastore::{TestBackend, test_backend};
use common::{Cetera, cluster_mode, in_ci};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp,
};
use fs::{Mounted, PowerCutFs};
use rand::Rng;

/// Mounts `fs` at `dir`, or says why it cannot (a failure under CI=true).
fn mount_or_skip(fs: &PowerCutFs, dir: &Path) -> Option<Mounted> {
    match fs.mount(dir) {
        Ok(mounted) => Some(mounted),
        Err(error) => {
            let msg = format!(
                "cannot mount the power-cut FUSE file system at {} ({error}); \
                 it needs /dev/fuse and root",
                dir.display()
            );
            if in_ci() {
                panic!("{msg} (CI=true, so this is an error rather than a skip)");
            }
            eprintln!("!!! WARNING: {msg}\n!!! SKIPPING this test.");
            None
        }
    }
}

/// A new file system mounted at `mnt` in a new temporary directory (kept
/// while the first is), or None where it cannot be (see `mount_or_skip`).
fn mount_in_tempdir() -> Option<(tempfile::TempDir, PathBuf, PowerCutFs, Mounted)> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let fs = PowerCutFs::default();
    let mounted = mount_or_skip(&fs, &dir)?;
    Some((tmp, dir, fs, mounted))
}

fn read(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

fn sync_dir(dir: &Path) {
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// The layer itself: what was synced survives a power cut, what was not is
/// gone, for file contents, sizes and directory entries alike.
#[test]
fn the_file_system_keeps_what_was_synced_and_drops_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let fs = PowerCutFs::default();
    let Some(mounted) = mount_or_skip(&fs, &dir) else {
        return;
    };
    let p = |name: &str| dir.join(name);

    // Files whose names are durable (the directory is synced after them).
    let mut appended = std::fs::File::create(p("appended")).unwrap();
    appended.write_all(b"synced").unwrap();
    appended.sync_data().unwrap();
    std::fs::File::create(p("never-synced"))
        .unwrap()
        .write_all(b"lost")
        .unwrap();
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let mut overwritten = std::fs::File::create(p("overwritten")).unwrap();
    overwritten.write_all(&big).unwrap();
    overwritten.sync_all().unwrap();
    let shrunk = std::fs::File::create(p("shrunk")).unwrap();
    shrunk.set_len(10_000).unwrap();
    shrunk.sync_data().unwrap();
    for name in ["unlinked", "renamed-synced", "renamed-unsynced"] {
        let mut f = std::fs::File::create(p(name)).unwrap();
        f.write_all(name.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    sync_dir(&dir);

    // Changes after the directory's sync.
    appended.write_all(b"+unsynced tail").unwrap();
    overwritten.seek(SeekFrom::Start(5_000)).unwrap();
    overwritten.write_all(&[0xff; 9_000]).unwrap();
    shrunk.set_len(100).unwrap();
    std::fs::rename(p("renamed-synced"), p("renamed-synced.new")).unwrap();
    sync_dir(&dir);
    // ...and after the directory's second sync: an unlink and renames
    // undone, names not made durable.
    std::fs::remove_file(p("unlinked")).unwrap();
    std::fs::rename(p("renamed-unsynced"), p("renamed-unsynced.new")).unwrap();
    std::fs::rename(p("renamed-synced.new"), p("renamed-synced.newer")).unwrap();
    std::fs::File::create(p("created-last")).unwrap();
    let mut new_file = std::fs::File::create(p("created-after")).unwrap();
    new_file.write_all(b"data synced, name not").unwrap();
    new_file.sync_all().unwrap();
    // What the program sees before the cut.
    assert_eq!(read(&p("appended")).unwrap(), b"synced+unsynced tail");
    assert_eq!(std::fs::metadata(p("shrunk")).unwrap().len(), 100);

    fs.cut_power();
    let eio = |r: std::io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EIO);
    assert!(
        eio(appended.write_all(b"after the cut")),
        "a write after the cut"
    );
    assert!(eio(appended.sync_data()), "an fsync after the cut");
    assert!(eio(std::fs::File::create(p("x")).map(drop)));
    drop((appended, overwritten, shrunk, new_file));
    mounted.unmount();
    fs.restore_power();
    let _mounted = fs.mount(&dir).unwrap();

    assert_eq!(read(&p("appended")).unwrap(), b"synced");
    assert_eq!(read(&p("never-synced")).unwrap(), b"", "data never synced");
    assert_eq!(read(&p("overwritten")).unwrap(), big, "overwritten pages");
    assert_eq!(read(&p("shrunk")).unwrap(), vec![0; 10_000], "the size");
    assert_eq!(read(&p("created-after")), None, "data synced, name not");
    assert_eq!(read(&p("created-last")), None, "name not synced");
    assert_eq!(read(&p("unlinked")).unwrap(), b"unlinked", "unlink undone");
    assert_eq!(read(&p("renamed-unsynced")).unwrap(), b"renamed-unsynced");
    assert_eq!(read(&p("renamed-unsynced.new")), None);
    assert_eq!(read(&p("renamed-synced")), None);
    assert_eq!(read(&p("renamed-synced.new")).unwrap(), b"renamed-synced");
    assert_eq!(read(&p("renamed-synced.newer")), None);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "appended",
            "never-synced",
            "overwritten",
            "renamed-synced.new",
            "renamed-unsynced",
            "shrunk",
            "unlinked"
        ]
    );
    // A cut with everything synced loses nothing, and the files work on.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(p("appended"))
        .unwrap();
    f.write_all(b" again").unwrap();
    f.sync_data().unwrap();
    let mut text = String::new();
    std::fs::File::open(p("appended"))
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "synced again");
}

/// What the clients were told: each key is written once, so its value and
/// revision after a restart must be exactly these.
#[derive(Default)]
struct Acknowledged {
    writes: Vec<(String, String, i64)>,
    /// Lease id, granted TTL, and the key put with it (if acknowledged).
    leases: Vec<(i64, i64, Option<String>)>,
    /// Keys written again and again: the last acknowledged value and
    /// revision of each (a later write may have reached the disk too).
    overwritten: HashMap<String, (String, i64)>,
    /// The highest acknowledged physical compaction.
    compacted: i64,
}

/// Load for one run of the server until it dies: puts, two-key Txns, lease
/// grants with a key each and keep-alives, and puts over a few keys with a
/// physical compaction every 50 of them. Returns when every task saw the
/// server go.
async fn load(endpoint: String, round: usize, acked: Arc<Mutex<Acknowledged>>) {
    let mut tasks = Vec::new();
    {
        let (endpoint, acked) = (endpoint.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut client) = Client::connect([endpoint], None).await else {
                return;
            };
            for i in 0.. {
                let key = format!("/overwritten/r{round}/{:02}", i % 20);
                let value = format!("{key}:{i}");
                let Ok(resp) = client.put(key.clone(), value.clone(), None).await else {
                    return;
                };
                let revision = resp.header().unwrap().revision();
                acked
                    .lock()
                    .unwrap()
                    .overwritten
                    .insert(key, (value, revision));
                if i % 50 == 49 {
                    let physical = CompactionOptions::new().with_physical();
                    if client.compact(revision, Some(physical)).await.is_err() {
                        return;
                    }
                    let mut acked = acked.lock().unwrap();
                    acked.compacted = acked.compacted.max(revision);
                }
            }
        }));
    }
    for w in 0..6 {
        let (endpoint, acked) = (endpoint.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut client) = Client::connect([endpoint], None).await else {
                return;
            };
            for i in 0.. {
                let key = format!("/put/r{round}/w{w}/{i:05}");
                let value = format!("{key}:{}", "v".repeat(200));
                match client.put(key.clone(), value.clone(), None).await {
                    Ok(resp) => acked.lock().unwrap().writes.push((
                        key,
                        value,
                        resp.header().unwrap().revision(),
                    )),
                    Err(_) => return,
                }
            }
        }));
    }
    for w in 0..2 {
        let (endpoint, acked) = (endpoint.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut client) = Client::connect([endpoint], None).await else {
                return;
            };
            for i in 0.. {
                let keys = [0, 1].map(|k| format!("/txn/r{round}/w{w}/{i:05}/{k}"));
                let txn = Txn::new()
                    .when([Compare::create_revision("/txn/never", CompareOp::Equal, 0)])
                    .and_then(keys.clone().map(|k| TxnOp::put(k.clone(), k, None)));
                match client.txn(txn).await {
                    Ok(resp) => {
                        assert!(resp.succeeded());
                        let revision = resp.header().unwrap().revision();
                        let mut acked = acked.lock().unwrap();
                        for k in keys {
                            acked.writes.push((k.clone(), k, revision));
                        }
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    {
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(mut client) = Client::connect([endpoint], None).await else {
                return;
            };
            let mut mine = Vec::new();
            for i in 0.. {
                let Ok(grant) = client.lease_grant(600, None).await else {
                    return;
                };
                let id = grant.id();
                acked.lock().unwrap().leases.push((id, 600, None));
                mine.push(id);
                let key = format!("/lease/r{round}/{i:05}");
                let options = PutOptions::new().with_lease(id);
                let Ok(resp) = client.put(key.clone(), key.clone(), Some(options)).await else {
                    return;
                };
                {
                    let mut all = acked.lock().unwrap();
                    let revision = resp.header().unwrap().revision();
                    all.writes.push((key.clone(), key.clone(), revision));
                    all.leases.last_mut().unwrap().2 = Some(key);
                }
                // Keep an earlier lease of this run alive.
                let earlier = mine[i % mine.len()];
                let Ok((mut keeper, mut acks)) = client.lease_keep_alive(earlier).await else {
                    return;
                };
                if keeper.keep_alive().await.is_err()
                    || !matches!(acks.message().await, Ok(Some(_)))
                {
                    return;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Checks that the restarted server has every acknowledged write and lease.
async fn check(endpoint: String, acked: &Acknowledged, round: usize) {
    let mut client = Client::connect([endpoint], None).await.unwrap();
    let all = client
        .get("/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let max_acked = acked.writes.iter().map(|w| w.2).max().unwrap_or(0);
    let revision = all.header().unwrap().revision();
    assert!(
        revision >= max_acked,
        "after cut {round}: revision {revision} is below the acknowledged {max_acked}"
    );
    let stored: HashMap<&[u8], (&[u8], i64, i64)> = all
        .kvs()
        .iter()
        .map(|kv| (kv.key(), (kv.value(), kv.mod_revision(), kv.lease())))
        .collect();
    for (key, value, revision) in &acked.writes {
        let found = stored.get(key.as_bytes()).map(|s| (s.0, s.1));
        assert_eq!(
            found,
            Some((value.as_bytes(), *revision)),
            "after cut {round}: acknowledged write {key} at revision {revision} lost"
        );
    }
    for (key, (value, revision)) in &acked.overwritten {
        let Some(&(found, found_revision, _)) = stored.get(key.as_bytes()) else {
            panic!("after cut {round}: {key}, acknowledged at revision {revision}, is gone");
        };
        assert!(
            found_revision > *revision
                || (found_revision == *revision && found == value.as_bytes()),
            "after cut {round}: {key} lost its acknowledged write at revision {revision}"
        );
    }
    if acked.compacted > 1 {
        let below = GetOptions::new().with_revision(acked.compacted - 1);
        let refused = client.get("/", Some(below)).await;
        assert!(
            matches!(&refused, Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("compacted")),
            "after cut {round}: the acknowledged compaction at {} is undone: {refused:?}",
            acked.compacted
        );
    }
    for (id, ttl, key) in &acked.leases {
        let live = client.lease_time_to_live(*id, None).await.unwrap();
        assert!(
            live.ttl() > 0 && live.granted_ttl() == *ttl,
            "after cut {round}: acknowledged lease {id:x} is gone (ttl {}, granted {})",
            live.ttl(),
            live.granted_ttl()
        );
        if let Some(key) = key {
            assert_eq!(stored[key.as_bytes()].2, *id, "{key}'s lease");
        }
    }
}

/// Cuts the power under `load`: the disk takes nothing more and `kill` ends
/// the processes; then waits for the load to see them go, unmounts, reverts
/// the disk to what was synced, and returns what was acknowledged so far.
async fn cut_power(
    fs: &PowerCutFs,
    mounted: Mounted,
    (round, delay): (usize, u64),
    kill: impl FnOnce(),
    load: tokio::task::JoinHandle<()>,
    acked: &Mutex<Acknowledged>,
) -> Acknowledged {
    fs.cut_power();
    kill();
    load.await.unwrap();
    mounted.unmount();
    let dropped = fs.restore_power();
    let so_far = std::mem::take(&mut *acked.lock().unwrap());
    eprintln!(
        "cut {round} after {delay} ms: {} writes, {} leases and compaction to {} acknowledged \
         so far, {} fsyncs so far, {dropped} unsynced pages and entries dropped",
        so_far.writes.len(),
        so_far.leases.len(),
        so_far.compacted,
        fs.syncs()
    );
    so_far
}

/// The power is cut several times at random moments under load; after each
/// cut cetera starts on what the disk kept and must have every acknowledged
/// put and Txn (value and revision), a revision no lower than any
/// acknowledged, every acknowledged lease grant and compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_power_cuts() {
    if cluster_mode() || !matches!(test_backend(), TestBackend::Sqlite) {
        eprintln!("SKIPPED: the power-cut test runs the embedded SQLite store");
        return;
    }
    let Some((_tmp, dir, fs, mut mounted)) = mount_in_tempdir() else {
        return;
    };
    let endpoint = format!("sqlite://{}", dir.join("state.db").display());
    let mut server = Cetera::start_on(&endpoint).await;
    let acked: Arc<Mutex<Acknowledged>> = Arc::default();
    const CUTS: usize = 4;
    for round in 0..CUTS {
        let load = tokio::spawn(load(server.endpoint(), round, acked.clone()));
        let delay = rand::rng().random_range(300..1500);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let so_far = cut_power(&fs, mounted, (round, delay), || server.kill(), load, &acked).await;
        mounted = fs.mount(&dir).expect("mount again after the power cut");
        server.restart().await;
        check(server.endpoint(), &so_far, round).await;
        *acked.lock().unwrap() = so_far;
    }
}

/// The same in replicated mode: three members on one file system, whose
/// power is cut under load (every member dies at once), then all start
/// again on what their disks kept. A member's store commits without a sync
/// of its own; what an acknowledged write rests on is the Raft log (fsynced
/// segment files), which must bring every member back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_power_cuts_in_a_cluster() {
    if cluster_mode() || !matches!(test_backend(), TestBackend::Sqlite) {
        eprintln!("SKIPPED: the power-cut test starts its own cluster of SQLite members");
        return;
    }
    let Some((_tmp, dir, fs, mut mounted)) = mount_in_tempdir() else {
        return;
    };
    let mut cluster = Cluster::start_direct_on(3, &dir).await;
    // The members' data directories, made by this test as an operator
    // would before the first start, are on disk.
    sync_dir(&dir);
    let acked: Arc<Mutex<Acknowledged>> = Arc::default();
    const CUTS: usize = 3;
    for round in 0..CUTS {
        let leader = cluster.leader(&[], Duration::from_secs(20)).await;
        let endpoint = cluster.members[leader].endpoint();
        let load = tokio::spawn(load(endpoint, round, acked.clone()));
        let delay = rand::rng().random_range(500..2000);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let kill_all = || cluster.members.iter_mut().for_each(|m| m.kill());
        let so_far = cut_power(&fs, mounted, (round, delay), kill_all, load, &acked).await;
        mounted = fs.mount(&dir).expect("mount again after the power cut");
        // Together: a member serves once it has a leader.
        let [a, b, c] = &mut cluster.members[..] else {
            unreachable!("three members")
        };
        tokio::join!(a.restart(), b.restart(), c.restart());
        for member in &cluster.members {
            check(member.endpoint(), &so_far, round).await;
        }
        *acked.lock().unwrap() = so_far;
    }
}
