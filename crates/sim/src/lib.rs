//! Test support for uraid: in-memory member devices with injectable faults, and helpers to
//! build arrays over them. Never used by the product itself.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use uraid_core::format::{MemberState, Superblock, DATA_OFFSET};
use uraid_core::{Geometry, Level};
use uraid_engine::array::WriteBuf;
use uraid_engine::buf::IoBuf;
use uraid_engine::BlockDev;
use uraid_engine::{Array, RuntimeHandle};

/// Fault switch shared between a test and one device.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every operation fails with EIO while set.
    pub dead: AtomicBool,
    /// When positive, counts operations down; the device dies when it reaches zero.
    pub die_after: AtomicI64,
    /// When set, every operation yields to the executor once before it touches the bytes, so
    /// other requests run in between, as they do while real I/O is in flight (memory
    /// otherwise completes synchronously and hides every interleaving).
    pub yield_ops: AtomicBool,
    /// While set (`hold`), every operation waits before it touches the bytes until
    /// `release`: requests stay in flight as long as a test needs them to.
    pub held: AtomicBool,
    parked: Mutex<Vec<Waker>>,
}

impl Faults {
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// The device dies on its `ops`-th operation from now (1 = the next one).
    pub fn kill_after(&self, ops: i64) {
        self.die_after.store(ops, Ordering::SeqCst);
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

    fn check(&self) -> io::Result<()> {
        if self.die_after.load(Ordering::SeqCst) > 0
            && self.die_after.fetch_sub(1, Ordering::SeqCst) == 1
        {
            self.kill();
        }
        if self.dead.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(libc_eio()))
        } else {
            Ok(())
        }
    }
}

fn libc_eio() -> i32 {
    5
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

/// A member held in memory.
pub struct MemDev {
    name: String,
    data: Mutex<Vec<u8>>,
    pub faults: Arc<Faults>,
}

impl MemDev {
    pub fn new(name: impl Into<String>, size: usize) -> MemDev {
        MemDev {
            name: name.into(),
            data: Mutex::new(vec![0; size]),
            faults: Arc::new(Faults::default()),
        }
    }

    /// A copy of the device's bytes (for inspecting what landed where).
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, off: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.until_released().await;
        if let Err(e) = self.faults.check() {
            return (Err(e), buf);
        }
        let d = self.data.lock().unwrap();
        let o = off as usize;
        let n = buf.len();
        buf.copy_from_slice(&d[o..o + n]);
        (Ok(()), buf)
    }

    async fn write(&self, off: u64, buf: IoBuf) -> (io::Result<()>, IoBuf) {
        yield_once(self.faults.yield_ops.load(Ordering::Relaxed)).await;
        self.faults.until_released().await;
        if let Err(e) = self.faults.check() {
            return (Err(e), buf);
        }
        let mut d = self.data.lock().unwrap();
        let o = off as usize;
        d[o..o + buf.len()].copy_from_slice(&buf);
        (Ok(()), buf)
    }

    async fn flush(&self) -> io::Result<()> {
        self.faults.check()
    }
}

/// A new array over fresh in-memory members (allocation map empty, as after `create`), plus
/// each member's fault switch.
pub fn mem_array(
    level: Level,
    members: usize,
    chunk: u64,
    member_data: u64,
    rt: Option<RuntimeHandle>,
) -> (Arc<Array<MemDev>>, Vec<Arc<Faults>>) {
    let geometry = Geometry::new(level, members, chunk, member_data).expect("valid test geometry");
    let sb = Superblock {
        array_uuid: [1; 16],
        name: "sim".into(),
        geometry,
        index: 0,
        clean: true,
        data_offset: DATA_OFFSET,
        events: 1,
        ctime: 0,
        utime: 0,
        device_uuid: [0; 16],
        states: vec![MemberState::Active; members],
    };
    // Data areas start as garbage (not even parity-consistent), as on a reused disk: the
    // allocation map must keep every never-written byte reading as zero, and no parity may
    // ever be computed from stale bytes.
    let devs: Vec<MemDev> = (0..members)
        .map(|i| {
            let d = MemDev::new(
                format!("mem{i}"),
                (DATA_OFFSET + geometry.member_data) as usize,
            );
            let junk = payload(0xdead_0000 + i as u64, geometry.member_data as usize);
            d.data.lock().unwrap()[DATA_OFFSET as usize..].copy_from_slice(&junk);
            d
        })
        .collect();
    let faults = devs.iter().map(|d| d.faults.clone()).collect();
    let uuids = (0..members).map(|i| [i as u8 + 1; 16]).collect();
    (
        Array::new(
            sb,
            uuids,
            devs.into_iter().map(Some).collect(),
            rt,
            Some(Vec::new()),
        ),
        faults,
    )
}

/// The flat reference model: what the volume must read back.
pub struct Model {
    pub bytes: Vec<u8>,
}

impl Model {
    pub fn new(size: u64) -> Model {
        Model {
            bytes: vec![0; size as usize],
        }
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        self.bytes[off as usize..off as usize + data.len()].copy_from_slice(data);
    }

    pub fn read(&self, off: u64, len: u64) -> &[u8] {
        &self.bytes[off as usize..(off + len) as usize]
    }
}

/// Deterministic pseudo-random payload for a write.
pub fn payload(seed: u64, len: usize) -> WriteBuf {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Arc::new(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
    )
}
