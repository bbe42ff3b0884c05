//! Under memory pressure, a whole free segment is kept for a request of its size
//! (decision 008).
//!
//! Best fit splits the smallest free block that fits. When that block is a whole cached
//! segment at least twice the request (one that served a large tensor, freed between
//! iterations), splitting it strands the segment: the large tensor comes back, finds no
//! block, and the device cannot give its segment again. Measured at PyTorch's policy's
//! smallest device (`npualloc replay --oom-segments`): resnet50_infer_varbatch failed a
//! 98 MiB request with 24.5 MiB live in a 98 MiB segment, mixtral_moe_train a 125 MiB
//! one with 30 MiB live in a 126 MiB segment; PyTorch's policy, with its smaller
//! segments cached, put those small tensors elsewhere.
//!
//! So such a segment is not split while the device could not give it back: the request
//! misses this stream's cache, runs the ladder (lending, then growth, which first tries
//! the request's own size rounded to 2 MiB, `alloc_segment`), and only if that fails too
//! takes the segment after all (`take_kept_whole`, before the release rungs): the rule
//! never fails a request that best fit would serve. Once the device has refused a
//! segment (the memory-short regime, `Regime::MemoryShort`) it always applies; before
//! that, only while the request's own segment can still be had, so that keeping never
//! causes the first failure (which turns every later segment to its request's own
//! size, `grow.rs`). Measured (decisions 008 and 038): the split happens before any
//! failure (resnet50_infer_varbatch's 98 MiB segment at its own smallest device);
//! applying the rule there too lowers the defaults' smallest device on
//! resnet50_infer_varbatch 1.212 → 1.029, t5_generate_varlen 1.720 → 1.660,
//! bert_infer_varlen 1.424 → 1.363 and bert_train 1.037 → 1.032 (× peak requested), and
//! OOMs at PyTorch's smallest device on #16's derived cases 21 → 19; without the
//! own-size condition (keep, grow, fail) it lost elsewhere (llama_lora_finetune 1.067 →
//! 1.103, gpt2_pretrain_bf16 1.035 → 1.088).
//!
//! Contract:
//! - applies to a fresh request's best fit: this stream's own cache and merged cache
//!   (`get_own_free_block`) and another stream's free block lent to it
//!   (`lend_block` with `BestFit::KeepingWhole`); never to a pending free taken by the
//!   pressure rung or to the rungs after the release (they keep plain best fit);
//! - only with `keep_whole` (which needs `adaptive_segments`; off in `PYTORCH_POLICY`), to large-pool
//!   blocks that are a whole ordinary segment (not split, not expandable) and at least
//!   twice the rounded request;
//! - before any failed growth, inert unless this allocator's own reservations leave no
//!   room for the segment on the device (its total memory) or under the memory
//!   fraction: uncapped figures do not move; on a device as small as the uncapped peak
//!   reserve it may act (more device mallocs there on some traces, never an OOM in the
//!   zoo; decision 008);
//! - "could not give it back": the segment's size would pass the memory fraction, or
//!   the device reports less free memory than that (`Device::mem_info`; asked only
//!   here, after the cheap tests);
//! - the fast path pays, when best fit found a large block at least twice the request,
//!   a call out of line with a relaxed load of the flag and, before any failure, of the
//!   reserved bytes against the device's total (asked of the device once,
//!   `Shared::device_total`); the rest is after a miss;
//! - a request whose block was kept carries it (`Request::kept_whole`, set after the
//!   cache rungs): its growth takes its own size rounded to 2 MiB (`grow.rs`,
//!   `after_failure_size`), before any failure too.

use super::request::Request;
use super::ShardState;
use crate::pool::rounding::ROUND_LARGE;
use crate::pool::{BlockId, PoolKind};

impl ShardState {
    /// Whether best fit's block `id` of `bsize` bytes must stay whole for now instead
    /// of serving a request of `rounded` bytes of pool `kind` (module contract).
    #[inline(always)]
    pub(super) fn keeps_whole(
        &mut self,
        kind: PoolKind,
        id: BlockId,
        bsize: usize,
        rounded: usize,
    ) -> bool {
        if kind != PoolKind::Large || bsize / 2 < rounded {
            return false;
        }
        self.keeps_whole_slow(id, bsize, rounded)
    }

    #[cold]
    #[inline(never)]
    fn keeps_whole_slow(&mut self, id: BlockId, bsize: usize, rounded: usize) -> bool {
        if !self.shared.policy.keep_whole {
            return false;
        }
        let failed = self.shared.memory_short();
        // Before any failure, no device call unless this allocator's own reservations
        // already rule the segment out (so an uncapped run never asks).
        if !failed && !self.held_past(bsize) {
            return false;
        }
        let block = &self.blocks[id];
        if block.is_split() || block.vm.is_some() || self.could_regrow(bsize) {
            return false;
        }
        // Before any failure, only while the request's own segment can be had: the
        // rule then never causes the first failure (which would turn every later
        // segment to its request's own size, `grow.rs`).
        failed || self.could_regrow(rounded.next_multiple_of(ROUND_LARGE))
    }

    /// Whether this allocator's reservations leave no room for `bytes` more on the
    /// device or under the memory fraction (`Shared::fits_beside`).
    fn held_past(&self, bytes: usize) -> bool {
        !self.shared.fits_beside(self.shared.reserved(), bytes)
    }

    /// Whether `req`'s best fit in this stream's free lists is a segment kept whole
    /// (`Request::kept_whole`: it grows the least it can instead). Slow path: after
    /// the cache rungs missed.
    pub(super) fn keeps_whole_for(&mut self, req: &Request) -> bool {
        let Some(list) = self.pools.get(&self.route()) else {
            return false;
        };
        match list.get(req.kind).best_fit(req.rounded) {
            Some((bsize, _, id)) => self.keeps_whole(req.kind, id, bsize, req.rounded),
            None => false,
        }
    }

    /// Whether the device (and the memory fraction) could give a segment of `bytes`
    /// now.
    fn could_regrow(&self, bytes: usize) -> bool {
        if let Some(max) = self.shared.allowed_max() {
            if self.shared.reserved().saturating_add(bytes) > max {
                return false;
            }
        }
        self.dev
            .mem_info(self.index)
            .map_or(true, |info| info.free >= bytes)
    }

    /// The block best fit would have given a request whose segment was kept whole,
    /// after growth failed for it: the rule yields rather than fail the request.
    pub(super) fn take_kept_whole(&mut self, req: &Request) -> Option<BlockId> {
        if !req.kept_whole {
            return None;
        }
        self.get_free_block(req.kind, req.rounded)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Released;
    use std::sync::Arc;

    use super::super::testing::{check, device, free, malloc_ok, Others};
    use super::super::{NoPeers, ShardState};
    use crate::device::sim::SimDevice;
    use crate::device::StreamHandle;

    const MIB: usize = 1 << 20;

    /// A device of `mib` MiB holding a cached whole 60 MiB segment and a live 30 MiB
    /// one. With `fail_first`, a request of the whole device has failed to grow (only
    /// the last rung, not run here, could try more). Without reclaiming before growth,
    /// which would give the idle 60 MiB segment back on that failure.
    fn cached_60(conf: &str, mib: usize, fail_first: bool) -> (Arc<SimDevice>, ShardState) {
        let conf = format!("{conf},reclaim_before_growth:False");
        let (sim, shared) = device(mib * MIB, conf.trim_start_matches(','));
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let big = malloc_ok(&mut st, 60 * MIB);
        let _live = malloc_ok(&mut st, 30 * MIB);
        free(&mut st, big);
        assert_eq!(st.acct.reserved(), 90 * MIB);
        if fail_first {
            assert_eq!(
                st.malloc(mib * MIB, Released::Nothing, &NoPeers)
                    .unwrap()
                    .served(),
                None
            );
        }
        st.finish_merge();
        (sim, st)
    }

    #[test]
    fn after_a_failed_growth_a_small_request_grows_instead_of_splitting_a_whole_segment() {
        // 30 MiB free: the 60 MiB segment could not come back, a 20 MiB one could.
        let (sim, mut st) = cached_60("", 120, true);
        assert_eq!(sim.counters(0).mallocs, 2);
        grows_its_own_4_mib_and_the_60_mib_tensor_finds_its_segment(&sim, &mut st);
    }

    /// A 4 MiB request beside `cached_60`'s whole segment: its own segment, not the head
    /// of the 60 MiB one, and the least (4 MiB, not the adaptive 20 MiB); so a 60 MiB
    /// tensor then comes back to its segment with no growth.
    fn grows_its_own_4_mib_and_the_60_mib_tensor_finds_its_segment(
        sim: &SimDevice,
        st: &mut ShardState,
    ) {
        let mallocs = sim.counters(0).mallocs;
        let small = malloc_ok(st, 4 * MIB);
        assert_eq!(sim.counters(0).mallocs, mallocs + 1);
        assert_eq!(st.acct.reserved(), 94 * MIB);
        let big = malloc_ok(st, 60 * MIB);
        assert_eq!(sim.counters(0).mallocs, mallocs + 1);
        free(st, big);
        free(st, small);
        st.finish_merge();
        check(st);
    }

    #[test]
    fn before_any_failed_growth_best_fit_splits_while_the_segment_could_come_back() {
        // 110 MiB free: the 60 MiB segment could be had again, so it is split as
        // PyTorch's best fit does (every uncapped replay).
        let (sim, mut st) = cached_60("", 200, false);
        let mallocs = sim.counters(0).mallocs;
        let _small = malloc_ok(&mut st, 4 * MIB);
        assert_eq!(sim.counters(0).mallocs, mallocs, "split, no growth");
        st.finish_merge();
        check(&st);
    }

    #[test]
    fn before_any_failed_growth_a_small_request_grows_its_own_size_instead_of_splitting() {
        // 10 MiB free and no growth failed yet: the 60 MiB segment could not come back,
        // the request's own 4 MiB can. It grows exactly that (not the adaptive 20 MiB,
        // whose failure would be the first), and the 60 MiB tensor finds its segment.
        let (sim, mut st) = cached_60("", 100, false);
        grows_its_own_4_mib_and_the_60_mib_tensor_finds_its_segment(&sim, &mut st);
        assert!(!st.shared.memory_short());
    }

    #[test]
    fn before_any_failed_growth_a_request_whose_own_segment_does_not_fit_splits() {
        // 10 MiB free: 12 MiB cannot grow either. Best fit splits the segment at once;
        // no growth is tried, so none fails and later segments keep adaptive sizes.
        let (sim, mut st) = cached_60("", 100, false);
        let mallocs = sim.counters(0).mallocs;
        assert!(st
            .malloc(12 * MIB, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        assert_eq!(sim.counters(0).mallocs, mallocs);
        assert!(!st.shared.memory_short());
        st.finish_merge();
        check(&st);
    }

    #[test]
    fn the_segment_is_split_when_the_request_cannot_grow_either() {
        // After the failure, 10 MiB free: a 12 MiB request cannot grow, so it takes the
        // kept segment rather than fail.
        let (sim, mut st) = cached_60("", 100, true);
        assert_eq!(sim.counters(0).mallocs, 2);
        let mallocs = sim.counters(0).mallocs;
        let p = st
            .malloc(12 * MIB, Released::Nothing, &NoPeers)
            .unwrap()
            .served();
        assert!(p.is_some());
        assert_eq!(sim.counters(0).mallocs, mallocs);
        assert_eq!(st.acct.stats().num_ooms, 0);
        st.finish_merge();
        check(&st);
    }

    #[test]
    fn another_stream_does_not_borrow_a_segment_kept_whole() {
        // The 60 MiB segment is the default stream's; a side stream asks for 4 MiB.
        // Without the rule it borrows the head of the segment (block lending).
        let (sim, lender) = cached_60("lend_segments:False", 120, true);
        let big = lender
            .blocks
            .iter()
            .find(|(_, b)| b.size == 60 * MIB)
            .unwrap()
            .1
            .ptr;
        let shared = lender.shared.clone();
        let lender = std::cell::RefCell::new(lender);
        let side = sim.create_stream(0).unwrap();
        let mut borrower = ShardState::new(side, shared);
        let q = borrower
            .malloc(4 * MIB, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served()
            .unwrap();
        assert_ne!(q, big, "lent the head of the kept segment");
        // A growth has failed on this device: the new segment is the request's own
        // size (`grow.rs`, `after_failure_size`), not an adaptive 20 MiB.
        assert_eq!(borrower.acct.reserved(), 4 * MIB, "a segment of its own");
        check(&borrower);
        let mut l = lender.borrow_mut();
        assert_eq!(
            l.malloc(60 * MIB, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            Some(big)
        );
    }

    #[test]
    fn pytorchs_policy_splits_as_pytorch_does() {
        let (sim, mut st) = cached_60(crate::config::PYTORCH_POLICY, 100, true);
        let mallocs = sim.counters(0).mallocs;
        let _small = malloc_ok(&mut st, 4 * MIB);
        assert_eq!(sim.counters(0).mallocs, mallocs);
    }
}
