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
//! Blocks of a segment tile its mapped pages; each maximal run of mapped pages is one
//! chain of blocks, counted as one segment in statistics and snapshots.

use super::{apply_net, State};
use crate::device::{Device, DeviceIndex, DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::vm::Page;
use crate::pool::{Block, BlockId, PoolKind, VmSegment};
use crate::stats;

/// Largest reservation (bytes) per segment, whatever the device reports.
const MAX_RESERVATION: usize = 1 << 46;
/// Largest small-pool reservation (torch_npu's `kSmallPoolVirAddrSize`).
const SMALL_RESERVATION: usize = 2 << 30;

/// Pages mapped by one runtime call. One, as PyTorch and torch_npu do: a free page can
/// then always go back. Mapping larger chunks (one call per grow) cut mapping calls by
/// at most 2.5x on the shipped traces but stranded partly free chunks (gpt2_infer 1.013
/// to 1.033 with 2 MiB pages), measured with `npualloc replay`.
const PAGES_PER_MAP: usize = 1;

/// Idle pages unmapped before growth: what is needed, and at least this fraction of the
/// shard's reserved bytes. Measured with `npualloc replay` on t5_train repeated four
/// times, every batch synchronising (a busy device): unmapping only what is needed took
/// 64 stream synchronisations, all idle pages 24 but 1,295 mapping calls instead of 730;
/// 1/32 took 28 and 730, same peak.
const UNMAP_SLACK_DIVISOR: usize = 32;

/// A run of mapped pages: its chain's first and last block.
struct Run {
    start: DevicePtr,
    end: DevicePtr,
    head: BlockId,
    tail: BlockId,
}

impl State {
    /// Free bytes of block `id` that could merge with new pages next to it.
    fn mergeable(&self, id: BlockId) -> usize {
        let b = &self.blocks[id];
        if b.is_free() && !b.hot {
            b.size
        } else {
            0
        }
    }

    /// Reserves a new expandable segment for (`stream`, current pool, `kind`): 9/8 of
    /// device memory for the large pool (PyTorch's size), at most 2 GiB for the small
    /// one (torch_npu's cap); another is reserved when one fills up.
    fn vm_reserve_segment(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
        kind: PoolKind,
    ) -> Result<usize, Error> {
        // The page size was checked against the device's granularity at creation.
        let page = self.config.page_size(kind);
        let total = dev.mem_info(index)?.total;
        let cap = match kind {
            PoolKind::Small => SMALL_RESERVATION,
            PoolKind::Large => MAX_RESERVATION,
        };
        let pages = (total / 8 * 9).min(cap).div_ceil(page).max(1);
        let base = dev.vm_reserve(index, pages * page)?;
        let pool = self.route();
        Ok(self
            .vm
            .insert(VmSegment::new(base, page, pages, stream, pool, kind)))
    }

    /// The runs of mapped pages of segment `seg`, in address order.
    fn vm_runs(&self, seg: usize) -> Vec<Run> {
        let tag = seg as u32 + 1;
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
        dev: &dyn Device,
        index: DeviceIndex,
        stream: StreamHandle,
        kind: PoolKind,
        rounded: usize,
    ) -> Result<Option<BlockId>, Error> {
        let pool = self.route();
        let mine: Vec<usize> = self
            .vm
            .iter()
            .filter(|(_, s)| s.stream == stream && s.pool == pool && s.kind == kind)
            .map(|(i, _)| i)
            .collect();
        // Best: fewest pages, then the oldest segment, then the lowest address.
        let mut best: Option<(usize, usize, DevicePtr)> = None;
        for seg in mine {
            if let Some((k, at)) = self.vm_fit(seg, rounded) {
                if best.is_none_or(|b| k < b.0) {
                    best = Some((k, seg, at));
                }
            }
        }
        let (k, seg, va) = match best {
            Some(b) => b,
            None => {
                // None yet, or every reservation is full.
                let seg = self.vm_reserve_segment(dev, index, stream, kind)?;
                match self.vm_fit(seg, rounded) {
                    Some((k, at)) => (k, seg, at),
                    None => return Ok(None), // larger than a whole reservation
                }
            }
        };
        self.vm_map_range(dev, index, seg, va, k)
    }

    /// Where segment `seg` could map the fewest pages to hold a free block of `rounded`
    /// bytes: (pages, address); next to a free run end when that saves pages.
    fn vm_fit(&self, seg: usize, rounded: usize) -> Option<(usize, DevicePtr)> {
        let (base, end, page) = {
            let s = &self.vm[seg];
            (s.base, s.end(), s.page)
        };
        let runs = self.vm_runs(seg);
        // Gaps between runs: (start, end, free bytes before, free bytes after).
        let mut gaps = Vec::with_capacity(runs.len() + 1);
        let mut at = base;
        let mut left = 0;
        for r in &runs {
            if r.start > at {
                gaps.push((at, r.start, left, self.mergeable(r.head)));
            }
            at = r.end;
            left = self.mergeable(r.tail);
        }
        if end > at {
            gaps.push((at, end, left, 0));
        }
        let pages_for = |have: usize| rounded.saturating_sub(have).div_ceil(page).max(1);
        // Fewest pages, then lowest address.
        let mut best: Option<(usize, DevicePtr)> = None;
        for (g0, g1, lf, rf) in gaps {
            let n = (g1 - g0) / page;
            let options = [
                (pages_for(lf), g0),
                (pages_for(rf), g1.saturating_sub(pages_for(rf) * page)),
                (n, g0),
            ];
            for (k, at) in options {
                let joined = lf * usize::from(at == g0) + rf * usize::from(at + k * page == g1);
                if k <= n && joined + k * page >= rounded && best.is_none_or(|b| (k, at) < b) {
                    best = Some((k, at));
                }
            }
        }
        best
    }

    /// Maps `k` pages at `va` in segment `seg` and hands back the merged free block.
    fn vm_map_range(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        seg: usize,
        va: DevicePtr,
        k: usize,
    ) -> Result<Option<BlockId>, Error> {
        let (page, first, stream, kind, pool) = {
            let s = &self.vm[seg];
            (s.page, (va - s.base) / s.page, s.stream, s.kind, s.pool)
        };
        let bytes = k * page;
        if !self.shared.try_reserve(bytes) {
            return Ok(None);
        }
        let markers = self.markers.clone();
        let range = markers.range(|| format!("npualloc.map {bytes}B dev{index}"));
        let chunk = PAGES_PER_MAP;
        let mut calls = 0;
        let mut i = 0;
        while i < k {
            let len = chunk.min(k - i);
            match dev.vm_map(index, va + i * page, len * page) {
                Ok(h) => self.vm[seg].set_chunk(first + i, len, h),
                Err(e) => {
                    // Roll back what this call mapped.
                    let mut j = 0;
                    while j < i {
                        if let Page::Head { handle, len } = self.vm[seg].pages[first + j] {
                            let _ = dev.vm_unmap(index, va + j * page, len * page, handle);
                            self.vm[seg].clear_chunk(first + j, len);
                            j += len;
                        } else {
                            unreachable!("pages mapped by this call are chunk heads");
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
            calls += 1;
            i += len;
        }
        drop(range);
        self.shared.note_reserved();
        self.stats.num_device_alloc += calls;

        // Link the new pages to the runs they touch.
        let tag = seg as u32 + 1;
        let left = self
            .blocks
            .iter()
            .find(|(_, b)| b.vm == tag && b.next.is_none() && b.ptr + b.size == va)
            .map(|(id, _)| id);
        let right = self
            .blocks
            .iter()
            .find(|(_, b)| b.vm == tag && b.prev.is_none() && b.ptr == va + bytes)
            .map(|(id, _)| id);
        let mut block = Block::segment(va, bytes, stream, kind);
        block.pool = pool;
        block.vm = tag;
        let touched: Vec<BlockId> = [left, right].into_iter().flatten().collect();
        self.split_uncount(&touched);
        let id = self.blocks.insert(block);
        if let Some(l) = left {
            self.blocks[l].next = Some(id);
            self.blocks[id].prev = Some(l);
        }
        if let Some(r) = right {
            self.blocks[r].prev = Some(id);
            self.blocks[id].next = Some(r);
        }
        self.split_recount(&touched);
        self.reserved += bytes;
        let st = kind.stat_type();
        stats::increase(&mut self.stats.reserved_bytes, st, bytes);
        let runs_delta = 1 - left.is_some() as i64 - right.is_some() as i64;
        apply_net(&mut self.stats.segment, st, runs_delta);
        self.coalesce(id, false);
        self.pool_remove(id);
        Ok(Some(id))
    }

    /// Uncounts free blocks from the inactive-split statistics before their links change.
    fn split_uncount(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let b = &self.blocks[id];
            if b.is_free() && b.is_split() {
                let (st, size) = (b.kind.stat_type(), b.size);
                stats::decrease(&mut self.stats.inactive_split, st, 1);
                stats::decrease(&mut self.stats.inactive_split_bytes, st, size);
            }
        }
    }

    /// Counts them again after.
    fn split_recount(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let b = &self.blocks[id];
            if b.is_free() && b.is_split() {
                let (st, size) = (b.kind.stat_type(), b.size);
                stats::increase(&mut self.stats.inactive_split, st, 1);
                stats::increase(&mut self.stats.inactive_split_bytes, st, size);
            }
        }
    }

    /// Unmaps whole pages of free block `id` (in its free list), from its end, until at
    /// least `want` bytes; returns the bytes. The caller has synchronised the stream.
    fn vm_unmap_block(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        id: BlockId,
        want: usize,
    ) -> Result<usize, Error> {
        let b = &self.blocks[id];
        let seg = b.vm as usize - 1;
        let (ptr, size, prev, next, kind) = (b.ptr, b.size, b.prev, b.next, b.kind);
        let mut chunks = self.vm[seg].chunks_inside(ptr, size);
        let page = self.vm[seg].page;
        let (mut keep, mut bytes) = (chunks.len(), 0);
        while keep > 0 && bytes < want {
            keep -= 1;
            bytes += chunks[keep].2 * page;
        }
        chunks.drain(..keep);
        let (mut done, mut calls) = (0, 0);
        let mut failure = None;
        for &(at, h, len) in &chunks {
            let va = self.vm[seg].addr(at);
            match dev.vm_unmap(index, va, len * self.vm[seg].page, h) {
                Ok(()) => {
                    self.vm[seg].clear_chunk(at, len);
                    done += len;
                    calls += 1;
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
        let first = chunks[0].0;
        let page = self.vm[seg].page;
        let (lo, hi) = (self.vm[seg].addr(first), self.vm[seg].addr(first + done));
        let touched: Vec<BlockId> = [prev, Some(id), next].into_iter().flatten().collect();
        self.split_uncount(&touched);
        self.pool_remove(id);
        // The front part (before the hole) stays block `id`; the back part is new.
        let front = if lo > ptr {
            let b = &mut self.blocks[id];
            b.size = lo - ptr;
            b.next = None;
            Some(id)
        } else {
            let b = self.blocks.remove(id);
            if let Some(p) = b.prev {
                self.blocks[p].next = None;
            }
            None
        };
        let back = (ptr + size > hi).then(|| {
            let mut blk = Block::segment(hi, ptr + size - hi, self.vm[seg].stream, kind);
            blk.pool = self.vm[seg].pool;
            blk.vm = seg as u32 + 1;
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
        self.split_recount(&after);

        let bytes = done * page;
        let s = &self.vm[seg];
        let runs_delta =
            s.is_mapped_at(lo.wrapping_sub(page)) as i64 + s.is_mapped_at(hi) as i64 - 1;
        self.reserved -= bytes;
        self.shared.unreserve(bytes);
        let st = kind.stat_type();
        stats::decrease(&mut self.stats.reserved_bytes, st, bytes);
        apply_net(&mut self.stats.segment, st, runs_delta);
        self.stats.num_device_free += calls;
        failure.map_or(Ok(bytes), |e| Err(e.into()))
    }

    /// Unmaps whole free pages of blocks freed at least `min_idle` malloc calls ago, in
    /// releasable pools, largest first, until `want` bytes are unmapped; returns the bytes.
    pub(super) fn vm_release_free(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        want: usize,
        min_idle: u64,
    ) -> usize {
        if self.vm.is_empty() || self.capturing.is_some() {
            return 0;
        }
        let mut candidates: Vec<(usize, BlockId)> = self
            .pools
            .iter()
            .filter(|((_, tag), _)| self.pool_releasable(*tag))
            .flat_map(|(_, p)| p.small.iter().chain(p.large.iter()))
            .filter(|&(_, _, id)| {
                let b = &self.blocks[id];
                b.vm != 0 && self.malloc_calls - b.freed_at >= min_idle
            })
            .map(|(_, _, id)| {
                let b = &self.blocks[id];
                let s = &self.vm[b.vm as usize - 1];
                let pages: usize = s.chunks_inside(b.ptr, b.size).iter().map(|c| c.2).sum();
                (pages * s.page, id)
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
        if dev.drain_before_free(index).is_err()
            || streams.iter().any(|&s| {
                // An idle stream needs no wait (the host queue was drained above).
                !dev.stream_query(index, s).unwrap_or(false)
                    && dev.synchronize_stream(index, s).is_err()
            })
        {
            return 0;
        }
        let markers = self.markers.clone();
        let _range = markers.range(|| format!("npualloc.unmap dev{index}"));
        // A synchronisation is paid anyway: take a little more than asked, so the next
        // growth does not need another one at once.
        let want = if want == usize::MAX {
            want
        } else {
            want.max(self.reserved / UNMAP_SLACK_DIVISOR)
        };
        let mut released = 0;
        for (_, id) in candidates {
            if released >= want {
                break;
            }
            if let Ok(n) = self.vm_unmap_block(dev, index, id, want - released) {
                released += n;
            }
        }
        released
    }

    /// Returns the reservations of segments with nothing mapped (on cache release).
    pub(super) fn vm_release_reservations(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<(), Error> {
        let empty: Vec<usize> = self
            .vm
            .iter()
            .filter(|(_, s)| s.mapped == 0 && self.pool_releasable(s.pool))
            .map(|(i, _)| i)
            .collect();
        let mut result = Ok(());
        for i in empty {
            let s = &self.vm[i];
            match dev.vm_release(index, s.base, s.end() - s.base) {
                Ok(()) => {
                    self.vm.remove(i);
                }
                Err(e) => result = result.and(Err(e.into())),
            }
        }
        result
    }
}
