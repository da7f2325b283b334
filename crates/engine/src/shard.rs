//! Per-thread shards: state that every reactor updates on every request (waiting-I/O
//! registries, counters, histogram buckets) is kept once per thread, each copy on its own
//! cache lines, and summed by whoever reads it (the watchdog, a metrics scrape). Two
//! reactors never write the same line, so the hot path pays no cross-core traffic.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Threads that get a shard of their own; every later thread counts in one extra shard that
/// they share, with atomic adds (an owner's plain store would overwrite a sharer's add).
pub const SHARDS: usize = 64;

/// This thread's shard: threads are numbered in the order they first ask.
pub fn index() -> usize {
    slot().0
}

/// This thread's shard, and whether the thread has it to itself (the first `SHARDS`
/// threads do; later ones share shard `SHARDS`, which no thread owns).
#[inline]
fn slot() -> (usize, bool) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static SHARD: Cell<(usize, bool)> = const { Cell::new((usize::MAX, false)) });
    SHARD.with(|s| {
        if s.get().0 == usize::MAX {
            let n = NEXT.fetch_add(1, Ordering::Relaxed) as usize;
            s.set(if n < SHARDS {
                (n, true)
            } else {
                (SHARDS, false)
            });
        }
        s.get()
    })
}

/// Adds `v` to a counter in the calling thread's shard (`Sharded::local`). A thread that
/// owns its shard adds with a plain load and store (no locked instruction: nobody else
/// writes that line); threads sharing a shard use an atomic add.
#[inline]
pub fn add(a: &AtomicU64, v: u64) {
    if slot().1 {
        a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    } else {
        a.fetch_add(v, Ordering::Relaxed);
    }
}

/// One copy of `T` per shard, each on its own cache lines.
pub struct Sharded<T> {
    shards: Box<[Padded<T>]>,
}

#[repr(align(128))]
struct Padded<T>(T);

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Sharded {
            shards: (0..=SHARDS).map(|_| Padded(T::default())).collect(),
        }
    }
}

impl<T> std::fmt::Debug for Sharded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sharded<{}>", std::any::type_name::<T>())
    }
}

impl<T> Sharded<T> {
    /// The calling thread's copy. Counters in it are updated with `shard::add`.
    #[inline]
    pub fn local(&self) -> &T {
        &self.shards[slot().0].0
    }

    /// The copy of shard `i` (a future that moved threads removes itself where it
    /// registered).
    pub fn get(&self, i: usize) -> &T {
        &self.shards[i].0
    }

    /// Every copy, for summing.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|p| &p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_beyond_the_shards_share_and_still_count_exactly() {
        let s: std::sync::Arc<Sharded<AtomicU64>> = Default::default();
        let handles: Vec<_> = (0..SHARDS * 2 + 3)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        add(s.local(), 1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let total: u64 = s.iter().map(|a| a.load(Ordering::Relaxed)).sum();
        assert_eq!(total, (SHARDS as u64 * 2 + 3) * 10_000);
    }

    #[test]
    fn threads_get_their_own_shard_and_sums_see_every_update() {
        let s: std::sync::Arc<Sharded<AtomicU64>> = Default::default();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        add(s.local(), 1);
                    }
                    slot()
                })
            })
            .collect();
        let slots: Vec<(usize, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let total: u64 = s.iter().map(|a| a.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 4000);
        // Owners have distinct shards; threads past the first SHARDS (other tests' threads
        // count too) share the one extra shard that nobody owns.
        let mut owned: Vec<usize> = slots.iter().filter(|s| s.1).map(|s| s.0).collect();
        let n = owned.len();
        owned.sort();
        owned.dedup();
        assert_eq!(owned.len(), n, "owners share a shard: {slots:?}");
        assert!(slots.iter().all(|s| s.1 || s.0 == SHARDS), "{slots:?}");
    }
}
