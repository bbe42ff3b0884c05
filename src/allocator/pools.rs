//! Graph-private pools on one device, across its streams' shards: use counts,
//! routing, captures underway, checkpoints, and the per-pool views torch's memory tools
//! ask for (PyTorch's `createOrIncrefPool`, `beginAllocateToPool`, `endAllocateToPool`,
//! `releasePool`, `getPoolUseCount`, `markCaptureBegin/End`, `getCheckpointState`,
//! `setCheckpointPoolState`, `checkPoolLiveAllocations`, `emptyCache(MempoolId)`,
//! `cacheInfo`).
//!
//! A pool is one use count for the device (`graph_pools.rs`) over segments held by the
//! shards of every stream that allocated for it (`shard/capture.rs`), so a capture's
//! side streams share its pool and its lifetime.
//!
//! Contract:
//! - allocations reach a pool by a stream route (`route_stream_to_pool`, until
//!   `end_allocate_to_pool`) or one request at a time (`malloc_in_pool`), only while the
//!   pool is live;
//! - a pool's segments stay while it is live, whatever a cache release asks;
//! - captures underway (`capture_begin` / `capture_end`) stop every event call and
//!   device free of the allocator; when the last one ends, the frees deferred meanwhile
//!   record their events;
//! - a restore either fails with nothing changed (or, on a device error while waiting
//!   for the pool's frees, with the pool's allocations freed) or puts every
//!   checkpointed segment back block for block (all shards locked, in creation order,
//!   for its duration).

use rustc_hash::FxHashSet;

use super::graph_pools::{check_id, NO_POOL};
use super::shard::{CheckpointSegment, NoPeers, Outcome, Released, ShardState};
use super::{CachingAllocator, OtherShards, Shard};
use crate::device::{DeviceIndex, DevicePtr, MempoolId, StreamHandle};
use crate::error::Error;
use crate::snapshot::SegmentInfo;

/// A graph pool's state at a checkpoint: every segment of the pool with its blocks
/// (PyTorch's `PrivatePoolState`). Made only by [`CachingAllocator::pool_checkpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint {
    device: DeviceIndex,
    id: MempoolId,
    segments: Vec<CheckpointSegment>,
}

impl PoolCheckpoint {
    /// The device of the pool.
    pub fn device(&self) -> DeviceIndex {
        self.device
    }

    /// The pool.
    pub fn pool(&self) -> MempoolId {
        self.id
    }

    /// The pool's segments, in address order, each with its blocks in address order.
    pub fn segments(&self) -> &[CheckpointSegment] {
        &self.segments
    }
}

/// What a restore changed (PyTorch's `CheckpointDelta`): the allocations it freed and
/// those it made (the checkpoint's allocated blocks, now live allocations owned by the
/// caller). An address may be in both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreDelta {
    /// Addresses of the pool's allocations freed.
    pub freed: Vec<DevicePtr>,
    /// The checkpoint's allocated blocks, allocated again: (address, size).
    pub allocated: Vec<(DevicePtr, usize)>,
}

impl CachingAllocator {
    /// Adds a use of pool `id`, creating it (PyTorch's `createOrIncrefPool`, and the use
    /// a capture or `beginAllocateToPool` holds). Returns the new count.
    pub fn pool_incref(&self, id: MempoolId) -> Result<u32, Error> {
        self.shared.pools.incref(id)
    }

    /// Pool `id`'s use count (PyTorch's `getPoolUseCount`); 0 for a pool that is not
    /// live.
    pub fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.shared.pools.use_count(id)
    }

    /// Drops one use of pool `id` (PyTorch's `releasePool`); at 0 its cached memory
    /// goes back to the device at the next cache release, once nothing in it is
    /// allocated. An unknown pool, or one with no use left, is an error.
    pub fn release_pool(&self, id: MempoolId) -> Result<(), Error> {
        self.shared.pools.release(id).map(|_| ())
    }

    /// PyTorch's `beginAllocateToPool` without the routing (the caller's filters pick
    /// requests for `malloc_in_pool`): adds a use of pool `id`, and prepares `stream`,
    /// about to be captured, for the capture: blocks lent to it are settled (their
    /// fences waited for), so that no event need ever be recorded on it while it
    /// captures.
    pub fn pool_begin(&self, id: MempoolId, stream: StreamHandle) -> Result<(), Error> {
        check_id(id)?;
        self.shard(stream)?;
        self.settle_fences_on(stream)?;
        self.shared.pools.incref(id).map(|_| ())
    }

    /// Routes allocations on `stream` to the graph-private pool `id` and marks a capture
    /// underway until [`end_allocate_to_pool`](Self::end_allocate_to_pool) (the C
    /// ABI's `npualloc_begin_allocate_to_pool`, made for captures): adds a use of the
    /// pool, creating it. While routed, the stream's allocations never reuse its own
    /// pool's memory and vice versa; while the capture is marked, no event is queried
    /// or recorded and frees of blocks used on other streams record their events only
    /// once no capture is underway.
    pub fn begin_allocate_to_pool(&self, id: MempoolId, stream: StreamHandle) -> Result<(), Error> {
        check_id(id)?;
        let (_, shard) = self.shard(stream)?;
        let routed = {
            let st = shard.lock();
            st.pool_id(st.capture.routed())
        };
        if let Some(p) = routed {
            return Err(Error::InvalidState(format!(
                "this stream is already allocating to pool {p:?}"
            )));
        }
        // No event may be recorded on the stream while it captures: from now on no
        // block is lent, and the fences of blocks it borrowed and gave back are
        // settled first (a host wait only if their work has not run).
        self.shared.pools.capture_begin();
        let begun = self.settle_fences_on(stream).and_then(|()| {
            let mut st = shard.lock();
            st.flush_hot();
            self.shared.pools.incref(id)?;
            st.route_to(id, true).inspect_err(|_| {
                let _ = self.shared.pools.release(id);
            })
        });
        if begun.is_err() {
            self.end_capture_mark();
        }
        begun
    }

    /// Routes allocations on `stream` to the live pool `id` until
    /// [`end_allocate_to_pool`](Self::end_allocate_to_pool); adds no use and marks no
    /// capture (graph trees' warm-up, `use_mem_pool`). Refused for a pool that is not
    /// live and for a stream already routed.
    pub fn route_stream_to_pool(&self, id: MempoolId, stream: StreamHandle) -> Result<(), Error> {
        self.shared
            .pools
            .require_live(id, "cannot route allocations to it")?;
        let (_, shard) = self.shard(stream)?;
        shard.lock().route_to(id, false)
    }

    /// Ends one stream route to pool `id` (PyTorch's `endAllocateToPool`: one end per
    /// begin or route), and the capture mark it holds if `begin_allocate_to_pool` made
    /// it. Refused when no stream routes to the pool.
    pub fn end_allocate_to_pool(&self, id: MempoolId) -> Result<(), Error> {
        for shard in self.shards.all() {
            let mut st = shard.lock();
            if st.is_capturing_to(id) {
                let marked = st.end_route();
                drop(st);
                if marked {
                    self.end_capture_mark();
                }
                return Ok(());
            }
        }
        Err(Error::InvalidState(format!(
            "not currently allocating to pool {id:?}"
        )))
    }

    /// Allocates at least `size` bytes for use on `stream` from the live pool `id`,
    /// whatever the stream routes to (the caller's filter chose the pool).
    pub fn malloc_in_pool(
        &self,
        size: usize,
        stream: StreamHandle,
        id: MempoolId,
    ) -> Result<DevicePtr, Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        self.shared
            .pools
            .require_live(id, "cannot allocate from it")?;
        let (_, shard) = self.shard(stream)?;
        let peers = OtherShards {
            table: &self.shards,
            own: stream,
            shared: &self.shared,
        };
        let found = self.with_shard(shard, |st| {
            st.malloc_in(id, size, Released::Nothing, &peers)
        });
        let ptr = match found {
            Ok(Outcome::Served(ptr)) => ptr,
            Ok(Outcome::OutOfMemory(e)) | Err(e) => return Err(self.malloc_failed(e, size)),
            Ok(Outcome::NeedsCleanRelease | Outcome::NeedsAllReleased) => {
                self.malloc_in_pool_last_resort(size, shard, id)?
            }
        };
        self.emit_alloc(ptr, size, stream, Some(id));
        Ok(ptr)
    }

    /// `malloc_in_pool` once only the other streams' caches can help: they are
    /// released, then the pool's shard tries for the last time.
    #[cold]
    fn malloc_in_pool_last_resort(
        &self,
        size: usize,
        shard: &Shard,
        id: MempoolId,
    ) -> Result<DevicePtr, Error> {
        self.release_other_caches(shard.stream);
        let found = self.with_shard(shard, |st| {
            st.malloc_in(id, size, Released::Others, &NoPeers)
        });
        self.end_of_climb(found.map_err(|e| self.malloc_failed(e, size))?, size)
    }

    /// A graph capture begins on the device (torch_npu's `markCaptureBegin`): until it
    /// ends, no event is queried, recorded or synchronised and nothing goes back to the
    /// device.
    pub fn capture_begin(&self) {
        self.shared.pools.capture_begin();
    }

    /// A graph capture ended (torch_npu's `markCaptureEnd`); refused when none is
    /// underway. When none is left, deferred frees record their events.
    pub fn capture_end(&self) -> Result<(), Error> {
        if self.shared.pools.capture_end()? == 0 {
            self.insert_deferred_events();
        }
        Ok(())
    }

    /// Whether a graph capture is underway on the device (torch_npu's
    /// `hasCapturesUnderway`).
    pub fn captures_underway(&self) -> bool {
        self.shared.capture_underway()
    }

    /// Ends one capture mark held by a route; see `capture_end`.
    fn end_capture_mark(&self) {
        if self.shared.pools.capture_end() == Ok(0) {
            self.insert_deferred_events();
        }
    }

    /// Every shard's frees deferred during captures record their events (none is
    /// underway now).
    fn insert_deferred_events(&self) {
        for shard in self.shards.all() {
            if shard.pending.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                self.with_shard(shard, |st| st.insert_deferred_events());
            }
        }
    }

    /// Settles the lending fences on `stream` in every other shard.
    pub(super) fn settle_fences_on(&self, stream: StreamHandle) -> Result<(), Error> {
        self.for_other_shards(stream, |st| st.settle_fences_on(stream))
    }

    /// Whether pool `id` is known: live, or still holding device memory.
    fn pool_known(&self, id: MempoolId) -> bool {
        self.shared.pools.is_live(id)
            || self
                .private_pool_stats()
                .iter()
                .any(|p| p.id == id && p.reserved_bytes[0].current > 0)
    }

    /// The state of live pool `id` (PyTorch's `getCheckpointState`): every segment of
    /// the pool, on every stream, with its blocks. Frees deferred by captures first
    /// record their events, and the pool's pending frees are waited for (PyTorch
    /// requires them complete; `shard/checkpoint.rs`). Refused while a capture is
    /// underway, and for a pool with expandable segments.
    pub fn pool_checkpoint(&self, id: MempoolId) -> Result<PoolCheckpoint, Error> {
        self.shared.pools.require_live(id, "cannot checkpoint it")?;
        if self.shared.capture_underway() {
            return Err(Error::InvalidState(format!(
                "pool {id:?} cannot be checkpointed while a graph capture is underway"
            )));
        }
        let mut segments = Vec::new();
        for shard in self.shards.all() {
            let part = self.with_shard(shard, |st| {
                st.process_events();
                st.settle_pool_waits(id)?;
                st.pool_segments(id)
            })?;
            segments.extend(part);
        }
        segments.sort_by_key(|s| s.address());
        Ok(PoolCheckpoint {
            device: self.index,
            id,
            segments,
        })
    }

    /// Puts pool `checkpoint.pool()` back to `checkpoint` (PyTorch's
    /// `setCheckpointPoolState`): frees every allocation of the pool now, re-carves
    /// each checkpointed segment into exactly its checkpointed blocks, and makes the
    /// blocks allocated at the checkpoint live allocations again (counted as
    /// allocations). Frees of allocations used on other streams are waited for, as the
    /// pool's other pending frees. Fails with nothing changed when the pool is not live,
    /// a checkpointed segment is gone, or a capture is underway; a device error while
    /// waiting is reported with the pool's allocations freed.
    pub fn pool_restore(&self, checkpoint: &PoolCheckpoint) -> Result<RestoreDelta, Error> {
        let id = checkpoint.id;
        if checkpoint.device != self.index {
            return Err(Error::InvalidArgument(format!(
                "the checkpoint is of device {}, not {}",
                checkpoint.device, self.index
            )));
        }
        self.shared.pools.require_live(id, "cannot restore it")?;
        if self.shared.capture_underway() {
            return Err(Error::InvalidState(format!(
                "pool {id:?} cannot be restored while a graph capture is underway"
            )));
        }
        for s in &checkpoint.segments {
            // Fails for a stream this allocator never served.
            self.shards.get(s.stream).ok_or_else(|| {
                Error::InvalidState(format!(
                    "the checkpoint's segment at {:#x} is of stream {:?}, which holds no \
                     memory here",
                    s.address(),
                    s.stream
                ))
            })?;
        }
        let shards = self.shards.all();
        // Completed events taken in first (no host wait), as for a checkpoint.
        for s in &shards {
            self.with_shard(s, |st| st.process_events());
        }
        let mut states: Vec<_> = shards.iter().map(|s| s.lock()).collect();
        let delta = restore_locked(&mut states, &shards, checkpoint);
        for (shard, st) in shards.iter().zip(&states) {
            self.set_pending(shard, st.pending_count());
        }
        delta
    }

    /// Whether the live allocations of pool `id` are exactly `ptrs` (PyTorch's
    /// `checkPoolLiveAllocations`); an unknown pool is an error.
    pub fn pool_check_live(&self, id: MempoolId, ptrs: &[DevicePtr]) -> Result<bool, Error> {
        check_id(id)?;
        if !self.pool_known(id) {
            return Err(Error::UnknownPool {
                id,
                why: "cannot check its allocations",
            });
        }
        let want: FxHashSet<DevicePtr> = ptrs.iter().copied().collect();
        let mut have = 0;
        for shard in self.shards.all() {
            for p in shard.lock().pool_allocations(id) {
                if !want.contains(&p) {
                    return Ok(false);
                }
                have += 1;
            }
        }
        Ok(have == want.len())
    }

    /// Releases the cached segments of pool `id` if it is no longer live (PyTorch's
    /// `emptyCache(mempool_id)`), after taking in its completed frees; `NO_POOL` is
    /// the whole cache ([`empty_cache`](Self::empty_cache)). A live pool keeps its
    /// segments; nothing happens while a capture is underway.
    pub fn empty_cache_pool(&self, id: MempoolId) -> Result<(), Error> {
        if id == NO_POOL {
            return self.empty_cache();
        }
        if self.shared.pools.is_live(id) || self.shared.capture_underway() {
            return Ok(());
        }
        let mut result = Ok(());
        for s in self.shards.all() {
            result = result.and(self.with_shard(s, |st| st.release_pool_cache(id)));
        }
        result
    }

    /// The bytes of every cached free block (all streams and pools) and the largest
    /// one (PyTorch's `cacheInfo`).
    pub fn cache_info(&self) -> (usize, usize) {
        let (mut total, mut largest) = (0, 0);
        for s in self.shards.all() {
            let mut st = s.lock();
            st.finish_merge();
            for size in st.cached_free_sizes() {
                total += size;
                largest = largest.max(size);
            }
        }
        (total, largest)
    }

    /// The segments of pool `id` (every segment for `None` or `NO_POOL`), as
    /// [`segments`](Self::segments) lists them (PyTorch's `snapshot(mempool_id)`).
    pub fn segments_of(&self, id: Option<MempoolId>) -> Vec<SegmentInfo> {
        let all = self.segments();
        match id.filter(|&p| p != NO_POOL) {
            None => all,
            Some(p) => all.into_iter().filter(|s| s.pool_id == Some(p)).collect(),
        }
    }

    /// Remembers `work` as the last HCCL work that used the live allocation `ptr`
    /// (torch_npu's `recordHcclWorkForBlock`; `shard/hccl.rs`).
    pub fn record_hccl_work(&self, ptr: DevicePtr, work: usize) -> Result<(), Error> {
        self.with_owner(ptr, None, |_, st, _| st.record_hccl_work(ptr, work))
            .unwrap_or(Err(Error::UnknownPointer { ptr }))
    }

    /// torch_npu's `eraseStreamWithBlockPtr`: erases the use of `stream` by the
    /// allocation `ptr` (live, or freed and waiting) if `work` is the last HCCL work
    /// recorded for it and it belongs to `current` (`shard/hccl.rs`). Returns whether
    /// `ptr` is such an allocation of this device (changed or not).
    pub fn erase_stream_for_work(
        &self,
        ptr: DevicePtr,
        stream: StreamHandle,
        work: usize,
        current: StreamHandle,
    ) -> Result<bool, Error> {
        for shard in self.shards.all() {
            let found = self.with_shard(shard, |st| {
                !st.hccl.is_empty() && st.erase_stream_for_work(ptr, stream, work, current)
            });
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// torch_npu's `eraseStream(ptr, stream)`: forgets the use of `stream` by the live
    /// allocation `ptr` only if the allocation's stream (its caller's: a lent block's
    /// borrower) is `current`, the stream now ordered after `stream`'s work; else
    /// nothing changes. An unknown pointer is an error.
    pub fn erase_stream_if_current(
        &self,
        ptr: DevicePtr,
        stream: StreamHandle,
        current: StreamHandle,
    ) -> Result<(), Error> {
        self.with_owner(ptr, None, |_, st, id| {
            let b = &st.blocks[id];
            if b.borrower().unwrap_or(b.stream) != current {
                return Ok(());
            }
            st.erase_stream(id, ptr, stream)
        })
        .unwrap_or(Err(Error::UnknownPointer { ptr }))
    }

    /// The memory fraction in force (torch's `getMemoryFraction`): the cap over the
    /// device's total memory, 1.0 when none is set.
    pub fn memory_fraction(&self) -> Result<f64, Error> {
        match self.shared.allowed_max() {
            None => Ok(1.0),
            Some(cap) => {
                let total = self.device.mem_info(self.index)?.total;
                Ok(if total == 0 {
                    1.0
                } else {
                    cap as f64 / total as f64
                })
            }
        }
    }

    /// The live pools with their use counts, in id order.
    pub fn live_pools(&self) -> Vec<(MempoolId, u32)> {
        self.shared.pools.live()
    }
}

/// `pool_restore` with every shard locked (`shards[i]` is `states[i]`'s).
fn restore_locked(
    states: &mut [parking_lot::MutexGuard<'_, ShardState>],
    shards: &[&Shard],
    checkpoint: &PoolCheckpoint,
) -> Result<RestoreDelta, Error> {
    let id = checkpoint.id;
    let of = |stream: StreamHandle| shards.iter().position(|s| s.stream == stream);
    // Everything is checked before anything changes.
    for (i, st) in states.iter_mut().enumerate() {
        let mine: Vec<&CheckpointSegment> = checkpoint
            .segments
            .iter()
            .filter(|s| of(s.stream) == Some(i))
            .collect();
        st.check_restorable(id, &mine)?;
    }
    let mut delta = RestoreDelta::default();
    for st in states.iter_mut() {
        delta.freed.extend(st.free_pool_allocations(id));
    }
    for st in states.iter_mut() {
        st.settle_pool_waits(id)?;
    }
    for seg in &checkpoint.segments {
        let i = of(seg.stream).expect("checked by pool_restore");
        delta.allocated.extend(states[i].restore_segment(id, seg));
    }
    Ok(delta)
}
