//! Lazy merge: a caller's free of a large-pool block whose previous neighbour is not free
//! may leave the merge with its free next neighbour (or, when that one is not free
//! either, its free-list insertion) to the shard's next operation. A large malloc+free
//! pair on a cached segment otherwise splits a block and merges it back every time;
//! when the next request is served by exactly that merged block, it is split again with
//! no merge, no slab operation and one free-list entry rewritten in place (a block only
//! waiting for its insertion is handed out as best fit would have returned it).
//!
//! Contract: every answer, statistic, snapshot and later decision is exactly what
//! merging at the free (`coalesce`) gives; the state itself is the same once the merge
//! is done or the block taken. Why:
//! - only a caller's free defers, as the last step of its operation
//!   (`free_block_deferring`); frees inside other operations merge at once;
//! - deferring (`defer_merge`) counts the merge's statistics at once, as `coalesce`
//!   would, and changes nothing else; `finish_merge` does the merge's structural steps
//!   (`try_merge`, `pool_insert` with the clocks of the free), the state merging at the
//!   free would have left, since nothing read or changed the free lists or the slab in
//!   between: the next operation finishes the merge before anything else reads them
//!   (`coalesce`, `flush_hot` — before every slow path, cache release and capture —,
//!   `get_free_block`, other shards' visits and the invariant checker; `segments`
//!   shows a deferred merge done);
//! - `take_unmerged` hands the block out only when best fit over the merged lists
//!   returns the merged block (`FreeList::would_pick` answers for the lists with the
//!   merged block in and `rest`'s entry out, exactly because every bin is scanned
//!   whole), the max_split rules accept it and it is split. Merging then splitting removes
//!   `rest`'s entry, pushes the merged block's and pops it again, and pushes the
//!   remainder's; the remainder keeps the merged block's slab slot (`front`'s) and the
//!   allocated front takes the slot the merge freed (`rest`'s). `alloc_unmerged` does
//!   the same with `FreeList::replace` and the same two slots, so bins, entry order,
//!   slots and links end up identical.
//!
//! Invariants: at most one merge is deferred, `front` + `rest` (`front.next`, or none);
//! `front` is a large-pool block, free (`Phase::Free`, clean) but in no free list; `rest`
//! is free, clean and in its free list; `front.prev` (and, with no `rest`,
//! `front.next`) is not mergeable; every bin of `rest`'s free list holds fewer
//! than `SCAN_LIMIT` entries (`FreeList::scanned_whole`), so best fit scans the bins of
//! `rest` and of the merged block whole, with or without their entries.

use super::ShardState;
use crate::allocator::accounting::Kind;
use crate::config::HEAD_ALIGN_MIN;
use crate::pool::{BlockId, PoolKind, Stamp};

/// A merge deferred by a free (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(super) struct LazyMerge {
    /// The freed block, in no free list.
    front: BlockId,
    /// Its free next neighbour, in its free list; `None` when neither neighbour is
    /// free (only the free-list insertion is deferred).
    rest: Option<BlockId>,
    /// The malloc and GC clocks at the free (the merged block's `freed_at`,
    /// `gc_count_base`).
    freed_at: Stamp,
    gc_count_base: Stamp,
    /// `take_unmerged` handed `front` out: `alloc_found_block` completes it at once.
    pub taken: bool,
}

impl LazyMerge {
    /// Whether a merge is deferred, not only an insertion.
    #[inline]
    pub fn has_rest(&self) -> bool {
        self.rest.is_some()
    }

    /// The malloc and GC clocks of the free (`freed_at`, `gc_count_base`).
    #[inline]
    pub fn clocks(&self) -> (Stamp, Stamp) {
        (self.freed_at, self.gc_count_base)
    }
}

impl ShardState {
    /// The deferred merge's (front, rest), if a merge (not only an insertion) is
    /// deferred.
    pub(super) fn deferred_pair(&self) -> Option<(BlockId, BlockId)> {
        let m = self.lazy.as_ref()?;
        Some((m.front, m.rest?))
    }

    /// Defers the merge of free block `id` (just freed by a caller, its statistics
    /// counted, in no free list) with the free block after it, counting the merge's
    /// statistics now;
    /// returns false, doing nothing, unless that merge is the only one `coalesce` would
    /// do and every bin of the free list is scanned whole. Out of line: the small-pool
    /// free (hot cache) stays as short as it was.
    #[inline(never)]
    pub(super) fn defer_merge(&mut self, id: BlockId) -> bool {
        self.finish_merge();
        if !self.shared.policy.lazy_merge {
            return false;
        }
        let f = &self.blocks[id];
        // Large-pool blocks only: small ones have the hot cache, and a small request
        // taking back the block just freed is rarer (measured on the trace mix).
        if f.kind != PoolKind::Large || f.dirty || f.prev.is_some_and(|p| self.mergeable(p) > 0) {
            return false;
        }
        let rest = f.next.filter(|&n| self.mergeable(n) > 0);
        if rest.is_some_and(|r| self.blocks[r].dirty) {
            return false;
        }
        let scanned_whole = self
            .pools
            .get(&f.pool)
            .is_some_and(|p| p.get(f.kind).scanned_whole());
        if !scanned_whole {
            return false;
        }
        // `coalesce`'s statistics (its net changes): the block, if split, counts as an
        // inactive split; a merged `rest` no longer does (net: `front`'s bytes).
        let acct = &mut self.acct;
        let st = f.kind.stat_type();
        match rest.map(|r| &self.blocks[r]) {
            None if f.is_split() => acct.increase_all(
                st,
                &[(Kind::InactiveSplit, 1), (Kind::InactiveSplitBytes, f.size)],
            ),
            None => {}
            Some(r) if f.prev.is_some() || r.next.is_some() => {
                acct.increase(Kind::InactiveSplitBytes, st, f.size);
            }
            Some(r) => acct.decrease_all(
                st,
                &[(Kind::InactiveSplit, 1), (Kind::InactiveSplitBytes, r.size)],
            ),
        }
        let (gc_count_base, freed_at) = self.reclaim.clocks();
        self.lazy = Some(LazyMerge {
            front: id,
            rest,
            freed_at,
            gc_count_base,
            taken: false,
        });
        true
    }

    /// Completes the deferred merge, if any, as `coalesce` would have done it at the free.
    #[inline]
    pub fn finish_merge(&mut self) {
        if let Some(m) = self.lazy.take() {
            self.merge_now(m);
        }
    }

    #[cold]
    #[inline(never)]
    fn merge_now(&mut self, m: LazyMerge) {
        debug_assert!(!m.taken, "a taken block is handed out at once");
        if let Some(rest) = m.rest {
            let absorbed = self.try_merge(m.front, rest);
            debug_assert!(absorbed > 0, "the deferred neighbour stays free");
        }
        self.pool_insert(m.front);
        let b = &mut self.blocks[m.front];
        b.freed_at = m.freed_at;
        b.gc_count_base = m.gc_count_base;
    }

    /// Rung 1 of the ladder, before best fit: the block of the deferred merge, if best
    /// fit over the merged lists would return the merged block (then
    /// `alloc_found_block` splits it); else the merge is completed and `None`.
    #[inline]
    pub(super) fn take_unmerged(&mut self, kind: PoolKind, rounded: usize) -> Option<BlockId> {
        self.lazy?;
        self.take_deferred(kind, rounded)
    }

    /// `take_unmerged` with a merge deferred (out of line: requests served by the hot
    /// cache or with nothing deferred stay as short as they were).
    #[inline(never)]
    fn take_deferred(&mut self, kind: PoolKind, rounded: usize) -> Option<BlockId> {
        let (front, rest) = self.lazy.as_ref().map(|m| (m.front, m.rest))?;
        if !self.serves(front, rest, kind, rounded) {
            self.finish_merge();
            return None;
        }
        // `get_free_block`'s clock.
        if self.gc_enabled() {
            self.reclaim.tick_gc();
        }
        if let Some(m) = self.lazy.as_mut() {
            m.taken = true;
        }
        Some(front)
    }

    /// Whether `get_free_block(kind, rounded)` on the merged lists would return the
    /// merged block (and, with a merge deferred, `alloc_found_block` split it).
    fn serves(
        &self,
        front: BlockId,
        rest: Option<BlockId>,
        kind: PoolKind,
        rounded: usize,
    ) -> bool {
        let f = &self.blocks[front];
        if f.kind != kind || f.pool != self.route() {
            return false;
        }
        let merged = f.size + rest.map_or(0, |r| self.blocks[r].size);
        if merged < rounded {
            return false;
        }
        let config = &self.shared.config;
        let max_split = config.max_split_size;
        if rounded < max_split && merged >= max_split {
            return false;
        }
        if rounded >= max_split && merged >= rounded.saturating_add(config.max_non_split_rounding) {
            return false;
        }
        if rest.is_some() && !self.split_rule(f.vm.is_some(), kind, merged, rounded) {
            return false;
        }
        // A block that may get a head split (`base_addr_aligned_kb`) is merged first.
        let align = self.shared.policy.base_addr_align;
        if align != 0 && rounded >= HEAD_ALIGN_MIN && f.ptr % align != 0 {
            return false;
        }
        // Nothing else cached (the usual case of one large pair), or best fit picks it.
        let Some(p) = self.pools.get(&f.pool) else {
            return false;
        };
        let list = p.get(kind);
        list.len() == usize::from(rest.is_some())
            || list.would_pick(rounded, (merged, f.place()), rest)
    }

    /// `alloc_found_block` for the block `take_unmerged` handed out (`id`, the deferred
    /// front): the merged block split, `rounded` bytes at the front for a request of
    /// `size`, with the statistics of the split (`logged`: whether they are logged).
    /// Returns the allocated block.
    #[inline(never)]
    pub(super) fn alloc_unmerged(
        &mut self,
        id: BlockId,
        size: usize,
        rounded: usize,
        logged: bool,
    ) -> BlockId {
        let m = self.lazy.take().expect("a taken deferred merge");
        debug_assert_eq!(m.front, id);
        let (front, rest) = (m.front, m.rest.expect("a deferred merge"));
        let (f, r) = (&self.blocks[front], &self.blocks[rest]);
        let (base, prev, next) = (f.ptr, f.prev, r.next);
        let already_split = prev.is_some() || next.is_some();
        let (st, key, kind) = (f.kind.stat_type(), f.pool, f.kind);
        let rest_size = f.size + r.size - rounded;
        let (gc, now) = self.reclaim.clocks();
        // Merging then splitting keeps the merged block (`front`'s slot) for the
        // remainder and gives the allocated front the slot the merge freed (`rest`'s):
        // the same slots here, so the state is the one merging at the free leaves.
        let b = &mut self.blocks[front];
        b.ptr = base + rounded;
        b.size = rest_size;
        b.prev = Some(rest);
        b.next = next;
        b.gc_count_base = gc;
        b.freed_at = now;
        self.pools
            .get_mut(&key)
            .expect("the deferred neighbour's pool")
            .get_mut(kind)
            .replace(&mut self.blocks, rest, front);
        // The front, as `Block::sibling` makes it.
        let b = &mut self.blocks[rest];
        b.ptr = base;
        b.size = rounded;
        b.prev = prev;
        b.next = Some(front);
        b.gc_count_base = 0;
        b.freed_at = 0;
        b.bin_pos = 0;
        if let Some(p) = prev {
            self.blocks[p].next = Some(rest);
        }
        if let Some(n) = next {
            self.blocks[n].prev = Some(front);
        }
        let logged = self.count_front_split(st, already_split, rounded, rest_size, logged);
        self.count_allocated(rest, size, logged)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, device, free, malloc_ok, shard};
    use super::super::Released;
    use super::super::{NoPeers, ShardState};
    use crate::config::PYTORCH_POLICY;
    use crate::device::{DevicePtr, StreamHandle};
    use crate::pool::{BlockId, Phase};

    #[test]
    fn a_large_pair_is_served_again_without_merging() {
        let (_sim, mut st) = shard("");
        let p = malloc_ok(&mut st, 8 << 20);
        let id = st.ptrs.get(&p).copied().unwrap();
        free(&mut st, p);
        assert!(
            st.lazy.is_some(),
            "the merge with the free remainder is deferred"
        );
        assert_eq!(st.blocks.len(), 2, "not merged yet");
        assert_eq!(st.blocks[id].phase, Phase::Free);
        let q = malloc_ok(&mut st, 8 << 20);
        assert_eq!(q, p);
        assert!(st.lazy.is_none());
        assert_eq!(
            st.blocks.len(),
            2,
            "no merge, no split: the same two blocks"
        );
        check(&st);
        free(&mut st, q);
        // Another size served by the merged block: taken too.
        let r = malloc_ok(&mut st, 3 << 20);
        assert_eq!((r, st.blocks.len()), (p, 2));
        check(&st);
    }

    #[test]
    fn a_request_the_merged_block_would_not_serve_completes_the_merge_first() {
        let (_sim, mut st) = shard("");
        // One 20 MiB segment: a (8 MiB), x, y (2 MiB each), a free 8 MiB tail.
        let a = malloc_ok(&mut st, 8 << 20);
        let x = malloc_ok(&mut st, 2 << 20);
        let y = malloc_ok(&mut st, 2 << 20);
        assert_eq!((x, y), (a + (8 << 20), a + (10 << 20)));
        free(&mut st, x); // between two live blocks: only its insertion deferred
        assert!(st.lazy.is_some_and(|m| !m.has_rest()));
        free(&mut st, a); // x inserted, then a's merge with x deferred (10 MiB)
        assert!(st.lazy.is_some_and(|m| m.has_rest()));
        // Best fit for 3 MiB is the 8 MiB tail, not the 10 MiB merged block.
        let e = malloc_ok(&mut st, 3 << 20);
        assert_eq!(e, a + (12 << 20));
        assert!(st.lazy.is_none(), "completed before best fit");
        check(&st);
        // Now the merged block (10 MiB at a) is the best fit for 9 MiB.
        let f = malloc_ok(&mut st, 9 << 20);
        assert_eq!(f, a);
        check(&st);
    }

    /// The same operations on a shard merging at every free and on one deferring:
    /// the same pointers and statistics, and once the merge is done the same segments,
    /// free lists (entries in order) and blocks (every field, slot for slot).
    fn same_as_merging_at_once(conf: &str, seed: u64) {
        let (_s1, shared) = device(8 << 30, conf);
        let mut lazy = ShardState::new(StreamHandle::DEFAULT, shared);
        let (_s2, shared) = device(8 << 30, &format!("{conf},lazy_merge:False"));
        let mut eager = ShardState::new(StreamHandle::DEFAULT, shared);
        let mut x = seed;
        let mut live: Vec<DevicePtr> = Vec::new();
        for step in 0..STEPS {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (x >> 33) as usize;
            if live.len() > 24 || (!live.is_empty() && r % 5 < 2) {
                let p = live.swap_remove(r / 7 % live.len());
                free(&mut lazy, p);
                free(&mut eager, p);
            } else {
                let size = match r % 4 {
                    0 => (r >> 4) % (1 << 20) + 1,
                    1 => 8 << 20,
                    _ => (r >> 4) % (24 << 20) + 1,
                };
                let (p, q) = (alloc(&mut lazy, size), alloc(&mut eager, size));
                assert_eq!(p, q, "{conf} seed {seed} step {step}: malloc({size})");
                live.push(p);
            }
            assert_eq!(lazy.stats_snapshot(), eager.stats_snapshot(), "step {step}");
            let segments = |st: &ShardState| format!("{:?}", st.segments());
            assert_eq!(segments(&lazy), segments(&eager), "step {step}: snapshot");
            if step % 7 == 0 {
                lazy.finish_merge();
                assert_eq!(lists(&lazy), lists(&eager), "step {step}");
                assert_eq!(blocks(&lazy), blocks(&eager), "step {step}: same slots");
                check(&lazy);
            }
        }
    }

    /// A malloc, releasing this shard's cache and retrying if the device is full.
    fn alloc(st: &mut ShardState, size: usize) -> DevicePtr {
        match st
            .malloc(size, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
        {
            Some(p) => p,
            None => st
                .malloc(size, Released::Others, &NoPeers)
                .unwrap()
                .served()
                .unwrap(),
        }
    }

    /// Every block slot, and the slot the next block takes. `bin_pos` is left out of
    /// blocks handed out: a stale value there means nothing (a deferred insertion
    /// never set it).
    fn blocks(st: &ShardState) -> String {
        let mut blocks = st.blocks.clone();
        for (_, b) in blocks.iter_mut().filter(|(_, b)| b.is_allocated()) {
            b.bin_pos = 0;
        }
        format!("{:#?} {}", blocks, blocks.vacant_key())
    }

    /// Every free-list entry, bin by bin in order.
    fn lists(st: &ShardState) -> Vec<(usize, DevicePtr, BlockId)> {
        st.pools
            .values()
            .flat_map(|p| p.small.iter().chain(p.large.iter()))
            .collect()
    }

    /// Random runs per setting, and operations per run (few under Miri, which
    /// interprets every step: the full count there took more than 10 minutes).
    const SEEDS: u64 = if cfg!(miri) { 1 } else { 4 };
    const STEPS: usize = if cfg!(miri) { 120 } else { 1500 };

    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of interpreted allocator steps: over 10 minutes"
    )]
    fn deferring_merges_changes_nothing_observable() {
        for conf in [
            "",
            "hot_cache:False",
            PYTORCH_POLICY,
            "max_split_size_mb:20",
            "expandable_segments:True",
        ] {
            for seed in 1..=SEEDS {
                same_as_merging_at_once(conf, seed);
            }
        }
    }
}
