//! The allocator's events for memory history (PyTorch's `TraceEntry` actions, read by
//! `torch.cuda.memory._record_memory_history` / memory_viz): a tracer told of every
//! allocation, free, segment change and out-of-memory failure of one device.
//!
//! Contract: events are emitted synchronously on the thread that causes them; those
//! that change which memory is reusable (a free completing, a segment going back) are
//! emitted under the lock of the shard that changes it, so the events of one address
//! come in the order its state changed. A tracer must not call the allocator.
//! With no tracer set, each emission point costs one relaxed load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::handle::{DeviceIndex, MempoolId, StreamHandle};

/// What happened (PyTorch's `TraceEntry::Action`, less `SNAPSHOT`, which the caller
/// of a snapshot records).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceAction {
    /// A caller got an allocation.
    Alloc,
    /// A caller freed an allocation (its memory may still wait for other streams).
    FreeRequested,
    /// A freed allocation's memory became reusable.
    FreeCompleted,
    /// A segment was allocated on the device.
    SegmentAlloc,
    /// A segment went back to the device.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// An allocation failed with out of memory.
    Oom,
}

/// One event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// What happened.
    pub action: TraceAction,
    /// The device.
    pub device: DeviceIndex,
    /// The address; for `Oom`, the device's free bytes (PyTorch's convention).
    pub address: u64,
    /// Bytes requested (allocations, frees, `Oom`), or of the segment or pages.
    pub size: usize,
    /// The stream of the allocation or segment.
    pub stream: StreamHandle,
    /// The graph pool it belongs to, if any.
    pub pool: Option<MempoolId>,
}

/// A tracer: called for each event.
pub type Tracer = Arc<dyn Fn(&TraceEvent) + Send + Sync>;

/// The tracer of one device, if set.
#[derive(Default)]
pub(crate) struct History {
    tracer: RwLock<Option<Tracer>>,
    on: AtomicBool,
}

impl History {
    /// Sets (or with `None` removes) the tracer.
    pub fn set(&self, tracer: Option<Tracer>) {
        let mut t = self.tracer.write();
        self.on.store(tracer.is_some(), Ordering::Release);
        *t = tracer;
    }

    /// Whether a tracer is set (one relaxed load).
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Tells the tracer, if any, of the event `make` builds.
    #[inline]
    pub fn emit(&self, make: impl FnOnce() -> TraceEvent) {
        if self.on() {
            self.emit_slow(make());
        }
    }

    #[cold]
    #[inline(never)]
    fn emit_slow(&self, e: TraceEvent) {
        if let Some(t) = self.tracer.read().as_ref() {
            t(&e);
        }
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("on", &self.on()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    fn event(address: u64) -> TraceEvent {
        TraceEvent {
            action: TraceAction::Alloc,
            device: 0,
            address,
            size: 8,
            stream: StreamHandle::DEFAULT,
            pool: None,
        }
    }

    #[test]
    fn events_reach_the_tracer_only_while_it_is_set() {
        let h = History::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        h.emit(|| event(1));
        let s = seen.clone();
        h.set(Some(Arc::new(move |e: &TraceEvent| {
            s.lock().push(e.address)
        })));
        assert!(h.on());
        h.emit(|| event(2));
        h.set(None);
        h.emit(|| event(3));
        assert_eq!(*seen.lock(), vec![2]);
        assert!(!h.on());
    }
}
