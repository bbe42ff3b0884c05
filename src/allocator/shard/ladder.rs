//! The malloc ladder of one shard: own cache, then lending, then growth, then release
//! and growth (PyTorch's `malloc`, with npualloc's rungs in between).
//!
//! Contract: `malloc` either hands out a block (its pointer mapped in `ptrs`), returns
//! `Ok(None)` when only releasing the other shards' caches could help (the caller does
//! that without this shard's lock and calls again with `others_released`), or fails
//! with out of memory after counting it.

use super::ShardState;
use super::{Grant, Peers};
use crate::allocator::oom;
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::rounding::{allocation_size, round_size, LARGE_BUFFER, ROUND_LARGE, SMALL_SIZE};
use crate::pool::{Block, BlockId, PoolKind};

/// Adaptive large segments are at least this fraction of the reserved high-water mark...
const ADAPTIVE_DIVISOR: usize = 8;
/// ...but no larger than this.
const ADAPTIVE_MAX: usize = 64 << 20;

impl ShardState {
    /// Serves a request on this shard's stream. `Ok(None)`: only releasing the other
    /// streams' caches could help; the caller does that (without this shard's lock
    /// held) and calls again with `others_released`.
    pub fn malloc(
        &mut self,
        size: usize,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<DevicePtr>, Error> {
        let stream = self.stream;
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        self.malloc_calls += 1;
        let too_large = || Error::SizeTooLarge { requested: size };
        let padded = size
            .checked_add(self.shared.padding)
            .ok_or_else(too_large)?;
        let rounded = round_size(padded, &self.shared.config).ok_or_else(too_large)?;
        if self.pending_count() > 0 && self.capturing.is_none() {
            self.process_events();
        }
        let kind = PoolKind::for_size(rounded);

        if let Some(id) = self.hot_take(stream, rounded) {
            return self
                .hand_out(id, size, rounded, stream)
                .map(|(ptr, _)| Some(ptr));
        }
        let id = match self.get_free_block(stream, kind, rounded) {
            Some(id) => id,
            None => match self.allocate_segment(
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
        self.hand_out(id, size, rounded, stream)
            .map(|(ptr, _)| Some(ptr))
    }

    /// Allocates found block `id` (out of its free list) for work on stream `taker`
    /// and maps its address; returns (address, the allocated block). A dirty block first
    /// orders `taker` after the streams that may still use it; if that fails, the block
    /// goes back to its free list.
    #[inline(always)]
    pub(super) fn hand_out(
        &mut self,
        id: BlockId,
        size: usize,
        rounded: usize,
        taker: StreamHandle,
    ) -> Result<(DevicePtr, BlockId), Error> {
        let dirty = self.blocks[id].dirty;
        if dirty {
            self.poll_fences();
            if let Err(e) = self.wait_for_dirty(id, taker) {
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

    /// The device allocation for a block of `rounded` bytes: PyTorch's sizes, or with
    /// `adaptive_segments` large-pool segments of at least 1/8 of the reserved
    /// high-water mark (20 to 64 MiB), so that tensors of different sizes share segments
    /// whose freed space coalesces, instead of each size stranding a segment of its own.
    pub(super) fn segment_size(&self, rounded: usize) -> Option<usize> {
        let pytorch = allocation_size(rounded)?;
        if !self.shared.config.adaptive_segments || rounded <= SMALL_SIZE {
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
    pub(super) fn allocate_segment(
        &mut self,
        size: usize,
        rounded: usize,
        seg_size: usize,
        stream: StreamHandle,
        kind: PoolKind,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<Grant>, Error> {
        let index = self.index;
        self.poll_fences();
        // Merge the hot cache first: its blocks may combine into a fit.
        if self.flush_hot() {
            if let Some(id) = self.get_free_block(stream, kind, rounded) {
                return Ok(Some(Grant::Own(id)));
            }
        }
        let expandable = self.shared.config.expandable_segments;
        if expandable && !others_released {
            // Another stream's free block before mapping pages.
            if let Some(ptr) = self.borrow_block(size, rounded, stream, kind, peers) {
                return Ok(Some(Grant::Lent(ptr)));
            }
            return Ok(self
                .allocate_pages(size, rounded, stream, kind, peers)?
                .map(Grant::Own));
        }
        if !others_released {
            if self.gc_enabled() {
                self.garbage_collect(peers);
            }
            if let Some(id) = self.borrow_segment(stream, kind, rounded, seg_size, peers)? {
                return Ok(Some(Grant::Own(id)));
            }
            if let Some(ptr) = self.borrow_block(size, rounded, stream, kind, peers) {
                return Ok(Some(Grant::Lent(ptr)));
            }
            self.release_empty_before_growth(seg_size, peers);
            if let Some(id) = self.alloc_block(seg_size, stream, kind)? {
                return Ok(Some(Grant::Own(id)));
            }
            if self.release_available_cached_blocks(stream, kind, rounded) {
                if let Some(id) = self.alloc_block(seg_size, stream, kind)? {
                    return Ok(Some(Grant::Own(id)));
                }
            }
            // Only releasing every cache (the other streams' too) can help now; not
            // during a capture, which must not synchronise.
            if self.capturing.is_none() {
                return Ok(None);
            }
            return Err(self.out_of_memory(size, seg_size));
        }
        // Last resort: wait for all pending frees, release every cached segment, retry.
        let markers = self.shared.markers.clone();
        let _range = markers.range(|| format!("npualloc.oom_retry {size}B dev{index}"));
        let released = self.release_cached_blocks();
        self.stats.num_alloc_retries += 1;
        if released.is_ok() {
            let grown = if expandable {
                self.vm_grow(stream, kind, rounded)?
            } else {
                self.alloc_block(seg_size, stream, kind)?
            };
            if let Some(id) = grown {
                return Ok(Some(Grant::Own(id)));
            }
        }
        let asked = if expandable {
            rounded.next_multiple_of(self.shared.config.page_size(kind))
        } else {
            seg_size
        };
        Err(self.out_of_memory(size, asked))
    }

    /// The first attempt of `allocate_segment` with expandable segments: map pages,
    /// after giving back idle free pages if reserved memory would pass its high-water
    /// mark; then this shard's free pages, then (`Ok(None)`) the other shards' caches.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn allocate_pages(
        &mut self,
        size: usize,
        rounded: usize,
        stream: StreamHandle,
        kind: PoolKind,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        let grow = rounded.next_multiple_of(self.shared.config.page_size(kind));
        if self.capturing.is_none() {
            self.release_empty_before_growth(grow, peers);
        }
        if let Some(id) = self.vm_grow(stream, kind, rounded)? {
            return Ok(Some(id));
        }
        if self.capturing.is_some() {
            // A capture must not synchronise: no releasing, out of memory now.
            return Err(self.out_of_memory(size, grow));
        }
        if self.vm_release_free(usize::MAX, 0) > 0 {
            return self.vm_grow(stream, kind, rounded);
        }
        Ok(None)
    }

    /// Counts an OOM and builds its error, with torch_npu's message.
    pub(super) fn out_of_memory(&mut self, size: usize, seg_size: usize) -> Error {
        let index = self.index;
        self.stats.num_ooms += 1;
        let info = self.dev.mem_info(index).ok();
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
    pub(super) fn alloc_block(
        &mut self,
        seg_size: usize,
        stream: StreamHandle,
        kind: PoolKind,
    ) -> Result<Option<BlockId>, Error> {
        let index = self.index;
        if !self.shared.try_reserve(seg_size) {
            return Ok(None); // over the memory fraction
        }
        let markers = self.shared.markers.clone();
        let range = markers.range(|| format!("npualloc.device_malloc {seg_size}B dev{index}"));
        let result = self.dev.malloc(index, seg_size);
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
}
