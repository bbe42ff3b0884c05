//! Expandable segments inside one shard: growing by mapping pages, shrinking by
//! unmapping whole free pages (`expandable_segments:True`).
//!
//! Each (stream, pool, size class) gets an address-range reservation ([`VmSegment`]):
//! 9/8 of device memory for the large pool as PyTorch, at most 2 GiB for the small one
//! as torch_npu, and another when one is full. A request that no free block fits maps
//! the fewest pages that make one fit, next to a free block at a run's end when there is
//! one, so the new pages merge with it. Whole free pages go back (unmapped after the
//! host queue is drained and, if it has work queued, the segment's stream synchronised:
//! unmapping does not wait for queued work) before reserved memory grows past its
//! high-water mark, on `empty_cache`, and before an out-of-memory error.
//!
//! With `adaptive_pages:True` the page (mapping granule) of the large pool scales with
//! the workload: 2 MiB while reserved memory is small, doubling as its high-water mark
//! grows, and for a request at least 1/32 of it, up to `large_segment_size_mb`
//! ([`ShardState::vm_page_for`]); growth maps into a reservation of its granule, so
//! pages of one reservation are all of one size. The small pool, and
//! `adaptive_pages:False`, keep the configured page sizes.
//!
//! Blocks of a segment tile its mapped pages; each maximal run of mapped pages is one
//! chain of blocks, counted as one segment in statistics and snapshots.

use super::ShardState;
use crate::allocator::accounting::Kind;
use crate::allocator::history::TraceAction;
use crate::config::HEAD_ALIGN_MIN;
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::free_list::FreeList;
use crate::pool::{Block, BlockId, PoolKind, VmId, VmSegment};

/// Largest reservation (bytes) per segment, whatever the device reports.
const MAX_RESERVATION: usize = 1 << 46;
/// Largest small-pool reservation (torch_npu's `kSmallPoolVirAddrSize`).
const SMALL_RESERVATION: usize = 2 << 30;

/// Idle pages unmapped before growth: what is needed, and at least this fraction of the
/// shard's reserved bytes. Measured with `npualloc replay` on t5_train repeated four
/// times, every batch synchronising (a busy device): unmapping only what is needed took
/// 64 stream synchronisations, all idle pages 24 but 1,295 mapping calls instead of 730;
/// 1/32 took 28 and 730, same peak.
const UNMAP_SLACK_DIVISOR: usize = 32;

/// With `adaptive_pages`, the large pool's page size (the mapping granule) is at
/// most this fraction of the reserved high-water mark ([`vm_page_for`](ShardState::vm_page_for)).
/// Measured on the 20 traces (`--conf expandable_segments:True`, decision 021): 1/64
/// left unet_train at 1.022 (1.016 with fixed 20 MiB pages), 1/128
/// at 1.016 (PyTorch's smallest device 1.013), 1/256 at 1.011, every other trace at or
/// under both; page maps 4,864 / 6,775 / 8,936 in all (1,529 with 20 MiB pages).
const GRANULE_DIVISOR: usize = 256;
/// The smallest granule (bytes): the smallest `large_segment_size_mb`.
const GRANULE_MIN: usize = 2 << 20;
/// With `adaptive_pages`, a growth maps pages of at least this fraction of its request
/// (doubling from [`GRANULE_MIN`], [`vm_page_for`](ShardState::vm_page_for)): a request
/// far above the mark's granule is not mapped in 2 MiB pages whose last one a repeated
/// workload keeps unmapping and mapping again. Measured (decision 021): gpt2_infer
/// `--repeat 4` mapped 99 pages every pass for its 196 MiB logits with
/// 2 MiB pages (176 maps once, 473 over four passes); with 1/32 (4 MiB pages for it)
/// 128 maps once and over four passes; 1/16 also changed bert_train (1.015 → 1.020).
const REQUEST_GRANULE_DIVISOR: usize = 32;

/// A run of mapped pages: its chain's first and last block.
struct Run {
    start: DevicePtr,
    end: DevicePtr,
    head: BlockId,
    tail: BlockId,
}

/// Where to map: `pages` pages at `at`, next to run tail `left` and run head `right`
/// when they touch the new pages.
#[derive(Clone, Copy)]
struct Fit {
    pages: usize,
    at: DevicePtr,
    left: Option<BlockId>,
    right: Option<BlockId>,
}

impl ShardState {
    /// Reserves a new expandable segment for (`stream`, current pool, `kind`): 9/8 of
    /// device memory for the large pool (PyTorch's size), at most 2 GiB for the small
    /// one (torch_npu's cap); another is reserved when one fills up.
    fn vm_reserve_segment(
        &mut self,
        stream: StreamHandle,
        kind: PoolKind,
        page: usize,
    ) -> Result<usize, Error> {
        let index = self.index;
        let total = self.dev.mem_info(index)?.total;
        let cap = match kind {
            PoolKind::Small => SMALL_RESERVATION,
            PoolKind::Large => MAX_RESERVATION,
        };
        let pages = (total / 8 * 9).min(cap).div_ceil(page).max(1);
        let base = self.dev.vm_reserve(index, pages * page)?;
        let pool = self.route();
        let mut seg = VmSegment::new(base, page, pages, stream, pool, kind);
        seg.shift = self.shared.place_shift(base, pages * page);
        Ok(self.vm.insert(seg))
    }

    /// The page size a growth of `kind` for a request of `rounded` bytes maps. The
    /// small pool, and the large pool without `adaptive_pages`: the configured size
    /// (checked against the device's granularity at creation). The large pool with
    /// `adaptive_pages`: a granule scaled to the workload, as adaptive segments scale
    /// ordinary ones: the largest of 2 MiB (or the device's granularity) doubled that
    /// is at most 1/256 of the reserved high-water mark (this stream's, but at least
    /// half the device's) or at most 1/32 of the request ([`REQUEST_GRANULE_DIVISOR`]),
    /// capped at `large_segment_size_mb` (20 MiB by default: 2 MiB pages below a 1 GiB
    /// mark, 4 below 2 GiB, 8 below 4 GiB, 16 below 8 GiB, then 20). Each granule maps
    /// into reservations of its own (`vm_grow`), so a small workload maps 2 MiB pages
    /// and a large one keeps the configured page.
    pub(super) fn vm_page_for(&self, kind: PoolKind, rounded: usize) -> usize {
        let top = self.shared.config.page_size(kind);
        if kind == PoolKind::Small || !self.shared.policy.adaptive_pages {
            return top;
        }
        let grain = self.dev.vm_granularity(self.index).unwrap_or(top);
        let mut page = GRANULE_MIN.next_multiple_of(grain.max(1));
        let target = (self.size_mark() / GRANULE_DIVISOR).max(rounded / REQUEST_GRANULE_DIVISOR);
        while page < top && page * 2 <= target {
            page *= 2;
        }
        page.min(top)
    }

    /// The bytes torch_npu's head split (`base_addr_aligned_kb`) takes off the front of
    /// free block `b` before it serves `rounded` bytes: with expandable segments, a
    /// request of [`HEAD_ALIGN_MIN`] or more starts at the next multiple of the
    /// alignment when the block does not start at one and still holds the request from
    /// there; else 0. A dirty block (lending) is served as it is.
    pub(super) fn aligned_head(&self, b: &Block, rounded: usize) -> usize {
        let policy = &self.shared.policy;
        let align = policy.base_addr_align;
        if align == 0 || !policy.expandable_segments || rounded < HEAD_ALIGN_MIN || b.dirty {
            return 0;
        }
        match b.ptr % align {
            0 => 0,
            off if align - off + rounded <= b.size => align - off,
            _ => 0,
        }
    }

    /// torch_npu's head split: block `id` (free, out of its free list) about to serve
    /// `rounded` bytes gives its first [`aligned_head`](Self::aligned_head) bytes to a
    /// new free block (into the free lists) and keeps the aligned rest, which it returns
    /// to be handed out. Statistics: the head is one more inactive split block; if `id`
    /// was not split before, both it and the head now are. Out of line: the default
    /// settings never call it. `logged`: whether the operation's changes are logged;
    /// returns whether they are from now on (`Accounting::increase_all_as`).
    #[inline(never)]
    pub(super) fn split_aligned_head(
        &mut self,
        id: BlockId,
        rounded: usize,
        logged: bool,
    ) -> (BlockId, bool) {
        let head = self.aligned_head(&self.blocks[id], rounded);
        if head == 0 {
            return (id, logged);
        }
        let b = &self.blocks[id];
        let (st, already_split, size) = (b.kind.stat_type(), b.is_split(), b.size);
        let front_id = self.carve_front(id, head);
        self.pool_insert(front_id);
        let logged = if already_split {
            self.acct
                .increase_all_as(logged, st, &[(Kind::InactiveSplit, 1)])
        } else {
            self.acct.increase_all_as(
                logged,
                st,
                &[(Kind::InactiveSplit, 2), (Kind::InactiveSplitBytes, size)],
            )
        };
        (id, logged)
    }

    /// PyTorch's best fit with expandable segments (`expandable_best_fit`): from the
    /// best fit `best`, while it is a block of an expandable segment, step to the next
    /// larger entry of `list` (size, then place) if that one can grow to less than
    /// this one: a block at the end of a run of mapped pages counts as the bytes it
    /// can grow to ([`growable_size`](Self::growable_size)), so a request takes a
    /// larger block elsewhere before the growable end (CUDACachingAllocator's and
    /// torch_npu's `get_free_block`). Returns (size, block). Out of line: the
    /// default settings never call it, and best fit stays as short as it was.
    #[cold]
    #[inline(never)]
    pub(super) fn growable_fit(
        &self,
        list: &FreeList,
        best: (usize, usize, BlockId),
    ) -> (usize, BlockId) {
        let mut it = best;
        while self.blocks[it.2].vm.is_some() {
            let key = (it.0, it.1);
            let Some(next) = list.iter().filter(|e| (e.0, e.1) > key).min() else {
                break;
            };
            if self.growable_size(next.2) >= self.growable_size(it.2) {
                break;
            }
            it = next;
        }
        (it.0, it.2)
    }

    /// The bytes free block `id` can grow to: its own, plus, at the end of a run of
    /// mapped pages of an expandable segment, the unmapped pages after it up to the
    /// next mapped page or the end of the reservation (PyTorch's `expandable_size`:
    /// the block plus its unmapped next block).
    fn growable_size(&self, id: BlockId) -> usize {
        let b = &self.blocks[id];
        let Some(vm) = b.vm.filter(|_| b.next.is_none()) else {
            return b.size;
        };
        let seg = &self.vm[vm.index()];
        let first = (b.ptr + b.size - seg.base) / seg.page;
        let unmapped = seg.pages[first..]
            .iter()
            .position(Option::is_some)
            .unwrap_or(seg.pages.len() - first);
        b.size + unmapped * seg.page
    }

    /// The runs of mapped pages of segment `seg`, in address order.
    fn vm_runs(&self, seg: usize) -> Vec<Run> {
        let tag = Some(VmId::new(seg));
        let (mut heads, mut tails) = (Vec::new(), Vec::new());
        for (id, b) in self.blocks.iter().filter(|(_, b)| b.vm == tag) {
            if b.prev.is_none() {
                heads.push((b.ptr, id));
            }
            if b.next.is_none() {
                tails.push((b.ptr + b.size, id));
            }
        }
        heads.sort_unstable();
        tails.sort_unstable();
        heads
            .into_iter()
            .zip(tails)
            .map(|((start, head), (end, tail))| Run {
                start,
                end,
                head,
                tail,
            })
            .collect()
    }

    /// Maps the fewest pages that give a free block of at least `rounded` bytes on
    /// `stream`; returns that block (out of its free list). `Ok(None)`: the device (or
    /// the memory fraction, or the reservation) is full.
    pub(super) fn vm_grow(
        &mut self,
        stream: StreamHandle,
        kind: PoolKind,
        rounded: usize,
    ) -> Result<Option<BlockId>, Error> {
        let pool = self.route();
        let page = self.vm_page_for(kind, rounded);
        // Only segments of today's granule grow: pages mapped with a smaller one stay
        // in use until they are free and unmapped.
        let mine: Vec<usize> = self
            .vm
            .iter()
            .filter(|(_, s)| {
                s.stream == stream && s.pool == pool && s.kind == kind && s.page == page
            })
            .map(|(i, _)| i)
            .collect();
        // Best: fewest pages, then the oldest segment, then the lowest address.
        let mut best: Option<(usize, Fit)> = None;
        for seg in mine {
            if let Some(fit) = self.vm_fit(seg, rounded) {
                if best.is_none_or(|b| fit.pages < b.1.pages) {
                    best = Some((seg, fit));
                }
            }
        }
        let (seg, fit) = match best {
            Some(b) => b,
            None => {
                // None yet, or every reservation is full.
                let seg = self.vm_reserve_segment(stream, kind, page)?;
                match self.vm_fit(seg, rounded) {
                    Some(fit) => (seg, fit),
                    None => return Ok(None), // larger than a whole reservation
                }
            }
        };
        self.vm_map_range(seg, fit)
    }

    /// Where segment `seg` could map the fewest pages to hold a free block of `rounded`
    /// bytes; next to a free run end when that saves pages.
    fn vm_fit(&self, seg: usize, rounded: usize) -> Option<Fit> {
        let (base, end, page) = {
            let s = &self.vm[seg];
            (s.base, s.end(), s.page)
        };
        let runs = self.vm_runs(seg);
        // Gaps between runs: (start, end, run tail before, run head after).
        let mut gaps = Vec::with_capacity(runs.len() + 1);
        let mut at = base;
        let mut left = None;
        for r in &runs {
            if r.start > at {
                gaps.push((at, r.start, left, Some(r.head)));
            }
            at = r.end;
            left = Some(r.tail);
        }
        if end > at {
            gaps.push((at, end, left, None));
        }
        let free = |b: Option<BlockId>| b.map_or(0, |id| self.mergeable(id));
        let pages_for = |have: usize| rounded.saturating_sub(have).div_ceil(page).max(1);
        // Fewest pages, then lowest address.
        let mut best: Option<Fit> = None;
        for (g0, g1, l, r) in gaps {
            let (lf, rf, n) = (free(l), free(r), (g1 - g0) / page);
            let options = [
                (pages_for(lf), g0),
                (pages_for(rf), g1.saturating_sub(pages_for(rf) * page)),
                (n, g0),
            ];
            for (k, at) in options {
                let fit = Fit {
                    pages: k,
                    at,
                    left: l.filter(|_| at == g0),
                    right: r.filter(|_| at + k * page == g1),
                };
                let joined = free(fit.left) + free(fit.right);
                if k <= n
                    && joined + k * page >= rounded
                    && best.is_none_or(|b| (k, at) < (b.pages, b.at))
                {
                    best = Some(fit);
                }
            }
        }
        best
    }

    /// Maps the pages of `fit` in segment `seg`, one mapping each, and hands back the
    /// free block they make with their free neighbours.
    fn vm_map_range(&mut self, seg: usize, fit: Fit) -> Result<Option<BlockId>, Error> {
        let index = self.index;
        let (page, first, stream, kind, pool, shift) = {
            let s = &self.vm[seg];
            (
                s.page,
                (fit.at - s.base) / s.page,
                s.stream,
                s.kind,
                s.pool,
                s.shift,
            )
        };
        let (va, k) = (fit.at, fit.pages);
        let bytes = k * page;
        if !self.shared.try_reserve(bytes) {
            return Ok(None);
        }
        let markers = self.shared.markers.clone();
        let range = markers.range(|| format!("npualloc.map {bytes}B dev{index}"));
        // One mapping per page, as PyTorch and torch_npu: a free page can always go back
        // (mapping a whole grow at once was measured worse; decision 020).
        for i in 0..k {
            match self.dev.vm_map(index, va + i * page, page) {
                Ok(h) => self.vm[seg].pages[first + i] = Some(h),
                Err(e) => {
                    // Roll back what this call mapped.
                    for j in 0..i {
                        if let Some(h) = self.vm[seg].pages[first + j].take() {
                            let _ = self.dev.vm_unmap(index, va + j * page, page, h);
                        }
                    }
                    self.shared.unreserve(bytes);
                    return if e.is_out_of_memory() {
                        Ok(None)
                    } else {
                        Err(e.into())
                    };
                }
            }
        }
        drop(range);
        self.shared.note_reserved();
        self.acct.count_device_mallocs(k as i64);

        // Link the new pages to the runs they touch.
        let mut block = Block::segment(va, bytes, stream, kind);
        block.pool = pool;
        block.vm = Some(VmId::new(seg));
        block.shift = shift;
        let touched: Vec<BlockId> = [fit.left, fit.right].into_iter().flatten().collect();
        self.count_split(&touched, false);
        let id = self.blocks.insert(block);
        if let Some(l) = fit.left {
            self.blocks[l].next = Some(id);
            self.blocks[id].prev = Some(l);
        }
        if let Some(r) = fit.right {
            self.blocks[r].prev = Some(id);
            self.blocks[id].next = Some(r);
        }
        self.count_split(&touched, true);
        self.bytes_reserved(kind, bytes);
        let st = kind.stat_type();
        self.note_device_memory(pool, kind, va, bytes, TraceAction::SegmentMap);
        let runs_delta = 1 - fit.left.is_some() as i64 - fit.right.is_some() as i64;
        self.acct.apply_net(Kind::Segment, st, runs_delta);
        self.coalesce(id, false);
        self.pool_remove(id);
        Ok(Some(id))
    }

    /// Counts (`add`) or uncounts the free split blocks among `ids` in the inactive-split
    /// statistics: uncounted before their links change, counted again after.
    fn count_split(&mut self, ids: &[BlockId], add: bool) {
        for &id in ids {
            let b = &self.blocks[id];
            if b.is_free() && b.is_split() {
                let (st, size) = (b.kind.stat_type(), b.size as i64);
                let sign = if add { 1 } else { -1 };
                self.acct.apply_net(Kind::InactiveSplit, st, sign);
                self.acct
                    .apply_net(Kind::InactiveSplitBytes, st, sign * size);
            }
        }
    }

    /// Unmaps whole pages of free block `id` (in its free list), from its end, until at
    /// least `want` bytes; returns the bytes. The caller has synchronised the stream.
    fn vm_unmap_block(&mut self, id: BlockId, want: usize) -> Result<usize, Error> {
        let index = self.index;
        let b = &self.blocks[id];
        let seg = b.vm.expect("a block of an expandable segment").index();
        let (ptr, size, prev, next, kind) = (b.ptr, b.size, b.prev, b.next, b.kind);
        let template = b.sibling(ptr, size);
        let page = self.vm[seg].page;
        let (first, count) = self.vm[seg].whole_pages(ptr, size);
        // The last pages of the block, as many as `want` needs.
        let n = count.min(want.div_ceil(page));
        let from = first + count - n;
        let mut done = 0;
        let mut failure = None;
        for i in from..from + n {
            let va = self.vm[seg].addr(i);
            let h = self.vm[seg].pages[i].expect("a block covers mapped pages only");
            match self.dev.vm_unmap(index, va, page, h) {
                Ok(()) => {
                    self.vm[seg].pages[i] = None;
                    done += 1;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if done == 0 {
            return failure.map_or(Ok(0), |e| Err(e.into()));
        }
        let (lo, hi) = (self.vm[seg].addr(from), self.vm[seg].addr(from + done));
        let touched: Vec<BlockId> = [prev, Some(id), next].into_iter().flatten().collect();
        self.count_split(&touched, false);
        self.pool_remove(id);
        // The front part (before the hole) stays block `id`; the back part is new.
        let front = if lo > ptr {
            let b = &mut self.blocks[id];
            b.size = lo - ptr;
            b.next = None;
            Some(id)
        } else {
            let b = self.blocks.remove(id);
            self.lending.forget(id); // clear marks only (dirty blocks are not unmapped)
            if let Some(p) = b.prev {
                self.blocks[p].next = None;
            }
            None
        };
        let back = (ptr + size > hi).then(|| {
            let mut blk = template.sibling(hi, ptr + size - hi);
            blk.next = next;
            let back = self.blocks.insert(blk);
            if let Some(n) = next {
                self.blocks[n].prev = Some(back);
            }
            back
        });
        if back.is_none() {
            if let Some(n) = next {
                self.blocks[n].prev = None;
            }
        }
        for piece in [front, back].into_iter().flatten() {
            self.pool_insert(piece);
        }
        let mut after: Vec<BlockId> = [prev, front, back, next].into_iter().flatten().collect();
        after.dedup();
        self.count_split(&after, true);

        let bytes = done * page;
        let s = &self.vm[seg];
        let runs_delta =
            s.is_mapped_at(lo.wrapping_sub(page)) as i64 + s.is_mapped_at(hi) as i64 - 1;
        self.acct.sub_reserved(bytes);
        self.shared.unreserve(bytes);
        let st = kind.stat_type();
        self.acct.decrease(Kind::ReservedBytes, st, bytes);
        self.note_device_memory(
            self.vm[seg].pool,
            kind,
            lo,
            bytes,
            TraceAction::SegmentUnmap,
        );
        self.acct.apply_net(Kind::Segment, st, runs_delta);
        self.acct.count_device_frees(done as i64);
        failure.map_or(Ok(bytes), |e| Err(e.into()))
    }

    /// Unmaps whole free pages of blocks freed at least `min_idle` malloc calls ago, in
    /// releasable pools, largest first, until `want` bytes are unmapped; returns the bytes.
    pub(super) fn vm_release_free(&mut self, want: usize, min_idle: u64) -> usize {
        let index = self.index;
        if self.vm.is_empty() || self.capture_underway() {
            return 0;
        }
        let mut candidates: Vec<(usize, BlockId)> = self
            .pools
            .iter()
            .filter(|(tag, _)| self.pool_releasable(**tag))
            .flat_map(|(_, p)| p.small.iter().chain(p.large.iter()))
            .filter(|&(_, _, id)| {
                let b = &self.blocks[id];
                // A dirty block's pages may still be used by its borrower: kept mapped.
                b.vm.is_some() && self.reclaim.idle_for(b.freed_at, min_idle) && !self.is_dirty(id)
            })
            .map(|(_, _, id)| {
                let b = &self.blocks[id];
                let s = &self.vm[b.vm.expect("filtered on vm").index()];
                (s.whole_pages(b.ptr, b.size).1 * s.page, id)
            })
            .filter(|&(bytes, _)| bytes > 0)
            .collect();
        if candidates.is_empty() {
            return 0;
        }
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        // Unmapping does not wait for queued work: drain, and synchronise streams that
        // still have work queued.
        let mut streams: Vec<StreamHandle> = candidates
            .iter()
            .map(|&(_, id)| self.blocks[id].stream)
            .collect();
        streams.sort_unstable();
        streams.dedup();
        if self.dev.drain_before_free(index).is_err()
            || streams.iter().any(|&s| {
                // An idle stream needs no wait (the host queue was drained above).
                !self.dev.stream_query(index, s).unwrap_or(false)
                    && self.dev.synchronize_stream(index, s).is_err()
            })
        {
            return 0;
        }
        let markers = self.shared.markers.clone();
        let _range = markers.range(|| format!("npualloc.unmap dev{index}"));
        // A synchronisation is paid anyway: take a little more than asked, so the next
        // growth does not need another one at once.
        let want = if want == usize::MAX {
            want
        } else {
            want.max(self.acct.reserved() / UNMAP_SLACK_DIVISOR)
        };
        let mut released = 0;
        for (_, id) in candidates {
            if released >= want {
                break;
            }
            if let Ok(n) = self.vm_unmap_block(id, want - released) {
                released += n;
            }
        }
        released
    }

    /// Returns the reservations of segments with nothing mapped (on cache release).
    pub(super) fn vm_release_reservations(&mut self) -> Result<(), Error> {
        let index = self.index;
        let empty: Vec<usize> = self
            .vm
            .iter()
            .filter(|(_, s)| s.mapped() == 0 && self.pool_releasable(s.pool))
            .map(|(i, _)| i)
            .collect();
        let mut result = Ok(());
        for i in empty {
            let s = &self.vm[i];
            match self.dev.vm_release(index, s.base, s.end() - s.base) {
                Ok(()) => {
                    self.vm.remove(i);
                }
                Err(e) => result = result.and(Err(e.into())),
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard};

    const MIB: usize = 1 << 20;
    const KIB16: usize = 16 << 10;
    const ALIGNED: &str = "expandable_segments:True,base_addr_aligned_kb:16";

    /// torch_npu's head split: a 2 MiB request after a 3 MiB + 512 B one starts at the
    /// next 16 KiB boundary, the 15.5 KiB before it a free block of its own (counted
    /// as an inactive split); without the setting it starts where the free block does.
    /// Everything merges back when freed.
    #[test]
    fn a_large_request_starts_at_the_alignment_past_a_free_head() {
        for conf in [ALIGNED, "expandable_segments:True"] {
            let (_sim, mut st) = shard(conf);
            let a = malloc_ok(&mut st, 3 * MIB + 1);
            let b = malloc_ok(&mut st, 2 * MIB);
            let end_a = a + 3 * MIB + 512;
            if conf == ALIGNED {
                assert_eq!(b, end_a + KIB16 - 512);
                let head = st.blocks[id_of(&st, b)].prev.unwrap();
                assert_eq!(st.blocks[head].size, KIB16 - 512);
                assert!(st.blocks[head].is_free());
                // The head and the aligned block's free tail.
                assert_eq!(st.acct.stats().inactive_split[0].current, 2);
            } else {
                assert_eq!(b, end_a);
            }
            check(&st);
            for p in [a, b] {
                free(&mut st, p);
            }
            st.finish_merge();
            check(&st);
            assert_eq!(st.acct.stats().inactive_split[0].current, 0, "{conf}");
        }
    }

    /// Under 2 MiB nothing is aligned; a block whose merge its free deferred (the lazy
    /// merge) is merged first and then aligned like any other.
    #[test]
    fn small_requests_stay_put_and_a_deferred_merge_is_aligned_too() {
        let (_sim, mut st) = shard(ALIGNED);
        let a = malloc_ok(&mut st, 3 * MIB + 1);
        let end_a = a + 3 * MIB + 512;
        let c = malloc_ok(&mut st, MIB + 1);
        assert_eq!(c, end_a);
        free(&mut st, c);
        assert!(
            st.lazy.is_some(),
            "the free deferred its merge with the tail"
        );
        let d = malloc_ok(&mut st, 2 * MIB);
        assert_eq!(d, end_a + KIB16 - 512);
        st.finish_merge();
        check(&st);
        for p in [a, d] {
            free(&mut st, p);
        }
        st.finish_merge();
        check(&st);
    }

    /// The large pool's granule grows with the reserved mark: a first 3 MiB request
    /// maps two 2 MiB pages (4 MiB, not one 20 MiB page); past a 1 GiB mark the next
    /// growth maps 4 MiB pages, in a reservation of its own; the small pool keeps 2 MiB
    /// pages. Without `adaptive_pages`, the fixed 20 MiB page.
    #[test]
    fn the_large_granule_grows_with_the_reserved_mark() {
        use super::super::testing::shard_on;
        use crate::pool::PoolKind::{Large, Small};
        let (_sim, mut st) = shard_on(2 << 30, "expandable_segments:True,adaptive_pages:True");
        assert_eq!(
            (st.vm_page_for(Large, 0), st.vm_page_for(Small, 0)),
            (2 * MIB, 2 * MIB)
        );
        malloc_ok(&mut st, 3 * MIB);
        assert_eq!(st.acct.reserved(), 4 * MIB);
        // 17 requests of 60 MiB (each under 32 × 2 MiB: the request keeps 2 MiB pages).
        for _ in 0..17 {
            malloc_ok(&mut st, 60 * MIB);
        }
        assert_eq!(st.acct.reserved(), 1024 * MIB, "still 2 MiB pages");
        assert_eq!(
            (st.vm_page_for(Large, 0), st.vm_page_for(Small, 0)),
            (4 * MIB, 2 * MIB)
        );
        let c = malloc_ok(&mut st, 3 * MIB);
        assert_eq!(st.acct.reserved(), 1028 * MIB);
        let seg = st.blocks[id_of(&st, c)].vm.unwrap().index();
        assert_eq!(st.vm[seg].page, 4 * MIB);
        let mut pages: Vec<usize> = st.vm.iter().map(|(_, s)| s.page).collect();
        pages.sort_unstable();
        assert_eq!(pages, [2 * MIB, 4 * MIB]);
        check(&st);

        let (_sim, mut st) = shard("expandable_segments:True,adaptive_pages:False");
        malloc_ok(&mut st, 3 * MIB);
        assert_eq!(st.acct.reserved(), 20 * MIB);
        assert_eq!(st.vm_page_for(crate::pool::PoolKind::Large, 0), 20 * MIB);
    }

    /// With adaptive pages a request far above the mark's granule maps pages of at
    /// least 1/32 of it: on a fresh shard (2 MiB granule) a 196 MiB request maps 4 MiB
    /// pages in a reservation of their own, a 3 MiB one two 2 MiB pages; 20 MiB pages
    /// at most.
    #[test]
    fn a_large_request_maps_pages_of_at_least_a_32nd_of_it() {
        use crate::pool::PoolKind::Large;
        let (_sim, mut st) = shard("expandable_segments:True,adaptive_pages:True");
        assert_eq!(st.vm_page_for(Large, 0), 2 * MIB);
        assert_eq!(st.vm_page_for(Large, 196 * MIB), 4 * MIB);
        assert_eq!(st.vm_page_for(Large, 127 * MIB), 2 * MIB);
        assert_eq!(st.vm_page_for(Large, 1 << 30), 20 * MIB);
        let big = malloc_ok(&mut st, 196 * MIB);
        assert_eq!(st.acct.reserved(), 196 * MIB, "49 pages of 4 MiB");
        let seg = st.blocks[id_of(&st, big)].vm.unwrap().index();
        assert_eq!(st.vm[seg].page, 4 * MIB);
        let small = malloc_ok(&mut st, 3 * MIB);
        let seg = st.blocks[id_of(&st, small)].vm.unwrap().index();
        assert_eq!(st.vm[seg].page, 2 * MIB);
        assert_eq!(st.acct.reserved(), 200 * MIB);
        check(&st);
        for p in [big, small] {
            free(&mut st, p);
        }
        st.finish_merge();
        check(&st);
    }

    /// PyTorch's best fit with expandable segments: a free 4 MiB end of the mapped
    /// pages can grow, so a 3 MiB request takes the free 8 MiB block in the middle
    /// instead (`expandable_best_fit`); without the setting, the smallest fit (the end).
    #[test]
    fn best_fit_counts_a_growable_end_as_what_it_can_grow_to() {
        for (conf, middle) in [
            // Fixed 20 MiB pages, as PyTorch's.
            (
                "expandable_segments:True,adaptive_pages:False,expandable_best_fit:True",
                true,
            ),
            ("expandable_segments:True,adaptive_pages:False", false),
        ] {
            let (_sim, mut st) = shard(conf);
            let a = malloc_ok(&mut st, 4 * MIB);
            let b = malloc_ok(&mut st, 8 * MIB);
            let c = malloc_ok(&mut st, 4 * MIB);
            assert_eq!((b, c), (a + 4 * MIB, a + 12 * MIB)); // one 20 MiB page: 4 MiB left
            free(&mut st, b);
            let d = malloc_ok(&mut st, 3 * MIB);
            assert_eq!(d, if middle { b } else { c + 4 * MIB }, "{conf}");
            st.finish_merge();
            check(&st);
        }
    }
}
