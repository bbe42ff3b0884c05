//! Growth: a new segment (or pages mapped) for a request the caches could not serve,
//! and the size of that segment.
//!
//! Sizes: PyTorch's (`allocation_size`), or with `adaptive_segments` large-pool
//! segments of at least 1/8 of the reserve mark, 20 to 64 MiB (`segment_size`); when
//! the device (or the memory fraction) cannot give that, the request's own size
//! rounded to 2 MiB, then PyTorch's (`alloc_segment`); in the memory-short regime
//! (`Regime::MemoryShort`) and for a request whose best fit was kept whole, the
//! request's own size from the start (`after_failure_size`).
//!
//! Contract: a device malloc that fails with out of memory is `Ok(None)` (the ladder
//! goes on to its next rung), any other device error is an error; reserved bytes are
//! counted under the memory fraction before the device call and given back if it
//! fails.

use super::request::Request;
use super::{Peers, ShardState};
use crate::allocator::history::TraceAction;
use crate::error::Error;
use crate::handle::StreamHandle;
use crate::pool::rounding::{allocation_size, LARGE_BUFFER, ROUND_LARGE, SMALL_SIZE};
use crate::pool::{Block, BlockId, PoolKind};

/// Adaptive large segments are at least this fraction of the reserved high-water mark...
const ADAPTIVE_DIVISOR: usize = 8;
/// ...but no larger than this.
const ADAPTIVE_MAX: usize = 64 << 20;

impl ShardState {
    /// The rung `Grow`: idle empty segments (or free pages) back first if reserved
    /// memory would pass its high-water mark (`release.rs`), then a new segment of
    /// `seg_size` bytes, or with expandable segments the pages that serve `req`.
    pub(super) fn grow(
        &mut self,
        req: &Request,
        seg_size: usize,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        let bytes = if self.shared.policy.expandable_segments {
            self.pages_for(req)
        } else {
            seg_size
        };
        self.release_empty_before_growth(bytes, peers);
        self.regrow(req, seg_size)
    }

    /// Growth with nothing given back first (the rungs after a release): a new segment
    /// of `seg_size` bytes, or the pages that serve `req`.
    pub(super) fn regrow(
        &mut self,
        req: &Request,
        seg_size: usize,
    ) -> Result<Option<BlockId>, Error> {
        if self.shared.policy.expandable_segments {
            return self.vm_grow(req.stream, req.kind, req.rounded);
        }
        self.alloc_segment(req, seg_size)
    }

    /// The bytes of pages that serve `req` with expandable segments.
    pub(super) fn pages_for(&self, req: &Request) -> usize {
        req.rounded
            .next_multiple_of(self.vm_page_for(req.kind, req.rounded))
    }

    /// The size an out-of-memory message names for `req`: the growth that failed.
    pub(super) fn failed_growth(&self, req: &Request, seg_size: usize) -> usize {
        if self.shared.policy.expandable_segments {
            self.pages_for(req)
        } else {
            self.after_failure_size(req, seg_size)
        }
    }

    /// The device allocation for a block of `rounded` bytes: PyTorch's sizes, or with
    /// `adaptive_segments` large-pool segments of at least 1/8 of the reserved
    /// high-water mark (20 to 64 MiB), so that tensors of different sizes share segments
    /// whose freed space coalesces, instead of each size stranding a segment of its own.
    /// A graph-private pool's segments take PyTorch's sizes: a captured graph replays
    /// one fixed layout for its life, so a larger segment shared across sizes only adds
    /// to what the pool holds (decision 046).
    pub(super) fn segment_size(&self, rounded: usize) -> Option<usize> {
        let pytorch = allocation_size(rounded)?;
        if !self.shared.policy.adaptive_segments || rounded <= SMALL_SIZE || self.route().is_some()
        {
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
    /// alone under-sizes those of streams in rotation; decision 001).
    pub(super) fn size_mark(&self) -> usize {
        self.acct.reserved_hwm().max(self.shared.hwm() / 2)
    }

    /// A new segment for `req`: `seg_size` bytes, or, when the device (or the memory
    /// fraction) cannot give that many, the request's own size rounded to 2 MiB
    /// (adaptive sizing only), then PyTorch's size if that is smaller than `seg_size`:
    /// memory is short, and a segment that fits beats a larger one that does not
    /// (measured: without it the defaults ran out of memory at PyTorch's smallest
    /// device on most derived cases; decision 002). Once a growth has failed, and
    /// for every request whose block was kept whole (`keep_whole.rs`), `seg_size` is
    /// already the request's own size (`after_failure_size`).
    pub(super) fn alloc_segment(
        &mut self,
        req: &Request,
        seg_size: usize,
    ) -> Result<Option<BlockId>, Error> {
        let seg_size = self.after_failure_size(req, seg_size);
        if let Some(id) = self.alloc_block(seg_size, req.stream, req.kind)? {
            return Ok(Some(id));
        }
        if self.fits_an_empty_device(seg_size) {
            self.shared.set_memory_short(true);
        }
        // Memory is short: the least first (measured: before PyTorch's 20 MiB for a 1
        // to 10 MiB request, unet_train's smallest device 1,680 → 1,674 MiB, PyTorch's;
        // decision 002).
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
    /// say memory is short (the memory-short regime). A request larger than the whole device
    /// is the caller's error and changes no later sizing.
    fn fits_an_empty_device(&self, bytes: usize) -> bool {
        self.shared.fits_beside(0, bytes)
    }

    /// `seg_size`, or once a device malloc for a segment has failed on this device
    /// (the memory-short regime), or for a request whose best fit was kept whole
    /// (`keep_whole.rs`), the request's own size rounded to 2 MiB if that is smaller
    /// (adaptive sizing only): memory is short, and an adaptive segment's excess over
    /// the request is what a later large request then misses (measured: OOM on
    /// PyTorch's smallest device 23 → 21 cases; decision 003). Before any failure and
    /// with no block kept whole, and so on every uncapped replay, nothing changes.
    fn after_failure_size(&self, req: &Request, seg_size: usize) -> usize {
        if !self.shared.memory_short() && !req.kept_whole {
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
        if !self.shared.policy.adaptive_segments || req.kind != PoolKind::Large {
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
        self.reclaim.note_segment_malloc(seg_size);
        self.segment_added(kind, seg_size);
        self.acct.count_device_mallocs(1);
        let mut seg = Block::segment(ptr, seg_size, stream, kind);
        seg.pool = self.route();
        seg.shift = self.shared.place_shift(ptr, seg_size);
        self.note_device_memory(seg.pool, kind, ptr, seg_size, TraceAction::SegmentAlloc);
        Ok(Some(self.blocks.insert(seg)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, shard, shard_on};
    use super::super::{NoPeers, Released, ShardState};
    use crate::device::sim::SimDevice;

    /// Serves `size` (it must be served), then the device mallocs so far and the bytes
    /// reserved.
    fn grown(sim: &SimDevice, st: &mut ShardState, size: usize) -> (u64, usize) {
        assert!(st
            .malloc(size, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        (sim.counters(0).mallocs, st.acct.reserved())
    }

    #[test]
    fn a_graph_pool_s_segments_take_pytorchs_sizes() {
        // 16 MiB asks for a 20 MiB adaptive segment on the stream's own pool; routed to a
        // graph pool it takes PyTorch's 16 MiB, and back on the own pool 20 MiB again.
        let (sim, mut st) = shard("");
        assert_eq!(st.segment_size(16 << 20), Some(20 << 20));
        let pool = crate::device::MempoolId(7, 0);
        st.begin_allocate_to_pool(pool).unwrap();
        assert_eq!(st.segment_size(16 << 20), Some(16 << 20));
        assert_eq!(grown(&sim, &mut st, 16 << 20), (1, 16 << 20));
        st.end_allocate_to_pool();
        assert_eq!(st.segment_size(16 << 20), Some(20 << 20));
        check(&st);
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
        assert_eq!(
            st.malloc(9 << 20, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        assert_eq!(sim.counters(0).mallocs, 0);
    }

    #[test]
    fn a_short_device_takes_the_exact_segment_before_pytorchs_20_mib() {
        // A live 170 MiB segment makes 4 MiB ask for a 22 MiB adaptive segment (1/8 of
        // the high-water mark); 20 MiB are left: PyTorch's 20 MiB would fit, but the
        // request's own 4 MiB come first once the adaptive one failed.
        let (sim, mut st) = shard_on(190 << 20, "");
        assert!(st
            .malloc(170 << 20, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        assert_eq!(st.segment_size(4 << 20), Some(22 << 20));
        assert_eq!(grown(&sim, &mut st, 4 << 20), (2, 174 << 20));
        check(&st);
    }

    #[test]
    fn after_a_failed_growth_a_new_segment_is_the_requests_own_size() {
        // 60 MiB live on a 100 MiB device; 12 MiB asks for a 20 MiB adaptive segment,
        // which fits. Before any growth failed it takes the 20 MiB...
        let (sim, mut st) = shard_on(100 << 20, "");
        assert!(st
            .malloc(60 << 20, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        assert_eq!(st.segment_size(12 << 20), Some(20 << 20));
        assert_eq!(grown(&sim, &mut st, 12 << 20), (2, 80 << 20));
        check(&st);
        // ...after a growth failed (50 MiB more does not fit), only its own 12 MiB.
        let (sim, mut st) = shard_on(100 << 20, "");
        assert!(st
            .malloc(60 << 20, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        assert_eq!(
            st.malloc(50 << 20, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
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
        assert_eq!(
            st.malloc(1 << 30, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        assert!(!st.shared.memory_short());
        assert_eq!(grown(&sim, &mut st, 12 << 20), (1, 20 << 20));
        // Past a memory fraction (50 MiB of the 100) it is the same.
        st.shared.set_allowed_max(50 << 20);
        assert_eq!(
            st.malloc(60 << 20, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        assert!(!st.shared.memory_short());
        check(&st);
    }
}
