//! Giving memory back to the device: whole free segments on cache release, before
//! growth past the high-water mark (idle ones, with churn back-off, never those of a
//! steady stream: `lending.rs`), oversize blocks (`max_split_size_mb`) and PyTorch's
//! garbage collection.
//!
//! Contract: only whole free segments that are not dirty (or whose streams were
//! synchronised) go back; segments of private pools still in use never do; a device free
//! is preceded by draining the host framework's queue (`drain_before_free`).

use super::Peers;
use super::ShardState;
use crate::allocator::history::TraceAction;
use crate::error::Error;
use crate::pool::{BlockId, PoolKind};

impl ShardState {
    /// This stream's own cached whole segments of `kinds` (in that order) that could go
    /// back to the device without a host wait (not dirty): (size, block).
    pub(super) fn clean_whole_segments<'a>(
        &'a self,
        kinds: &'a [PoolKind],
    ) -> impl Iterator<Item = (usize, BlockId)> + 'a {
        self.pools
            .iter()
            .filter(|(tag, _)| tag.is_none())
            .flat_map(move |(_, p)| kinds.iter().flat_map(move |&k| p.get(k).iter()))
            .filter(|&(_, _, id)| self.is_whole_segment(id) && !self.is_dirty(id))
            .map(|(s, _, id)| (s, id))
    }

    /// Whether free block `id` is a whole device allocation (unsplit, not expandable).
    pub(super) fn is_whole_segment(&self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        !b.is_split() && b.vm.is_none()
    }

    /// Frees a whole, unsplit, free segment to the device.
    pub(super) fn release_block(&mut self, id: BlockId) -> Result<(), Error> {
        let index = self.index;
        let b = &self.blocks[id];
        debug_assert!(b.is_free() && !b.is_split());
        for s in self.lending.open_streams(id) {
            // Work queued there may still use it; device frees need not wait for it.
            self.dev.synchronize_stream(index, s)?;
        }
        let range = self
            .shared
            .markers
            .range(|| format!("npualloc.device_free {}B dev{index}", b.size));
        let freed = self.dev.free(index, b.ptr);
        drop(range);
        freed?;
        let (kind, size, pool, ptr) = (b.kind, b.size, b.pool, b.ptr);
        self.pool_remove(id);
        self.blocks.remove(id);
        self.lending.forget(id);
        self.shared.unreserve(size);
        self.segment_removed(kind, size);
        self.note_device_memory(pool, kind, ptr, size, TraceAction::SegmentFree);
        self.acct.count_device_frees(1);
        Ok(())
    }

    /// The cached free blocks that are whole segments, in releasable pools; with
    /// `clean_only`, only those that need no host wait (not dirty).
    fn cached_whole_segments(&self, clean_only: bool) -> Vec<BlockId> {
        self.pools
            .iter()
            .filter(|(tag, _)| self.pool_releasable(**tag))
            .flat_map(|(_, p)| p.small.iter().chain(p.large.iter()))
            .map(|(_, _, id)| id)
            .filter(|&id| self.is_whole_segment(id) && !(clean_only && self.is_dirty(id)))
            .collect()
    }

    /// Releases every free whole segment of every stream and pool.
    pub(super) fn release_free_segments(&mut self) -> Result<(), Error> {
        let index = self.index;
        let whole = self.cached_whole_segments(false);
        self.vm_release_free(usize::MAX, 0);
        let mut result = self.vm_release_reservations();
        if whole.is_empty() {
            return result;
        }
        self.dev.drain_before_free(index)?;
        for id in whole {
            if let Err(e) = self.release_block(id) {
                result = result.and(Err(e));
            }
        }
        self.pools
            .retain(|_, p| !(p.small.is_empty() && p.large.is_empty() && p.hot.is_empty()));
        result
    }

    /// Frees every cached whole segment that can go back without a host wait (not
    /// dirty, in a releasable pool), after taking in the events and fences that
    /// completed; returns whether any went back (the rung `ReleaseClean`, `../last_resort.rs`).
    pub fn release_clean_segments(&mut self) -> bool {
        self.process_events();
        self.poll_fences();
        self.flush_hot();
        let whole = self.cached_whole_segments(true);
        if whole.is_empty() || self.dev.drain_before_free(self.index).is_err() {
            return false;
        }
        let mut released = false;
        for id in whole {
            released |= self.release_block(id).is_ok();
        }
        self.pools
            .retain(|_, p| !(p.small.is_empty() && p.large.is_empty() && p.hot.is_empty()));
        released
    }

    /// PyTorch's `release_cached_blocks`: synchronise events, then free every cached segment.
    pub fn release_cached_blocks(&mut self) -> Result<(), Error> {
        let index = self.index;
        let markers = self.shared.markers.clone();
        let _range = markers.range(|| format!("npualloc.cache_release dev{index}"));
        let synced = self.synchronize_and_free_events();
        self.flush_hot();
        let released = self.release_free_segments();
        synced.and(released)
    }

    /// With `max_split_size` set: free oversize cached blocks of this stream until
    /// `max(size, max_split_size)` bytes are released.
    pub(super) fn release_available_cached_blocks(&mut self, kind: PoolKind, size: usize) -> bool {
        let index = self.index;
        let max_split = self.shared.config.max_split_size;
        if max_split == usize::MAX || !self.pool_releasable(self.route()) {
            return false;
        }
        let target = size.max(max_split);
        let Some(pools) = self.pools.get(&self.route()) else {
            return false;
        };
        let list = pools.get(kind);
        let whole = |id: BlockId| self.is_whole_segment(id);
        if let Some((_, _, id)) = list.best_fit(target).filter(|&(_, _, id)| whole(id)) {
            return self.dev.drain_before_free(index).is_ok() && self.release_block(id).is_ok();
        }
        let candidates: Vec<(usize, BlockId)> = list
            .iter_desc()
            .into_iter()
            .take_while(|&(s, _, _)| s >= max_split)
            .filter(|&(_, _, id)| whole(id))
            .map(|(s, _, id)| (s, id))
            .collect();
        if candidates.is_empty() || self.dev.drain_before_free(index).is_err() {
            return false;
        }
        let mut released = 0;
        for (s, id) in candidates {
            if released >= target {
                break;
            }
            if self.release_block(id).is_ok() {
                released += s;
            }
        }
        released >= target
    }

    /// Before reserved memory grows past its high-water mark, return wholly empty cached
    /// segments (which cannot serve this request: the free lists had no fit) until the
    /// new segment fits under the mark. Below the mark nothing is freed, so a repeating
    /// workload settles with no device frees. A steady shard (`lending.rs`) gives
    /// nothing back, and its idle segments are not taken by another stream's growth:
    /// at steady state they are its loop's, needed again.
    ///
    /// Measured cost (decision 004): a segment returned for a
    /// growth of the other pool (a large one for a 2 MiB small-pool segment) is what a
    /// repeated workload's second pass makes again (mlp_infer, bert_infer_varlen: one
    /// device malloc each, the one-pass mark 2 MiB under PyTorch's); every rule tried
    /// that blocks such reclaims lost an uncapped figure elsewhere.
    pub(super) fn release_empty_before_growth(&mut self, seg_size: usize, peers: &dyn Peers) {
        let index = self.index;
        if !self.shared.policy.reclaim_before_growth || self.capture_underway() {
            return;
        }
        let over = (self.shared.reserved() + seg_size).saturating_sub(self.shared.hwm());
        if over == 0 || self.steady() || self.dev.drain_before_free(index).is_err() {
            return;
        }
        let mut released = self.release_idle_segments(over);
        if released < over {
            peers.visit(&mut |other| {
                if !other.steady() {
                    released += other.release_idle_segments(over - released);
                }
                released < over
            });
        }
    }

    /// Releases wholly empty cached segments idle long enough (largest first: the
    /// fewest device frees for the bytes) until `want` bytes are freed; returns the bytes.
    pub(super) fn release_idle_segments(&mut self, want: usize) -> usize {
        self.poll_fences();
        let min_idle = self.reclaim.min_idle();
        let mut empties: Vec<(usize, BlockId)> = self
            .clean_whole_segments(&[PoolKind::Small, PoolKind::Large])
            .filter(|&(_, id)| self.reclaim.idle_for(self.blocks[id].freed_at, min_idle))
            .collect();
        empties.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut released = 0;
        for (s, id) in empties {
            if released >= want {
                break;
            }
            if self.release_block(id).is_ok() {
                released += s;
                self.reclaim.note_reclaimed(s);
            }
        }
        if released < want {
            released += self.vm_release_free(want - released, min_idle);
        }
        released
    }

    /// PyTorch's garbage collection: free old, unsplit large cached blocks until usage
    /// falls below the threshold.
    pub(super) fn garbage_collect(&mut self, peers: &dyn Peers) {
        let index = self.index;
        let Some(max) = self.shared.allowed_max() else {
            return;
        };
        let threshold = (self.shared.config.garbage_collection_threshold * max as f64) as usize;
        let reserved = self.shared.reserved();
        if reserved <= threshold || self.dev.drain_before_free(index).is_err() {
            return;
        }
        let target = reserved - threshold;
        let mut reclaimed = self.collect_old_blocks(target);
        if reclaimed < target {
            peers.visit(&mut |other| {
                reclaimed += other.collect_old_blocks(target - reclaimed);
                reclaimed < target
            });
        }
    }

    /// Frees unsplit large cached blocks, oldest first by rounds of "older than the
    /// average age", until `target` bytes are reclaimed; returns the bytes.
    pub(super) fn collect_old_blocks(&mut self, target: usize) -> usize {
        let mut candidates: Vec<(u64, usize, BlockId)> = self
            .clean_whole_segments(&[PoolKind::Large])
            .map(|(s, id)| (self.reclaim.gc_age(self.blocks[id].gc_count_base), s, id))
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
                if self.release_block(id).is_ok() {
                    reclaimed += s;
                }
            }
        }
        reclaimed
    }

    pub fn empty_cache(&mut self) -> Result<(), Error> {
        let index = self.index;
        let released = self.release_cached_blocks();
        let destroyed = (self.waits)
            .destroy_idle_events(&*self.dev, index)
            .map_err(Error::from);
        released.and(destroyed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, malloc_ok, shard};

    #[test]
    fn a_cache_release_frees_every_free_segment() {
        let (sim, mut st) = shard("");
        let small = malloc_ok(&mut st, 1000);
        let large = malloc_ok(&mut st, 4 << 20);
        free(&mut st, small);
        free(&mut st, large);
        assert_eq!(st.acct.reserved(), (2 << 20) + (20 << 20));
        st.release_cached_blocks().unwrap();
        assert_eq!(st.acct.reserved(), 0);
        assert_eq!(st.acct.stats().num_device_free, 2);
        assert_eq!(sim.counters(0).live_bytes, 0);
        check(&st);
    }

    #[test]
    fn live_blocks_keep_their_segment() {
        let (_sim, mut st) = shard("");
        let _live = malloc_ok(&mut st, 1000);
        st.release_cached_blocks().unwrap();
        assert_eq!(st.acct.reserved(), 2 << 20);
        check(&st);
    }
}
