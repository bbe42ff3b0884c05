//! Streams and events of the simulated device.
//!
//! A stream is a FIFO of operations. In threaded mode a worker thread per stream runs
//! them as they arrive; in manual mode nothing runs until a test steps the stream.
//!
//! Invariants:
//! - operations of one stream run in the order they were queued, one at a time;
//! - each record of an event is its own mark; the event is complete exactly when the
//!   mark of its latest record has run (or it was never recorded), as in CUDA and ACL:
//!   recording an event again does not complete, or release waits on, earlier records;
//! - a wait operation does not run before the mark it captured has run;
//! - operations are numbered per stream from 1 in queue order; `after[x] = n` on a
//!   stream means its operations queued from now on run after operation `n` of stream
//!   `x` (learnt from waits, transitively through the waited-for record's own `after`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;

use super::memory::SimMemory;

/// Work a simulated kernel does: it reads and writes device memory.
pub type Kernel = Box<dyn FnOnce(&SimMemory) + Send + 'static>;

/// One record of an event.
#[derive(Default)]
pub(super) struct Record {
    /// Set once the record has run on its stream.
    pub done: AtomicBool,
    /// What a stream waiting on this record is ordered after: the recording stream's
    /// operations up to this record, and whatever that stream was ordered after.
    pub after: Mutex<Order>,
}

/// (stream, operation number) pairs, at most one per stream: what work is ordered after.
pub(super) type Order = SmallVec<[(usize, u64); 2]>;

/// Raises `into`'s entry for `stream` to at least `n`.
fn order_after(into: &mut Order, stream: usize, n: u64) {
    match into.iter_mut().find(|e| e.0 == stream) {
        Some(e) => e.1 = e.1.max(n),
        None => into.push((stream, n)),
    }
}

/// One record of an event (shared with the operations queued for it).
pub(super) type Mark = Arc<Record>;

/// State of one simulated event.
#[derive(Default)]
pub(super) struct EventState {
    /// The mark of the latest record queued on a stream; `None`: never recorded.
    latest: Mutex<Option<Mark>>,
}

impl EventState {
    /// A new record: it becomes the event's latest; queue it as `Op::Record`.
    pub fn record(&self) -> Mark {
        let mut latest = self.latest.lock();
        // Reuse the previous record's allocation when nothing refers to it any more
        // (it ran and no wait holds it): the common case of a pooled event.
        if let Some(m) = latest.as_mut().and_then(Arc::get_mut) {
            *m.done.get_mut() = false;
            m.after.get_mut().clear();
        } else {
            *latest = Some(Mark::default());
        }
        latest.clone().expect("just set")
    }

    /// The latest record, for a wait to capture.
    pub fn latest(&self) -> Option<Mark> {
        self.latest.lock().clone()
    }

    pub fn is_complete(&self) -> bool {
        self.latest
            .lock()
            .as_ref()
            .is_none_or(|m| m.done.load(Ordering::Acquire))
    }
}

pub(super) enum Op {
    Kernel(Kernel),
    Record(Mark),
    /// A wait, and whether it has held its stream back (counted once).
    Wait(Mark, AtomicBool),
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

/// Streams whose queue changed (operations queued or run), once someone listens
/// ([`ChangeLog::listen`]): lets a manual-mode driver visit only the streams that
/// changed instead of every stream after every step. Duplicates are possible.
#[derive(Default)]
pub(super) struct ChangeLog {
    on: AtomicBool,
    /// Set after a note is pushed, cleared by `take` before it drains: a `take` that
    /// finds it clear returns at once without the lock (a replay asks after every
    /// event, and most events change no queue).
    noted: AtomicBool,
    changed: Mutex<Vec<usize>>,
}

impl ChangeLog {
    pub fn listen(&self) {
        self.on.store(true, Ordering::Release);
    }

    fn note(&self, stream: usize) {
        if self.on.load(Ordering::Acquire) {
            self.changed.lock().push(stream);
            self.noted.store(true, Ordering::Release);
        }
    }

    /// The streams noted since the last call (with duplicates; a note racing with the
    /// call may come in the next one).
    pub fn take(&self) -> Vec<usize> {
        if !self.noted.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.changed.lock())
    }
}

/// One simulated stream.
pub(super) struct StreamState {
    /// This stream's handle, for the change log.
    handle: usize,
    changes: Arc<ChangeLog>,
    queue: Mutex<VecDeque<Op>>,
    work: Condvar,
    /// Serialises manual stepping so that ops of one stream never overlap.
    exec: Mutex<()>,
    /// Operation numbers of other streams this stream's next operations run after.
    after: Mutex<Order>,
    enqueued: AtomicU64,
    done: AtomicU64,
    /// Waits that found their record not yet run: this stream stalled on another.
    stalled: AtomicU64,
    pub shutdown: AtomicBool,
}

impl StreamState {
    pub fn new(handle: usize, changes: Arc<ChangeLog>) -> Self {
        StreamState {
            handle,
            changes,
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            exec: Mutex::new(()),
            after: Mutex::new(Order::new()),
            enqueued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        }
    }

    /// Queues `op`; returns its number on this stream.
    pub fn push(&self, op: Op) -> u64 {
        let mut q = self.queue.lock();
        q.push_back(op);
        let n = self.enqueued.fetch_add(1, Ordering::AcqRel) + 1;
        drop(q);
        self.work.notify_one();
        self.changes.note(self.handle);
        n
    }

    /// Queues a record of `mark` (this stream is `me`): a stream waiting on it runs
    /// after everything queued here so far.
    pub fn push_record(&self, me: usize, mark: Mark) {
        let n = self.push(Op::Record(mark.clone()));
        let mut theirs = mark.after.lock();
        theirs.clear();
        theirs.extend(self.after.lock().iter().copied());
        order_after(&mut theirs, me, n);
    }

    /// Queues a wait for `mark`: this stream's later operations run after it.
    pub fn push_wait(&self, mark: Mark) {
        let theirs = mark.after.lock().clone();
        {
            let mut mine = self.after.lock();
            for (s, n) in theirs {
                order_after(&mut mine, s, n);
            }
        }
        self.push(Op::Wait(mark, AtomicBool::new(false)));
    }

    /// Manual mode: counts the wait this stream is blocked at, if any, as a stall (once).
    pub fn note_blocked(&self) {
        if let Some(Op::Wait(mark, stalled)) = self.queue.lock().front() {
            self.note_stall(mark, stalled);
        }
    }

    /// Counts `wait` as a stall (once) if its record has not run yet.
    fn note_stall(&self, mark: &Mark, stalled: &AtomicBool) {
        if !mark.done.load(Ordering::Acquire) && !stalled.swap(true, Ordering::AcqRel) {
            self.stalled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits of this stream that found their record not yet run.
    pub fn stalls(&self) -> u64 {
        self.stalled.load(Ordering::Relaxed)
    }

    /// (operations queued so far, operations run so far).
    pub fn position(&self) -> (u64, u64) {
        (
            self.enqueued.load(Ordering::Acquire),
            self.done.load(Ordering::Acquire),
        )
    }

    /// The number of the last operation of stream `other` that this stream's next
    /// operations are ordered after (0: none).
    pub fn ordered_after(&self, other: usize) -> u64 {
        self.after
            .lock()
            .iter()
            .find(|e| e.0 == other)
            .map_or(0, |e| e.1)
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
            if let Op::Wait(mark, stalled) = &op {
                self.note_stall(mark, stalled);
                progress.wait_until(
                    || mark.done.load(Ordering::Acquire),
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
                    Some(Op::Wait(mark, _)) if !mark.done.load(Ordering::Acquire) => break,
                    Some(_) => q.pop_front().expect("front exists"),
                }
            };
            execute(op, memory);
            self.finish(progress);
            ran += 1;
        }
        if ran > 0 {
            self.changes.note(self.handle);
        }
        ran
    }
}

fn execute(op: Op, memory: &SimMemory) {
    match op {
        Op::Kernel(k) => k(memory),
        Op::Record(mark) => mark.done.store(true, Ordering::Release),
        Op::Wait(..) => {}
    }
}
