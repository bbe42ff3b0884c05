//! The block state of one device's allocator, behind its mutex.
//!
//! Invariants (see `invariants.rs`, which checks them):
//! - every block belongs to exactly one segment, whose blocks tile it;
//! - free blocks are exactly the free-list entries, and never neighbours;
//! - allocated blocks are exactly the pointer-map entries;
//! - a pending block's `event_count` equals its queued events plus parked frees;
//! - a lent block is allocated here for another stream's caller (`stream_uses[0]`); a
//!   dirty block is free and has marks in `dirty`, and only such blocks have marks;
//! - `reserved` and every current statistic equal a recount of the blocks.

mod expandable;

use rustc_hash::FxHashSet;
use std::sync::Arc;

use slab::Slab;

use super::oom;
use super::shared::Shared;
use crate::config::Config;
use crate::device::{Device, DeviceError, DeviceIndex, DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::free_list::HOT_CAPACITY;
use crate::pool::rounding::{
    allocation_size, round_size, LARGE_BUFFER, MIN_BLOCK, ROUND_LARGE, SMALL_SIZE,
};
use crate::pool::{Block, BlockId, PoolKind, PoolTag, PtrTable, StreamMap, VmSegment};
use crate::profiling::Mstx;
use crate::stats::{self, DeviceStats, StatType};
use crate::stream::{DirtyMarks, EventPool, Fences, PendingFrees, UNFENCED};

/// Access to the other streams' shards from inside one shard's slow path.
pub(crate) trait Peers {
    /// Calls `f` on each other shard whose lock is free right now, until it returns false.
    fn visit(&self, f: &mut dyn FnMut(&mut State) -> bool);
}

/// Where a request that missed this stream's free lists is served.
enum Grant {
    /// A block of this shard (from a new or borrowed segment, or pages mapped).
    Own(BlockId),
    /// A block lent by another stream's shard, which keeps it (see `lend_block`).
    Lent(DevicePtr),
}

/// No other shards (tests of one shard, and the last-resort pass).
pub(crate) struct NoPeers;

impl Peers for NoPeers {
    fn visit(&self, _: &mut dyn FnMut(&mut State) -> bool) {}
}

/// How many recent reclaims are remembered for churn detection.
const RECENT_RECLAIMS: usize = 64;
/// A reclaimed segment allocated again within this many malloc calls counts as churn.
const RECLAIM_WINDOW: u64 = 4096;
/// The idle requirement after the first churn.
const MIN_RECLAIM_IDLE: u64 = 64;
/// A lent segment is at most this many times the segment a new allocation would get.
const LEND_SIZE_FACTOR: usize = 2;
/// Adaptive large segments are at least this fraction of the reserved high-water mark...
const ADAPTIVE_DIVISOR: usize = 8;
/// ...but no larger than this.
const ADAPTIVE_MAX: usize = 64 << 20;

/// What a block is doing, as snapshots report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for events on other streams.
    ActivePendingFree,
    /// Cached and reusable.
    Inactive,
}

/// One block in a snapshot.
#[derive(Clone, Debug)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub size: usize,
    /// Bytes the caller asked for (0 when inactive).
    pub requested_size: usize,
    /// State.
    pub state: BlockState,
    /// Allocated for a caller on this other stream (cross-stream lending).
    pub lent_to: Option<StreamHandle>,
    /// Free, but these streams it was lent to may still use it (their fences have not
    /// been seen complete): whoever takes it first waits for them on the device.
    pub dirty_on: Vec<StreamHandle>,
}

/// One segment (device allocation) in a snapshot.
#[derive(Clone, Debug)]
pub struct SegmentInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub total_size: usize,
    /// Stream the segment serves.
    pub stream: StreamHandle,
    /// Pool.
    pub kind: PoolKind,
    /// Blocks in address order.
    pub blocks: Vec<BlockInfo>,
    /// The graph-private pool holding the segment (`None`: the stream's own pool).
    pub pool_id: Option<(u64, u64)>,
    /// A run of mapped pages of an expandable segment.
    pub is_expandable: bool,
}

pub(super) struct State {
    /// The stream this shard serves (its own pools are keyed by it).
    pub stream: StreamHandle,
    pub config: Config,
    pub blocks: Slab<Block>,
    /// This shard's live allocations: pointer → block.
    pub ptrs: PtrTable,
    pub pools: StreamMap,
    pub known_streams: FxHashSet<StreamHandle>,
    pub pending: PendingFrees,
    /// Blocks whose events could not be recorded: each holds one `event_count` token
    /// until the next full synchronisation.
    pub parked: Vec<BlockId>,
    pub events: EventPool,
    pub stats: DeviceStats,
    /// Settings and device-wide counters shared with the other streams' shards.
    pub shared: Arc<Shared>,
    pub reserved: usize,
    /// Highest `reserved` of this shard (sizes its adaptive segments).
    pub reserved_hwm: usize,
    pub gc_calls: u64,
    /// Number of malloc calls so far (the clock of segment idleness).
    pub malloc_calls: u64,
    /// Idle time (malloc calls) a segment needs before it may be reclaimed; doubles
    /// whenever a reclaimed segment has to be allocated again soon after.
    pub reclaim_min_idle: u64,
    /// Recently reclaimed segments: (size, when).
    pub recent_reclaims: std::collections::VecDeque<(usize, u64)>,
    /// Profiler markers around the slow paths.
    pub markers: Arc<Mstx>,
    /// Graph-private pools of this stream; pool tag `t` is entry `t - 1`.
    pub private: Vec<PrivatePool>,
    /// The private pool allocations go to while a graph capture is under way.
    pub capturing: Option<PoolTag>,
    /// Frees with stream uses made during a capture: their events are recorded when it
    /// ends (event calls are not allowed while capturing).
    pub deferred: Vec<BlockId>,
    /// Expandable segments (`Block::vm` is an index here plus one).
    pub vm: Slab<VmSegment>,
    /// How far the streams this shard lent blocks to have run.
    pub fences: Fences,
    /// Which free blocks streams they were lent to may still use (`Block::dirty`).
    pub dirty: DirtyMarks,
}

/// A graph-private pool (PyTorch's `PrivatePool`).
#[derive(Clone, Copy, Debug)]
pub struct PrivatePool {
    /// The caller's pool id (`MempoolId_t`).
    pub id: (u64, u64),
    /// Captures using it that were not released; 0 = its memory may go back.
    pub use_count: u32,
}

impl State {
    pub fn new(stream: StreamHandle, shared: Arc<Shared>, markers: Arc<Mstx>) -> Self {
        let config = shared.config.clone();
        let mut known_streams = FxHashSet::default();
        known_streams.insert(StreamHandle::DEFAULT);
        State {
            stream,
            config,
            blocks: Slab::new(),
            ptrs: PtrTable::default(),
            pools: StreamMap::default(),
            known_streams,
            pending: PendingFrees::default(),
            parked: Vec::new(),
            events: EventPool::default(),
            stats: DeviceStats::default(),
            shared,
            reserved: 0,
            reserved_hwm: 0,
            gc_calls: 0,
            malloc_calls: 0,
            reclaim_min_idle: 0,
            recent_reclaims: std::collections::VecDeque::new(),
            markers,
            private: Vec::new(),
            capturing: None,
            deferred: Vec::new(),
            vm: Slab::new(),
            fences: Fences::default(),
            dirty: DirtyMarks::default(),
        }
    }

    pub fn check_stream(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        s: StreamHandle,
    ) -> Result<(), Error> {
        if !self.known_streams.contains(&s) {
            dev.check_stream(index, s)?;
            self.known_streams.insert(s);
        }
        Ok(())
    }

    fn gc_enabled(&self) -> bool {
        self.shared.allowed_max().is_some() && self.config.garbage_collection_threshold > 0.0
    }

    // ---- graph-private pools ----------------------------------------------------------

    /// The pool this shard's allocations go to now.
    #[inline]
    fn route(&self) -> PoolTag {
        self.capturing.unwrap_or(0)
    }

    /// Whether cached segments of pool `tag` may go back to the device.
    fn pool_releasable(&self, tag: PoolTag) -> bool {
        tag == 0 || self.private[tag as usize - 1].use_count == 0
    }

    fn private_tag(&self, id: (u64, u64)) -> Option<PoolTag> {
        self.private
            .iter()
            .position(|p| p.id == id)
            .map(|i| i as PoolTag + 1)
    }

    /// Starts routing this stream's allocations to private pool `id` (created, or its
    /// use count raised).
    pub fn begin_allocate_to_pool(&mut self, id: (u64, u64)) -> Result<(), Error> {
        if id == (0, 0) {
            return Err(Error::InvalidArgument("pool id (0, 0) is reserved".into()));
        }
        if let Some(t) = self.capturing {
            return Err(Error::InvalidState(format!(
                "this stream is already allocating to pool {:?}",
                self.private[t as usize - 1].id
            )));
        }
        let tag = match self.private_tag(id) {
            Some(t) => {
                let p = &mut self.private[t as usize - 1];
                if p.use_count == 0 {
                    return Err(Error::InvalidState(format!("pool {id:?} was released")));
                }
                p.use_count += 1;
                t
            }
            None => {
                self.private.push(PrivatePool { id, use_count: 1 });
                self.private.len() as PoolTag
            }
        };
        self.capturing = Some(tag);
        Ok(())
    }

    /// Whether this stream is allocating to private pool `id` now.
    pub fn is_capturing_to(&self, id: (u64, u64)) -> bool {
        self.capturing
            .is_some_and(|t| self.private[t as usize - 1].id == id)
    }

    /// Stops routing to the private pool and records the events of frees deferred
    /// during the capture.
    pub fn end_allocate_to_pool(&mut self, dev: &dyn Device, index: DeviceIndex) {
        self.capturing = None;
        for id in std::mem::take(&mut self.deferred) {
            self.blocks[id].event_count -= 1;
            self.insert_events(dev, index, id);
        }
    }

    /// Drops one use of private pool `id`; at zero its cached memory may go back to
    /// the device (at the next cache release). Returns whether this shard has the pool.
    pub fn release_pool(&mut self, id: (u64, u64)) -> bool {
        match self.private_tag(id) {
            Some(t) => {
                let p = &mut self.private[t as usize - 1];
                p.use_count = p.use_count.saturating_sub(1);
                true
            }
            None => false,
        }
    }

    /// Device bytes held by private-pool segments.
    pub fn private_pool_bytes(&self) -> usize {
        self.blocks
            .iter()
            .filter(|(_, b)| b.pool != 0)
            .map(|(_, b)| b.size)
            .sum()
    }

    // ---- free lists -------------------------------------------------------------

    fn pool_insert(&mut self, id: BlockId) {
        let (gc, now) = (self.gc_calls, self.malloc_calls);
        let b = &mut self.blocks[id];
        b.gc_count_base = gc;
        b.freed_at = now;
        let (key, kind) = ((b.stream, b.pool), b.kind);
        self.pools
            .get_or_default(key)
            .get_mut(kind)
            .insert(&mut self.blocks, id);
    }

    fn pool_remove(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (key, kind) = ((b.stream, b.pool), b.kind);
        let removed = match self.pools.get_mut(&key) {
            Some(p) => p.get_mut(kind).remove(&mut self.blocks, id),
            None => false,
        };
        debug_assert!(removed, "block {id} was not in its free list");
    }

    /// PyTorch's `get_free_block`: best fit on the same stream, honouring max_split_size.
    fn get_free_block(
        &mut self,
        stream: StreamHandle,
        kind: PoolKind,
        size: usize,
    ) -> Option<BlockId> {
        if self.gc_enabled() {
            self.gc_calls += 1;
        }
        let list = self.pools.get(&(stream, self.route()))?.get(kind);
        let (bsize, _, id) = list.best_fit(size)?;
        let max_split = self.config.max_split_size;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(self.config.max_non_split_rounding) {
            return None;
        }
        self.pool_remove(id);
        Some(id)
    }

    // ---- malloc -----------------------------------------------------------------

    /// Serves a request on this shard's stream. `Ok(None)`: only releasing the other
    /// streams' caches could help; the caller does that (without this shard's lock
    /// held) and calls again with `others_released`.
    pub fn malloc(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        size: usize,
        stream: StreamHandle,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<DevicePtr>, Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        self.malloc_calls += 1;
        let too_large = || Error::SizeTooLarge { requested: size };
        let padded = size
            .checked_add(self.shared.padding)
            .ok_or_else(too_large)?;
        let rounded = round_size(padded, &self.config).ok_or_else(too_large)?;
        if self.pending_count() > 0 && self.capturing.is_none() {
            self.process_events(dev, index);
        }
        let kind = PoolKind::for_size(rounded);

        if let Some(id) = self.hot_take(stream, rounded) {
            return self
                .hand_out(dev, index, id, size, rounded, stream)
                .map(|(ptr, _)| Some(ptr));
        }
        let id = match self.get_free_block(stream, kind, rounded) {
            Some(id) => id,
            None => match self.allocate_segment(
                dev,
                index,
                size,
                rounded,
                self.segment_size(rounded).ok_or_else(too_large)?,
                stream,
                kind,
                others_released,
                peers,
            )? {
                Some(Grant::Own(id)) => id,
                Some(Grant::Lent(ptr)) => return Ok(Some(ptr)),
                None => return Ok(None),
            },
        };
        self.hand_out(dev, index, id, size, rounded, stream)
            .map(|(ptr, _)| Some(ptr))
    }

    /// Allocates found block `id` (out of its free list) for work on stream `taker`
    /// and maps its address; returns (address, the allocated block). A dirty block first
    /// orders `taker` after the streams that may still use it; if that fails, the block
    /// goes back to its free list.
    #[inline(always)]
    fn hand_out(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        id: BlockId,
        size: usize,
        rounded: usize,
        taker: StreamHandle,
    ) -> Result<(DevicePtr, BlockId), Error> {
        let dirty = self.blocks[id].dirty;
        if dirty {
            self.poll_fences(dev, index);
            if let Err(e) = self.wait_for_dirty(dev, index, id, taker) {
                self.pool_insert(id);
                return Err(e);
            }
        }
        let out = self.alloc_found_block(id, size, rounded);
        if dirty && out == id {
            // Handed out whole; a split-off front starts clean and the free remainder
            // (`id`) stays dirty for other takers, unless the wait met its marks.
            self.dirty.take(id);
            self.blocks[id].dirty = false;
        } else if dirty {
            self.prune_marks(id);
        }
        let ptr = self.blocks[out].ptr;
        self.ptrs.insert(ptr, out);
        Ok((ptr, out))
    }

    /// Orders `taker` after every stream block `id` is still dirty on (other than
    /// `taker` itself, whose own order suffices).
    #[cold]
    fn wait_for_dirty(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        id: BlockId,
        taker: StreamHandle,
    ) -> Result<(), Error> {
        let marks: Vec<_> = self.dirty.get(id).to_vec();
        for (s, epoch) in marks {
            if s != taker && !self.fences.is_clear(s, epoch) {
                self.order_after(dev, index, taker, s)?;
                if taker == self.stream {
                    self.fences.met(s);
                }
            }
        }
        Ok(())
    }

    /// Drops block `id`'s dirty state if all its marks are clear.
    fn prune_marks(&mut self, id: BlockId) {
        if self.blocks[id].dirty && self.fences.all_clear(self.dirty.get(id)) {
            self.dirty.take(id);
            self.blocks[id].dirty = false;
        }
    }

    /// Before `stream` starts capturing: waits for the fences on it, so that no block
    /// stays dirty on it (taking one would record an event on the capturing stream).
    pub fn settle_fences_on(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        let events = &mut self.events;
        self.fences
            .synchronize(dev, index, Some(stream), |ev| events.put(ev))?;
        let unfenced = self
            .dirty
            .iter()
            .any(|(_, m)| m.iter().any(|&(s, e)| s == stream && e == UNFENCED));
        if unfenced {
            dev.synchronize_stream(index, stream)?;
            for id in self.dirty.clear_stream(stream) {
                self.blocks[id].dirty = false;
            }
        }
        Ok(())
    }

    /// Takes in the fences that completed (no waiting). Only lending and slow paths poll
    /// them, never the fast path: a fence frees no memory, it only spares the next taker
    /// of a dirty block a device-side wait and lets a dirty segment go back to the
    /// device (a fence that never completes must not cost every malloc a query).
    fn poll_fences(&mut self, dev: &dyn Device, index: DeviceIndex) {
        if !self.fences.is_empty() {
            let events = &mut self.events;
            self.fences.poll(dev, index, |ev| events.put(ev));
        }
    }

    /// Whether block `id` may still be in use on a stream it was lent to.
    pub(super) fn is_dirty(&self, id: BlockId) -> bool {
        self.blocks[id].dirty && !self.fences.all_clear(self.dirty.get(id))
    }

    /// This stream's own cached whole segments of `kinds` (in that order) that could go
    /// back to the device without a host wait (not dirty): (size, block).
    fn clean_whole_segments<'a>(
        &'a self,
        kinds: &'a [PoolKind],
    ) -> impl Iterator<Item = (usize, BlockId)> + 'a {
        self.pools
            .iter()
            .filter(|((_, tag), _)| *tag == 0)
            .flat_map(move |(_, p)| kinds.iter().flat_map(move |&k| p.get(k).iter()))
            .filter(|&(_, _, id)| self.is_whole_segment(id) && !self.is_dirty(id))
            .map(|(s, _, id)| (s, id))
    }

    /// Records a fence on `borrower` for a lent block it just freed; returns the
    /// epoch of the block's dirty mark.
    fn fence(&mut self, dev: &dyn Device, index: DeviceIndex, borrower: StreamHandle) -> u64 {
        let Ok(ev) = self.events.get(dev, index) else {
            return UNFENCED;
        };
        match dev.event_record(index, ev, borrower) {
            Ok(()) => self.fences.push(borrower, ev),
            Err(_) => {
                self.events.put(ev);
                UNFENCED
            }
        }
    }

    /// The device allocation for a block of `rounded` bytes: PyTorch's sizes, or with
    /// `adaptive_segments` large-pool segments of at least 1/8 of the reserved
    /// high-water mark (20 to 64 MiB), so that tensors of different sizes share segments
    /// whose freed space coalesces, instead of each size stranding a segment of its own.
    fn segment_size(&self, rounded: usize) -> Option<usize> {
        let pytorch = allocation_size(rounded)?;
        if !self.config.adaptive_segments || rounded <= SMALL_SIZE {
            return Some(pytorch);
        }
        // This stream's own high-water mark, but at least half the device's: streams
        // taking turns still get segments large enough to share (measured: the
        // device's alone over-sizes a side stream's segments, the stream's alone
        // under-sizes those of streams in rotation; benches/README.md).
        let mark = self.reserved_hwm.max(self.shared.hwm() / 2);
        let floor = (mark / ADAPTIVE_DIVISOR).clamp(LARGE_BUFFER, ADAPTIVE_MAX);
        let exact = rounded.checked_next_multiple_of(ROUND_LARGE)?;
        Some(exact.max(floor.next_multiple_of(ROUND_LARGE)))
    }

    /// The slow path: a new segment, releasing cache as needed, or out of memory.
    #[allow(clippy::too_many_arguments)]
    fn allocate_segment(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        size: usize,
        rounded: usize,
        seg_size: usize,
        stream: StreamHandle,
        kind: PoolKind,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<Grant>, Error> {
        self.poll_fences(dev, index);
        // Merge the hot cache first: its blocks may combine into a fit.
        if self.flush_hot() {
            if let Some(id) = self.get_free_block(stream, kind, rounded) {
                return Ok(Some(Grant::Own(id)));
            }
        }
        let expandable = self.config.expandable_segments;
        if expandable && !others_released {
            // Another stream's free block before mapping pages.
            if let Some(ptr) = self.borrow_block(dev, index, size, rounded, stream, kind, peers) {
                return Ok(Some(Grant::Lent(ptr)));
            }
            return Ok(self
                .allocate_pages(dev, index, size, rounded, stream, kind, peers)?
                .map(Grant::Own));
        }
        if !others_released {
            if self.gc_enabled() {
                self.garbage_collect(dev, index, peers);
            }
            if let Some(id) =
                self.borrow_segment(dev, index, stream, kind, rounded, seg_size, peers)?
            {
                return Ok(Some(Grant::Own(id)));
            }
            if let Some(ptr) = self.borrow_block(dev, index, size, rounded, stream, kind, peers) {
                return Ok(Some(Grant::Lent(ptr)));
            }
            self.release_empty_before_growth(dev, index, seg_size, peers);
            if let Some(id) = self.alloc_block(dev, index, seg_size, stream, kind)? {
                return Ok(Some(Grant::Own(id)));
            }
            if self.release_available_cached_blocks(dev, index, stream, kind, rounded) {
                if let Some(id) = self.alloc_block(dev, index, seg_size, stream, kind)? {
                    return Ok(Some(Grant::Own(id)));
                }
            }
            // Only releasing every cache (the other streams' too) can help now; not
            // during a capture, which must not synchronise.
            if self.capturing.is_none() {
                return Ok(None);
            }
            return Err(self.out_of_memory(dev, index, size, seg_size));
        }
        // Last resort: wait for all pending frees, release every cached segment, retry.
        let markers = self.markers.clone();
        let _range = markers.range(|| format!("npualloc.oom_retry {size}B dev{index}"));
        let released = self.release_cached_blocks(dev, index);
        self.stats.num_alloc_retries += 1;
        if released.is_ok() {
            let grown = if expandable {
                self.vm_grow(dev, index, stream, kind, rounded)?
            } else {
                self.alloc_block(dev, index, seg_size, stream, kind)?
            };
            if let Some(id) = grown {
                return Ok(Some(Grant::Own(id)));
            }
        }
        let asked = if expandable {
            rounded.next_multiple_of(self.config.page_size(kind))
        } else {
            seg_size
        };
        Err(self.out_of_memory(dev, index, size, asked))
    }

    /// The first attempt of `allocate_segment` with expandable segments: map pages,
    /// after giving back idle free pages if reserved memory would pass its high-water
    /// mark; then this shard's free pages, then (`Ok(None)`) the other shards' caches.
    #[allow(clippy::too_many_arguments)]
    fn allocate_pages(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        size: usize,
        rounded: usize,
        stream: StreamHandle,
        kind: PoolKind,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        let grow = rounded.next_multiple_of(self.config.page_size(kind));
        if self.capturing.is_none() {
            self.release_empty_before_growth(dev, index, grow, peers);
        }
        if let Some(id) = self.vm_grow(dev, index, stream, kind, rounded)? {
            return Ok(Some(id));
        }
        if self.capturing.is_some() {
            // A capture must not synchronise: no releasing, out of memory now.
            return Err(self.out_of_memory(dev, index, size, grow));
        }
        if self.vm_release_free(dev, index, usize::MAX, 0) > 0 {
            return self.vm_grow(dev, index, stream, kind, rounded);
        }
        Ok(None)
    }

    /// Counts an OOM and builds its error, with torch_npu's message.
    fn out_of_memory(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        size: usize,
        seg_size: usize,
    ) -> Error {
        self.stats.num_ooms += 1;
        let info = dev.mem_info(index).ok();
        Error::OutOfMemory {
            requested: size,
            message: oom::message(
                index,
                size,
                seg_size,
                info,
                self.shared.allowed_max(),
                &self.stats,
            ),
        }
    }

    /// Allocates a whole segment; `Ok(None)` when the device (or the fraction) is full.
    fn alloc_block(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        seg_size: usize,
        stream: StreamHandle,
        kind: PoolKind,
    ) -> Result<Option<BlockId>, Error> {
        if !self.shared.try_reserve(seg_size) {
            return Ok(None); // over the memory fraction
        }
        let markers = self.markers.clone();
        let range = markers.range(|| format!("npualloc.device_malloc {seg_size}B dev{index}"));
        let result = dev.malloc(index, seg_size);
        drop(range);
        let ptr = match result {
            Ok(p) => p,
            Err(e) => {
                self.shared.unreserve(seg_size);
                if e.is_out_of_memory() {
                    return Ok(None);
                }
                return Err(e.into());
            }
        };
        self.shared.note_reserved();
        if !self.recent_reclaims.is_empty() {
            self.note_segment_malloc(seg_size);
        }
        self.segment_added(kind, seg_size);
        self.stats.num_device_alloc += 1;
        let mut seg = Block::segment(ptr, seg_size, stream, kind);
        seg.pool = self.route();
        Ok(Some(self.blocks.insert(seg)))
    }

    fn should_split(&self, block: &Block, rounded: usize) -> bool {
        let rem = block.size - rounded;
        if block.vm != 0 {
            // Expandable segments strand nothing by splitting (PyTorch's rule).
            return rem >= MIN_BLOCK;
        }
        match block.kind {
            PoolKind::Small => rem >= MIN_BLOCK,
            PoolKind::Large => rounded < self.config.max_split_size && rem > SMALL_SIZE,
        }
    }

    /// Hands out block `id` (already out of its free list), splitting off the tail.
    fn alloc_found_block(&mut self, id: BlockId, size: usize, rounded: usize) -> BlockId {
        let st = self.blocks[id].kind.stat_type();
        let already_split = self.blocks[id].is_split();
        let mut out = id;
        if self.should_split(&self.blocks[id], rounded) {
            // The front becomes a new block; the original keeps the remainder.
            let b = &self.blocks[id];
            let mut front = b.sibling(b.ptr, rounded);
            front.prev = b.prev;
            front.next = Some(id);
            let front_id = self.blocks.insert(front);
            if let Some(p) = self.blocks[front_id].prev {
                self.blocks[p].next = Some(front_id);
            }
            let rest = &mut self.blocks[id];
            rest.prev = Some(front_id);
            rest.ptr += rounded;
            rest.size -= rounded;
            let rest_size = rest.size;
            self.pool_insert(id);
            if already_split {
                stats::decrease(&mut self.stats.inactive_split_bytes, st, rounded);
            } else {
                stats::increase(&mut self.stats.inactive_split_bytes, st, rest_size);
                stats::increase(&mut self.stats.inactive_split, st, 1);
            }
            out = front_id;
        } else if already_split {
            let bsize = self.blocks[id].size;
            stats::decrease(&mut self.stats.inactive_split_bytes, st, bsize);
            stats::decrease(&mut self.stats.inactive_split, st, 1);
        }
        let b = &mut self.blocks[out];
        b.allocated = true;
        b.requested = size;
        let bsize = b.size;
        stats::increase(&mut self.stats.allocation, st, 1);
        stats::increase(&mut self.stats.allocated_bytes, st, bsize);
        stats::increase(&mut self.stats.active, st, 1);
        stats::increase(&mut self.stats.active_bytes, st, bsize);
        stats::increase(&mut self.stats.requested_bytes, st, size);
        if bsize >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        out
    }

    // ---- free ---------------------------------------------------------------------

    pub fn free(&mut self, dev: &dyn Device, index: DeviceIndex, id: BlockId) {
        let b = &mut self.blocks[id];
        debug_assert!(b.allocated);
        b.allocated = false;
        let (st, size, lent) = (b.kind.stat_type(), b.size, b.lent);
        stats::decrease(&mut self.stats.allocation, st, 1);
        stats::decrease(&mut self.stats.allocated_bytes, st, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if lent && self.return_lent(dev, index, id) {
            return;
        }
        if self.blocks[id].stream_uses.is_empty() {
            self.free_block(id);
        } else if self.capturing.is_some() {
            // No event calls during a capture: record them when it ends.
            self.blocks[id].event_count += 1;
            self.deferred.push(id);
        } else {
            self.insert_events(dev, index, id);
        }
    }

    /// A lent block freed by its borrower: back to this stream's pool at once (the
    /// caller continues as for any free), marked dirty until a fence on the borrower
    /// completes, so that whoever takes it sooner waits on the device. Returns true if
    /// it was kept back instead: no event may be recorded on a capturing borrower, so
    /// the block waits for the next full synchronisation (cache release or OOM retry).
    #[cold]
    fn return_lent(&mut self, dev: &dyn Device, index: DeviceIndex, id: BlockId) -> bool {
        self.poll_fences(dev, index); // recycles the events of completed fences
        let b = &mut self.blocks[id];
        b.lent = false;
        let borrower = b.stream_uses.remove(0);
        if self.shared.is_capturing(borrower) {
            let b = &mut self.blocks[id];
            b.stream_uses.clear();
            b.event_count += 1;
            self.parked.push(id);
            return true;
        }
        let epoch = self.fence(dev, index, borrower);
        self.dirty.add(id, borrower, epoch);
        self.blocks[id].dirty = true;
        false
    }

    /// Records one event per other stream the block was used on.
    fn insert_events(&mut self, dev: &dyn Device, index: DeviceIndex, id: BlockId) {
        let uses = std::mem::take(&mut self.blocks[id].stream_uses);
        let mut failed = false;
        for s in uses {
            let recorded = self.events.get(dev, index).and_then(|ev| {
                dev.event_record(index, ev, s).map(|_| ev).inspect_err(|_| {
                    // Never queued: the event is idle and can go straight back.
                    self.events.put(ev);
                })
            });
            match recorded {
                Ok(ev) => {
                    self.blocks[id].event_count += 1;
                    self.pending.push(s, ev, id);
                }
                Err(_) => failed = true,
            }
        }
        if failed {
            // Without an event we cannot tell when that stream is done with the block:
            // park it until the next full synchronisation (empty_cache or OOM retry).
            self.blocks[id].event_count += 1;
            self.parked.push(id);
        }
    }

    /// A block becomes reusable: into its stream's hot cache if there is room, else
    /// into its free list, merged with free neighbours.
    fn free_block(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        debug_assert!(b.is_free() && b.stream_uses.is_empty());
        let (st, size, requested, stream, split) = (
            b.kind.stat_type(),
            b.size,
            b.requested,
            b.stream,
            b.is_split(),
        );
        b.requested = 0;
        stats::decrease(&mut self.stats.active, st, 1);
        stats::decrease(&mut self.stats.active_bytes, st, size);
        stats::decrease(&mut self.stats.requested_bytes, st, requested);
        // Only small-pool blocks: parking large blocks unmerged changes where later
        // large requests land and costs reserve (measured on the shipped traces).
        let b = &self.blocks[id];
        let small = b.kind == PoolKind::Small && b.pool == 0 && self.config.hot_cache && !b.dirty;
        let hot = &mut self.pools.get_or_default((stream, 0)).hot;
        if small && hot.len() < HOT_CAPACITY {
            hot.push((size, id));
            self.blocks[id].hot = true;
            if split {
                stats::increase(&mut self.stats.inactive_split, st, 1);
                stats::increase(&mut self.stats.inactive_split_bytes, st, size);
            }
            return;
        }
        self.coalesce(id, false);
    }

    /// Puts free block `id` in its free list, merged with free neighbours. `counted`:
    /// the block is already counted as an inactive split (it comes from the hot cache).
    fn coalesce(&mut self, id: BlockId, counted: bool) {
        let b = &self.blocks[id];
        let st = b.kind.stat_type();
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        if counted && b.is_split() {
            net_blocks -= 1;
            net_bytes -= b.size as i64;
        }
        let neighbours = [b.prev, b.next];
        for n in neighbours.into_iter().flatten() {
            let subsumed = self.try_merge(id, n);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.pool_insert(id);
        if self.blocks[id].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[id].size as i64;
        }
        apply_net(&mut self.stats.inactive_split, st, net_blocks);
        apply_net(&mut self.stats.inactive_split_bytes, st, net_bytes);
    }

    /// Takes a hot block of exactly `size` bytes on `stream`, most recent first.
    fn hot_take(&mut self, stream: StreamHandle, size: usize) -> Option<BlockId> {
        if self.capturing.is_some() {
            return None;
        }
        let hot = &mut self.pools.get_mut(&(stream, 0))?.hot;
        let pos = hot.iter().rposition(|&(s, _)| s == size)?;
        let (_, id) = hot.swap_remove(pos);
        self.blocks[id].hot = false;
        Some(id)
    }

    /// Moves every hot block into the free lists; returns whether there were any.
    pub fn flush_hot(&mut self) -> bool {
        let hot: Vec<BlockId> = self
            .pools
            .values_mut()
            .flat_map(|p| p.hot.drain(..).map(|(_, id)| id))
            .collect();
        for &id in &hot {
            self.blocks[id].hot = false;
            self.coalesce(id, true);
        }
        !hot.is_empty()
    }

    /// Bytes of block `id` a neighbour may absorb: its size when free and not parked in
    /// the hot cache, else 0.
    fn mergeable(&self, id: BlockId) -> usize {
        let b = &self.blocks[id];
        if b.is_free() && !b.hot {
            b.size
        } else {
            0
        }
    }

    /// Merges free neighbour `src` into `dst`; returns the bytes absorbed (0 if not free).
    fn try_merge(&mut self, dst: BlockId, src: BlockId) -> usize {
        if self.mergeable(src) == 0 {
            return 0;
        }
        self.pool_remove(src);
        let s = self.blocks.remove(src);
        if s.dirty {
            self.dirty.merge_into(dst, src);
            self.blocks[dst].dirty = true;
            self.prune_marks(dst);
        }
        let d = &mut self.blocks[dst];
        if d.prev == Some(src) {
            d.ptr = s.ptr;
            d.prev = s.prev;
            d.size += s.size;
            if let Some(p) = s.prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            d.next = s.next;
            d.size += s.size;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        s.size
    }

    // ---- streams and events --------------------------------------------------------

    pub fn record_stream(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        id: BlockId,
        ptr: DevicePtr,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        let live = self
            .blocks
            .get(id)
            .is_some_and(|b| b.allocated && b.ptr == ptr);
        if !live {
            return Err(Error::UnknownPointer { ptr });
        }
        if self.blocks[id].stream == stream {
            return Ok(());
        }
        self.check_stream(dev, index, stream)?;
        let uses = &mut self.blocks[id].stream_uses;
        if !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    pub fn erase_stream(
        &mut self,
        id: BlockId,
        ptr: DevicePtr,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        match self.blocks.get_mut(id) {
            Some(b) if b.allocated && b.ptr == ptr => {
                // A borrower is the allocation's stream to the caller: never erased.
                if b.borrower() != Some(stream) {
                    b.stream_uses.retain(|s| *s != stream);
                }
                Ok(())
            }
            _ => Err(Error::UnknownPointer { ptr }),
        }
    }

    /// Returns blocks whose events have all completed to their free lists (no waiting).
    pub fn process_events(&mut self, dev: &dyn Device, index: DeviceIndex) {
        let mut ready = Vec::new();
        let events = &mut self.events;
        self.pending.poll(dev, index, |_, ev, id| {
            events.put(ev);
            ready.push(id);
        });
        for id in ready {
            self.event_done(id);
        }
    }

    fn event_done(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// Waits for every pending event and parked free; PyTorch's `synchronize_and_free_events`.
    fn synchronize_and_free_events(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<(), Error> {
        self.stats.num_sync_all_streams += 1;
        let markers = self.markers.clone();
        let _range = markers.range(|| {
            format!(
                "npualloc.event_sync {} events dev{index}",
                self.pending.len()
            )
        });
        let mut first_err: Option<DeviceError> = None;
        if !self.parked.is_empty() {
            match dev.synchronize_device(index) {
                Ok(()) => {
                    for id in std::mem::take(&mut self.parked) {
                        self.event_done(id);
                    }
                }
                Err(e) => first_err = Some(e),
            }
        }
        let events = &mut self.events;
        if let Err(e) = self
            .fences
            .synchronize(dev, index, None, |ev| events.put(ev))
        {
            first_err.get_or_insert(e);
        }
        for (s, ev, id) in self.pending.drain() {
            match dev.event_synchronize(index, ev) {
                Ok(()) => {
                    self.events.put(ev);
                    self.event_done(id);
                }
                Err(e) => {
                    self.pending.push(s, ev, id);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    // ---- releasing memory -------------------------------------------------------------

    /// Whether free block `id` is a whole device allocation (unsplit, not expandable).
    fn is_whole_segment(&self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        !b.is_split() && b.vm == 0
    }

    /// Frees a whole, unsplit, free segment to the device.
    fn release_block(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        id: BlockId,
    ) -> Result<(), Error> {
        let b = &self.blocks[id];
        debug_assert!(b.is_free() && !b.is_split());
        for &(s, epoch) in self.dirty.get(id) {
            if !self.fences.is_clear(s, epoch) {
                // Work queued there may still use it; device frees need not wait for it.
                dev.synchronize_stream(index, s)?;
            }
        }
        let range = self
            .markers
            .range(|| format!("npualloc.device_free {}B dev{index}", b.size));
        let freed = dev.free(index, b.ptr);
        drop(range);
        freed?;
        let (kind, size) = (b.kind, b.size);
        self.pool_remove(id);
        self.blocks.remove(id);
        self.dirty.take(id);
        self.shared.unreserve(size);
        self.segment_removed(kind, size);
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// Counts a segment this shard now holds: reserved bytes and segment statistics.
    fn segment_added(&mut self, kind: PoolKind, size: usize) {
        self.reserved += size;
        self.reserved_hwm = self.reserved_hwm.max(self.reserved);
        let st = kind.stat_type();
        stats::increase(&mut self.stats.segment, st, 1);
        stats::increase(&mut self.stats.reserved_bytes, st, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
    }

    /// Uncounts a segment this shard no longer holds (freed or lent).
    fn segment_removed(&mut self, kind: PoolKind, size: usize) {
        self.reserved -= size;
        let st = kind.stat_type();
        stats::decrease(&mut self.stats.segment, st, 1);
        stats::decrease(&mut self.stats.reserved_bytes, st, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
    }

    /// Releases every free whole segment of every stream and pool.
    fn release_free_segments(&mut self, dev: &dyn Device, index: DeviceIndex) -> Result<(), Error> {
        let whole: Vec<BlockId> = self
            .pools
            .iter()
            .filter(|((_, tag), _)| self.pool_releasable(*tag))
            .flat_map(|(_, p)| p.small.iter().chain(p.large.iter()))
            .map(|(_, _, id)| id)
            .filter(|&id| self.is_whole_segment(id))
            .collect();
        self.vm_release_free(dev, index, usize::MAX, 0);
        let mut result = self.vm_release_reservations(dev, index);
        if whole.is_empty() {
            return result;
        }
        dev.drain_before_free(index)?;
        for id in whole {
            if let Err(e) = self.release_block(dev, index, id) {
                result = result.and(Err(e));
            }
        }
        self.pools
            .retain(|_, p| !(p.small.is_empty() && p.large.is_empty() && p.hot.is_empty()));
        result
    }

    /// PyTorch's `release_cached_blocks`: synchronise events, then free every cached segment.
    pub fn release_cached_blocks(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<(), Error> {
        let markers = self.markers.clone();
        let _range = markers.range(|| format!("npualloc.cache_release dev{index}"));
        let synced = self.synchronize_and_free_events(dev, index);
        self.flush_hot();
        let released = self.release_free_segments(dev, index);
        synced.and(released)
    }

    /// With `max_split_size` set: free oversize cached blocks of this stream until
    /// `max(size, max_split_size)` bytes are released.
    fn release_available_cached_blocks(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
        kind: PoolKind,
        size: usize,
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == usize::MAX {
            return false;
        }
        let target = size.max(max_split);
        let Some(pools) = self.pools.get(&(stream, self.route())) else {
            return false;
        };
        let list = pools.get(kind);
        let whole = |id: BlockId| self.is_whole_segment(id);
        if let Some((_, _, id)) = list.best_fit(target).filter(|&(_, _, id)| whole(id)) {
            return dev.drain_before_free(index).is_ok()
                && self.release_block(dev, index, id).is_ok();
        }
        let candidates: Vec<(usize, BlockId)> = list
            .iter_desc()
            .into_iter()
            .take_while(|&(s, _, _)| s >= max_split)
            .filter(|&(_, _, id)| whole(id))
            .map(|(s, _, id)| (s, id))
            .collect();
        if candidates.is_empty() || dev.drain_before_free(index).is_err() {
            return false;
        }
        let mut released = 0;
        for (s, id) in candidates {
            if released >= target {
                break;
            }
            if self.release_block(dev, index, id).is_ok() {
                released += s;
            }
        }
        released >= target
    }

    /// Before reserved memory grows past its high-water mark, return wholly empty cached
    /// segments (which cannot serve this request: the free lists had no fit) until the
    /// new segment fits under the mark. Below the mark nothing is freed, so a repeating
    /// workload settles with no device frees.
    fn release_empty_before_growth(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        seg_size: usize,
        peers: &dyn Peers,
    ) {
        if !self.config.reclaim_before_growth {
            return;
        }
        let over = (self.shared.reserved() + seg_size).saturating_sub(self.shared.hwm());
        if over == 0 || dev.drain_before_free(index).is_err() {
            return;
        }
        let mut released = self.release_idle_segments(dev, index, over);
        if released < over {
            peers.visit(&mut |other| {
                released += other.release_idle_segments(dev, index, over - released);
                released < over
            });
        }
    }

    /// Cross-stream lending (`lend_segments`; never while capturing): instead of a new
    /// device allocation, take a wholly free cached segment from another stream's shard.
    /// This stream waits on the device for an event recorded on the lender's stream
    /// (work queued there on the segment finishes first); the host never blocks.
    #[allow(clippy::too_many_arguments)]
    fn borrow_segment(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
        kind: PoolKind,
        rounded: usize,
        seg_size: usize,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        if !self.config.lend_segments || self.capturing.is_some() {
            return Ok(None);
        }
        let limit = seg_size.saturating_mul(LEND_SIZE_FACTOR);
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_segment(dev, index, kind, rounded, limit, stream);
            lent.is_none()
        });
        let Some((ptr, size)) = lent else {
            return Ok(None);
        };
        self.segment_added(kind, size);
        Ok(Some(
            self.blocks.insert(Block::segment(ptr, size, stream, kind)),
        ))
    }

    /// Gives up the smallest wholly free cached segment of `kind` holding at least
    /// `size` bytes (and at most `limit`) to stream `borrower`, ordered on the device
    /// after the work queued on this stream (and on any stream it is dirty on):
    /// (address, size).
    pub fn lend_segment(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        kind: PoolKind,
        size: usize,
        limit: usize,
        borrower: StreamHandle,
    ) -> Option<(DevicePtr, usize)> {
        if self.capturing.is_some() {
            return None;
        }
        let (bsize, _, id) = self
            .pools
            .iter()
            .filter(|((_, tag), _)| *tag == 0)
            .flat_map(|(_, p)| p.get(kind).iter())
            .filter(|&(s, _, id)| s >= size && s <= limit && self.is_whole_segment(id))
            .min_by_key(|&(s, p, _)| (s, p))?;
        self.order_after(dev, index, borrower, self.stream).ok()?;
        self.wait_for_dirty(dev, index, id, borrower).ok()?;
        self.pool_remove(id);
        let b = self.blocks.remove(id);
        self.dirty.take(id);
        self.segment_removed(kind, bsize);
        Some((b.ptr, bsize))
    }

    /// Serves a request of `rounded` bytes made on stream `borrower` from this shard's
    /// free blocks (best fit, as for its own requests). The borrower first waits on the
    /// device for the work queued on this stream so far. The block stays this shard's,
    /// allocated, with `borrower` as its user; once freed it comes back at once, dirty
    /// on the borrower (`return_lent`).
    pub fn lend_block(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        kind: PoolKind,
        size: usize,
        rounded: usize,
        borrower: StreamHandle,
    ) -> Option<DevicePtr> {
        if self.capturing.is_some() {
            return None;
        }
        let own = self.stream;
        let id = self.get_free_block(own, kind, rounded)?;
        if self.order_after(dev, index, borrower, own).is_err() {
            self.pool_insert(id);
            return None;
        }
        let (ptr, id) = self
            .hand_out(dev, index, id, size, rounded, borrower)
            .ok()?;
        let b = &mut self.blocks[id];
        b.lent = true;
        b.stream_uses.insert(0, borrower);
        Some(ptr)
    }

    /// Block lending, the borrower's side (`lend_blocks`; never while capturing): another
    /// stream's free block for this request (see `lend_block`).
    #[allow(clippy::too_many_arguments)]
    fn borrow_block(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        size: usize,
        rounded: usize,
        stream: StreamHandle,
        kind: PoolKind,
        peers: &dyn Peers,
    ) -> Option<DevicePtr> {
        if !self.config.lend_blocks || self.capturing.is_some() {
            return None;
        }
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_block(dev, index, kind, size, rounded, stream);
            lent.is_none()
        });
        lent
    }

    /// Makes `stream` wait on the device for the work queued on `from` so far (an
    /// event recorded on `from`); without events, on the host.
    fn order_after(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
        from: StreamHandle,
    ) -> Result<(), Error> {
        let ordered = self.events.get(dev, index).and_then(|ev| {
            let r = dev
                .event_record(index, ev, from)
                .and_then(|_| dev.stream_wait_event(index, stream, ev));
            self.events.put(ev);
            r
        });
        if ordered.is_err() {
            dev.synchronize_device(index)?;
        }
        Ok(())
    }

    /// Releases wholly empty cached segments idle long enough (largest first: the
    /// fewest device frees for the bytes) until `want` bytes are freed; returns the bytes.
    fn release_idle_segments(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        want: usize,
    ) -> usize {
        self.poll_fences(dev, index);
        let min_idle = self.reclaim_min_idle;
        let mut empties: Vec<(usize, BlockId)> = self
            .clean_whole_segments(&[PoolKind::Small, PoolKind::Large])
            .filter(|&(_, id)| self.malloc_calls - self.blocks[id].freed_at >= min_idle)
            .collect();
        empties.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut released = 0;
        for (s, id) in empties {
            if released >= want {
                break;
            }
            if self.release_block(dev, index, id).is_ok() {
                released += s;
                if self.recent_reclaims.len() == RECENT_RECLAIMS {
                    self.recent_reclaims.pop_front();
                }
                self.recent_reclaims.push_back((s, self.malloc_calls));
            }
        }
        if released < want {
            released += self.vm_release_free(dev, index, want - released, min_idle);
        }
        released
    }

    /// A new segment of `size` bytes: if one like it was reclaimed recently, reclaiming
    /// is churning (a cyclic workload needs it back), so demand longer idleness.
    fn note_segment_malloc(&mut self, size: usize) {
        let now = self.malloc_calls;
        let window = RECLAIM_WINDOW;
        if let Some(i) = self
            .recent_reclaims
            .iter()
            .position(|&(s, at)| s == size && now - at <= window)
        {
            self.recent_reclaims.remove(i);
            self.reclaim_min_idle = self
                .reclaim_min_idle
                .saturating_mul(2)
                .max(MIN_RECLAIM_IDLE);
        }
    }

    /// PyTorch's garbage collection: free old, unsplit large cached blocks until usage
    /// falls below the threshold.
    fn garbage_collect(&mut self, dev: &dyn Device, index: DeviceIndex, peers: &dyn Peers) {
        let Some(max) = self.shared.allowed_max() else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as usize;
        let reserved = self.shared.reserved();
        if reserved <= threshold || dev.drain_before_free(index).is_err() {
            return;
        }
        let target = reserved - threshold;
        let mut reclaimed = self.collect_old_blocks(dev, index, target);
        if reclaimed < target {
            peers.visit(&mut |other| {
                reclaimed += other.collect_old_blocks(dev, index, target - reclaimed);
                reclaimed < target
            });
        }
    }

    /// Frees unsplit large cached blocks, oldest first by rounds of "older than the
    /// average age", until `target` bytes are reclaimed; returns the bytes.
    fn collect_old_blocks(&mut self, dev: &dyn Device, index: DeviceIndex, target: usize) -> usize {
        let mut candidates: Vec<(u64, usize, BlockId)> = self
            .clean_whole_segments(&[PoolKind::Large])
            .map(|(s, id)| (self.gc_calls - self.blocks[id].gc_count_base, s, id))
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let avg = candidates.iter().map(|c| c.0).sum::<u64>() / candidates.len() as u64;
            let (old, young): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|c| c.0 >= avg);
            candidates = young;
            for (_, s, id) in old {
                if reclaimed >= target {
                    break;
                }
                if self.release_block(dev, index, id).is_ok() {
                    reclaimed += s;
                }
            }
        }
        reclaimed
    }

    pub fn empty_cache(&mut self, dev: &dyn Device, index: DeviceIndex) -> Result<(), Error> {
        let released = self.release_cached_blocks(dev, index);
        let destroyed = self.events.destroy_idle(dev, index).map_err(Error::from);
        released.and(destroyed)
    }

    // ---- inspection ----------------------------------------------------------------------

    /// Frees waiting for events or a synchronisation.
    pub fn pending_count(&self) -> usize {
        self.pending.len() + self.parked.len() + self.deferred.len()
    }

    pub fn stats_snapshot(&self) -> DeviceStats {
        let mut s = self.stats;
        s.max_split_size = i64::try_from(self.config.max_split_size).unwrap_or(i64::MAX);
        s
    }

    pub fn segment_of(&self, id: BlockId) -> (DevicePtr, usize) {
        let mut head = id;
        while let Some(p) = self.blocks[head].prev {
            head = p;
        }
        let (mut size, mut cur) = (0, Some(head));
        while let Some(c) = cur {
            size += self.blocks[c].size;
            cur = self.blocks[c].next;
        }
        (self.blocks[head].ptr, size)
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut out: Vec<SegmentInfo> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(|(head, b)| {
                let mut blocks = Vec::new();
                let mut cur = Some(head);
                while let Some(c) = cur {
                    let blk = &self.blocks[c];
                    let state = if blk.allocated {
                        BlockState::ActiveAllocated
                    } else if blk.event_count > 0 {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    };
                    blocks.push(BlockInfo {
                        address: blk.ptr,
                        size: blk.size,
                        requested_size: blk.requested,
                        state,
                        lent_to: blk.borrower(),
                        dirty_on: self
                            .dirty
                            .get(c)
                            .iter()
                            .filter(|&&(s, e)| !self.fences.is_clear(s, e))
                            .map(|&(s, _)| s)
                            .collect(),
                    });
                    cur = blk.next;
                }
                SegmentInfo {
                    pool_id: (b.pool != 0).then(|| self.private[b.pool as usize - 1].id),
                    is_expandable: b.vm != 0,
                    address: b.ptr,
                    total_size: blocks.iter().map(|x| x.size).sum(),
                    stream: b.stream,
                    kind: b.kind,
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }
}

fn apply_net(arr: &mut stats::StatArray, st: StatType, net: i64) {
    match net.cmp(&0) {
        std::cmp::Ordering::Greater => stats::increase(arr, st, net as usize),
        std::cmp::Ordering::Less => stats::decrease(arr, st, net.unsigned_abs() as usize),
        std::cmp::Ordering::Equal => {}
    }
}
