//! Cross-stream lending: whole free segments (`lend_segments`) and free blocks
//! (`lend_blocks`) of another stream's shard, ordered on the device.
//!
//! Contract: the borrower waits on the device for an event recorded on the lender's
//! stream before it uses lent memory; the host never blocks; nothing is lent to or by a
//! capturing stream. A lent block stays the lender's: allocated, with the borrower as
//! its first stream use; freed, it comes back at once, dirty on the borrower.
//!
//! Invariant: a lent block is allocated and `stream_uses[0]` is its borrower.
//!
//! **A steady borrower grows instead.** A lent block goes back to its lender when
//! freed, so the borrower's own cache never grows from it: a stream that misses for the
//! same request at the same phase of every pass of a steady loop would borrow again each
//! time, with events, forever. So each shard counts the borrows (blocks and segments)
//! per request size (pool and rounded bytes) since the device last grew other than by
//! this rule (`Shared::growths`); once a size was borrowed `REPEATS` times in such a
//! stretch, the next miss for it grows this shard's own cache first (`ladder.rs`) and
//! borrows only if that fails. Growth elsewhere on the device starts the count again: a
//! workload still growing (one pass of a trace) keeps lending's memory savings, which
//! come from borrowing the same sizes again and again (layers); `REPEATS` was chosen on
//! the derived multi-stream replays (decision 011). Memory is short when growth
//! would pass the reserve budget (then it borrows without trying), the memory fraction
//! or the device's capacity (the growth fails, and the borrow is not counted): there
//! lending is kept as before.
//!
//! **A steady stream keeps its memory.** A miss that comes rarely (a stream's cache one
//! segment short every few dozen passes, as the ABI trace mix on the fake ACL runtime
//! showed) takes many passes to reach `REPEATS`, and every growth in between starts
//! the count again; meanwhile segments kept moving between the two streams, each move
//! with events, and `reclaim_before_growth` gave idle segments back (a 96 MiB one for a
//! 2 MiB growth) that their stream allocated again a pass later, which is growth
//! again. So a shard is *steady* when the device's reserved high-water mark rose at
//! most once in its last `STEADY_CALLS` malloc calls, as this shard saw it (it looks at
//! the start and end of each of its misses, so another stream's rise counts from this
//! shard's next miss; growth back under the mark after reclaiming is not a rise). A
//! steady shard's miss grows its own cache first and borrows only if that fails (as
//! a repeat does; with expandable segments a miss still borrows a block before mapping
//! pages), its growth gives no idle segment back first, and another stream's
//! growth takes none of its idle segments (`release.rs`): at steady state the memory
//! in each stream's cache is what that stream's loop needs again. A workload that
//! changes phase raises the mark twice in a short time, which ends steadiness and
//! brings lending and reclaiming back; it pays at most one segment for the first
//! growth. `STEADY_CALLS` (2^18: about a hundred passes of a training loop of a few
//! thousand allocations) is longer than every stream of the shipped and zoo replays,
//! whose figures are unchanged (decision 012).

use super::request::{BestFit, Counting, GrowFirst, Request};
use super::Peers;
use super::ShardState;
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::{Block, BlockId, Phase, PoolKind};

/// A lent segment is at most this many times the segment a new allocation would get.
const LEND_SIZE_FACTOR: usize = 2;

impl ShardState {
    /// A lent block freed by its borrower: back to this stream's pool at once (the
    /// caller continues as for any free), marked dirty until a fence on the borrower
    /// completes, so that whoever takes it sooner waits on the device. Returns true if
    /// it was kept back instead: no event may be recorded on a capturing borrower, so
    /// the block waits for the next full synchronisation (cache release or OOM retry).
    #[cold]
    pub(super) fn return_lent(&mut self, id: BlockId) -> bool {
        self.poll_fences(); // recycles the events of completed fences
        let b = &mut self.blocks[id];
        let borrower = b.stream_uses.remove(0);
        if self.capture_underway() {
            let b = &mut self.blocks[id];
            b.stream_uses.clear();
            b.add_wait();
            self.waits.park(id);
            return true;
        }
        let epoch = self.fence(borrower);
        self.lending.mark(id, borrower, epoch);
        self.blocks[id].dirty = true;
        false
    }

    /// Cross-stream lending (`lend_segments`; never while capturing): instead of a new
    /// device allocation, take a wholly free cached segment from another stream's shard.
    /// This stream waits on the device for an event recorded on the lender's stream
    /// (work queued there on the segment finishes first); the host never blocks.
    /// `counting`: as for `borrow_block`.
    pub(super) fn borrow_segment(
        &mut self,
        req: &Request,
        seg_size: usize,
        counting: Counting,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        let (stream, kind) = (req.stream, req.kind);
        if !self.shared.policy.lend_segments || self.route().is_some() || self.capture_underway() {
            return Ok(None);
        }
        let limit = seg_size.saturating_mul(LEND_SIZE_FACTOR);
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_segment(kind, req.rounded, limit, stream);
            lent.is_none()
        });
        let Some((ptr, size, shift)) = lent else {
            return Ok(None);
        };
        if counting == Counting::Counted {
            self.note_borrow(req);
        }
        self.segment_added(kind, size);
        let seg = Block {
            shift,
            ..Block::segment(ptr, size, stream, kind)
        };
        Ok(Some(self.blocks.insert(seg)))
    }

    /// Gives up the smallest wholly free cached segment of `kind` holding at least
    /// `size` bytes (and at most `limit`; the lowest place among equals) to stream
    /// `borrower`, ordered on the device after the work queued on this stream (and on
    /// any stream it is dirty on): (address, size, shift: it keeps its place range).
    pub fn lend_segment(
        &mut self,
        kind: PoolKind,
        size: usize,
        limit: usize,
        borrower: StreamHandle,
    ) -> Option<(DevicePtr, usize, usize)> {
        if self.route().is_some() || self.capture_underway() {
            return None;
        }
        let (bsize, _, id) = self
            .pools
            .iter()
            .filter(|(tag, _)| tag.is_none())
            .flat_map(|(_, p)| p.get(kind).iter())
            .filter(|&(s, _, id)| s >= size && s <= limit && self.is_whole_segment(id))
            .min_by_key(|&(s, p, _)| (s, p))?;
        self.order_after(borrower, self.stream).ok()?;
        self.wait_for_dirty(id, borrower).ok()?;
        self.pool_remove(id);
        let b = self.blocks.remove(id);
        self.lending.forget(id);
        self.segment_removed(kind, bsize);
        Some((b.ptr, bsize, b.shift))
    }

    /// Serves `req`, made on another stream (the borrower, `req.stream`), from this
    /// shard's free blocks, by best fit `fit`: for a borrower's fresh request
    /// (`borrow_block`) the own cache's, which under memory pressure may keep a whole
    /// segment for its size (`keep_whole.rs`); plain for a pending free (`pressure.rs`),
    /// which is taken for the request it was chosen for, and after the release rungs.
    /// The borrower first waits on the device for the work queued on this stream so
    /// far. The block stays this shard's, allocated, with the borrower as its user;
    /// once freed it comes back at once, dirty on the borrower (`return_lent`).
    pub(super) fn lend_block(&mut self, req: &Request, fit: BestFit) -> Option<DevicePtr> {
        match fit {
            BestFit::KeepingWhole => self.lend_block_as::<true>(req),
            BestFit::Plain => self.lend_block_as::<false>(req),
        }
    }

    fn lend_block_as<const KEEP_WHOLE: bool>(&mut self, req: &Request) -> Option<DevicePtr> {
        if self.route().is_some() || self.capture_underway() {
            return None;
        }
        let (own, borrower) = (self.stream, req.stream);
        let id = if KEEP_WHOLE {
            self.get_own_free_block(req.kind, req.rounded)?
        } else {
            self.get_free_block(req.kind, req.rounded)?
        };
        if self.order_after(borrower, own).is_err() {
            self.pool_insert(id);
            return None;
        }
        let (ptr, id) = self.hand_out(id, req).ok()?;
        let b = &mut self.blocks[id];
        b.phase = Phase::Lent;
        b.stream_uses.insert(0, borrower);
        Some(ptr)
    }

    /// Block lending, the borrower's side (`lend_blocks`; never while capturing): another
    /// stream's free block for this request, by best fit `fit` (see `lend_block`).
    /// `counting`: whether the borrow counts for the repeat rule (module doc).
    pub(super) fn borrow_block(
        &mut self,
        req: &Request,
        counting: Counting,
        fit: BestFit,
        peers: &dyn Peers,
    ) -> Option<DevicePtr> {
        if !self.shared.policy.lend_blocks || self.route().is_some() || self.capture_underway() {
            return None;
        }
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_block(req, fit);
            lent.is_none()
        });
        if lent.is_some() && counting == Counting::Counted {
            self.note_borrow(req);
        }
        lent
    }

    /// Whether a miss for `req` grows this shard's own cache before borrowing, and why:
    /// its size was borrowed `REPEATS` times since the device last grew (the count
    /// starts again), or this shard is steady; never when growth would pass the reserve
    /// budget.
    pub(super) fn grow_before_borrowing(&mut self, req: &Request, seg_size: usize) -> GrowFirst {
        let first = if self.lending.take_repeat(req, self.shared.growths()) {
            GrowFirst::Repeat
        } else if self.steady() {
            GrowFirst::Steady
        } else {
            return GrowFirst::No;
        };
        if self.over_budget(seg_size) {
            return GrowFirst::No;
        }
        first
    }

    /// Counts a borrow for the repeat rule.
    fn note_borrow(&mut self, req: &Request) {
        self.lending.note_borrow(req, self.shared.growths());
    }

    /// Takes note of a rise of the device's reserved high-water mark since the last
    /// look (slow paths only).
    pub(super) fn note_growth(&mut self) {
        let now = self.reclaim.now();
        self.lending.note_mark(self.shared.hwm(), now);
    }

    /// Whether this shard is steady: the device's reserved high-water mark rose at most
    /// once in its last `STEADY_CALLS` malloc calls, as it saw it (module doc). Slow
    /// paths only.
    pub(super) fn steady(&mut self) -> bool {
        self.note_growth();
        self.lending.steady(self.reclaim.now())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Released;
    use std::cell::RefCell;

    use super::super::lending_state::{REPEATS, STEADY_CALLS};
    use super::super::testing::{check, device, free, id_of, Others};
    use super::super::ShardState;
    use crate::device::{DevicePtr, StreamHandle};
    use crate::stream::UNFENCED;

    #[test]
    fn a_free_block_is_lent_and_comes_back_dirty() {
        let Setup {
            sim,
            side,
            lender,
            mut borrower,
            freed: p,
        } = lender_and_borrower("lend_segments:False");
        let q = borrower
            .malloc(4 << 20, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served()
            .unwrap();
        assert_eq!(q, p, "served from the lender's free block");
        assert_eq!(
            sim.counters(0).mallocs,
            1,
            "no device malloc for the borrower"
        );
        assert!(borrower.ptrs.get(&q).is_none());
        let mut l = lender.borrow_mut();
        let id = id_of(&l, q);
        assert_eq!(l.blocks[id].borrower(), Some(side));
        check(&l);
        l.ptrs.remove(&q);
        l.free(id);
        assert!(
            l.blocks[id].dirty,
            "free, but the borrower may still use it"
        );
        check(&l);
        // The borrower's queue starts with its wait for the lender's stream.
        sim.complete_stream(0, side).unwrap();
        l.poll_fences();
        assert!(l.is_dirty(id), "the borrower is held behind the lender");
        sim.complete_stream(0, StreamHandle::DEFAULT).unwrap();
        sim.complete_stream(0, side).unwrap();
        l.poll_fences();
        assert!(!l.is_dirty(id), "the borrower's fence completed");
    }

    /// With expandable segments, a lent block freed by its borrower while no event can
    /// be created is unfenced: the next full synchronisation clears it, so its pages
    /// can be unmapped.
    #[test]
    fn a_block_freed_without_a_fence_goes_back_at_the_next_full_synchronisation() {
        let Setup {
            sim,
            side,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("expandable_segments:True");
        let q = borrower
            .malloc(4 << 20, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served()
            .unwrap();
        let mut l = lender.borrow_mut();
        let id = id_of(&l, q);
        assert_eq!(l.blocks[id].borrower(), Some(side));
        // No idle event to reuse, and creating one fails: the fence cannot be recorded.
        l.waits.destroy_idle_events(&*sim, 0).unwrap();
        sim.fail_nth_event_create(0, 1);
        l.ptrs.remove(&q);
        l.free(id);
        assert_eq!(l.lending.marks(id), [(side, UNFENCED)]);
        check(&l);
        l.release_cached_blocks().unwrap();
        check(&l);
        assert_eq!(
            l.acct.reserved(),
            0,
            "pages of the unfenced block stayed mapped"
        );
        let c = sim.counters(0);
        assert_eq!(c.maps, c.unmaps);
    }

    /// A lender on the default stream holding one free 4 MiB block (in a 20 MiB
    /// segment), and a borrower on a side stream, with settings `conf`.
    struct Setup {
        sim: std::sync::Arc<crate::device::sim::SimDevice>,
        side: StreamHandle,
        lender: RefCell<ShardState>,
        borrower: ShardState,
        /// The lender's free block.
        freed: DevicePtr,
    }

    fn lender_and_borrower(conf: &str) -> Setup {
        let (sim, shared) = device(1 << 30, conf);
        let side = sim.create_stream(0).unwrap();
        let lender = RefCell::new(ShardState::new(StreamHandle::DEFAULT, shared.clone()));
        let freed = {
            let mut l = lender.borrow_mut();
            let p = l
                .malloc(4 << 20, Released::Nothing, &Others(vec![]))
                .unwrap()
                .served()
                .unwrap();
            let id = l.ptrs.remove(&p).unwrap();
            l.free(id);
            p
        };
        let borrower = ShardState::new(side, shared);
        Setup {
            sim,
            side,
            lender,
            borrower,
            freed,
        }
    }

    /// The borrower allocates 4 MiB and frees it; returns whether the lender served it.
    fn borrow_and_free(lender: &RefCell<ShardState>, borrower: &mut ShardState) -> bool {
        let p = borrower
            .malloc(4 << 20, Released::Nothing, &Others(vec![lender]))
            .unwrap()
            .served()
            .unwrap();
        if let Some(id) = borrower.ptrs.remove(&p) {
            borrower.free(id);
            return false;
        }
        let mut l = lender.borrow_mut();
        let id = l.ptrs.remove(&p).unwrap();
        l.free(id);
        true
    }

    #[test]
    #[cfg_attr(miri, ignore = "64+ borrows with events, interpreted: minutes")]
    fn a_steady_borrower_grows_its_own_cache() {
        let Setup {
            sim,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("lend_segments:False");
        for i in 0..REPEATS {
            assert!(borrow_and_free(&lender, &mut borrower), "borrow {i}");
        }
        assert_eq!(sim.counters(0).mallocs, 1);
        // The same miss once more: its own segment now, and never a borrow again.
        assert!(!borrow_and_free(&lender, &mut borrower));
        assert_eq!(sim.counters(0).mallocs, 2);
        let records = sim.counters(0).event_records;
        for _ in 0..REPEATS {
            assert!(!borrow_and_free(&lender, &mut borrower));
        }
        assert_eq!(
            sim.counters(0).event_records,
            records,
            "no event at steady state"
        );
        lender.borrow_mut().finish_merge();
        borrower.finish_merge();
        check(&lender.borrow());
        check(&borrower);
    }

    #[test]
    #[cfg_attr(miri, ignore = "64+ borrows with events, interpreted: minutes")]
    fn growth_elsewhere_starts_the_count_again() {
        let Setup {
            sim,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("lend_segments:False");
        for _ in 0..REPEATS - 1 {
            assert!(borrow_and_free(&lender, &mut borrower));
        }
        // The lender grows (the workload is not steady): the borrows so far do not count.
        let q = {
            let mut l = lender.borrow_mut();
            l.malloc(30 << 20, Released::Nothing, &Others(vec![]))
                .unwrap()
                .served()
                .unwrap()
        };
        assert_eq!(sim.counters(0).mallocs, 2);
        for _ in 0..REPEATS {
            assert!(borrow_and_free(&lender, &mut borrower));
        }
        assert_eq!(sim.counters(0).mallocs, 2);
        assert!(!borrow_and_free(&lender, &mut borrower));
        assert_eq!(sim.counters(0).mallocs, 3);
        let mut l = lender.borrow_mut();
        let id = l.ptrs.remove(&q).unwrap();
        l.free(id);
        l.finish_merge();
        check(&l);
    }

    #[test]
    #[cfg_attr(miri, ignore = "64+ borrows with events, interpreted: minutes")]
    fn past_the_reserve_budget_a_steady_borrower_keeps_borrowing() {
        // 20 MiB reserved: one more 20 MiB segment would pass a 30 MiB budget.
        let Setup {
            sim,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("lend_segments:False,reserve_budget_mb:30");
        for i in 0..2 * REPEATS {
            assert!(borrow_and_free(&lender, &mut borrower), "borrow {i}");
        }
        assert_eq!(sim.counters(0).mallocs, 1);
        lender.borrow_mut().finish_merge();
        check(&lender.borrow());
    }

    /// Runs `n` malloc calls of 1 KiB on `st`, each freed at once (its own cache serves
    /// them after the first): the shard's malloc clock moves by `n`.
    fn tick(st: &mut ShardState, others: &Others, n: u64) {
        for _ in 0..n {
            let p = st
                .malloc(1024, Released::Nothing, others)
                .unwrap()
                .served()
                .unwrap();
            free(st, p);
        }
    }

    /// A stream whose miss comes rarely in a steady loop (fewer than `REPEATS` times
    /// between two growths of the device) would borrow at every pass, with events.
    /// Once the device's reserved high-water mark has risen at most once in
    /// `STEADY_CALLS` of its malloc calls, its miss grows its own cache instead
    /// (decision 012).
    #[test]
    #[cfg_attr(miri, ignore = "2^18 malloc calls, interpreted: hours")]
    fn a_steady_stream_grows_its_own_cache_at_a_miss() {
        let Setup {
            sim,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("lend_segments:False");
        let others = Others(vec![&lender]);
        assert!(borrow_and_free(&lender, &mut borrower), "not steady yet");
        // A small segment of its own (the mark rises), then a long stretch without.
        tick(&mut borrower, &others, STEADY_CALLS);
        let (mallocs, records) = (sim.counters(0).mallocs, sim.counters(0).event_records);
        assert!(!borrow_and_free(&lender, &mut borrower), "steady: grows");
        assert_eq!(sim.counters(0).mallocs, mallocs + 1);
        assert_eq!(sim.counters(0).event_records, records, "no event");
        lender.borrow_mut().finish_merge();
        borrower.finish_merge();
        check(&lender.borrow());
        check(&borrower);
    }

    /// Growing past the high-water mark would give an idle segment back first, which
    /// its stream allocates again a pass later (a steady loop's pass can be longer than
    /// the churn back-off's window). A steady stream keeps its idle segments, and two
    /// growths close together end steadiness (decision 012).
    #[test]
    #[cfg_attr(miri, ignore = "2^18 malloc calls, interpreted: hours")]
    fn a_steady_stream_reclaims_nothing_before_growth() {
        let (sim, shared) = device(1 << 30, "");
        let mut st = ShardState::new(crate::device::StreamHandle::DEFAULT, shared);
        let none = Others(vec![]);
        let small = st
            .malloc(1024, Released::Nothing, &none)
            .unwrap()
            .served()
            .unwrap(); // a small segment
        let idle = st
            .malloc(12 << 20, Released::Nothing, &none)
            .unwrap()
            .served()
            .unwrap();
        free(&mut st, idle); // a 20 MiB segment, idle, at the high-water mark
        tick(&mut st, &none, STEADY_CALLS);
        let frees = sim.counters(0).frees;
        let live = st
            .malloc(24 << 20, Released::Nothing, &none)
            .unwrap()
            .served()
            .unwrap();
        assert_eq!(sim.counters(0).frees, frees, "the idle segment stays");
        assert_eq!(st.acct.reserved(), (20 << 20) + (2 << 20) + (24 << 20));
        // A second growth soon after: no longer steady, the idle segment goes back
        // before the third.
        let second = st
            .malloc(40 << 20, Released::Nothing, &none)
            .unwrap()
            .served()
            .unwrap();
        assert_eq!(sim.counters(0).frees, frees);
        let third = st
            .malloc(48 << 20, Released::Nothing, &none)
            .unwrap()
            .served()
            .unwrap();
        assert_eq!(sim.counters(0).frees, frees + 1, "reclaimed again");
        for p in [small, live, second, third] {
            free(&mut st, p);
        }
        st.finish_merge();
        check(&st);
    }

    #[test]
    fn a_wholly_free_segment_moves_to_the_borrower() {
        let Setup {
            sim,
            lender,
            mut borrower,
            ..
        } = lender_and_borrower("");
        borrower
            .malloc(4 << 20, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served()
            .unwrap();
        assert_eq!(sim.counters(0).mallocs, 1);
        assert_eq!(
            (lender.borrow().acct.reserved(), borrower.acct.reserved()),
            (0, 20 << 20)
        );
        check(&lender.borrow());
        check(&borrower);
    }
}
