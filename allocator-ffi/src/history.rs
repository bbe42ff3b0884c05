//! The allocator's events for torch's memory history (`_record_memory_history`,
//! memory_viz): a callback told of every allocation, free, segment change and
//! out-of-memory failure, on every device.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use parking_lot::Mutex;

use npualloc_core::allocator::{TraceAction, TraceEvent, Tracer};

use crate::panic::code;
use crate::runtime::runtime;
use crate::types::npualloc_stream;

/// A trace entry: an allocation (`address`, requested `size`).
pub const NPUALLOC_TRACE_ALLOC: c_int = 0;
/// A trace entry: a caller freed an allocation (its memory may still wait for other
/// streams).
pub const NPUALLOC_TRACE_FREE_REQUESTED: c_int = 1;
/// A trace entry: a freed allocation's memory is reusable.
pub const NPUALLOC_TRACE_FREE_COMPLETED: c_int = 2;
/// A trace entry: a segment was allocated on the device.
pub const NPUALLOC_TRACE_SEGMENT_ALLOC: c_int = 3;
/// A trace entry: a segment went back to the device.
pub const NPUALLOC_TRACE_SEGMENT_FREE: c_int = 4;
/// A trace entry: pages of an expandable segment were mapped.
pub const NPUALLOC_TRACE_SEGMENT_MAP: c_int = 5;
/// A trace entry: pages of an expandable segment were unmapped.
pub const NPUALLOC_TRACE_SEGMENT_UNMAP: c_int = 6;
/// A trace entry: an allocation failed with out of memory (`address` holds the device's
/// free bytes, `size` the request, as PyTorch's `TraceEntry::OOM`).
pub const NPUALLOC_TRACE_OOM: c_int = 7;

/// One event for torch's memory history (the fields of PyTorch's `TraceEntry` the
/// allocator knows; the caller adds its own context).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct npualloc_trace_entry {
    /// `NPUALLOC_TRACE_*`.
    pub action: c_int,
    /// Device index.
    pub device: c_int,
    /// Address (for `NPUALLOC_TRACE_OOM`: the device's free bytes).
    pub address: u64,
    /// Bytes: requested for allocations and frees, of the segment or pages otherwise.
    pub size: usize,
    /// The stream of the allocation or segment.
    pub stream: npualloc_stream,
    /// Its graph pool ((0, 0): none): first integer.
    pub pool_hi: u64,
    /// Its graph pool: second integer.
    pub pool_lo: u64,
}

/// Called for each trace entry, synchronously, on the thread that caused it, with
/// allocator locks held: it must return quickly, never call npualloc, and never throw.
pub type npualloc_trace_callback =
    Option<extern "C" fn(ctx: *mut c_void, entry: *const npualloc_trace_entry)>;

/// The C callback and its context.
#[derive(Clone, Copy)]
struct CCallback {
    f: extern "C" fn(*mut c_void, *const npualloc_trace_entry),
    ctx: *mut c_void,
}

// SAFETY: the context pointer is only handed back to the caller's callback, which is
// documented to be callable from any thread.
unsafe impl Send for CCallback {}
// SAFETY: as above; the callback is never mutated after it is set.
unsafe impl Sync for CCallback {}

impl CCallback {
    fn call(&self, entry: &npualloc_trace_entry) {
        (self.f)(self.ctx, entry);
    }
}

/// The callback set by `npualloc_set_trace_callback`, for allocators made later.
static CALLBACK: Mutex<Option<Tracer>> = Mutex::new(None);

fn action_code(a: TraceAction) -> c_int {
    match a {
        TraceAction::Alloc => NPUALLOC_TRACE_ALLOC,
        TraceAction::FreeRequested => NPUALLOC_TRACE_FREE_REQUESTED,
        TraceAction::FreeCompleted => NPUALLOC_TRACE_FREE_COMPLETED,
        TraceAction::SegmentAlloc => NPUALLOC_TRACE_SEGMENT_ALLOC,
        TraceAction::SegmentFree => NPUALLOC_TRACE_SEGMENT_FREE,
        TraceAction::SegmentMap => NPUALLOC_TRACE_SEGMENT_MAP,
        TraceAction::SegmentUnmap => NPUALLOC_TRACE_SEGMENT_UNMAP,
        TraceAction::Oom => NPUALLOC_TRACE_OOM,
    }
}

fn tracer(cb: CCallback) -> Tracer {
    Arc::new(move |e: &TraceEvent| {
        let pool = e.pool.unwrap_or_default();
        let entry = npualloc_trace_entry {
            action: action_code(e.action),
            device: e.device as c_int,
            address: e.address,
            size: e.size,
            stream: e.stream.0 as npualloc_stream,
            pool_hi: pool.0,
            pool_lo: pool.1,
        };
        cb.call(&entry);
    })
}

/// The tracer an allocator made now gets (the callback set, if any).
pub(crate) fn current() -> Option<Tracer> {
    CALLBACK.lock().clone()
}

/// Sets the callback told of every allocator event on every device (for torch's
/// `_record_memory_history`); NULL removes it. Any time; `ctx` is passed back.
#[no_mangle]
pub extern "C" fn npualloc_set_trace_callback(
    callback: npualloc_trace_callback,
    ctx: *mut c_void,
) -> c_int {
    code("npualloc_set_trace_callback", || {
        let t = callback.map(|f| tracer(CCallback { f, ctx }));
        let rt = runtime()?;
        let mut slot = CALLBACK.lock();
        *slot = t.clone();
        for a in rt.existing() {
            a.set_tracer(t.clone());
        }
        Ok(())
    })
}
