//! Graph pools, captures, checkpoints and the views torch's memory tools need: the
//! entry points a complete torch_npu `NPUAllocator` (or torch `CUDAAllocator`) is built
//! on (DESIGN.md, "Installing into torch_npu and torch: the complete allocator").
//!
//! How they relate to the older `npualloc_begin_allocate_to_pool` (kept, for programs
//! written against it): that call is `npualloc_pool_begin` + a stream route +
//! `npualloc_capture_begin` in one, ended by `npualloc_end_allocate_to_pool`. A
//! complete allocator calls the parts: `npualloc_pool_begin` in `beginAllocateToPool`,
//! `npualloc_malloc_in_pool` for each request its filters send to a pool,
//! `npualloc_capture_begin` / `npualloc_capture_end` in `markCaptureBegin` /
//! `markCaptureEnd`, and `npualloc_release_pool` in `releasePool`.

use std::ffi::{c_int, c_void};

use npualloc_core::allocator::{PoolCheckpoint, NO_POOL};
use npualloc_core::snapshot::BlockState;
use npualloc_core::{MempoolId, StreamHandle};

use crate::error::*;
use crate::panic::{code, or_default};
use crate::runtime::runtime;
use crate::types::npualloc_stream;

fn pool(id_hi: u64, id_lo: u64) -> MempoolId {
    MempoolId(id_hi, id_lo)
}

fn stream_of(s: npualloc_stream) -> StreamHandle {
    StreamHandle(s as usize)
}

fn null_arg(name: &str) -> Failure {
    Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, format!("{name} is NULL"))
}

/// Adds a use of pool (`id_hi`, `id_lo`) on `device`, creating the pool (torch's
/// `createOrIncrefPool`, e.g. for `torch.npu.MemPool`). (0, 0) is reserved:
/// NPUALLOC_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn npualloc_pool_incref(device: c_int, id_hi: u64, id_lo: u64) -> c_int {
    code("npualloc_pool_incref", || {
        runtime()?
            .allocator(device)?
            .pool_incref(pool(id_hi, id_lo))?;
        Ok(())
    })
}

/// The core side of torch's `beginAllocateToPool(device, pool, filter)`: adds a use
/// of the pool (creating it) and prepares `stream` (the current stream, about to be
/// captured) for a capture: blocks lent to it are settled, so that no event is ever
/// recorded on it while it captures. Routes nothing: the caller evaluates its filters
/// and sends each matching request to `npualloc_malloc_in_pool`.
#[no_mangle]
pub extern "C" fn npualloc_pool_begin(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    stream: npualloc_stream,
) -> c_int {
    code("npualloc_pool_begin", || {
        Ok(runtime()?
            .allocator(device)?
            .pool_begin(pool(id_hi, id_lo), stream_of(stream))?)
    })
}

/// Stores the pool's use count in `*out` (torch's `getPoolUseCount`): 0 for a pool
/// that is not live (never created, or every use released).
#[no_mangle]
pub extern "C" fn npualloc_pool_use_count(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    out: *mut i64,
) -> c_int {
    code("npualloc_pool_use_count", || {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let n = runtime()?
            .allocator(device)?
            .pool_use_count(pool(id_hi, id_lo));
        // SAFETY: `out` is a non-NULL pointer to a caller-owned, writable int64_t.
        unsafe { out.write(i64::from(n)) };
        Ok(())
    })
}

/// Routes allocations on `stream` to the live pool until (one call of)
/// `npualloc_end_allocate_to_pool`, adding no use and marking no capture (a route
/// without a capture: graph trees' warm-up, `use_mem_pool`). A pool that is not live
/// gives NPUALLOC_ERR_UNKNOWN_POOL; a stream already routed NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_route_stream_to_pool(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    stream: npualloc_stream,
) -> c_int {
    code("npualloc_route_stream_to_pool", || {
        Ok(runtime()?
            .allocator(device)?
            .route_stream_to_pool(pool(id_hi, id_lo), stream_of(stream))?)
    })
}

/// Allocates `size` bytes on `device` for use on `stream` from the live pool (the
/// caller's `beginAllocateToPool` filter accepted the request), whatever `stream`
/// routes to. Returns NULL on failure (a pool that is not live, out of memory: the
/// reason in `npualloc_last_error()`); `size` 0 returns NULL and is not a failure.
/// The pointer is freed with `npualloc_free`.
#[no_mangle]
pub extern "C" fn npualloc_malloc_in_pool(
    size: usize,
    device: c_int,
    stream: npualloc_stream,
    id_hi: u64,
    id_lo: u64,
) -> *mut c_void {
    or_default("npualloc_malloc_in_pool", std::ptr::null_mut(), || {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let rt = runtime()?;
        let ptr =
            rt.allocator(device)?
                .malloc_in_pool(size, stream_of(stream), pool(id_hi, id_lo))?;
        if let Some(r) = rt.recorder {
            r.alloc(ptr, size, stream as usize);
        }
        Ok(ptr as *mut c_void)
    })
}

/// A graph capture begins on `device` (torch_npu's `markCaptureBegin`, called once the
/// runtime's capture started): until the matching `npualloc_capture_end`, npualloc
/// makes no event query, record or synchronisation and no device free on the device,
/// lends no block across streams, and defers the events of frees of blocks used on
/// other streams.
#[no_mangle]
pub extern "C" fn npualloc_capture_begin(device: c_int) -> c_int {
    code("npualloc_capture_begin", || {
        runtime()?.allocator(device)?.capture_begin();
        Ok(())
    })
}

/// A graph capture on `device` ended (torch_npu's `markCaptureEnd`). When no capture
/// is left underway, the frees deferred meanwhile record their events (for the streams
/// recorded before the capture; uses recorded during it are captured work). Without a
/// capture underway: NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_capture_end(device: c_int) -> c_int {
    code("npualloc_capture_end", || {
        Ok(runtime()?.allocator(device)?.capture_end()?)
    })
}

/// Stores in `*out` whether a graph capture is underway on `device` (torch_npu's
/// `hasCapturesUnderway`).
#[no_mangle]
pub extern "C" fn npualloc_captures_underway(device: c_int, out: *mut bool) -> c_int {
    code("npualloc_captures_underway", || {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let on = runtime()?.allocator(device)?.captures_underway();
        // SAFETY: `out` is a non-NULL pointer to a caller-owned, writable bool.
        unsafe { out.write(on) };
        Ok(())
    })
}

/// One block of a checkpointed pool (PyTorch's `BlockState`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct npualloc_block_state {
    /// Start address.
    pub ptr: *mut c_void,
    /// Size in bytes.
    pub size: usize,
    /// The stream of its segment.
    pub stream: npualloc_stream,
    /// Whether it was allocated at the checkpoint.
    pub allocated: bool,
    /// Index of its segment in the checkpoint (segments in address order).
    pub segment: usize,
}

/// A graph pool's checkpoint (PyTorch's `PrivatePoolState`), made by
/// `npualloc_pool_checkpoint` and freed by `npualloc_pool_state_destroy`.
pub struct npualloc_pool_state {
    state: PoolCheckpoint,
    blocks: Vec<npualloc_block_state>,
}

/// Checkpoints the live pool (torch's `getCheckpointState`): every segment of the
/// pool on every stream, with its blocks. Stores a new state in `*out` (owned by the
/// caller: free it with `npualloc_pool_state_destroy`). A pool that is not live gives
/// NPUALLOC_ERR_UNKNOWN_POOL; one with frees still waiting for other streams' work
/// NPUALLOC_ERR_INVALID_STATE; one with expandable segments NPUALLOC_ERR_UNSUPPORTED.
#[no_mangle]
pub extern "C" fn npualloc_pool_checkpoint(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    out: *mut *mut npualloc_pool_state,
) -> c_int {
    code("npualloc_pool_checkpoint", || {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let state = runtime()?
            .allocator(device)?
            .pool_checkpoint(pool(id_hi, id_lo))?;
        let blocks = state
            .segments()
            .iter()
            .enumerate()
            .flat_map(|(i, seg)| {
                seg.blocks.iter().map(move |b| npualloc_block_state {
                    ptr: b.ptr as *mut c_void,
                    size: b.size,
                    stream: seg.stream.0 as npualloc_stream,
                    allocated: b.allocated,
                    segment: i,
                })
            })
            .collect();
        let boxed = Box::new(npualloc_pool_state { state, blocks });
        // SAFETY: `out` is a non-NULL pointer to a caller-owned, writable pointer.
        unsafe { out.write(Box::into_raw(boxed)) };
        Ok(())
    })
}

/// Reads a checkpoint: stores its blocks (all segments', in address order; owned by
/// `state`, valid until it is destroyed) in `*blocks` and their number in `*count`,
/// and the number of segments in `*segments` (if not NULL).
#[no_mangle]
pub extern "C" fn npualloc_pool_state_blocks(
    state: *const npualloc_pool_state,
    blocks: *mut *const npualloc_block_state,
    count: *mut usize,
    segments: *mut usize,
) -> c_int {
    code("npualloc_pool_state_blocks", || {
        // SAFETY: `state` is NULL or a state made by npualloc_pool_checkpoint and not yet
        // destroyed (the documented contract).
        let st = unsafe { state.as_ref() }.ok_or_else(|| null_arg("state"))?;
        if blocks.is_null() || count.is_null() {
            return Err(null_arg("blocks or count"));
        }
        // SAFETY: `blocks` and `count` are non-NULL, caller-owned and writable; `segments`
        // is NULL or likewise.
        unsafe {
            blocks.write(st.blocks.as_ptr());
            count.write(st.blocks.len());
            if !segments.is_null() {
                segments.write(st.state.segments().len());
            }
        }
        Ok(())
    })
}

/// Frees a checkpoint made by `npualloc_pool_checkpoint`; NULL is ignored.
#[no_mangle]
pub extern "C" fn npualloc_pool_state_destroy(state: *mut npualloc_pool_state) {
    or_default("npualloc_pool_state_destroy", (), || {
        if !state.is_null() {
            // SAFETY: a non-NULL `state` was made by Box::into_raw in
            // npualloc_pool_checkpoint and is destroyed once (the documented contract).
            drop(unsafe { Box::from_raw(state) });
        }
        Ok(())
    })
}

/// Called once per allocation a restore freed, with its address.
pub type npualloc_restore_freed = Option<extern "C" fn(ctx: *mut c_void, ptr: *mut c_void)>;

/// Called once per allocation a restore made (a block allocated at the checkpoint),
/// with its address and size: a live allocation the caller owns, freed with
/// `npualloc_free`.
pub type npualloc_restore_allocated =
    Option<extern "C" fn(ctx: *mut c_void, ptr: *mut c_void, size: usize)>;

/// Restores the pool of `state` to it (torch's `setCheckpointPoolState`): frees every
/// allocation of the pool now, re-carves each checkpointed segment into exactly its
/// checkpointed blocks (same addresses: captured graphs have them baked in), and makes
/// the blocks allocated at the checkpoint live allocations again, counted in the
/// statistics as allocations. Then, with no lock held, calls `on_freed` for each freed
/// address and `on_allocated` for each new allocation (either may be NULL; an address
/// may come in both). The callbacks must not throw. Fails with nothing changed: a
/// `device` other than the state's (NPUALLOC_ERR_INVALID_ARGUMENT), a pool that is not
/// live (NPUALLOC_ERR_UNKNOWN_POOL), a checkpointed segment no longer in the pool, a
/// free of the pool still waiting for another stream, an allocation of the pool
/// recorded on another stream outside a capture (NPUALLOC_ERR_INVALID_STATE).
#[no_mangle]
pub extern "C" fn npualloc_pool_restore(
    device: c_int,
    state: *const npualloc_pool_state,
    on_freed: npualloc_restore_freed,
    on_allocated: npualloc_restore_allocated,
    ctx: *mut c_void,
) -> c_int {
    code("npualloc_pool_restore", || {
        // SAFETY: `state` is NULL or a live state made by npualloc_pool_checkpoint.
        let st = unsafe { state.as_ref() }.ok_or_else(|| null_arg("state"))?;
        let delta = runtime()?.allocator(device)?.pool_restore(&st.state)?;
        if let Some(f) = on_freed {
            for &p in &delta.freed {
                f(ctx, p as *mut c_void);
            }
        }
        if let Some(f) = on_allocated {
            for &(p, size) in &delta.allocated {
                f(ctx, p as *mut c_void, size);
            }
        }
        Ok(())
    })
}

/// Stores in `*equal` whether the pool's live allocations are exactly the `n`
/// addresses `ptrs` (torch's `checkPoolLiveAllocations`; duplicates count once).
/// `ptrs` may be NULL when `n` is 0. A pool neither live nor holding memory gives
/// NPUALLOC_ERR_UNKNOWN_POOL.
#[no_mangle]
pub extern "C" fn npualloc_pool_check_live(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    ptrs: *const *mut c_void,
    n: usize,
    equal: *mut bool,
) -> c_int {
    code("npualloc_pool_check_live", || {
        if equal.is_null() || (ptrs.is_null() && n > 0) {
            return Err(null_arg("equal, or ptrs with n > 0"));
        }
        let list: Vec<usize> = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: `ptrs` points to `n` readable pointers (non-NULL when n > 0).
            unsafe { std::slice::from_raw_parts(ptrs, n) }
                .iter()
                .map(|&p| p as usize)
                .collect()
        };
        let same = runtime()?
            .allocator(device)?
            .pool_check_live(pool(id_hi, id_lo), &list)?;
        // SAFETY: `equal` is a non-NULL pointer to a caller-owned, writable bool.
        unsafe { equal.write(same) };
        Ok(())
    })
}

/// Releases the cached segments of one pool (torch's `emptyCache(mempool_id)`): a pool
/// that is no longer live gives back its whole free segments after waiting for its own
/// pending frees; a live pool keeps them. (0, 0) is the whole device's cache
/// (`npualloc_empty_cache_device`). Nothing happens while a capture is underway.
#[no_mangle]
pub extern "C" fn npualloc_empty_cache_pool(device: c_int, id_hi: u64, id_lo: u64) -> c_int {
    code("npualloc_empty_cache_pool", || {
        Ok(runtime()?
            .allocator(device)?
            .empty_cache_pool(pool(id_hi, id_lo))?)
    })
}

/// Stores the bytes of every cached free block of `device` (all streams and pools) in
/// `*cached_and_free` and the largest one in `*largest_block` (torch's `cacheInfo`).
#[no_mangle]
pub extern "C" fn npualloc_cache_info(
    device: c_int,
    cached_and_free: *mut usize,
    largest_block: *mut usize,
) -> c_int {
    code("npualloc_cache_info", || {
        if cached_and_free.is_null() || largest_block.is_null() {
            return Err(null_arg("cached_and_free or largest_block"));
        }
        let (total, largest) = runtime()?.allocator(device)?.cache_info();
        // SAFETY: both are non-NULL pointers to caller-owned, writable size_t.
        unsafe {
            cached_and_free.write(total);
            largest_block.write(largest);
        }
        Ok(())
    })
}

/// Stores the memory fraction of `device` in `*out` (torch's `getMemoryFraction`): the
/// cap set by `npualloc_set_memory_fraction` or `per_process_memory_fraction` over the
/// device's total memory, 1.0 when none is set.
#[no_mangle]
pub extern "C" fn npualloc_get_memory_fraction(device: c_int, out: *mut f64) -> c_int {
    code("npualloc_get_memory_fraction", || {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let f = runtime()?.allocator(device)?.memory_fraction()?;
        // SAFETY: `out` is a non-NULL pointer to a caller-owned, writable double.
        unsafe { out.write(f) };
        Ok(())
    })
}

/// Zeroes the accumulated statistics of `device` (`allocated` and `freed` counts, the
/// event counters; torch's `resetAccumulatedStats`); current values and peaks stay.
#[no_mangle]
pub extern "C" fn npualloc_reset_accumulated_stats(device: c_int) -> c_int {
    code("npualloc_reset_accumulated_stats", || {
        runtime()?.allocator(device)?.reset_accumulated_stats();
        Ok(())
    })
}

/// A block in a snapshot: inactive (cached, free).
pub const NPUALLOC_BLOCK_INACTIVE: c_int = 0;
/// A block in a snapshot: allocated.
pub const NPUALLOC_BLOCK_ACTIVE_ALLOCATED: c_int = 1;
/// A block in a snapshot: freed, waiting for work on other streams.
pub const NPUALLOC_BLOCK_ACTIVE_PENDING_FREE: c_int = 2;

/// One segment of a snapshot (torch's `SegmentInfo`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct npualloc_segment_info {
    /// Device index.
    pub device: c_int,
    /// Start address.
    pub address: *mut c_void,
    /// Size in bytes.
    pub total_size: usize,
    /// Bytes of its allocated blocks.
    pub allocated_size: usize,
    /// Bytes of its allocated and pending-free blocks.
    pub active_size: usize,
    /// Bytes requested by the callers of its active blocks.
    pub requested_size: usize,
    /// The stream it serves.
    pub stream: npualloc_stream,
    /// Its owner graph pool (`segment_pool_id`, (0, 0) for none): first integer.
    pub pool_hi: u64,
    /// Its owner graph pool: second integer.
    pub pool_lo: u64,
    /// A large-pool segment (else small).
    pub is_large: bool,
    /// A run of mapped pages of an expandable segment.
    pub is_expandable: bool,
    /// Index of its first block in the snapshot's blocks.
    pub first_block: usize,
    /// Number of its blocks.
    pub block_count: usize,
}

/// One block of a snapshot (torch's `BlockInfo`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct npualloc_block_info {
    /// Start address.
    pub address: *mut c_void,
    /// Size in bytes.
    pub size: usize,
    /// Bytes the caller asked for (0 when inactive).
    pub requested_size: usize,
    /// `NPUALLOC_BLOCK_*`.
    pub state: c_int,
}

/// A snapshot of one device's segments, made by `npualloc_snapshot_take` and freed by
/// `npualloc_snapshot_destroy`.
pub struct npualloc_snapshot {
    segments: Vec<npualloc_segment_info>,
    blocks: Vec<npualloc_block_info>,
}

/// Takes a snapshot of `device`'s segments (torch's `snapshot(mempool_id)`): those of
/// pool (`id_hi`, `id_lo`) only, or every segment for (0, 0); in address order, each
/// with its blocks. Stores it in `*out` (free it with `npualloc_snapshot_destroy`).
#[no_mangle]
pub extern "C" fn npualloc_snapshot_take(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    out: *mut *mut npualloc_snapshot,
) -> c_int {
    code("npualloc_snapshot_take", || {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let id = pool(id_hi, id_lo);
        let segs = runtime()?
            .allocator(device)?
            .segments_of((id != NO_POOL).then_some(id));
        let mut snap = npualloc_snapshot {
            segments: Vec::with_capacity(segs.len()),
            blocks: Vec::new(),
        };
        for s in segs {
            let first_block = snap.blocks.len();
            let (mut allocated, mut active, mut requested) = (0, 0, 0);
            for b in &s.blocks {
                let state = match b.state {
                    BlockState::Inactive => NPUALLOC_BLOCK_INACTIVE,
                    BlockState::ActiveAllocated => NPUALLOC_BLOCK_ACTIVE_ALLOCATED,
                    BlockState::ActivePendingFree => NPUALLOC_BLOCK_ACTIVE_PENDING_FREE,
                };
                if b.state == BlockState::ActiveAllocated {
                    allocated += b.size;
                }
                if b.state != BlockState::Inactive {
                    active += b.size;
                    requested += b.requested_size;
                }
                snap.blocks.push(npualloc_block_info {
                    address: b.address as *mut c_void,
                    size: b.size,
                    requested_size: b.requested_size,
                    state,
                });
            }
            let owner = s.pool_id.unwrap_or(NO_POOL);
            snap.segments.push(npualloc_segment_info {
                device,
                address: s.address as *mut c_void,
                total_size: s.total_size,
                allocated_size: allocated,
                active_size: active,
                requested_size: requested,
                stream: s.stream.0 as npualloc_stream,
                pool_hi: owner.0,
                pool_lo: owner.1,
                is_large: s.kind == npualloc_core::PoolKind::Large,
                is_expandable: s.is_expandable,
                first_block,
                block_count: s.blocks.len(),
            });
        }
        // SAFETY: `out` is a non-NULL pointer to a caller-owned, writable pointer.
        unsafe { out.write(Box::into_raw(Box::new(snap))) };
        Ok(())
    })
}

/// Reads a snapshot: its segments and blocks (owned by `snapshot`, valid until it is
/// destroyed) and their numbers. Any out-pointer may be NULL when not wanted.
#[no_mangle]
pub extern "C" fn npualloc_snapshot_read(
    snapshot: *const npualloc_snapshot,
    segments: *mut *const npualloc_segment_info,
    segment_count: *mut usize,
    blocks: *mut *const npualloc_block_info,
    block_count: *mut usize,
) -> c_int {
    code("npualloc_snapshot_read", || {
        // SAFETY: `snapshot` is NULL or a live snapshot made by npualloc_snapshot_take.
        let s = unsafe { snapshot.as_ref() }.ok_or_else(|| null_arg("snapshot"))?;
        // SAFETY: each out-pointer is NULL or caller-owned and writable.
        unsafe {
            if !segments.is_null() {
                segments.write(s.segments.as_ptr());
            }
            if !segment_count.is_null() {
                segment_count.write(s.segments.len());
            }
            if !blocks.is_null() {
                blocks.write(s.blocks.as_ptr());
            }
            if !block_count.is_null() {
                block_count.write(s.blocks.len());
            }
        }
        Ok(())
    })
}

/// Frees a snapshot made by `npualloc_snapshot_take`; NULL is ignored.
#[no_mangle]
pub extern "C" fn npualloc_snapshot_destroy(snapshot: *mut npualloc_snapshot) {
    or_default("npualloc_snapshot_destroy", (), || {
        if !snapshot.is_null() {
            // SAFETY: a non-NULL `snapshot` was made by Box::into_raw in
            // npualloc_snapshot_take and is destroyed once (the documented contract).
            drop(unsafe { Box::from_raw(snapshot) });
        }
        Ok(())
    })
}
