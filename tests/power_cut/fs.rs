//! A FUSE file system in memory that can lose power: every write not yet made
//! durable by an fsync is dropped, as a disk's volatile cache would drop it.
//!
//! What it models, conservatively (the weakest a POSIX file system promises):
//!
//! - **File contents and size** are durable only up to the last `fsync` or
//!   `fdatasync` of that file (both are treated alike: the size is data, and
//!   times and modes are not modelled). Writes, truncations and `fallocate`
//!   after it are lost, page by page in 4 KiB pages, all of them.
//! - **Directory entries** (create, mkdir, unlink, rmdir, rename) are durable
//!   only when the directory that holds them is fsynced. An fsync of a new
//!   file does not make its name durable (fsync(2): "an explicit fsync() on a
//!   file descriptor for the directory is also needed"); a file created,
//!   written and fsynced but whose directory was not is gone after the cut;
//!   an unlink or rename not followed by an fsync of the directory is undone.
//!   A rename between two directories is durable in each one separately.
//! - Nothing is lost without a power cut, and nothing is torn within a page:
//!   a lost page reverts whole to its synced content.
//!
//! [`PowerCutFs::cut_power`] makes every later mutation fail with EIO (an
//! fsync then never reports success for data the cut lost); the caller kills
//! the processes using the mount, unmounts it, calls
//! [`PowerCutFs::restore_power`] (which reverts everything to its synced
//! state), and mounts the same file system again: the fresh mount has no page
//! cache of the old one's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// The unit in which unsynced data is tracked and dropped.
const PAGE: u64 = 4096;
/// Attributes and entries are not cached by the kernel: every lookup asks.
const TTL: Duration = Duration::ZERO;

/// A file's bytes as the program sees them and as the disk holds them.
#[derive(Default)]
struct FileData {
    current: Vec<u8>,
    synced: Vec<u8>,
    /// Pages of `current` that may differ from `synced`.
    dirty: BTreeSet<u64>,
}

impl FileData {
    fn mark(&mut self, from: u64, to: u64) {
        if to > from {
            self.dirty.extend(from / PAGE..=(to - 1) / PAGE);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let old_len = self.current.len() as u64;
        let end = offset + data.len() as u64;
        if end > old_len {
            self.current.resize(end as usize, 0);
        }
        self.current[offset as usize..end as usize].copy_from_slice(data);
        self.mark(offset.min(old_len), end);
    }

    fn set_len(&mut self, len: u64) {
        let old_len = self.current.len() as u64;
        self.current.resize(len as usize, 0);
        self.mark(old_len.min(len), old_len.max(len));
    }

    fn sync(&mut self) {
        self.synced.resize(self.current.len(), 0);
        for page in std::mem::take(&mut self.dirty) {
            let start = (page * PAGE) as usize;
            let end = (start + PAGE as usize).min(self.current.len());
            if start < end {
                self.synced[start..end].copy_from_slice(&self.current[start..end]);
            }
        }
    }

    /// Returns how many pages were not synced.
    fn lose_unsynced(&mut self) -> usize {
        self.current = self.synced.clone();
        std::mem::take(&mut self.dirty).len()
    }
}

/// A directory's entries as the program sees them and as the disk holds them.
#[derive(Default)]
struct DirData {
    current: BTreeMap<OsString, u64>,
    synced: BTreeMap<OsString, u64>,
}

enum Node {
    File(FileData),
    Dir(DirData),
}

struct Inode {
    node: Node,
    mode: u16,
}

struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    powered: bool,
    /// fsyncs that reached the disk, files and directories (for the tests).
    syncs: u64,
}

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let inode = self.inodes.get(&ino)?;
        let (kind, size, nlink) = match &inode.node {
            Node::File(f) => (FileType::RegularFile, f.current.len() as u64, 1),
            Node::Dir(_) => (FileType::Directory, 0, 2),
        };
        let epoch = SystemTime::UNIX_EPOCH;
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: epoch,
            mtime: epoch,
            ctime: epoch,
            crtime: epoch,
            kind,
            perm: inode.mode,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.inodes.get_mut(&ino).map(|i| &mut i.node) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.inodes.get_mut(&ino).map(|i| &mut i.node) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn powered(&self) -> Result<(), Errno> {
        if self.powered {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }

    /// Adds a new inode under `parent` as `name` (in the current entries only).
    fn make(&mut self, parent: u64, name: &OsStr, node: Node, mode: u16) -> Result<u64, Errno> {
        self.powered()?;
        let ino = self.next_ino;
        let dir = self.dir_mut(parent)?;
        if dir.current.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        dir.current.insert(name.to_owned(), ino);
        self.next_ino += 1;
        self.inodes.insert(ino, Inode { node, mode });
        Ok(ino)
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir_mut(parent)?
            .current
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    /// Reverts every file and directory to its synced state and forgets the
    /// inodes no synced directory reaches.
    /// Returns how many pages and directory entries differed (were lost).
    fn lose_unsynced(&mut self) -> usize {
        let mut lost = 0;
        for inode in self.inodes.values_mut() {
            match &mut inode.node {
                Node::File(f) => lost += f.lose_unsynced(),
                Node::Dir(d) => {
                    lost += d
                        .current
                        .iter()
                        .filter(|e| d.synced.get(e.0) != Some(e.1))
                        .count()
                        + d.synced
                            .keys()
                            .filter(|k| !d.current.contains_key(*k))
                            .count();
                    d.current = d.synced.clone();
                }
            }
        }
        let mut reachable = BTreeSet::from([INodeNo::ROOT.0]);
        let mut stack = vec![INodeNo::ROOT.0];
        while let Some(ino) = stack.pop() {
            if let Some(Node::Dir(d)) = self.inodes.get(&ino).map(|i| &i.node) {
                for &child in d.synced.values() {
                    if reachable.insert(child) {
                        stack.push(child);
                    }
                }
            }
        }
        self.inodes.retain(|ino, _| reachable.contains(ino));
        lost
    }
}

/// The file system's state, shared by its mounts and the test driving it.
#[derive(Clone)]
pub struct PowerCutFs {
    state: Arc<Mutex<State>>,
}

impl Default for PowerCutFs {
    fn default() -> Self {
        let root = Inode {
            node: Node::Dir(DirData::default()),
            mode: 0o755,
        };
        PowerCutFs {
            state: Arc::new(Mutex::new(State {
                inodes: HashMap::from([(INodeNo::ROOT.0, root)]),
                next_ino: 2,
                powered: true,
                syncs: 0,
            })),
        }
    }
}

/// A mount of a [`PowerCutFs`]; unmounted when dropped.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    dir: std::path::PathBuf,
}

impl Mounted {
    /// Unmounts, waiting for the file system's thread to end. An unmount
    /// failed once with other test binaries running (its error was not
    /// kept): a busy mount (EBUSY) is tried again for 5 s, and any other
    /// error fails the test with its errno and the mount point.
    pub fn unmount(mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let dir = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())
            .expect("a mount point without NUL bytes");
        let mut busy = 0;
        let unmounted = loop {
            // SAFETY: umount reads the NUL-terminated path and nothing else.
            if unsafe { libc::umount(dir.as_ptr()) } == 0 {
                break true;
            }
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EBUSY) if busy < 100 => busy += 1,
                // Not root: leave it to fuser, which knows fusermount.
                Some(libc::EPERM) => break false,
                _ => panic!(
                    "unmount the power-cut file system at {} (busy {busy} times before): {error}",
                    self.dir.display()
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !unmounted {
            session
                .umount_and_join()
                .expect("unmount the power-cut file system");
            return;
        }
        // The file system's thread ends as its device reports the unmount.
        // Its error (seen twice, beside other test binaries) is the FUSE
        // session's, not the disk's: the mount is gone, and the disk's state
        // is shared with the next mount (a handler that panicked with it
        // locked poisons it, which the next mount reports).
        if let Err(error) = session.join() {
            eprintln!(
                "warning: the power-cut file system's thread at {} ended with: {error}",
                self.dir.display()
            );
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

impl PowerCutFs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("power-cut fs state poisoned")
    }

    /// Mounts the file system at `dir` (an empty directory), served by a
    /// background thread.
    pub fn mount(&self, dir: &Path) -> std::io::Result<Mounted> {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("cetera-power-cut".into()),
            fuser::MountOption::RW,
        ];
        let session = fuser::spawn_mount(self.clone(), dir, &config)?;
        Ok(Mounted {
            session: Some(session),
            dir: dir.to_path_buf(),
        })
    }

    /// The power goes: from now on every write, fsync and namespace change
    /// fails with EIO, until [`PowerCutFs::restore_power`].
    pub fn cut_power(&self) {
        self.state().powered = false;
    }

    /// Power comes back: everything not synced before the cut is gone.
    /// Call it with the file system unmounted, then mount it again. Returns
    /// how many unsynced pages and directory entries were dropped.
    pub fn restore_power(&self) -> usize {
        let mut state = self.state();
        let lost = state.lose_unsynced();
        state.powered = true;
        lost
    }

    /// Fsyncs that succeeded so far (files and directories).
    pub fn syncs(&self) -> u64 {
        self.state().syncs
    }

    fn reply_entry(&self, result: Result<u64, Errno>, reply: ReplyEntry) {
        let state = self.state();
        match result.and_then(|ino| state.attr(ino).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

fn empty_reply(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.state().lookup(parent.0, name);
        self.reply_entry(result, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state();
        let result = (|| {
            if let Some(size) = size {
                state.powered()?;
                state.file_mut(ino.0)?.set_len(size);
            }
            if let Some(mode) = mode {
                let inode = state.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
                inode.mode = (mode & 0o7777) as u16;
            }
            state.attr(ino.0).ok_or(Errno::ENOENT)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let node = Node::Dir(DirData::default());
        let result = self
            .state()
            .make(parent.0, name, node, (mode & !umask & 0o7777) as u16);
        self.reply_entry(result, reply);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.state();
        let node = Node::File(FileData::default());
        let result = state
            .make(parent.0, name, node, (mode & !umask & 0o7777) as u16)
            .and_then(|ino| state.attr(ino).ok_or(Errno::ENOENT));
        match result {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            let ino = state.lookup(parent.0, name)?;
            state.file_mut(ino)?;
            state.dir_mut(parent.0)?.current.remove(name);
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            let ino = state.lookup(parent.0, name)?;
            if !state.dir_mut(ino)?.current.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            state.dir_mut(parent.0)?.current.remove(name);
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            if !flags.is_empty() {
                return Err(Errno::EINVAL);
            }
            let ino = state.lookup(parent.0, name)?;
            if let Ok(target) = state.lookup(newparent.0, newname) {
                let target_is_dir = state.dir_mut(target).is_ok();
                let source_is_dir = state.dir_mut(ino).is_ok();
                if target_is_dir != source_is_dir {
                    return Err(if target_is_dir {
                        Errno::EISDIR
                    } else {
                        Errno::ENOTDIR
                    });
                }
                if target_is_dir && !state.dir_mut(target)?.current.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            state.dir_mut(parent.0)?.current.remove(name);
            state
                .dir_mut(newparent.0)?
                .current
                .insert(newname.to_owned(), ino);
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.state();
        let result = (|| {
            state.file_mut(ino.0)?;
            if flags.0 & libc::O_TRUNC != 0 {
                state.powered()?;
                state.file_mut(ino.0)?.set_len(0);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.state();
        match state.file_mut(ino.0) {
            Ok(file) => {
                let len = file.current.len() as u64;
                let start = offset.min(len) as usize;
                let end = (offset + u64::from(size)).min(len) as usize;
                reply.data(&file.current[start..end]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            state.file_mut(ino.0)?.write(offset, data);
            Ok(())
        })();
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            state.file_mut(ino.0)?.sync();
            state.syncs += 1;
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            if mode != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            let file = state.file_mut(ino.0)?;
            if offset + length > file.current.len() as u64 {
                file.set_len(offset + length);
            }
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut state = self.state();
        let entries: Vec<(u64, OsString)> = match state.dir_mut(ino.0) {
            Ok(dir) => dir
                .current
                .iter()
                .map(|(name, &ino)| (ino, name.clone()))
                .collect(),
            Err(e) => return reply.error(e),
        };
        let all = [(ino.0, OsString::from(".")), (ino.0, OsString::from(".."))]
            .into_iter()
            .chain(entries);
        for (index, (child, name)) in all.enumerate().skip(offset as usize) {
            let kind = match state.inodes.get(&child).map(|i| &i.node) {
                Some(Node::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let result = (|| {
            state.powered()?;
            let dir = state.dir_mut(ino.0)?;
            dir.synced = dir.current.clone();
            state.syncs += 1;
            Ok(())
        })();
        empty_reply(result, reply);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
