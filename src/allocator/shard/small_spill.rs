//! At the last rung, a small-pool request takes a free block of a large-pool segment
//! rather than run out of memory (decision 017).
//!
//! PyTorch keeps the pools apart: a request of 1 MiB or less only ever takes a block of
//! a 2 MiB small-pool segment, and when the device cannot give one more, it is out of
//! memory however much is free in the large pool. Measured at PyTorch's policy's
//! smallest device (`npualloc replay --oom-segments`): t5_generate_varlen failed a
//! 1004 KiB request with the device full, the small-pool segments' largest free block
//! 1003.5 KiB, and 17 MiB free in one block of a large-pool segment.
//!
//! So at the very end of the last rung (`ladder.rs`, `release_all_and_grow`: every
//! pending free synchronised, every cached segment released, the own free lists looked
//! at again, growth and another stream's small block tried), a small request takes best
//! fit in this stream's large-pool free lists instead of failing.
//!
//! Contract:
//! - only with `small_spill` (PyTorch's policy keeps PyTorch's
//!   out of memory), without expandable segments, and only where the request would
//!   otherwise be out of memory: a replay with no out of memory is unchanged, so are
//!   all uncapped figures;
//! - the block stays a large-pool block: it is split by the large pool's rule (a
//!   remainder over 1 MiB stays free in the large pool), its statistics count in the
//!   large pool (as every block's, by the pool of its segment, as PyTorch's do), and
//!   freed it goes back to the large pool's free lists (never to the hot cache, which
//!   holds small-pool blocks only);
//! - `max_split_size_mb` holds: best fit does not take an oversize block for it
//!   (`get_free_block`).
//!
//! Measured and dropped (decision 039): the same before
//! the last rung's host synchronisation, or before the last rungs at all (fewer host
//! syncs, but small requests then spill where the synchronised small frees would have
//! served: min capacity worse on 2 to 9 cases); also borrowing another stream's
//! large-pool block (two cases better, host syncs at each case's own min capacity
//! 368 → 4,337).

use super::request::Request;
use super::ShardState;
use crate::pool::{BlockId, PoolKind};

impl ShardState {
    /// A free block of this stream's large pool for small request `req`, the last
    /// step before out of memory (module contract); out of its free list.
    pub(super) fn take_large_for_small(&mut self, req: &Request) -> Option<BlockId> {
        if req.kind != PoolKind::Small {
            return None;
        }
        self.get_free_block(PoolKind::Large, req.rounded)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard_on};
    use super::super::Released;
    use super::super::{NoPeers, ShardState};
    use crate::device::sim::SimDevice;
    use crate::error::Error;
    use crate::pool::PoolKind;
    use crate::snapshot::BlockState;
    use crate::stats::StatType;
    use std::sync::Arc;

    /// A 24 MiB device holding a 20 MiB large-pool segment (12 MiB free, 2 MiB live,
    /// 6 MiB free; the same under both policies) and two 2 MiB small-pool segments
    /// filled by 1 MiB requests: no small-pool segment can grow.
    fn full_small_pool(conf: &str) -> (Arc<SimDevice>, ShardState) {
        let (sim, mut st) = shard_on(24 << 20, conf);
        let whole = malloc_ok(&mut st, 20 << 20);
        free(&mut st, whole);
        let large = malloc_ok(&mut st, 12 << 20);
        let _pin = malloc_ok(&mut st, 2 << 20);
        for _ in 0..4 {
            assert!(st
                .malloc(1 << 20, Released::Nothing, &NoPeers)
                .unwrap()
                .served()
                .is_some());
        }
        free(&mut st, large);
        st.finish_merge();
        assert_eq!(sim.counters(0).mallocs, 3);
        (sim, st)
    }

    #[test]
    fn a_small_request_takes_a_large_block_rather_than_run_out_of_memory() {
        let (sim, mut st) = full_small_pool("");
        assert_eq!(
            st.malloc(1000, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        let p = st
            .malloc(1000, Released::Others, &NoPeers)
            .unwrap()
            .served()
            .unwrap();
        let id = id_of(&st, p);
        assert_eq!(st.blocks[id].kind, PoolKind::Large);
        assert_eq!(st.blocks[id].size, 1024);
        assert_eq!(st.acct.stats().num_ooms, 0);
        assert_eq!(sim.counters(0).mallocs, 3);
        // Counted in the large pool, as its segment: the 2 MiB block and this one.
        let s = st.stats_snapshot();
        let (large, small) = (StatType::LargePool as usize, StatType::SmallPool as usize);
        assert_eq!(s.allocated_bytes[large].current, (2 << 20) + 1024);
        assert_eq!(s.allocated_bytes[small].current, 4 << 20);
        // Freed, it goes back to the large pool (not the hot cache) and merges with
        // the rest of the block it came from: 12 MiB free, 2 MiB live, 6 MiB free.
        free(&mut st, p);
        st.finish_merge();
        let large: Vec<Vec<(usize, bool)>> = st
            .segments()
            .iter()
            .filter(|s| s.kind == PoolKind::Large)
            .map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.size >> 20, b.state == BlockState::Inactive))
                    .collect()
            })
            .collect();
        assert_eq!(large, vec![vec![(12, true), (2, false), (6, true)]]);
        check(&st);
    }

    #[test]
    fn pytorchs_policy_keeps_its_pools_apart() {
        let (_sim, mut st) = full_small_pool(crate::config::PYTORCH_POLICY);
        assert_eq!(
            st.malloc(1000, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        let e = st
            .malloc(1000, Released::Others, &NoPeers)
            .unwrap()
            .unwrap_oom();
        assert!(matches!(e, Error::OutOfMemory { .. }));
        check(&st);
    }
}
