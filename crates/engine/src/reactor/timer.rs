//! `sleep`: a future that resolves after a duration. On a reactor with a ring it is one
//! IORING_OP_TIMEOUT (it goes to the kernel with the reactor's next submission, and a reactor
//! sleeping in io_uring_enter wakes for it: no thread, no extra syscall). Elsewhere (a
//! reactor without io_uring, a thread blocking on a future: the crash simulator, tests) one
//! shared timer thread wakes the waker at the deadline.
//!
//! Dropping the future early is allowed: the ring's timeout completes later as an orphaned
//! operation (ring.rs), the timer thread's entry wakes a waker nobody listens to.

use super::local;
use io_uring::{opcode, types};
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Resolves once `d` has passed.
pub async fn sleep(d: Duration) {
    if let Some(l) = local().filter(|l| l.has_ring()) {
        let ts = Box::new(
            types::Timespec::new()
                .sec(d.as_secs())
                .nsec(d.subsec_nanos()),
        );
        let p: *const types::Timespec = &*ts;
        // The timespec is kept with the op until its completion (push_keep): the kernel reads
        // it at submission, which may come after this future is dropped.
        let op = l.push_timer(move |ud| opcode::Timeout::new(p).build().user_data(ud), ts);
        drop(l);
        // -ETIME when the time is up (the only way a pure timeout completes).
        let _ = op.await;
        return;
    }
    let deadline = Instant::now() + d;
    std::future::poll_fn(|cx| {
        if Instant::now() >= deadline {
            return Poll::Ready(());
        }
        thread_timers().add(deadline, cx.waker());
        Poll::Pending
    })
    .await
}

/// The shared timer thread's queue: deadlines and the wakers due at them.
struct Timers {
    due: Mutex<Vec<(Instant, Waker)>>,
    cv: Condvar,
}

impl Timers {
    fn add(&self, at: Instant, w: &Waker) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = due.iter().all(|(t, _)| at < *t);
        due.push((at, w.clone()));
        drop(due);
        if earliest {
            self.cv.notify_one();
        }
    }

    /// The thread: wakes what is due, sleeps until the next deadline.
    fn run(&self) {
        // Wake-ups within microseconds, not the default 50 µs of timer slack.
        // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only this thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            let mut fire = Vec::new();
            due.retain(|(t, w)| {
                let keep = *t > now;
                if !keep {
                    fire.push(w.clone());
                }
                keep
            });
            if !fire.is_empty() {
                drop(due);
                fire.into_iter().for_each(Waker::wake);
                due = self.due.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            due = match due.iter().map(|(t, _)| *t).min() {
                None => self.cv.wait(due).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    self.cv
                        .wait_timeout(due, t.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

fn thread_timers() -> &'static Timers {
    static T: OnceLock<&'static Timers> = OnceLock::new();
    T.get_or_init(|| {
        let t: &'static Timers = Box::leak(Box::new(Timers {
            due: Mutex::new(Vec::new()),
            cv: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("uraid-timer".into())
            .spawn(move || t.run())
            .expect("starting the timer thread");
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reactor::Runtime;

    #[test]
    fn sleep_waits_at_least_its_duration_on_and_off_the_ring() {
        let d = Duration::from_millis(3);
        let t0 = Instant::now();
        futures::executor::block_on(sleep(d));
        assert!(t0.elapsed() >= d, "off the reactors");
        for uring in [true, false] {
            let rt = Runtime::new(1, 8, uring).unwrap();
            let took = rt.handle().block_on(0, move || async move {
                let t0 = Instant::now();
                sleep(d).await;
                t0.elapsed()
            });
            assert!(took >= d, "uring {uring}: {took:?}");
            assert!(took < Duration::from_secs(1), "uring {uring}: {took:?}");
            rt.shutdown();
        }
    }

    /// A sleep dropped before its time (a plugged write whose stripe filled) leaves nothing
    /// behind that keeps the reactor from stopping.
    #[test]
    fn a_dropped_sleep_does_not_hold_the_reactor() {
        let rt = Runtime::new(1, 8, true).unwrap();
        rt.handle().block_on(0, || async {
            let s = Box::pin(sleep(Duration::from_millis(20)));
            let _ = futures::poll!(s);
        });
        let t0 = Instant::now();
        rt.shutdown();
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
