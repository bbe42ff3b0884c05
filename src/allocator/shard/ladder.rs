//! The malloc ladder of one shard: own cache, then lending, then growth, then release
//! and growth (PyTorch's `malloc`, with npualloc's rungs in between).
//!
//! The rungs, in order (each one only when the ones above found nothing):
//! 1. **own cache**: the hot cache, then best fit in this stream's free lists (first
//!    the block of a deferred merge, when best fit would split it off the merged block);
//!    best fit does not split a whole segment twice the request's size or more that
//!    the device could not give back, once a device malloc has failed or while the
//!    request's own segment can be had (`keep_whole.rs`): the request grows instead,
//!    its own size first, and takes that segment only if growth fails (before rung
//!    5's release);
//! 2. **merged cache**: the hot cache merged into the free lists, best fit again;
//! 3. **lending**: garbage collection (with a memory fraction), a wholly free segment of
//!    another stream, then a free block of another stream (`lending.rs`); with
//!    expandable segments only the block. A stream that keeps borrowing for the same
//!    request size while the device does not grow (a steady loop) grows first instead
//!    (rung 4 moved up, `lending.rs`'s repeat rule), and borrows if that fails; so
//!    does every miss of a steady stream (`lending.rs`);
//! 4. **grow**: idle empty segments back first if reserved memory would pass its
//!    high-water mark (not those of steady streams), then a device malloc (with
//!    expandable segments: map pages; when the device or the memory fraction cannot
//!    give an adaptive segment, the request's own size rounded to 2 MiB, then
//!    PyTorch's size, `alloc_segment`; also in rungs 5 and 6; once any device malloc
//!    for a segment has failed on the device, the own size only, never an adaptive
//!    one: `after_failure_size`. Measured and dropped, benches/README.md: the adaptive
//!    size only while the device's free memory (`mem_info`) leaves room for k more
//!    such segments, which acts before any failure but broke single-stream traces);
//!    past the reserve budget, the device-side wait of rung 5 first;
//! 5. **release and grow**: oversize cached blocks back (`max_split_size_mb`), grow
//!    again; then **wait on the device** for a pending free that fits: this stream's
//!    own, else another stream's, lent (`pressure.rs`; only when growth failed or
//!    would pass the reserve budget);
//! 6. **release everything and grow** (`others_released`: the caller,
//!    `../last_resort.rs`, first gave back every stream's cached segments that need no
//!    host wait and ran this ladder again, then released the other shards' caches
//!    without this shard's lock): wait for every pending free (on npualloc's path each
//!    stream holding one is synchronised once, `events.rs`), release every cached
//!    segment; (npualloc's path) take a free block of this stream, which the
//!    synchronised frees may have merged; grow; else (npualloc's path) borrow another
//!    stream's free block, likewise; else (npualloc's path) a small request takes a
//!    free block of this stream's large pool (`small_spill.rs`); else out of memory.
//!
//! Contract: `malloc` either hands out a block (its pointer mapped in `ptrs`), returns
//! `Ok(None)` when only rung 6 could help, or fails with out of memory after counting it.
//! A capture never reaches rung 6 (it must not synchronise): out of memory at once.

use std::sync::atomic::Ordering;

use super::lending::GrowFirst;
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

/// One malloc request, sized once (PyTorch's `AllocParams`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    /// Bytes the caller asked for.
    pub size: usize,
    /// The block size that serves it (padded and rounded).
    pub rounded: usize,
    /// The pool the block comes from.
    pub kind: PoolKind,
    /// The stream that will use the block: this shard's own, or a borrower's.
    pub stream: StreamHandle,
    /// Best fit's block for it in the own cache was kept whole (`keep_whole.rs`): it
    /// grows the least it can. Set once the own cache missed.
    pub kept_whole: bool,
}

impl ShardState {
    /// Sizes a request of `size` bytes on this shard's stream.
    fn request(&self, size: usize) -> Result<Request, Error> {
        let too_large = || Error::SizeTooLarge { requested: size };
        let padded = size
            .checked_add(self.shared.padding)
            .ok_or_else(too_large)?;
        let config = &self.shared.config;
        let rounded = round_size(padded, |s| config.divisions_for(s)).ok_or_else(too_large)?;
        Ok(Request {
            size,
            rounded,
            kind: PoolKind::for_size(rounded),
            stream: self.stream,
            kept_whole: false,
        })
    }

    /// Serves a request on this shard's stream. `Ok(None)`: only releasing the other
    /// streams' caches could help; the caller does that (without this shard's lock
    /// held) and calls again with `others_released`.
    pub fn malloc(
        &mut self,
        size: usize,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<DevicePtr>, Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        self.reclaim.malloc_calls += 1;
        let req = self.request(size)?;
        if self.pending_count() > 0 && !self.capture_underway() {
            self.process_events();
        }
        let id = match self.take_own_cache(&req) {
            Some(id) => id,
            None => match self.miss(&req, others_released, peers)? {
                Some(Grant::Own(id)) => id,
                Some(Grant::Lent(ptr)) => return Ok(Some(ptr)),
                None => return Ok(None),
            },
        };
        self.hand_out(id, &req).map(|(ptr, _)| Some(ptr))
    }

    /// Rung 1: a hot block of the exact size, else best fit in this stream's free lists.
    /// The hot cache holds handed-out small-pool blocks only, whose sizes are their
    /// rounded requests (at most `SMALL_SIZE`): a large request skips it.
    #[inline(always)]
    fn take_own_cache(&mut self, req: &Request) -> Option<BlockId> {
        let hot = match req.kind {
            PoolKind::Small => self.hot_take(req.rounded),
            PoolKind::Large => None,
        };
        hot.or_else(|| self.take_unmerged(req.kind, req.rounded))
            .or_else(|| self.get_own_free_block(req.kind, req.rounded))
    }

    /// Rungs 2 to 6, for a request the own cache could not serve. Looks at the device's
    /// reserved high-water mark before and after (`lending.rs`: steadiness), so that a
    /// rise by this shard's own growth counts from when it happened.
    fn miss(
        &mut self,
        req: &Request,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<Grant>, Error> {
        self.note_growth();
        let grant = self.miss_rungs(req, others_released, peers);
        self.note_growth();
        grant
    }

    /// `miss` without the bookkeeping.
    fn miss_rungs(
        &mut self,
        req: &Request,
        others_released: bool,
        peers: &dyn Peers,
    ) -> Result<Option<Grant>, Error> {
        let seg_size = self.segment_size(req.rounded).ok_or(Error::SizeTooLarge {
            requested: req.size,
        })?;
        self.poll_fences();
        if let Some(id) = self.take_merged_cache(req) {
            return Ok(Some(Grant::Own(id)));
        }
        let req = &Request {
            kept_whole: self.keeps_whole_for(req),
            ..*req
        };
        if others_released {
            return self.release_all_and_grow(req, seg_size, peers).map(Some);
        }
        if self.shared.config.expandable_segments {
            // Another stream's free block before mapping pages.
            if let Some(ptr) = self.borrow_block(req, false, true, peers) {
                return Ok(Some(Grant::Lent(ptr)));
            }
            return Ok(self.grow_pages(req, peers)?.map(Grant::Own));
        }
        if self.gc_enabled() {
            self.garbage_collect(peers);
        }
        // A repeat borrower grows its own cache before borrowing (`lending.rs`); if
        // that fails, memory is short: it borrows, without counting the borrow.
        let first = self.grow_before_borrowing(req, seg_size);
        let regrow = first != GrowFirst::No;
        if regrow {
            if let Some(id) = self.grow(req, seg_size, peers)? {
                if first == GrowFirst::Repeat {
                    self.shared.regrowths.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(Some(Grant::Own(id)));
            }
        }
        if let Some(id) = self.borrow_segment(req, seg_size, !regrow, peers)? {
            return Ok(Some(Grant::Own(id)));
        }
        if let Some(ptr) = self.borrow_block(req, !regrow, true, peers) {
            return Ok(Some(Grant::Lent(ptr)));
        }
        if self.over_budget(seg_size) {
            if let Some(grant) = self.pressure_rung(req, peers) {
                return Ok(Some(grant));
            }
        }
        if !regrow {
            if let Some(id) = self.grow(req, seg_size, peers)? {
                return Ok(Some(Grant::Own(id)));
            }
        }
        // Growth failed: a whole segment kept for its size serves after all.
        if let Some(id) = self.take_kept_whole(req) {
            return Ok(Some(Grant::Own(id)));
        }
        if let Some(id) = self.release_oversize_and_grow(req, seg_size)? {
            return Ok(Some(Grant::Own(id)));
        }
        if let Some(grant) = self.pressure_rung(req, peers) {
            return Ok(Some(grant));
        }
        // Only releasing every cache (the other streams' too) can help now; not
        // while a graph is captured on any stream, which must not synchronise.
        if !self.capture_underway() {
            return Ok(None);
        }
        let asked = self.after_failure_size(req, seg_size);
        Err(self.out_of_memory(req.size, asked))
    }

    /// Rung 2: the hot cache merged into the free lists (its blocks may combine into a
    /// fit), best fit again.
    fn take_merged_cache(&mut self, req: &Request) -> Option<BlockId> {
        if self.flush_hot() {
            return self.get_own_free_block(req.kind, req.rounded);
        }
        None
    }

    /// Rung 4: a new segment, after giving back idle empty segments if reserved memory
    /// would pass its high-water mark.
    pub(super) fn grow(
        &mut self,
        req: &Request,
        seg_size: usize,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        self.release_empty_before_growth(seg_size, peers);
        self.alloc_segment(req, seg_size)
    }

    /// Rung 5: oversize cached blocks of this stream back to the device
    /// (`max_split_size_mb`), then a new segment.
    fn release_oversize_and_grow(
        &mut self,
        req: &Request,
        seg_size: usize,
    ) -> Result<Option<BlockId>, Error> {
        if !self.capture_underway() && self.release_available_cached_blocks(req.kind, req.rounded) {
            return self.alloc_segment(req, seg_size);
        }
        Ok(None)
    }

    /// Rung 6, the last resort: wait for all pending frees, release every cached
    /// segment, take a fitting free block (npualloc's path), grow, borrow (npualloc's
    /// path); else out of memory.
    fn release_all_and_grow(
        &mut self,
        req: &Request,
        seg_size: usize,
        peers: &dyn Peers,
    ) -> Result<Grant, Error> {
        let (index, size) = (self.index, req.size);
        let markers = self.shared.markers.clone();
        let _range = markers.range(|| format!("npualloc.oom_retry {size}B dev{index}"));
        let released = self.release_cached_blocks();
        self.acct.stats.num_alloc_retries += 1;
        let expandable = self.shared.config.expandable_segments;
        // The frees just synchronised may have merged into a free block of this stream
        // that fits: it serves before a new segment (PyTorch's path does not look
        // again, it only grows).
        if self.shared.config.wait_before_growth {
            if let Some(id) = self.get_free_block(req.kind, req.rounded) {
                return Ok(Grant::Own(id));
            }
        }
        if released.is_ok() {
            let grown = if expandable {
                self.vm_grow(req.stream, req.kind, req.rounded)?
            } else {
                self.alloc_segment(req, seg_size)?
            };
            if let Some(id) = grown {
                return Ok(Grant::Own(id));
            }
        }
        // The frees just synchronised may have left a fitting free block on another
        // stream: lend it rather than fail (`peers` is `NoPeers` on PyTorch's path).
        if let Some(ptr) = self.borrow_block(req, false, false, peers) {
            return Ok(Grant::Lent(ptr));
        }
        // (npualloc's path) a small request takes a large-pool block rather than fail.
        if let Some(id) = self.take_large_for_small(req) {
            return Ok(Grant::Own(id));
        }
        let asked = if expandable {
            req.rounded
                .next_multiple_of(self.vm_page_for(req.kind, req.rounded))
        } else {
            self.after_failure_size(req, seg_size)
        };
        Err(self.out_of_memory(size, asked))
    }

    /// Rung 4 with expandable segments: map pages, after giving back idle free pages if
    /// reserved memory would pass its high-water mark; then this shard's free pages,
    /// then (`Ok(None)`) the other shards' caches.
    fn grow_pages(&mut self, req: &Request, peers: &dyn Peers) -> Result<Option<BlockId>, Error> {
        let grow = req
            .rounded
            .next_multiple_of(self.vm_page_for(req.kind, req.rounded));
        if !self.capture_underway() {
            self.release_empty_before_growth(grow, peers);
        }
        if let Some(id) = self.vm_grow(req.stream, req.kind, req.rounded)? {
            return Ok(Some(id));
        }
        if self.capture_underway() {
            // A capture must not synchronise: no releasing, out of memory now.
            return Err(self.out_of_memory(req.size, grow));
        }
        if self.vm_release_free(usize::MAX, 0) > 0 {
            return self.vm_grow(req.stream, req.kind, req.rounded);
        }
        Ok(None)
    }

    /// Allocates found block `id` (out of its free list) for `req` (whose stream is the
    /// taker) and maps its address; returns (address, the allocated block). A dirty block first
    /// orders the taker after the streams that may still use it; if that fails, the block
    /// goes back to its free list.
    #[inline(always)]
    pub(super) fn hand_out(
        &mut self,
        id: BlockId,
        req: &Request,
    ) -> Result<(DevicePtr, BlockId), Error> {
        let dirty = self.blocks[id].dirty;
        if dirty {
            self.poll_fences();
            if let Err(e) = self.wait_for_dirty(id, req.stream) {
                self.pool_insert(id);
                return Err(e);
            }
        }
        let out = self.alloc_found_block(id, req.size, req.rounded);
        if dirty && out == id {
            // Handed out whole; a split-off front starts clean and the free remainder
            // (`id`) stays dirty for other takers, unless the wait met its marks.
            self.lending.dirty.take(id);
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
        let mark = self.size_mark();
        let floor = (mark / ADAPTIVE_DIVISOR).clamp(LARGE_BUFFER, ADAPTIVE_MAX);
        let exact = rounded.checked_next_multiple_of(ROUND_LARGE)?;
        Some(exact.max(floor.next_multiple_of(ROUND_LARGE)))
    }

    /// The reserve mark that adaptive sizes scale with (segments here, expandable
    /// pages in `expandable.rs`): this stream's own high-water mark, but at least half
    /// the device's, so streams taking turns still get sizes large enough to share
    /// (measured: the device's alone over-sizes a side stream's segments, the stream's
    /// alone under-sizes those of streams in rotation; benches/README.md).
    pub(super) fn size_mark(&self) -> usize {
        self.acct.reserved_hwm.max(self.shared.hwm() / 2)
    }

    /// Counts an OOM and builds its error, with torch_npu's message.
    pub(super) fn out_of_memory(&mut self, size: usize, seg_size: usize) -> Error {
        let index = self.index;
        self.acct.stats.num_ooms += 1;
        let info = self.dev.mem_info(index).ok();
        Error::OutOfMemory {
            requested: size,
            message: oom::message(
                self.dev.name(),
                index,
                size,
                seg_size,
                info,
                self.shared.allowed_max(),
                &self.acct.stats,
            ),
        }
    }

    /// A new segment for `req`: `seg_size` bytes, or, when the device (or the memory
    /// fraction) cannot give that many, the request's own size rounded to 2 MiB
    /// (adaptive sizing only), then PyTorch's size if that is smaller than `seg_size`:
    /// memory is short, and a segment that fits beats a larger one that does not
    /// (measured: without it the defaults ran out of memory at PyTorch's smallest
    /// device on most derived cases, benches/README.md). Once a growth has failed, and
    /// for every request whose block was kept whole (`keep_whole.rs`), `seg_size` is
    /// already the request's own size (`after_failure_size`).
    fn alloc_segment(&mut self, req: &Request, seg_size: usize) -> Result<Option<BlockId>, Error> {
        let seg_size = self.after_failure_size(req, seg_size);
        if let Some(id) = self.alloc_block(seg_size, req.stream, req.kind)? {
            return Ok(Some(id));
        }
        if self.fits_an_empty_device(seg_size) {
            self.shared.growth_failed.store(true, Ordering::Relaxed);
        }
        // Memory is short: the least first (measured: before PyTorch's 20 MiB for a 1
        // to 10 MiB request, unet_train's smallest device 1,680 → 1,674 MiB, PyTorch's;
        // benches/README.md, issue #16's fourth pass).
        if let Some(exact) = self.exact_segment_size(req).filter(|&e| e < seg_size) {
            if let Some(id) = self.alloc_block(exact, req.stream, req.kind)? {
                return Ok(Some(id));
            }
        }
        let pytorch = match allocation_size(req.rounded) {
            Some(pytorch) if pytorch < seg_size => pytorch,
            _ => seg_size,
        };
        if pytorch < seg_size {
            if let Some(id) = self.alloc_block(pytorch, req.stream, req.kind)? {
                return Ok(Some(id));
            }
        }
        match self.exact_segment_size(req) {
            Some(exact) if exact < pytorch => self.alloc_block(exact, req.stream, req.kind),
            _ => Ok(None),
        }
    }

    /// Whether a segment of `bytes` could be had on this device with nothing reserved
    /// (its total memory, and the memory fraction): only then does its failed malloc
    /// say memory is short (`growth_failed`). A request larger than the whole device
    /// is the caller's error and changes no later sizing.
    fn fits_an_empty_device(&self, bytes: usize) -> bool {
        self.shared.fits_beside(0, bytes)
    }

    /// `seg_size`, or once a device malloc for a segment has failed on this device
    /// (`growth_failed`), or for a request whose best fit was kept whole
    /// (`keep_whole.rs`), the request's own size rounded to 2 MiB if that is smaller
    /// (adaptive sizing only): memory is short, and
    /// an adaptive segment's excess over the request is what a later large request
    /// then misses (measured: OOM on PyTorch's smallest device 23 → 21 cases,
    /// benches/README.md, issue #16's session 9, w2). Before any failure and with no
    /// block kept whole, and so on every uncapped replay, nothing changes.
    fn after_failure_size(&self, req: &Request, seg_size: usize) -> usize {
        if !self.shared.growth_failed.load(Ordering::Relaxed) && !req.kept_whole {
            return seg_size;
        }
        match self.exact_segment_size(req) {
            Some(exact) if exact < seg_size => exact,
            _ => seg_size,
        }
    }

    /// The smallest large-pool segment that serves `req` (its size rounded up to 2 MiB),
    /// with `adaptive_segments` only: PyTorch's 20 MiB for a 1 to 10 MiB request may
    /// not fit where this does.
    fn exact_segment_size(&self, req: &Request) -> Option<usize> {
        if !self.shared.config.adaptive_segments || req.kind != PoolKind::Large {
            return None;
        }
        req.rounded.checked_next_multiple_of(ROUND_LARGE)
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
        if !self.reclaim.recent.is_empty() {
            self.note_segment_malloc(seg_size);
        }
        self.segment_added(kind, seg_size);
        self.acct.stats.num_device_alloc += 1;
        let mut seg = Block::segment(ptr, seg_size, stream, kind);
        seg.pool = self.route();
        seg.shift = self.shared.place_shift(ptr, seg_size);
        self.note_pool_reserved(seg.pool, kind, seg_size, true);
        Ok(Some(self.blocks.insert(seg)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, shard, shard_on};
    use super::super::{NoPeers, ShardState};
    use crate::device::sim::SimDevice;
    use crate::device::MempoolId;
    use crate::error::Error;
    use crate::pool::PoolKind;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_request_is_sized_once_for_its_pool() {
        let (_sim, st) = shard("");
        let r = st.request(1000).unwrap();
        assert_eq!((r.size, r.rounded, r.kind), (1000, 1024, PoolKind::Small));
        assert_eq!(r.stream, st.stream);
        let r = st.request((3 << 20) + 1).unwrap();
        assert_eq!((r.rounded, r.kind), ((3 << 20) + 512, PoolKind::Large));
        assert!(matches!(
            st.request(usize::MAX),
            Err(Error::SizeTooLarge { .. })
        ));
    }

    #[test]
    fn request_padding_moves_a_request_across_a_rounding_step() {
        // torch_npu's preset pads by 32 bytes before rounding: 512 B takes 1 KiB, and
        // 2 MiB takes 2 MiB + 512 B (the device's own padding, 0 here, is not added).
        let (_sim, st) = shard(crate::config::TORCH_NPU_POLICY);
        assert_eq!(st.request(512).unwrap().rounded, 1024);
        assert_eq!(st.request(2 << 20).unwrap().rounded, (2 << 20) + 512);
        let (_sim, st) = shard(crate::config::PYTORCH_POLICY);
        assert_eq!(st.request(512).unwrap().rounded, 512);
    }

    #[test]
    fn the_own_cache_serves_a_repeat_without_a_device_malloc() {
        let (sim, mut st) = shard("");
        let p = st.malloc(1000, false, &NoPeers).unwrap().unwrap();
        free(&mut st, p);
        let q = st.malloc(1000, false, &NoPeers).unwrap().unwrap();
        assert_eq!(p, q);
        assert_eq!(sim.counters(0).mallocs, 1);
        check(&st);
    }

    /// Serves `size` (it must be served), then the device mallocs so far and the bytes
    /// reserved.
    fn grown(sim: &SimDevice, st: &mut ShardState, size: usize) -> (u64, usize) {
        assert!(st.malloc(size, false, &NoPeers).unwrap().is_some());
        (sim.counters(0).mallocs, st.acct.reserved)
    }

    #[test]
    fn a_short_device_takes_pytorchs_segment_size_when_the_adaptive_one_does_not_fit() {
        // 12 MiB asks for a 20 MiB adaptive segment; a 16 MiB device cannot give it,
        // PyTorch's 12 MiB one fits.
        let (sim, mut st) = shard_on(16 << 20, "");
        assert_eq!(st.segment_size(12 << 20), Some(20 << 20));
        assert_eq!(grown(&sim, &mut st, 12 << 20), (1, 12 << 20));
        check(&st);
    }

    #[test]
    fn a_short_device_takes_the_exact_segment_when_pytorchs_20_mib_does_not_fit() {
        // 9 MiB asks for a 20 MiB segment (adaptive and PyTorch's alike); a 16 MiB device
        // cannot give it, a 10 MiB one (the request rounded to 2 MiB) fits. PyTorch's
        // policy keeps PyTorch's sizes: it needs the last rung, and fails there.
        let (sim, mut st) = shard_on(16 << 20, "");
        assert_eq!(grown(&sim, &mut st, 9 << 20), (1, 10 << 20));
        check(&st);
        let (sim, mut st) = shard_on(16 << 20, crate::config::PYTORCH_POLICY);
        assert_eq!(st.malloc(9 << 20, false, &NoPeers).unwrap(), None);
        assert_eq!(sim.counters(0).mallocs, 0);
    }

    #[test]
    fn a_short_device_takes_the_exact_segment_before_pytorchs_20_mib() {
        // A live 170 MiB segment makes 4 MiB ask for a 22 MiB adaptive segment (1/8 of
        // the high-water mark); 20 MiB are left: PyTorch's 20 MiB would fit, but the
        // request's own 4 MiB come first once the adaptive one failed.
        let (sim, mut st) = shard_on(190 << 20, "");
        assert!(st.malloc(170 << 20, false, &NoPeers).unwrap().is_some());
        assert_eq!(st.segment_size(4 << 20), Some(22 << 20));
        assert_eq!(grown(&sim, &mut st, 4 << 20), (2, 174 << 20));
        check(&st);
    }

    #[test]
    fn after_a_failed_growth_a_new_segment_is_the_requests_own_size() {
        // 60 MiB live on a 100 MiB device; 12 MiB asks for a 20 MiB adaptive segment,
        // which fits. Before any growth failed it takes the 20 MiB...
        let (sim, mut st) = shard_on(100 << 20, "");
        assert!(st.malloc(60 << 20, false, &NoPeers).unwrap().is_some());
        assert_eq!(st.segment_size(12 << 20), Some(20 << 20));
        assert_eq!(grown(&sim, &mut st, 12 << 20), (2, 80 << 20));
        check(&st);
        // ...after a growth failed (50 MiB more does not fit), only its own 12 MiB.
        let (sim, mut st) = shard_on(100 << 20, "");
        assert!(st.malloc(60 << 20, false, &NoPeers).unwrap().is_some());
        assert_eq!(st.malloc(50 << 20, false, &NoPeers).unwrap(), None);
        assert_eq!(st.segment_size(12 << 20), Some(20 << 20));
        assert_eq!(grown(&sim, &mut st, 12 << 20), (2, 72 << 20));
        check(&st);
    }

    #[test]
    fn a_request_larger_than_the_device_leaves_segment_sizes_alone() {
        // 1 GiB on a 100 MiB device fails; it says nothing about pressure, so 12 MiB
        // still takes its 20 MiB adaptive segment (the own 12 MiB once pressure is real,
        // the test above).
        let (sim, mut st) = shard_on(100 << 20, "");
        assert_eq!(st.malloc(1 << 30, false, &NoPeers).unwrap(), None);
        assert!(!st.shared.growth_failed.load(Relaxed));
        assert_eq!(grown(&sim, &mut st, 12 << 20), (1, 20 << 20));
        // Past a memory fraction (50 MiB of the 100) it is the same.
        st.shared.set_allowed_max(50 << 20);
        assert_eq!(st.malloc(60 << 20, false, &NoPeers).unwrap(), None);
        assert!(!st.shared.growth_failed.load(Relaxed));
        check(&st);
    }

    #[test]
    fn only_the_last_rung_reports_out_of_memory() {
        let (_sim, mut st) = shard("");
        // 2 GiB on a 1 GiB device: rung 5 fails, so the shard asks for rung 6.
        assert_eq!(st.malloc(2 << 30, false, &NoPeers).unwrap(), None);
        assert_eq!(st.acct.stats.num_ooms, 0);
        let e = st.malloc(2 << 30, true, &NoPeers).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }));
        assert_eq!(
            (st.acct.stats.num_ooms, st.acct.stats.num_alloc_retries),
            (1, 1)
        );
        check(&st);
    }

    #[test]
    fn a_capture_is_out_of_memory_at_once() {
        let (_sim, mut st) = shard("");
        st.begin_allocate_to_pool(MempoolId(1, 1)).unwrap();
        let e = st.malloc(2 << 30, false, &NoPeers).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }));
        assert_eq!(st.acct.stats.num_alloc_retries, 0);
    }
}
