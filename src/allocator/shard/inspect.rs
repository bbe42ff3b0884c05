//! Inspection of one shard: waiting frees, statistics, segments for snapshots.
//!
//! Contract: read-only; nothing here changes the shard.

use super::ShardState;
use crate::device::DevicePtr;
use crate::pool::BlockId;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo};
use crate::stats::DeviceStats;

impl ShardState {
    /// Frees waiting for events or a synchronisation.
    pub fn pending_count(&self) -> usize {
        self.waits.len() + self.capture.deferred().len()
    }

    /// The sizes of the cached free blocks (free lists and hot cache, every pool).
    pub fn cached_free_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.blocks
            .iter()
            .filter(|(_, b)| b.is_free())
            .map(|(_, b)| b.size)
    }

    /// The shard's statistics: its per-stream peaks are its own (see
    /// `StatLog::stream_peaks`).
    pub fn stats_snapshot(&self) -> DeviceStats {
        let mut s = self.acct.stream_snapshot();
        s.max_split_size = i64::try_from(self.shared.config.max_split_size).unwrap_or(i64::MAX);
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

    /// Every segment with its blocks (a deferred merge shown done, `lazy_merge.rs`).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let merged = self.deferred_pair();
        let mut out: Vec<SegmentInfo> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(|(head, b)| {
                let mut blocks = Vec::new();
                let mut cur = Some(head);
                while let Some(c) = cur {
                    let mut blk = &self.blocks[c];
                    let mut size = blk.size;
                    if let Some((_, rest)) = merged.filter(|&(front, _)| front == c) {
                        size += self.blocks[rest].size;
                        blk = &self.blocks[rest]; // its `next` follows the merged block
                    }
                    let state = if blk.is_allocated() {
                        BlockState::ActiveAllocated
                    } else if blk.waits() > 0 {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    };
                    blocks.push(BlockInfo {
                        address: self.blocks[c].ptr,
                        size,
                        requested_size: blk.requested,
                        state,
                        lent_to: blk.borrower(),
                        dirty_on: self.lending.open_streams(c),
                    });
                    cur = blk.next;
                }
                SegmentInfo {
                    pool_id: self.pool_id(b.pool),
                    is_expandable: b.vm.is_some(),
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

#[cfg(test)]
mod tests {
    use super::super::testing::{free, malloc_ok, shard};

    use crate::snapshot::BlockState;

    #[test]
    fn segments_list_blocks_in_address_order_with_their_state() {
        let (_sim, mut st) = shard("hot_cache:False");
        let a = malloc_ok(&mut st, 1000);
        let b = malloc_ok(&mut st, 1000);
        free(&mut st, a);
        let segs = st.segments();
        assert_eq!(segs.len(), 1);
        let states: Vec<_> = segs[0]
            .blocks
            .iter()
            .map(|x| (x.address, x.state))
            .collect();
        assert_eq!(
            states[..2],
            [(a, BlockState::Inactive), (b, BlockState::ActiveAllocated)]
        );
        assert_eq!(segs[0].total_size, 2 << 20);
        assert_eq!(
            st.segment_of(st.ptrs.get(&b).copied().unwrap()),
            (a, 2 << 20)
        );
    }

    #[test]
    fn snapshots_derive_the_freed_counts_across_a_reset() {
        // Decreases only lower `current`; the snapshot derives `freed`, also after a
        // reset of the accumulated counts with allocations still live.
        let (_sim, mut st) = shard("");
        let a = malloc_ok(&mut st, 1000);
        let b = malloc_ok(&mut st, 3000);
        free(&mut st, a);
        let s = st.stats_snapshot().allocated_bytes;
        let acc = |x: crate::stats::Stat| (x.current, x.allocated, x.freed);
        assert_eq!(
            (acc(s[0]), acc(s[1])),
            ((3072, 4096, 1024), (3072, 4096, 1024))
        );
        st.acct.reset_accumulated();
        let s = st.stats_snapshot().allocated_bytes;
        assert_eq!(acc(s[0]), (3072, 0, 0));
        let c = malloc_ok(&mut st, 512);
        free(&mut st, b);
        free(&mut st, c);
        let s = st.stats_snapshot();
        assert_eq!(acc(s.allocated_bytes[0]), (0, 512, 3584));
        assert_eq!(acc(s.allocation[1]), (0, 1, 2));
        assert_eq!(acc(s.allocation[2]), (0, 0, 0));
    }
}
