//! Streams and events of the simulated device.
//!
//! A stream is a FIFO of operations. In threaded mode a worker thread per stream runs
//! them as they arrive; in manual mode nothing runs until a test steps the stream.
//!
//! Invariants:
//! - operations of one stream run in the order they were queued, one at a time;
//! - an event's `completed` generation never exceeds its `recorded` generation, and an
//!   event is complete exactly when every record queued so far has run;
//! - a wait operation does not run before the waited-for record has run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::memory::SimMemory;

/// Work a simulated kernel does: it reads and writes device memory.
pub type Kernel = Box<dyn FnOnce(&SimMemory) + Send + 'static>;

/// State of one simulated event.
#[derive(Default)]
pub(super) struct EventState {
    /// Generation of the last record queued on a stream.
    pub recorded: AtomicU64,
    /// Highest generation whose record has run.
    pub completed: AtomicU64,
}

impl EventState {
    pub fn is_complete(&self) -> bool {
        self.completed.load(Ordering::Acquire) >= self.recorded.load(Ordering::Acquire)
    }

    fn reached(&self, gen: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= gen
    }
}

pub(super) enum Op {
    Kernel(Kernel),
    Record(Arc<EventState>, u64),
    Wait(Arc<EventState>, u64),
}

/// Wakes host threads and workers when any operation of a device finishes.
#[derive(Default)]
pub(super) struct Progress {
    lock: Mutex<u64>,
    cv: Condvar,
}

impl Progress {
    pub fn notify(&self) {
        *self.lock.lock() += 1;
        self.cv.notify_all();
    }

    /// Blocks until `done()` holds or `stop()` does.
    pub fn wait_until(&self, done: impl Fn() -> bool, stop: impl Fn() -> bool) {
        let mut guard = self.lock.lock();
        while !done() && !stop() {
            self.cv
                .wait_for(&mut guard, std::time::Duration::from_millis(50));
        }
    }
}

/// One simulated stream.
pub(super) struct StreamState {
    queue: Mutex<VecDeque<Op>>,
    work: Condvar,
    /// Serialises manual stepping so that ops of one stream never overlap.
    exec: Mutex<()>,
    enqueued: AtomicU64,
    done: AtomicU64,
    pub shutdown: AtomicBool,
}

impl StreamState {
    pub fn new() -> Self {
        StreamState {
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            exec: Mutex::new(()),
            enqueued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        }
    }

    pub fn push(&self, op: Op) {
        let mut q = self.queue.lock();
        q.push_back(op);
        self.enqueued.fetch_add(1, Ordering::AcqRel);
        drop(q);
        self.work.notify_one();
    }

    pub fn is_idle(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.enqueued.load(Ordering::Acquire)
    }

    pub fn pending(&self) -> u64 {
        self.enqueued.load(Ordering::Acquire) - self.done.load(Ordering::Acquire)
    }

    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
        let _q = self.queue.lock();
        self.work.notify_all();
    }

    fn finish(&self, progress: &Progress) {
        self.done.fetch_add(1, Ordering::AcqRel);
        progress.notify();
    }

    /// Worker loop of threaded mode.
    pub fn run_worker(self: Arc<Self>, memory: Arc<SimMemory>, progress: Arc<Progress>) {
        loop {
            let op = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(op) = q.pop_front() {
                        break op;
                    }
                    if self.shutdown.load(Ordering::Acquire) {
                        return;
                    }
                    self.work.wait(&mut q);
                }
            };
            if let Op::Wait(ev, gen) = &op {
                progress.wait_until(
                    || ev.reached(*gen),
                    || self.shutdown.load(Ordering::Acquire),
                );
            }
            execute(op, &memory);
            self.finish(&progress);
        }
    }

    /// Manual mode: runs up to `max` queued ops, stopping at a wait that is not yet
    /// satisfied. Returns how many ran.
    pub fn step(&self, max: usize, memory: &SimMemory, progress: &Progress) -> usize {
        let _exec = self.exec.lock();
        let mut ran = 0;
        while ran < max {
            let op = {
                let mut q = self.queue.lock();
                match q.front() {
                    None => break,
                    Some(Op::Wait(ev, gen)) if !ev.reached(*gen) => break,
                    Some(_) => q.pop_front().expect("front exists"),
                }
            };
            execute(op, memory);
            self.finish(progress);
            ran += 1;
        }
        ran
    }
}

fn execute(op: Op, memory: &SimMemory) {
    match op {
        Op::Kernel(k) => k(memory),
        Op::Record(ev, gen) => {
            ev.completed.fetch_max(gen, Ordering::AcqRel);
        }
        Op::Wait(..) => {}
    }
}
