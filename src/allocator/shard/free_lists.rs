//! The shard's free lists: taking a block (best fit, split) and giving one back (hot
//! cache or merge with free neighbours), with PyTorch's block statistics.
//!
//! Contract: every function here keeps the free lists and the statistics in step with
//! the blocks; none calls the device.
//!
//! Invariants:
//! - a free block that is not hot is in exactly one free list, that of its
//!   (stream, pool tag, kind); hot blocks are only in their stream's hot cache;
//! - no two free, non-hot neighbours exist (they are merged on insertion), but for the
//!   one pair whose merge a free may defer to the next operation (`lazy_merge.rs`):
//!   nothing here reads or changes the free lists while a merge is deferred;
//! - `inactive_split[_bytes]` count the free blocks of split segments, hot ones included.

use super::request::Request;
use super::ShardState;
use crate::allocator::accounting::Kind;
use crate::config::HEAD_ALIGN_MIN;
use crate::error::Error;
use crate::handle::DevicePtr;
use crate::pool::free_list::HOT_CAPACITY;
use crate::pool::rounding::{MIN_BLOCK, SMALL_SIZE};
use crate::pool::{Block, BlockId, Phase, PoolKind};
use crate::stats::StatType;

impl ShardState {
    pub(super) fn pool_insert(&mut self, id: BlockId) {
        debug_assert!(
            self.lazy.is_none(),
            "free lists changed with a merge deferred"
        );
        let (gc, now) = self.reclaim.clocks();
        let b = &mut self.blocks[id];
        b.gc_count_base = gc;
        b.freed_at = now;
        let (key, kind) = (b.pool, b.kind);
        self.pools
            .get_or_default(key)
            .get_mut(kind)
            .insert(&mut self.blocks, id);
    }

    pub(super) fn pool_remove(&mut self, id: BlockId) {
        debug_assert!(
            self.lazy.is_none(),
            "free lists changed with a merge deferred"
        );
        let b = &self.blocks[id];
        let (key, kind) = (b.pool, b.kind);
        let removed = match self.pools.get_mut(&key) {
            Some(p) => p.get_mut(kind).remove(&mut self.blocks, id),
            None => false,
        };
        debug_assert!(removed, "block {id} was not in its free list");
    }

    /// PyTorch's `get_free_block`: best fit in the pool allocations go to now,
    /// honouring max_split_size.
    pub(super) fn get_free_block(&mut self, kind: PoolKind, size: usize) -> Option<BlockId> {
        self.best_fit_as::<false>(kind, size)
    }

    /// `get_free_block` for this stream's own request on the ladder's cache rungs: a
    /// whole segment may also be kept whole for its size (`keep_whole.rs`).
    pub(super) fn get_own_free_block(&mut self, kind: PoolKind, size: usize) -> Option<BlockId> {
        self.best_fit_as::<true>(kind, size)
    }

    #[inline(always)]
    fn best_fit_as<const KEEP_WHOLE: bool>(
        &mut self,
        kind: PoolKind,
        size: usize,
    ) -> Option<BlockId> {
        self.finish_merge();
        if self.gc_enabled() {
            self.reclaim.tick_gc();
        }
        let list = self.pools.get(&self.route())?.get(kind);
        let (mut bsize, place, mut id) = list.best_fit(size)?;
        if self.shared.policy.expandable_best_fit && self.blocks[id].vm.is_some() {
            (bsize, id) = self.growable_fit(list, (bsize, place, id));
        }
        let max_split = self.shared.config.max_split_size;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split
            && bsize >= size.saturating_add(self.shared.config.max_non_split_rounding)
        {
            return None;
        }
        if KEEP_WHOLE && self.keeps_whole(kind, id, bsize, size) {
            return None;
        }
        self.pool_remove(id);
        Some(id)
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
            self.lending.forget(id);
            self.blocks[id].dirty = false;
        } else if dirty {
            self.prune_marks(id);
        }
        let ptr = self.blocks[out].ptr;
        self.ptrs.insert(ptr, out);
        Ok((ptr, out))
    }

    pub(super) fn should_split(&self, block: &Block, rounded: usize) -> bool {
        self.split_rule(block.vm.is_some(), block.kind, block.size, rounded)
    }

    /// Whether a free block of `size` bytes of pool `kind` (of an expandable segment:
    /// `vm`) is split to serve `rounded` bytes.
    pub(super) fn split_rule(&self, vm: bool, kind: PoolKind, size: usize, rounded: usize) -> bool {
        let rem = size - rounded;
        if vm {
            // Expandable segments strand nothing by splitting (PyTorch's rule).
            return rem >= MIN_BLOCK;
        }
        match kind {
            PoolKind::Small => rem >= MIN_BLOCK,
            PoolKind::Large => rounded < self.shared.config.max_split_size && rem > SMALL_SIZE,
        }
    }

    /// Hands out block `id` (already out of its free list), splitting off the head that
    /// `base_addr_aligned_kb` asks for (`expandable.rs`) and the tail.
    ///
    /// Loads the statistics flag once (it visits no other shard): when set, a copy of
    /// its own (`LOG`, out of line) runs instead; the usual copy, which quiet shards
    /// run too (`../accounting/totals/quiet.rs`), logs nothing and has no call to save registers
    /// around.
    pub(super) fn alloc_found_block(
        &mut self,
        id: BlockId,
        size: usize,
        rounded: usize,
    ) -> BlockId {
        if self.acct.logging_by(&self.shared.stats_logging) {
            return self.alloc_found_block_logged(id, size, rounded);
        }
        self.alloc_found_block_as::<false>(id, size, rounded)
    }

    #[cold]
    #[inline(never)]
    fn alloc_found_block_logged(&mut self, id: BlockId, size: usize, rounded: usize) -> BlockId {
        self.alloc_found_block_as::<true>(id, size, rounded)
    }

    #[inline(always)]
    fn alloc_found_block_as<const LOG: bool>(
        &mut self,
        id: BlockId,
        size: usize,
        rounded: usize,
    ) -> BlockId {
        if let Some(m) = self.lazy.filter(|m| m.taken) {
            if m.has_rest() {
                return self.alloc_unmerged(id, size, rounded, LOG);
            }
            // Only its insertion was deferred: out of every list, as best fit leaves it,
            // with the clocks the insertion would have set.
            self.lazy = None;
            let b = &mut self.blocks[id];
            (b.freed_at, b.gc_count_base) = m.clocks();
        }
        // The size first: requests under 2 MiB (most) skip the settings' load.
        if rounded >= HEAD_ALIGN_MIN && self.shared.policy.base_addr_align != 0 {
            let (id, logged) = self.split_aligned_head(id, rounded, LOG);
            if !LOG && logged {
                // The head's statistics passed an allowance: the rest is logged.
                return self.alloc_tail::<true>(id, size, rounded);
            }
            return self.alloc_tail::<LOG>(id, size, rounded);
        }
        self.alloc_tail::<LOG>(id, size, rounded)
    }

    /// `alloc_found_block` once the head is split off: the tail split and the counts.
    #[inline(always)]
    fn alloc_tail<const LOG: bool>(&mut self, id: BlockId, size: usize, rounded: usize) -> BlockId {
        let st = self.blocks[id].kind.stat_type();
        let already_split = self.blocks[id].is_split();
        if self.should_split(&self.blocks[id], rounded) {
            return self.split_front::<LOG>(id, size, rounded, st, already_split);
        }
        if already_split {
            let bsize = self.blocks[id].size;
            self.acct.decrease_all_as(
                LOG,
                st,
                &[(Kind::InactiveSplitBytes, bsize), (Kind::InactiveSplit, 1)],
            );
        }
        self.count_allocated_as::<LOG>(id, size)
    }

    /// Splits `rounded` bytes off the front of free block `id` (out of its free list)
    /// as a new block, handed out for a request of `size` bytes and returned; `id`
    /// keeps the remainder and goes back in its free list. Out of line (a tail call:
    /// a block handed out whole, the hot cache's, saves no register for it).
    #[inline(never)]
    fn split_front<const LOG: bool>(
        &mut self,
        id: BlockId,
        size: usize,
        rounded: usize,
        st: StatType,
        already_split: bool,
    ) -> BlockId {
        let front_id = self.carve_front(id, rounded);
        let rest_size = self.blocks[id].size;
        self.pool_insert(id);
        let logged = self.count_front_split(st, already_split, rounded, rest_size, LOG);
        if !LOG && logged {
            // The split's statistics passed an allowance: the counts are logged.
            return self.count_allocated_logged(front_id, size);
        }
        self.count_allocated_as::<LOG>(front_id, size)
    }

    /// Cuts the first `n` bytes of block `id` off as a new block linked just before it
    /// (same segment, stream, pool and state); `id` keeps the rest. Links only: no free
    /// list and no statistic changes (the callers do theirs).
    #[inline(always)]
    pub(super) fn carve_front(&mut self, id: BlockId, n: usize) -> BlockId {
        let b = &self.blocks[id];
        let mut front = b.sibling(b.ptr, n);
        front.prev = b.prev;
        front.next = Some(id);
        let front_id = self.blocks.insert(front);
        if let Some(p) = self.blocks[front_id].prev {
            self.blocks[p].next = Some(front_id);
        }
        let rest = &mut self.blocks[id];
        rest.prev = Some(front_id);
        rest.ptr += n;
        rest.size -= n;
        front_id
    }

    /// The statistics of splitting `rounded` bytes off the front of a free block (of a
    /// segment split before: `already_split`), leaving `rest_size` bytes free. `logged`:
    /// whether the operation's changes are logged (`Accounting::logging`); returns
    /// whether they are from now on (`Accounting::increase_all_as`).
    pub(super) fn count_front_split(
        &mut self,
        st: StatType,
        already_split: bool,
        rounded: usize,
        rest_size: usize,
        logged: bool,
    ) -> bool {
        if already_split {
            self.acct
                .decrease_all_as(logged, st, &[(Kind::InactiveSplitBytes, rounded)]);
            logged
        } else {
            self.acct.increase_all_as(
                logged,
                st,
                &[
                    (Kind::InactiveSplitBytes, rest_size),
                    (Kind::InactiveSplit, 1),
                ],
            )
        }
    }

    /// Block `out` is handed out for a request of `size` bytes: its phase and statistics.
    /// `logged`: whether the operation's changes are logged (`Accounting::logging`).
    pub(super) fn count_allocated(&mut self, out: BlockId, size: usize, logged: bool) -> BlockId {
        if logged {
            return self.count_allocated_logged(out, size);
        }
        self.count_allocated_as::<false>(out, size)
    }

    #[cold]
    #[inline(never)]
    fn count_allocated_logged(&mut self, out: BlockId, size: usize) -> BlockId {
        self.count_allocated_as::<true>(out, size)
    }

    #[inline(always)]
    fn count_allocated_as<const LOG: bool>(&mut self, out: BlockId, size: usize) -> BlockId {
        let st = self.blocks[out].kind.stat_type();
        let b = &mut self.blocks[out];
        b.phase = Phase::Allocated;
        b.requested = size;
        let bsize = b.size;
        let logged = self.acct.increase_all_as(
            LOG,
            st,
            &[
                (Kind::Allocation, 1),
                (Kind::AllocatedBytes, bsize),
                (Kind::Active, 1),
                (Kind::ActiveBytes, bsize),
                (Kind::RequestedBytes, size),
            ],
        );
        if bsize >= self.shared.config.max_split_size {
            // After a group that passed an allowance (`logged`), logged too.
            self.acct.increase_all_as(
                logged,
                StatType::Aggregate,
                &[(Kind::OversizeAllocations, 1)],
            );
        }
        out
    }

    /// A block becomes reusable: into its stream's hot cache if there is room, else
    /// into its free list, merged with free neighbours.
    pub(super) fn free_block(&mut self, id: BlockId) {
        let logged = self.acct.logging();
        self.release_to_cache(id, false, logged);
    }

    /// `free_block` for a caller's free, the last step of the operation: the merge
    /// with the free block after it may be deferred to the shard's next operation
    /// (`lazy_merge.rs`). Frees inside other operations (events completed, waits) merge
    /// at once, so no operation meets a merge deferred during itself. `logged`: whether
    /// the changes are logged (a constant in `free`'s copies).
    #[inline(always)]
    pub(super) fn free_block_deferring(&mut self, id: BlockId, logged: bool) {
        self.release_to_cache(id, true, logged);
    }

    #[inline(always)]
    fn release_to_cache(&mut self, id: BlockId, may_defer: bool, logged: bool) {
        let b = &mut self.blocks[id];
        debug_assert!(b.is_free() && b.stream_uses.is_empty());
        let (st, size, requested, split) = (b.kind.stat_type(), b.size, b.requested, b.is_split());
        b.requested = 0;
        self.acct.decrease_all_as(
            logged,
            st,
            &[
                (Kind::Active, 1),
                (Kind::ActiveBytes, size),
                (Kind::RequestedBytes, requested),
            ],
        );
        // Only small-pool blocks: keeping large blocks unmerged for reuse changes where
        // later large requests land and costs reserve (measured on the shipped traces);
        // their merges are only ever deferred, invisibly (`lazy_merge.rs`).
        let b = &self.blocks[id];
        let small = b.kind == PoolKind::Small
            && b.pool.is_none()
            && self.shared.policy.hot_cache
            && !b.dirty;
        // The hot cache is looked up for small blocks only (a large free never uses it).
        if small {
            let hot = &mut self.pools.get_or_default(None).hot;
            if hot.len() < HOT_CAPACITY {
                // A large request skips the hot cache (`ladder.rs`, `take_own_cache`).
                debug_assert!(size <= SMALL_SIZE, "a hot block of a small request's size");
                hot.push((size, id));
                self.blocks[id].phase = Phase::Hot;
                if split {
                    self.acct.increase_all_as(
                        logged,
                        st,
                        &[(Kind::InactiveSplit, 1), (Kind::InactiveSplitBytes, size)],
                    );
                }
                return;
            }
        }
        if may_defer && self.defer_merge(id) {
            return;
        }
        self.coalesce(id, false);
    }

    /// Puts free block `id` in its free list, merged with free neighbours. `counted`:
    /// the block is already counted as an inactive split (it comes from the hot cache).
    pub(super) fn coalesce(&mut self, id: BlockId, counted: bool) {
        self.finish_merge();
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
        self.acct.apply_net(Kind::InactiveSplit, st, net_blocks);
        self.acct.apply_net(Kind::InactiveSplitBytes, st, net_bytes);
    }

    /// Takes a hot block of exactly `size` bytes on `stream`, most recent first.
    pub(super) fn hot_take(&mut self, size: usize) -> Option<BlockId> {
        if self.route().is_some() {
            return None;
        }
        let hot = &mut self.pools.get_mut(&None)?.hot;
        let pos = hot.iter().rposition(|&(s, _)| s == size)?;
        let (_, id) = hot.swap_remove(pos);
        self.blocks[id].phase = Phase::Free;
        Some(id)
    }

    /// Moves every hot block into the free lists; returns whether there were any.
    pub fn flush_hot(&mut self) -> bool {
        self.finish_merge();
        let hot: Vec<BlockId> = self
            .pools
            .values_mut()
            .flat_map(|p| p.hot.drain(..).map(|(_, id)| id))
            .collect();
        for &id in &hot {
            self.blocks[id].phase = Phase::Free;
            self.coalesce(id, true);
        }
        !hot.is_empty()
    }

    /// Bytes of block `id` a neighbour may absorb: its size when free and not parked in
    /// the hot cache, else 0.
    pub(super) fn mergeable(&self, id: BlockId) -> usize {
        let b = &self.blocks[id];
        if b.phase == Phase::Free {
            b.size
        } else {
            0
        }
    }

    /// Merges free neighbour `src` into `dst`; returns the bytes absorbed (0 if not free).
    pub(super) fn try_merge(&mut self, dst: BlockId, src: BlockId) -> usize {
        if self.mergeable(src) == 0 {
            return 0;
        }
        self.pool_remove(src);
        let s = self.blocks.remove(src);
        if s.dirty {
            self.lending.merge_marks(dst, src);
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

    /// Counts `bytes` of device memory this shard now reserves (a segment, or pages
    /// mapped into one): reserved bytes, their high-water mark and statistics.
    pub(super) fn bytes_reserved(&mut self, kind: PoolKind, bytes: usize) {
        self.acct.add_reserved(bytes);
        self.acct
            .increase(Kind::ReservedBytes, kind.stat_type(), bytes);
    }

    /// Counts a segment this shard now holds: reserved bytes and segment statistics.
    pub(super) fn segment_added(&mut self, kind: PoolKind, size: usize) {
        self.acct.increase(Kind::Segment, kind.stat_type(), 1);
        self.bytes_reserved(kind, size);
        if size >= self.shared.config.max_split_size {
            self.acct
                .increase(Kind::OversizeSegments, StatType::Aggregate, 1);
        }
    }

    /// Uncounts a segment this shard no longer holds (freed or lent).
    pub(super) fn segment_removed(&mut self, kind: PoolKind, size: usize) {
        self.acct.sub_reserved(size);
        let st = kind.stat_type();
        self.acct.decrease(Kind::Segment, st, 1);
        self.acct.decrease(Kind::ReservedBytes, st, size);
        if size >= self.shared.config.max_split_size {
            self.acct
                .decrease(Kind::OversizeSegments, StatType::Aggregate, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard};

    #[test]
    fn split_blocks_merge_back_into_one_whole_segment() {
        let (_sim, mut st) = shard("hot_cache:False");
        let a = malloc_ok(&mut st, 1000);
        let b = malloc_ok(&mut st, 1000);
        assert_eq!(
            b,
            a + 1024,
            "the second block is split off the same segment"
        );
        assert_eq!(st.acct.stats().inactive_split[0].current, 1);
        free(&mut st, a);
        st.finish_merge();
        check(&st);
        assert_eq!(st.acct.stats().inactive_split[0].current, 2);
        free(&mut st, b);
        check(&st);
        assert_eq!(st.acct.stats().inactive_split[0].current, 0);
        assert_eq!(st.blocks.len(), 1, "merged into one block");
        let (_, _, id) = st
            .pools
            .iter()
            .next()
            .unwrap()
            .1
            .small
            .iter()
            .next()
            .unwrap();
        assert!(st.is_whole_segment(id));
    }

    #[test]
    fn hot_blocks_stay_unmerged_until_flushed() {
        let (_sim, mut st) = shard("");
        let a = malloc_ok(&mut st, 1000);
        let id = id_of(&st, a);
        free(&mut st, a);
        assert_eq!(st.blocks[id].phase, crate::pool::Phase::Hot);
        assert_eq!(
            st.blocks.len(),
            2,
            "not merged with the rest of its segment"
        );
        check(&st);
        assert!(st.flush_hot());
        assert!(!st.flush_hot(), "nothing left to flush");
        assert_eq!(st.blocks.len(), 1);
        check(&st);
    }
}
