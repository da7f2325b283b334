//! Member devices. The array is generic over `BlockDev`, so tests swap in in-memory and
//! fault-injecting devices (crate `uraid-sim`) for the real `FileDev`.

use crate::buf::{IoBuf, Segments};
use crate::reactor;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A member device: positioned reads and writes of aligned buffers, and a durability barrier.
/// Buffers are passed by value and handed back, so an implementation may keep them while the
/// kernel works on them.
pub trait BlockDev: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// A name for messages (usually the path).
    fn name(&self) -> &str;
    /// Fills `buf` from `off`. A short read is an error.
    fn read(&self, off: u64, buf: IoBuf) -> impl Future<Output = (io::Result<()>, IoBuf)>;
    /// Writes all of `buf` at `off`.
    fn write(&self, off: u64, buf: IoBuf) -> impl Future<Output = (io::Result<()>, IoBuf)>;
    /// Writes the pieces of `segs`, back to back, at `off`: one write, as if they were one
    /// buffer. The default copies them into one; `FileDev` writes them in place (writev),
    /// which lets a client's payload reach the members without a copy.
    fn write_gather(&self, off: u64, segs: Segments) -> impl Future<Output = io::Result<()>> {
        async move { self.write(off, segs.to_buf()).await.0 }
    }
    /// Makes every completed write durable.
    fn flush(&self) -> impl Future<Output = io::Result<()>>;
    /// Tells the device that `[off, off + len)` holds nothing the array needs (TRIM passed
    /// down): a file punches a hole (its space is returned), a block device gets a discard.
    /// What the range reads afterwards is unspecified (zeros, the old bytes, anything), so
    /// the array discards only units its allocation map says hold no data
    /// (array/discard.rs). `Unsupported` (the default): the device cannot.
    fn discard(&self, off: u64, len: u64) -> impl Future<Output = io::Result<()>> {
        let _ = (off, len);
        async { Err(io::Error::from(io::ErrorKind::Unsupported)) }
    }
    /// The array is done with this device (a replaced, failed or dropped device of a slot
    /// that has another one): let go of it (its exclusive claim) although the handle stays
    /// alive for I/O still on its way, which from now on reaches nothing.
    fn retire(&self) {}
    /// Whether reads complete as a memory copy on the calling thread (tmpfs members): there
    /// is no device latency for read-ahead to hide (`serve --read-ahead auto`).
    fn completes_inline(&self) -> bool {
        false
    }
}

/// A member that is a regular file or a block device, opened with O_DIRECT. I/O goes through
/// the calling reactor's io_uring when there is one, else blocking pread/pwrite.
///
/// Members on tmpfs (memory) are the exception: tmpfs cannot do I/O asynchronously, so
/// io_uring hands every request to a kernel worker thread and back (an IPI and two context
/// switches for a memcpy). For them the reactor runs every op inline (pread/pwrite,
/// fallocate, fdatasync), which is what the worker would do, minus the hand-offs.
pub struct FileDev {
    file: File,
    path: String,
    size: u64,
    pub(crate) memory: bool,
    /// The filesystem may block the thread that submits I/O (FUSE, network filesystems):
    /// ring I/O goes straight to io-wq workers (`reactor::member_flags`).
    punt: bool,
    /// A block device: discards are BLKDISCARD, not hole punching.
    block: bool,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;
/// FUSE, NFS, SMB (two), 9p, Ceph: filesystems whose I/O can sleep in the submitter.
const PUNT_MAGICS: [i64; 6] = [
    0x6573_5546,
    0x6969,
    0xFF53_4D42,
    0xFE53_4D42,
    0x0102_1997,
    0x00c3_6400,
];

/// The filesystem magic of `file` (0 if fstatfs fails).
fn fs_magic(file: &File) -> i64 {
    // SAFETY: fstatfs fills the statfs struct we pass; all-zero is a valid initial value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a live statfs.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    if r == 0 {
        st.f_type as i64
    } else {
        0
    }
}

/// Whether `file` lives on tmpfs.
fn on_tmpfs(file: &File) -> bool {
    fs_magic(file) == TMPFS_MAGIC
}

/// Turns a CQE result for a `want`-byte transfer into an io::Result; a short transfer is an
/// error (members are sized, so it means the device shrank or failed).
fn ring_result(what: &str, res: i32, want: usize) -> io::Result<()> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else if res as usize != want {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short {what}: {res} of {want} bytes"),
        ))
    } else {
        Ok(())
    }
}

/// Writes every piece of `segs` at `off` with pwritev (retrying after a short write).
fn pwritev_all(file: &File, off: u64, segs: &Segments) -> io::Result<()> {
    let want = segs.len();
    let mut done = 0usize;
    while done < want {
        let mut skip = done;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(segs.parts.len());
        for s in segs.iter() {
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            iov.push(libc::iovec {
                iov_base: s[skip..].as_ptr() as *mut libc::c_void,
                iov_len: s.len() - skip,
            });
            skip = 0;
            if iov.len() == 1024 {
                break;
            }
        }
        // SAFETY: every iovec points into a buffer `segs` keeps alive for this call; the
        // kernel only reads through them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {done} of {want} bytes"),
            ));
        }
        done += n as usize;
    }
    Ok(())
}

impl FileDev {
    /// Opens a member for reading and writing with O_DIRECT, exclusively: a block device with
    /// O_EXCL (refused while mounted or claimed by another exclusive opener), a regular file
    /// with an exclusive `flock` held until the `FileDev` is dropped. A member another process
    /// holds is `OpenError::Busy`, naming the holder where it can be found.
    pub fn open(path: &Path) -> Result<FileDev, OpenError> {
        FileDev::open_with(path, Access::ReadWrite)
    }

    /// `open`, with the access mode given: `Access::ReadOnly` opens the member O_RDONLY (still
    /// exclusively), so nothing this device does can change it; writes fail with EBADF.
    pub fn open_with(path: &Path, access: Access) -> Result<FileDev, OpenError> {
        let file = open_exclusive(path, access, true)?;
        let size = device_size(&file).map_err(|err| OpenError::Io {
            path: path.display().to_string(),
            err,
        })?;
        let block = file
            .metadata()
            .is_ok_and(|m| m.file_type().is_block_device());
        // A device node lives on devtmpfs, which reports tmpfs's magic: only a regular file
        // on tmpfs is memory.
        let memory = !block && on_tmpfs(&file);
        let punt = PUNT_MAGICS.contains(&fs_magic(&file));
        Ok(FileDev {
            file,
            path: path.display().to_string(),
            size,
            memory,
            punt,
            block,
        })
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }
}

/// How a member is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

/// Who holds a member that could not be opened exclusively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The process holding the file's `flock` (found in /proc/locks), with its command name.
    Pid { pid: u32, comm: Option<String> },
    /// A block device mounted here (from /proc/self/mountinfo).
    Mounted(String),
    /// A block device claimed by kernel devices (its /sys/dev/block/M:m/holders: md, dm, ...).
    Kernel(Vec<String>),
    /// Held by a process that cannot be named: block devices opened with O_EXCL record no
    /// owner. `openers` are the other processes that have it open at all (from /proc/PID/fd),
    /// one of which is likely the holder.
    Unknown { openers: Vec<u32> },
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Pid { pid, comm: Some(c) } => write!(f, "by pid {pid} ({c})"),
            Holder::Pid { pid, comm: None } => write!(f, "by pid {pid}"),
            Holder::Mounted(at) => write!(f, "(mounted on {at})"),
            Holder::Kernel(by) => write!(f, "(held by {})", by.join(", ")),
            Holder::Unknown { openers } if openers.is_empty() => {
                write!(f, "(opened exclusively by another process)")
            }
            Holder::Unknown { openers } => {
                let pids: Vec<String> = openers.iter().map(|p| p.to_string()).collect();
                write!(
                    f,
                    "(opened exclusively by another process; open in pid {})",
                    pids.join(", ")
                )
            }
        }
    }
}

/// Why a member could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the member exclusively (or it is mounted, or claimed by md/dm).
    #[error("{path} is in use {holder}")]
    Busy { path: String, holder: Holder },
    #[error("{path}: {err}")]
    Io { path: String, err: io::Error },
    /// A block device opened for writing is write-protected (its read-only flag).
    #[error("{path} is write-protected (a read-only block device: blockdev --getro says 1)")]
    ReadOnly { path: String },
}

/// What to do about a write-protected member (`OpenError::ReadOnly`).
pub const READ_ONLY_HINT: &str = "uraid writes to its members: make it writable (blockdev \
     --setrw), or serve --read-only (an array stopped cleanly: nothing is written then)";

/// A member I/O error for the log: EPERM and EROFS say what they usually mean here (a
/// write-protected device, or one remounted read-only underneath).
pub(crate) fn explain(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EROFS) => {
            format!("{e} (the device refuses writes: write-protected or read-only)")
        }
        _ => e.to_string(),
    }
}

/// `BLKROGET` (linux/fs.h: `_IO(0x12, 94)`): the block device's read-only flag.
const BLKROGET: libc::c_ulong = 0x125e;

/// Whether block device `file` is write-protected (false when that cannot be asked).
fn block_read_only(file: &File) -> bool {
    let mut ro: libc::c_int = 0;
    // SAFETY: BLKROGET writes one int through the pointer, which is valid and aligned for
    // the duration of the call; the descriptor is ours.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKROGET, &mut ro as *mut libc::c_int) };
    r == 0 && ro != 0
}

/// Opens `path` (O_DIRECT if `direct`) and claims it for this process: block devices with
/// O_EXCL, everything else with `flock(LOCK_EX | LOCK_NB)` on the returned file. The claim
/// lasts as long as the file stays open. Readers that only look (`examine`, `status`) do not
/// claim anything and are never refused.
pub fn open_exclusive(path: &Path, access: Access, direct: bool) -> Result<File, OpenError> {
    let io_err = |err| OpenError::Io {
        path: path.display().to_string(),
        err,
    };
    let block = std::fs::metadata(path)
        .map_err(io_err)?
        .file_type()
        .is_block_device();
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if block {
        // Without O_CREAT, O_EXCL on a block device means an exclusive open (EBUSY while
        // mounted, part of md/dm, or opened O_EXCL elsewhere).
        flags |= libc::O_EXCL;
    }
    let file = match OpenOptions::new()
        .read(true)
        .write(access == Access::ReadWrite)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if block && e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(OpenError::Busy {
                path: path.display().to_string(),
                holder: block_holder(path),
            })
        }
        Err(e) => return Err(io_err(e)),
    };
    // Linux opens a read-only block device for writing and fails each write with EPERM:
    // the member would fail at the first write. Said now, by name.
    if block && access == Access::ReadWrite && block_read_only(&file) {
        return Err(OpenError::ReadOnly {
            path: path.display().to_string(),
        });
    }
    if !block {
        // SAFETY: flock on a file descriptor we own; it takes no pointers.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(OpenError::Busy {
                    path: path.display().to_string(),
                    holder: file_holder(&file),
                });
            }
            // A filesystem without flock support (ENOLCK on some network filesystems): the
            // member is still usable, but nothing stops a second opener.
            tracing::warn!(
                "{}: cannot lock ({e}); another process could open it at the same time",
                path.display()
            );
        }
    }
    Ok(file)
}

/// The process holding `file`'s flock, from /proc/locks (`N: FLOCK ADVISORY WRITE PID
/// MAJ:MIN:INODE ...`, major and minor in hex).
fn file_holder(file: &File) -> Holder {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = file.metadata() else {
        return Holder::Unknown { openers: vec![] };
    };
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(md.dev()),
        libc::minor(md.dev()),
        md.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Blocked waiters ("N: -> FLOCK ...") are not holders: their f[1] is "->".
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == id)
            .then(|| f[4].parse::<u32>().ok())
            .flatten()
    });
    match pid {
        Some(pid) if pid != 0 => Holder::Pid {
            pid,
            comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim().to_string()),
        },
        _ => Holder::Unknown {
            openers: openers(|m| m.dev() == md.dev() && m.ino() == md.ino()),
        },
    }
}

/// What holds a block device that refused O_EXCL: a mount, a kernel holder (md, dm), or a
/// process we can at best narrow down to the ones that have it open.
fn block_holder(path: &Path) -> Holder {
    use std::os::unix::fs::MetadataExt;
    let Ok(rdev) = std::fs::metadata(path).map(|m| m.rdev()) else {
        return Holder::Unknown { openers: vec![] };
    };
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT ... (decimal major:minor)
    let dev = format!("{major}:{minor}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some(at) = mountinfo.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 4 && f[2] == dev).then(|| f[4].to_string())
    }) {
        return Holder::Mounted(at);
    }
    let mut kernel: Vec<String> = std::fs::read_dir(format!("/sys/dev/block/{dev}/holders"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !kernel.is_empty() {
        kernel.sort();
        return Holder::Kernel(kernel);
    }
    Holder::Unknown {
        openers: openers(|m| m.file_type().is_block_device() && m.rdev() == rdev),
    }
}

/// Other processes with an open file descriptor that `is_it` accepts (from /proc/PID/fd).
/// Only used to explain a refusal, so unreadable entries are skipped.
fn openers(is_it: impl Fn(&std::fs::Metadata) -> bool) -> Vec<u32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for p in procs.filter_map(|e| e.ok()) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .filter_map(|e| e.ok())
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| is_it(&m)))
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

/// Size of a regular file or block device.
pub fn device_size(file: &File) -> io::Result<u64> {
    let md = file.metadata()?;
    if md.file_type().is_block_device() {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid and aligned.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), 0x8008_1272, &mut size as *mut u64) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(size)
    } else {
        Ok(md.len())
    }
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size
    }

    /// Points the descriptor at /dev/null (dup2): the member file's open description is
    /// closed, so its flock or O_EXCL claim ends and the device can be used again (added,
    /// given to another array), while the descriptor number stays valid: an I/O still on
    /// its way writes nowhere and reads nothing (a short read: an error), never another
    /// file that reused the number.
    fn retire(&self) {
        let null = match OpenOptions::new().read(true).write(true).open("/dev/null") {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("{}: cannot let go of it: /dev/null: {e}", self.path);
                return;
            }
        };
        // SAFETY: dup2 between two descriptors this process owns (`null` lives until the end
        // of this block, `self.file` as long as the FileDev); it takes no pointers.
        let r = unsafe { libc::dup2(null.as_raw_fd(), self.file.as_raw_fd()) };
        if r < 0 {
            tracing::warn!(
                "{}: cannot let go of it: {}",
                self.path,
                io::Error::last_os_error()
            );
        }
    }

    fn name(&self) -> &str {
        &self.path
    }

    fn completes_inline(&self) -> bool {
        self.memory
    }

    async fn read(&self, off: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        let want = buf.len();
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let (res, b) =
                    reactor::ring_read(&l, self.file.as_raw_fd(), off, buf, self.punt).await;
                (
                    ring_result("read", res, want),
                    b.expect("read op returns its buffer"),
                )
            }
            None => {
                let r = self.file.read_exact_at(&mut buf, off);
                (r, buf)
            }
        }
    }

    async fn write(&self, off: u64, buf: IoBuf) -> (io::Result<()>, IoBuf) {
        let want = buf.len();
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let (res, b) =
                    reactor::ring_write(&l, self.file.as_raw_fd(), off, buf, self.punt).await;
                (
                    ring_result("write", res, want),
                    b.expect("write op returns its buffer"),
                )
            }
            None => {
                let r = self.file.write_all_at(&buf, off);
                (r, buf)
            }
        }
    }

    async fn write_gather(&self, off: u64, segs: Segments) -> io::Result<()> {
        let want = segs.len();
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let res = reactor::ring_writev(&l, self.file.as_raw_fd(), off, segs, self.punt)
                    .await
                    .0;
                ring_result("write", res, want)
            }
            None => pwritev_all(&self.file, off, &segs),
        }
    }

    /// Files: `fallocate(PUNCH_HOLE | KEEP_SIZE)`, through the ring when there is one (the
    /// kernel runs it on an io-wq worker). Block devices: BLKDISCARD, which no ring opcode
    /// issues on every kernel this runs on and which can take long: on a thread of its own,
    /// with its own descriptor (a `dup`, so the number stays valid until it returns).
    async fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        if self.block {
            let f = self.file.try_clone()?;
            let (tx, rx) = futures::channel::oneshot::channel();
            std::thread::Builder::new()
                .name("uraid-discard".into())
                .spawn(move || {
                    let range: [u64; 2] = [off, len];
                    // SAFETY: BLKDISCARD reads two u64s (start, length) through the pointer,
                    // which lives until the call returns; `f` is a descriptor this thread owns.
                    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
                    let _ = tx.send(if r < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(())
                    });
                })?;
            return rx
                .await
                .unwrap_or_else(|_| Err(io::Error::other("discard thread died")));
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let (res, _) =
                    reactor::ring_fallocate(&l, self.file.as_raw_fd(), off, len, mode, self.punt)
                        .await;
                if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(())
                }
            }
            None => {
                // SAFETY: plain fallocate syscall on a descriptor this device owns.
                let r =
                    unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off as i64, len as i64) };
                if r < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            }
        }
    }

    /// On tmpfs inline like every other op: fdatasync there returns at once (there is
    /// nothing to write back), and through the ring it would take a trip to an io-wq worker.
    async fn flush(&self) -> io::Result<()> {
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let (res, _) = reactor::ring_fdatasync(&l, self.file.as_raw_fd(), self.punt).await;
                if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(())
                }
            }
            None => self.file.sync_data(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member on tmpfs completes inline (so `--read-ahead auto` leaves read-ahead off over
    /// it).
    #[test]
    fn tmpfs_members_complete_inline() {
        let base = Path::new("/dev/shm");
        if !base.is_dir() {
            return; // no tmpfs to try here
        }
        let p = base.join(format!("uraid-inline-{}", std::process::id()));
        std::fs::File::create(&p)
            .and_then(|f| f.set_len(1 << 20))
            .expect("member file");
        let d = FileDev::open_with(&p, Access::ReadWrite).expect("open");
        let inline = d.completes_inline();
        drop(d);
        let _ = std::fs::remove_file(&p);
        assert!(inline, "a member on /dev/shm completes inline");
    }

    /// A block device is not memory, though its node on devtmpfs reports tmpfs's magic:
    /// its I/O goes through the ring (a blocking pread on a disk would stall the reactor).
    #[test]
    fn block_devices_do_not_complete_inline() {
        let base = Path::new("/dev/shm");
        if !base.is_dir() {
            return;
        }
        let back = base.join(format!("uraid-loop-{}", std::process::id()));
        std::fs::File::create(&back)
            .and_then(|f| f.set_len(4 << 20))
            .expect("backing file");
        let o = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&back)
            .output();
        let dev = match o {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            other => {
                let _ = std::fs::remove_file(&back);
                // Not root or no loop driver: say so loudly rather than pass silently.
                eprintln!("SKIPPED block_devices_do_not_complete_inline: {other:?}");
                return;
            }
        };
        let opened = FileDev::open_with(Path::new(&dev), Access::ReadWrite)
            .map(|d| (d.completes_inline(), d.block, on_tmpfs(&d.file)));
        let _ = std::process::Command::new("losetup")
            .args(["-d", &dev])
            .status();
        let _ = std::fs::remove_file(&back);
        let (inline, block, magic) = opened.expect("open the loop device");
        assert!(block, "{dev} is a block device");
        assert!(!inline, "{dev} must not be treated as memory");
        if !magic {
            // The case this guards against needs /dev on devtmpfs (tmpfs's magic).
            eprintln!("block_devices_do_not_complete_inline: /dev is not devtmpfs here");
        }
    }
}
