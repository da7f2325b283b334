//! Test support for uraid: in-memory member devices with injectable faults (dead devices,
//! bad sectors, hangs, a volatile write cache that a simulated power cut partly loses), the
//! flat reference model, and helpers to build and reassemble arrays over them (`fixtures`,
//! re-exported here), with one seeded generator (`rng`). Never used by the product itself.

pub mod crash;
pub mod fixtures;
pub mod interaction;
pub mod rng;

pub use fixtures::*;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use uraid_core::format::DATA_OFFSET;
use uraid_engine::buf::IoBuf;
use uraid_engine::BlockDev;

/// Fault switch shared between a test and one device.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every operation fails with ENODEV (the device is gone) while set.
    pub dead: AtomicBool,
    /// When positive, counts operations down; the device dies when it reaches zero.
    pub die_after: AtomicI64,
    /// When set, every operation yields to the executor once before it touches the bytes, so
    /// other requests run in between, as they do while real I/O is in flight (memory
    /// otherwise completes synchronously and hides every interleaving).
    pub yield_ops: AtomicBool,
    /// Reads of bytes in `[bad_lo, bad_hi)` (device offsets) fail with EIO: bad sectors. A
    /// write over them repairs them (as a drive remaps a sector on write).
    bad: Mutex<Vec<(u64, u64)>>,
    /// While set, operations never complete (a hung device).
    pub hang: AtomicBool,
    /// Operations started (for tests that count member I/O).
    pub ops: AtomicU64,
    /// Every read and write sleeps this many microseconds first (blocking the thread): a
    /// slow but working device (fail-slow tests).
    pub delay_us: AtomicU64,
    /// Every read and write waits this many microseconds on the reactor's timer first
    /// (other operations go on meanwhile): a fail-slow device in a simulation with other
    /// work on the same reactor, where `delay_us` would stall everything alike.
    pub lag_us: AtomicU64,
    /// Writes to the metadata area (below the data offset) yield this many extra times: a
    /// slow map-page or superblock write, to widen a race window on purpose.
    pub slow_meta_writes: AtomicU64,
    /// Each write yields a pseudo-random 0..4 extra times, so concurrent writes to different
    /// members complete in different orders.
    pub jitter: AtomicBool,
    jitter_seq: AtomicU64,
    /// While set (`hold`), every operation waits before it touches the bytes until
    /// `release`: requests stay in flight as long as a test needs them to.
    pub held: AtomicBool,
    parked: Mutex<Vec<Waker>>,
    /// While set, flushes never complete (reads and writes do): what a test needs to cut
    /// the power between a write and the flush that would make it durable.
    pub flush_hang: AtomicBool,
    /// Every read yields this many extra times before it copies: a slow read, so other
    /// requests (a trim of the same range) run while it is in flight.
    pub read_yields: AtomicU64,
    /// Bytes discarded (`BlockDev::discard`) so far, and discards asked for (done or not).
    pub discarded: AtomicU64,
    pub discard_calls: AtomicU64,
    /// While set, discards fail as unsupported (a device without discard support).
    pub no_discard: AtomicBool,
}

impl Faults {
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// The device dies on its `ops`-th operation from now (1 = the next one).
    pub fn kill_after(&self, ops: i64) {
        self.die_after.store(ops, Ordering::SeqCst);
    }

    /// Marks device bytes `[lo, hi)` unreadable until written.
    pub fn bad_range(&self, lo: u64, hi: u64) {
        self.bad.lock().unwrap().push((lo, hi));
    }

    /// Operations from now on wait until `release`.
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Lets every held (and later) operation proceed.
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        for w in self.parked.lock().unwrap().drain(..) {
            w.wake();
        }
    }

    async fn until_released(&self) {
        std::future::poll_fn(|cx| {
            if !self.held.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            self.parked.lock().unwrap().push(cx.waker().clone());
            // Released between the check and the push: its drain may have missed us.
            if self.held.load(Ordering::SeqCst) {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await
    }

    /// Waits `lag_us` on the reactor's timer (nothing when it is 0).
    async fn lag(&self) {
        let us = self.lag_us.load(Ordering::Relaxed);
        if us > 0 {
            uraid_engine::reactor::sleep(std::time::Duration::from_micros(us)).await;
        }
    }

    fn check(&self) -> io::Result<()> {
        self.ops.fetch_add(1, Ordering::SeqCst);
        let d = self.delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(std::time::Duration::from_micros(d));
        }
        if self.die_after.load(Ordering::SeqCst) > 0
            && self.die_after.fetch_sub(1, Ordering::SeqCst) == 1
        {
            self.kill();
        }
        if self.dead.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(libc_enodev()))
        } else {
            Ok(())
        }
    }

    fn check_read(&self, off: u64, len: u64) -> io::Result<()> {
        let bad = self.bad.lock().unwrap();
        if bad.iter().any(|&(lo, hi)| off < hi && lo < off + len) {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        Ok(())
    }

    fn repair(&self, off: u64, len: u64) {
        let mut bad = self.bad.lock().unwrap();
        // Whole sectors written are good again; partial overlaps keep the rest bad.
        let mut out = Vec::new();
        for &(lo, hi) in bad.iter() {
            if off < hi && lo < off + len {
                if lo < off {
                    out.push((lo, off));
                }
                if off + len < hi {
                    out.push((off + len, hi));
                }
            } else {
                out.push((lo, hi));
            }
        }
        *bad = out;
    }
}

fn libc_enodev() -> i32 {
    19
}

/// Returns Pending once (waking itself), then Ready: one trip through the executor.
async fn yield_once(on: bool) {
    let mut yielded = !on;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Pending until `hang` is cleared (polled again on every executor trip).
async fn wait_unhung(f: &Faults) {
    wait_while(&f.hang).await
}

/// Waits while `flag` is set.
async fn wait_while(flag: &AtomicBool) {
    std::future::poll_fn(|cx| {
        if flag.load(Ordering::SeqCst) {
            // Re-poll later: a test that clears the flag (or a watchdog abort) moves on.
            let w = cx.waker().clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(5));
                w.wake();
            });
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await
}

/// The bytes of one device: what reads see, and (in cache mode) what survives a power cut.
pub(crate) struct DevState {
    pub(crate) data: Vec<u8>,
    /// Some: the device has a volatile write cache. `durable` is what the medium holds;
    /// `cache` the writes completed since the last flush, in completion order.
    pub(crate) durable: Option<Vec<u8>>,
    pub(crate) cache: Vec<(u64, Vec<u8>)>,
}

/// A member held in memory.
pub struct MemDev {
    name: String,
    pub(crate) state: Arc<Mutex<DevState>>,
    pub faults: Arc<Faults>,
    /// Power-cut clock shared by the devices of one crash trial.
    pub(crate) clock: Option<Arc<crash::Clock>>,
}

impl MemDev {
    pub fn new(name: impl Into<String>, size: usize) -> MemDev {
        MemDev::from_image(name, vec![0; size])
    }

    /// A device holding `image` (no write cache).
    pub fn from_image(name: impl Into<String>, image: Vec<u8>) -> MemDev {
        MemDev {
            name: name.into(),
            state: Arc::new(Mutex::new(DevState {
                data: image,
                durable: None,
                cache: Vec::new(),
            })),
            faults: Arc::new(Faults::default()),
            clock: None,
        }
    }

    /// Another handle on the same device (its bytes, faults and power clock): a test keeps
    /// one on a device it gives to an array.
    pub fn share(&self) -> MemDev {
        MemDev {
            name: self.name.clone(),
            state: self.state.clone(),
            faults: self.faults.clone(),
            clock: self.clock.clone(),
        }
    }

    /// A copy of the device's bytes as reads see them.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().unwrap().data.clone()
    }

    /// Ticks the power-cut clock; Err once the power is off.
    fn tick(&self) -> io::Result<()> {
        match &self.clock {
            Some(c) => c.tick(),
            None => Ok(()),
        }
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.state.lock().unwrap().data.len() as u64
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, off: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.lag().await;
        for _ in 0..self.faults.read_yields.load(Ordering::Relaxed) {
            yield_once(true).await;
        }
        self.faults.until_released().await;
        wait_unhung(&self.faults).await;
        let n = buf.len();
        if let Err(e) = self
            .tick()
            .and_then(|_| self.faults.check())
            .and_then(|_| self.faults.check_read(off, n as u64))
        {
            return (Err(e), buf);
        }
        let d = self.state.lock().unwrap();
        let o = off as usize;
        buf.copy_from_slice(&d.data[o..o + n]);
        (Ok(()), buf)
    }

    async fn write(&self, off: u64, buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.lag().await;
        self.faults.until_released().await;
        if self.faults.jitter.load(Ordering::Relaxed) {
            let n = self.faults.jitter_seq.fetch_add(1, Ordering::Relaxed);
            let salt = self.name.bytes().fold(0u64, |a, b| a * 31 + b as u64);
            let extra = (n ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61;
            for _ in 0..extra {
                yield_once(true).await;
            }
        }
        if off < DATA_OFFSET {
            for _ in 0..self.faults.slow_meta_writes.load(Ordering::Relaxed) {
                yield_once(true).await;
            }
        }
        wait_unhung(&self.faults).await;
        if let Err(e) = self.tick().and_then(|_| self.faults.check()) {
            return (Err(e), buf);
        }
        self.faults.repair(off, buf.len() as u64);
        let mut d = self.state.lock().unwrap();
        let o = off as usize;
        d.data[o..o + buf.len()].copy_from_slice(&buf);
        if d.durable.is_some() {
            d.cache.push((off, buf.to_vec()));
        }
        (Ok(()), buf)
    }

    /// Like a block device's discard, what the range reads afterwards is unspecified: it is
    /// filled with bytes that are neither zeros nor, in general, the old ones (so parity over
    /// a discarded unit does not add up), and in cache mode the change is volatile like a
    /// write until the next flush.
    async fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.until_released().await;
        wait_unhung(&self.faults).await;
        self.tick().and_then(|_| self.faults.check())?;
        self.faults.discard_calls.fetch_add(1, Ordering::Relaxed);
        if self.faults.no_discard.load(Ordering::Relaxed) {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        self.faults.discarded.fetch_add(len, Ordering::Relaxed);
        // Different on every member (mirror copies and parity do not agree by chance).
        let salt = self.name.bytes().fold(0u8, |a, b| a.wrapping_mul(31) ^ b);
        let junk: Vec<u8> = (off..off + len)
            .map(|b| 0xA5 ^ salt ^ (b as u8).wrapping_mul(31) ^ (b >> 12) as u8)
            .collect();
        let mut d = self.state.lock().unwrap();
        let o = off as usize;
        d.data[o..o + junk.len()].copy_from_slice(&junk);
        if d.durable.is_some() {
            d.cache.push((off, junk));
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        wait_unhung(&self.faults).await;
        wait_while(&self.faults.flush_hang).await;
        self.tick().and_then(|_| self.faults.check())?;
        let mut d = self.state.lock().unwrap();
        let d = &mut *d;
        if let Some(durable) = d.durable.as_mut() {
            for (off, bytes) in d.cache.drain(..) {
                durable[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok(())
    }
}
