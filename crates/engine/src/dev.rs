//! Member devices. The array is generic over `BlockDev`, so tests swap in in-memory and
//! fault-injecting devices (crate `uraid-sim`) for the real `FileDev`.

use crate::buf::IoBuf;
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
    /// Makes every completed write durable.
    fn flush(&self) -> impl Future<Output = io::Result<()>>;
}

/// A member that is a regular file or a block device, opened with O_DIRECT. I/O goes through
/// the calling reactor's io_uring when there is one, else blocking pread/pwrite.
///
/// Members on tmpfs (memory) are the exception: tmpfs cannot do I/O asynchronously, so
/// io_uring hands every request to a kernel worker thread and back (an IPI and two context
/// switches for a memcpy). For them the reactor copies inline with pread/pwrite, which is what
/// the worker would do, minus the hand-offs.
pub struct FileDev {
    file: File,
    path: String,
    size: u64,
    pub(crate) memory: bool,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether `file` lives on tmpfs.
fn on_tmpfs(file: &File) -> bool {
    // SAFETY: fstatfs fills the statfs struct we pass; all-zero is a valid initial value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a live statfs.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    r == 0 && st.f_type as i64 == TMPFS_MAGIC
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

impl FileDev {
    pub fn open(path: &Path) -> io::Result<FileDev> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let size = device_size(&file)?;
        let memory = on_tmpfs(&file);
        Ok(FileDev {
            file,
            path: path.display().to_string(),
            size,
            memory,
        })
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }
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

    fn name(&self) -> &str {
        &self.path
    }

    async fn read(&self, off: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        let want = buf.len();
        match reactor::local().filter(|l| l.has_ring() && !self.memory) {
            Some(l) => {
                let (res, b) = reactor::ring_read(&l, self.file.as_raw_fd(), off, buf).await;
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
                let (res, b) = reactor::ring_write(&l, self.file.as_raw_fd(), off, buf).await;
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

    async fn flush(&self) -> io::Result<()> {
        match reactor::local().filter(|l| l.has_ring()) {
            Some(l) => {
                let (res, _) = reactor::ring_fdatasync(&l, self.file.as_raw_fd()).await;
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
