//! I/O buffers aligned for O_DIRECT.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every I/O buffer: enough for O_DIRECT on 4Kn devices and for SIMD kernels.
pub const BUF_ALIGN: usize = 4096;

/// An owned, 4 KiB-aligned byte buffer for O_DIRECT I/O.
///
/// Written by hand rather than taken from `aligned-vec`, whose constructors copy and fill
/// byte by byte. Buffers are recycled through a per-thread pool by power-of-two size class:
/// a recycled buffer holds stale (but initialised) bytes, so the data path never pays for
/// allocation or zeroing — every user overwrites the bytes it hands out.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Allocated size: for a pooled buffer its size class, a power of two >= BUF_ALIGN; else
    /// the length in whole pages.
    cap: usize,
    /// Returned to the pool when dropped; false for buffers allocated inside `unpooled`, which
    /// are mapped and unmapped (`map`).
    pooled: bool,
}

// SAFETY: IoBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for IoBuf {}

/// Buffers kept per size class and thread: at most this many, and at most `POOL_BYTES` of
/// them (a count alone let a thread keep 512 x 4 MiB).
const POOL_DEPTH: usize = 512;
const POOL_BYTES: usize = 16 << 20;
/// Classes above this size are not pooled.
const POOL_MAX_CLASS: usize = 4 << 20;

thread_local! {
    static POOL: std::cell::RefCell<Vec<Vec<NonNull<u8>>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Inside `unpooled`'s poll: buffers allocated now are mapped, not pooled.
    static UNPOOLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `fut` with every buffer of at least `UNPOOLED_MIN` bytes it allocates outside the
/// pools: mapped for it, and when dropped (on any thread) kept in the shared spare list
/// within its limit (`Spare`) or unmapped, never put in a thread's pool. For memory that a
/// budget bounds (read-ahead's cache): pooled, each buffer the cache released would stay with
/// the thread that dropped it, up to `POOL_BYTES` per size class and thread, beside the
/// budget.
pub async fn unpooled<F: std::future::Future>(fut: F) -> F::Output {
    /// Restores the flag also if the poll unwinds.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UNPOOLED.with(|u| u.set(self.0));
        }
    }
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let _restore = Restore(UNPOOLED.with(|u| u.replace(true)));
        fut.as_mut().poll(cx)
    })
    .await
}

/// Smaller buffers stay pooled inside `unpooled`: a mapping each would cost more than the
/// copy it serves (and count against the kernel's limit on mappings).
const UNPOOLED_MIN: usize = 64 << 10;

fn class_index(cap: usize) -> usize {
    cap.trailing_zeros() as usize
}

impl IoBuf {
    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, BUF_ALIGN).expect("I/O buffer size fits a Layout")
    }

    /// A buffer of `len` bytes with unspecified (initialised) contents. The caller overwrites
    /// what it uses.
    pub fn with_len(len: usize) -> IoBuf {
        if len >= UNPOOLED_MIN && UNPOOLED.with(|u| u.get()) {
            // It never meets another size: whole pages, no size class.
            let cap = len.next_multiple_of(BUF_ALIGN);
            if let Some(ptr) = spare_take(cap).or_else(|| map(cap)) {
                return IoBuf {
                    ptr,
                    len,
                    cap,
                    pooled: false,
                };
            }
            // No mapping to be had (out of memory or of mappings): a pooled buffer.
        }
        let cap = len.max(BUF_ALIGN).next_power_of_two();
        if cap <= POOL_MAX_CLASS {
            let hit = POOL.try_with(|p| {
                p.borrow_mut()
                    .get_mut(class_index(cap))
                    .and_then(|v| v.pop())
            });
            if let Ok(Some(ptr)) = hit {
                return IoBuf {
                    ptr,
                    len,
                    cap,
                    pooled: true,
                };
            }
        }
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size. Zeroing on first allocation makes every byte
        // initialised, which recycled buffers then stay.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            len,
            cap,
            pooled: true,
        }
    }

    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        let mut b = IoBuf::with_len(len);
        b.fill(0);
        b
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_of(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::with_len(data.len());
        b.copy_from_slice(data);
        b
    }
}

/// Unpooled buffers dropped and kept for reuse, by exact length, shared by every thread:
/// at most `limit` bytes, the sum of what `Spare` reservations asked for. The rest is
/// unmapped. Mapping every buffer afresh cost read-ahead two thirds of its throughput on
/// memory members (zeroing and unmapping 1 GB/s is most of a core).
struct Spares {
    /// Addresses by length (None until the first is kept: a const-built static).
    by_len: Option<std::collections::HashMap<usize, Vec<usize>>>,
    bytes: usize,
    limit: usize,
}

impl Spares {
    const fn new() -> Spares {
        Spares {
            by_len: None,
            bytes: 0,
            limit: 0,
        }
    }

    fn take(&mut self, cap: usize) -> Option<usize> {
        let p = self.by_len.as_mut()?.get_mut(&cap)?.pop()?;
        self.bytes -= cap;
        Some(p)
    }

    /// Keeps `p` (`cap` bytes), making room by giving back buffers of other lengths (a
    /// length asked for now is likelier to be asked for again than one kept earlier, e.g.
    /// before a member failed); `p` itself, and nothing else, if buffers of its own length
    /// already fill the limit. What is given back, to unmap.
    fn keep(&mut self, p: usize, cap: usize) -> Vec<(usize, usize)> {
        let by_len = self.by_len.get_or_insert_with(Default::default);
        let own = by_len.get(&cap).map_or(0, |v| v.len() * cap);
        if own + cap > self.limit {
            // Would not fit even with every other length given back.
            return vec![(p, cap)];
        }
        let mut over = Vec::new();
        for (&other, v) in by_len.iter_mut() {
            while self.bytes + cap > self.limit && other != cap {
                let Some(q) = v.pop() else { break };
                self.bytes -= other;
                over.push((q, other));
            }
        }
        by_len.entry(cap).or_default().push(p);
        self.bytes += cap;
        over
    }

    /// Lowers the limit by `by`; the buffers now over it, to unmap.
    fn shrink(&mut self, by: usize) -> Vec<(usize, usize)> {
        self.limit -= by;
        let mut over = Vec::new();
        for (&cap, v) in self.by_len.iter_mut().flatten() {
            while self.bytes > self.limit {
                let Some(p) = v.pop() else { break };
                self.bytes -= cap;
                over.push((p, cap));
            }
        }
        over
    }
}

static SPARES: std::sync::Mutex<Spares> = std::sync::Mutex::new(Spares::new());

fn spares<R>(f: impl FnOnce(&mut Spares) -> R) -> R {
    // A panic under the lock leaves the lists consistent: each push and pop is whole.
    f(&mut SPARES.lock().unwrap_or_else(|p| p.into_inner()))
}

fn spare_take(cap: usize) -> Option<NonNull<u8>> {
    NonNull::new(spares(|s| s.take(cap))? as *mut u8)
}

/// Keeps `ptr` (an unpooled buffer of `cap` bytes) for reuse if the limit allows, and unmaps
/// what does not fit.
fn spare_keep(ptr: NonNull<u8>, cap: usize) {
    for (p, cap) in spares(|s| s.keep(ptr.as_ptr() as usize, cap)) {
        if let Some(p) = NonNull::new(p as *mut u8) {
            unmap(p, cap);
        }
    }
}

/// A share of the spare-buffer limit, held by whoever bounds its unpooled memory (read-ahead
/// keeps `bytes` of its budget for it); given back when dropped.
#[derive(Debug)]
pub struct Spare(usize);

impl Spare {
    pub fn reserve(bytes: usize) -> Spare {
        spares(|s| s.limit += bytes);
        Spare(bytes)
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        for (p, cap) in spares(|s| s.shrink(self.0)) {
            if let Some(p) = NonNull::new(p as *mut u8) {
                unmap(p, cap);
            }
        }
    }
}

fn unmap(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: `ptr` was mapped by `map` with exactly this length and is unmapped once: its
    // buffer was dropped and it left the spare lists.
    let r = unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
    debug_assert_eq!(r, 0, "munmap of a buffer's own mapping");
    MAPPED.fetch_sub(cap, std::sync::atomic::Ordering::Relaxed);
}

/// Bytes of unpooled buffers mapped now (in use or spare), and the most there ever were.
static MAPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static MAPPED_PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Bytes of unpooled buffers mapped now (in use or kept spare) and the peak since the process
/// started: what read-ahead's budget bounds, summed over every volume.
pub fn unpooled_bytes() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (MAPPED.load(Relaxed), MAPPED_PEAK.load(Relaxed))
}

/// `len` bytes (a multiple of the page size) of anonymous memory, zero-filled and populated
/// up front (one fault per mapping, not per page). Unpooled buffers are mapped rather than
/// taken from the allocator: glibc keeps freed heap memory in its arenas, so the memory a
/// budget gave back stayed resident (read-ahead with a 64 MiB budget held about twice that
/// on top).
fn map(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: a fresh private anonymous mapping: no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    use std::sync::atomic::Ordering::Relaxed;
    let now = MAPPED.fetch_add(len, Relaxed) + len;
    MAPPED_PEAK.fetch_max(now, Relaxed);
    NonNull::new(p.cast())
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::copy_of(self)
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        let (ptr, cap) = (self.ptr, self.cap);
        if self.pooled && cap <= POOL_MAX_CLASS {
            let kept = POOL.try_with(|p| {
                let mut p = p.borrow_mut();
                let i = class_index(cap);
                if p.len() <= i {
                    p.resize_with(i + 1, Vec::new);
                }
                if p[i].len() < POOL_DEPTH.min(POOL_BYTES / cap).max(4) {
                    p[i].push(ptr);
                    true
                } else {
                    false
                }
            });
            if kept == Ok(true) {
                return;
            }
        }
        if !self.pooled {
            spare_keep(ptr, cap);
            return;
        }
        // SAFETY: allocated in with_len with exactly this layout, and freed once (a pooled
        // pointer is owned by the pool, not by any IoBuf).
        unsafe { alloc::dealloc(ptr.as_ptr(), Self::layout(cap)) };
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

/// A zero-filled aligned buffer of `len` bytes.
pub fn zeroed(len: usize) -> IoBuf {
    IoBuf::zeroed(len)
}

/// An aligned buffer of `len` bytes whose contents the caller will overwrite.
pub fn alloc(len: usize) -> IoBuf {
    IoBuf::with_len(len)
}

/// An aligned copy of `data`.
pub fn copy_of(data: &[u8]) -> IoBuf {
    IoBuf::copy_of(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_hold_their_bytes() {
        for len in [0, 1, 511, 4096, 65536 + 3] {
            let z = zeroed(len);
            assert_eq!(z.as_ptr() as usize % BUF_ALIGN, 0);
            assert!(z.iter().all(|&b| b == 0) && z.len() == len);
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let c = copy_of(&data);
            assert_eq!(c.as_ptr() as usize % BUF_ALIGN, 0);
            assert_eq!(&c[..], &data[..]);
            let mut d = c.clone();
            if len > 0 {
                d[0] ^= 1;
                assert_ne!(d[0], c[0]);
            }
        }
    }

    #[test]
    fn pool_recycles_by_class_and_zeroed_really_zeroes() {
        let mut a = alloc(5000);
        a.fill(0xab);
        let p = a.as_ptr();
        drop(a);
        let b = alloc(8000); // same 8 KiB class: the recycled buffer
        assert_eq!(b.as_ptr(), p);
        drop(b);
        let z = zeroed(8192);
        assert_eq!(z.as_ptr(), p);
        assert!(z.iter().all(|&x| x == 0));
    }

    #[test]
    fn spares_stay_within_their_limit() {
        let mut s = Spares::new();
        assert_eq!(
            s.keep(0x1000, 4096),
            [(0x1000, 4096)],
            "no limit: nothing kept"
        );
        s.limit = 3 * 4096;
        assert_eq!(s.keep(0x1000, 4096), []);
        assert_eq!(s.keep(0x2000, 8192), []);
        assert_eq!(
            s.keep(0x4000, 8192),
            [(0x4000, 8192)],
            "its own length fills it: only it goes"
        );
        assert_eq!(
            (s.take(8192), s.take(8192), s.bytes),
            (Some(0x2000), None, 4096)
        );
        assert_eq!(s.take(12288), None, "only exact lengths are reused");
        assert_eq!(
            s.keep(0x6000, 12288),
            [(0x1000, 4096)],
            "another length makes room"
        );
        assert_eq!((s.take(12288), s.bytes), (Some(0x6000), 0));
        assert_eq!(s.keep(0x1000, 4096), []);
        assert_eq!(s.keep(0x2000, 8192), []);
        let over = s.shrink(2 * 4096);
        let given: usize = over.iter().map(|&(_, cap)| cap).sum();
        assert!(s.bytes <= s.limit && s.limit == 4096, "{over:?}");
        assert_eq!(
            s.bytes + given,
            3 * 4096,
            "every buffer kept or given back once"
        );
    }

    #[test]
    fn unpooled_buffers_skip_the_pool_when_dropped() {
        use std::future::Future;
        // A class no other test here uses, so the pool starts empty for it on this thread.
        let len = 3 << 20;
        assert!(len >= UNPOOLED_MIN);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let fut = std::pin::pin!(unpooled(async move { alloc(len) }));
        let std::task::Poll::Ready(b) = fut.poll(&mut cx) else {
            panic!("an async block without awaits completes in one poll");
        };
        assert!(
            !b.pooled && b.cap == len,
            "unpooled: exact pages, no size class"
        );
        drop(b);
        let in_pool = POOL.with(|p| p.borrow().get(class_index(4 << 20)).map_or(0, |v| v.len()));
        assert_eq!(in_pool, 0, "an unpooled buffer went back to the pool");
        // Outside the scope allocation pools again.
        let c = alloc(len);
        assert!(c.pooled);
        drop(c);
        let in_pool = POOL.with(|p| p.borrow().get(class_index(4 << 20)).map_or(0, |v| v.len()));
        assert_eq!(in_pool, 1);
    }
}

/// A read result: pieces of buffers that together hold the requested bytes, in order.
/// Keeping pieces (rather than copying into one buffer) lets a network server send them with
/// one writev and no copy.
/// A member buffer may back several segments (adjacent chunks read from one member in one I/O),
/// hence the Arc.
#[derive(Debug, Default, Clone)]
pub struct Segments {
    pub parts: Vec<(std::sync::Arc<IoBuf>, std::ops::Range<usize>)>,
}

impl Segments {
    pub fn len(&self) -> usize {
        self.parts.iter().map(|(_, r)| r.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|(b, r)| &b[r.clone()])
    }

    /// Copies everything into one aligned buffer (devices without gather writes).
    pub fn to_buf(&self) -> IoBuf {
        let mut b = IoBuf::with_len(self.len());
        let mut at = 0;
        for s in self.iter() {
            b[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        b
    }

    /// Copies everything into one vector (tests and tools; the data path avoids this).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for s in self.iter() {
            v.extend_from_slice(s);
        }
        v
    }
}

/// The bytes of one volume write, shared (not copied) by every stripe, member write and
/// encoder that uses them. Held in an aligned buffer so that member writes can point at the
/// client's payload itself (O_DIRECT): the NBD server receives payloads straight into one
/// (`IoBuf::with_len`, no zeroing), and writes of whole chunks go out as gather writes of its
/// slices. Made from a `Vec` (or anything else) with one copy, for tests and tools.
#[derive(Clone, Debug)]
pub struct WriteBuf(std::sync::Arc<IoBuf>);

impl WriteBuf {
    /// `range` of these bytes as one piece of a gather write, without copying.
    pub fn segment(
        &self,
        range: std::ops::Range<usize>,
    ) -> (std::sync::Arc<IoBuf>, std::ops::Range<usize>) {
        debug_assert!(range.end <= self.0.len());
        (self.0.clone(), range)
    }
}

impl std::ops::Deref for WriteBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<IoBuf> for WriteBuf {
    fn from(b: IoBuf) -> WriteBuf {
        WriteBuf(std::sync::Arc::new(b))
    }
}

impl From<&[u8]> for WriteBuf {
    fn from(v: &[u8]) -> WriteBuf {
        IoBuf::copy_of(v).into()
    }
}

impl From<Vec<u8>> for WriteBuf {
    fn from(v: Vec<u8>) -> WriteBuf {
        WriteBuf::from(&v[..])
    }
}

impl From<std::sync::Arc<Vec<u8>>> for WriteBuf {
    fn from(v: std::sync::Arc<Vec<u8>>) -> WriteBuf {
        WriteBuf::from(&v[..])
    }
}

impl From<&std::sync::Arc<Vec<u8>>> for WriteBuf {
    fn from(v: &std::sync::Arc<Vec<u8>>) -> WriteBuf {
        WriteBuf::from(&v[..])
    }
}
