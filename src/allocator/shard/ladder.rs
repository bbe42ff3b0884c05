//! The miss path of one shard as one ladder: a list of rungs built once from the
//! policy ([`Ladder::new`]), climbed from the top by every malloc until a rung serves
//! the request (PyTorch's `DeviceCachingAllocator::malloc`, one `||` chain, with
//! npualloc's rungs in between). The list, in order; a rung that is not in this
//! allocator's ladder is left out at build time, never tested at run time:
//!
//! | rung | what it tries | in the ladder when (`Policy`) |
//! |---|---|---|
//! | `OwnCache` | the hot cache, then best fit in this stream's free lists (`malloc`, the fast path) | always |
//! | `MergedCache` | the hot cache merged into the free lists, best fit again | always |
//! | `GarbageCollect` | PyTorch's garbage collection (with a memory fraction) | `garbage_collection_threshold` |
//! | `GrowBeforeBorrowing` | a repeat borrower, or a steady stream, grows first (`lending.rs`) | lending, ordinary segments |
//! | `BorrowSegment` | a wholly free segment of another stream (`lending.rs`) | `lend_segments` |
//! | `BorrowBlock` | a free block of another stream (`lending.rs`) | `lend_blocks` |
//! | `WaitOverBudget` | past the reserve budget: a device-side wait for a pending free (`pressure.rs`) | `pressure_wait`, `reserve_budget_mb` |
//! | `Grow` | a new segment or pages, idle memory back first past the mark (`grow.rs`) | always |
//! | `KeptWhole` | growth failed: the segment kept whole for the request serves (`keep_whole.rs`) | `keep_whole` |
//! | `ReleaseOversize` | oversize cached blocks back, grow again (`release.rs`) | `max_split_size_mb` |
//! | `ReleaseFreePages` | free pages back, map again (`expandable.rs`) | `expandable_segments` |
//! | `PressureWait` | a device-side wait for a pending free, this stream's or another's (`pressure.rs`) | `pressure_wait` |
//! | `ReleaseClean` | across shards: every stream's clean cached segments back, then the ladder again | `release_clean` |
//! | `ReleaseOthers` | across shards: the other streams' caches back, then the cache rungs and the rest | always |
//! | `ReleaseOwn` | this stream's pending frees synchronised, its cache back (`events.rs`, `release.rs`) | always |
//! | `FreeListsAgain` | best fit again: the frees just synchronised may have merged | `look_again` |
//! | `GrowAfterRelease` | a new segment or pages, nothing given back first | always |
//! | `BorrowAfterRelease` | another stream's free block, plain best fit | `look_again`, `lend_blocks` |
//! | `SmallSpill` | a small request takes a large-pool block (`small_spill.rs`) | `small_spill` |
//!
//! Past the last rung the request is out of memory.
//!
//! The two rungs marked "across shards" need the other shards' locks, which a shard
//! never waits for with its own held: there the climb stops with a named outcome
//! ([`Outcome::NeedsCleanRelease`], [`Outcome::NeedsAllReleased`]), the caller
//! (`../last_resort.rs`) does the release with no shard lock held and climbs again,
//! saying what it released ([`Released`]). A graph capture never releases (it must not
//! synchronise): the release rungs pass, and the first rung across shards is out of
//! memory at once.
//!
//! Contract: `malloc` hands out a block (its pointer mapped in `ptrs`), or stops with a
//! named outcome; out of memory is counted once, where the climb ends.

use std::sync::atomic::Ordering;

use super::request::{BestFit, Counting, Grant, GrowFirst, Outcome, Released, Request};
use super::rungs::Rung;
use super::{Peers, ShardState};
use crate::allocator::oom;
use crate::error::Error;
use crate::pool::rounding::round_size;
use crate::pool::{BlockId, PoolKind};
use crate::profiling::HeldRange;

/// One climb's state, passed from rung to rung.
struct Climb {
    /// The request, `kept_whole` set by the merged-cache rung.
    req: Request,
    /// The segment a growth asks for first (`grow.rs`).
    seg_size: usize,
    /// What `GrowBeforeBorrowing` decided; `None` when the ladder has no such rung.
    grow_first: Option<GrowFirst>,
    /// Whether `ReleaseOwn` gave every cached segment back.
    released_own: bool,
    /// The profiler range of the rungs from `ReleaseOwn` on.
    _retry_range: Option<HeldRange>,
}

impl Climb {
    /// Whether the climb grew before borrowing (and failed, or it would be served).
    fn grew_first(&self) -> bool {
        matches!(self.grow_first, Some(GrowFirst::Repeat | GrowFirst::Steady))
    }

    /// Whether a borrow counts for lending's repeat rule: only where the ladder has the
    /// rule and the climb did not grow first (then memory is short).
    fn counting(&self) -> Counting {
        match self.grow_first {
            Some(GrowFirst::No) => Counting::Counted,
            _ => Counting::Uncounted,
        }
    }
}

/// What one rung did.
enum Step {
    /// Nothing for this request: the next rung.
    Next,
    /// Served.
    Take(Grant),
    /// The climb stops here.
    Stop(Outcome),
}

impl ShardState {
    /// Sizes a request of `size` bytes on this shard's stream.
    fn request(&self, size: usize) -> Result<Request, Error> {
        let too_large = || Error::SizeTooLarge { requested: size };
        let padded = size
            .checked_add(self.shared.padding)
            .ok_or_else(too_large)?;
        let config = &self.shared.config;
        let rounded = round_size(padded, |s| config.divisions_for(s)).ok_or_else(too_large)?;
        Ok(Request {
            size,
            rounded,
            kind: PoolKind::for_size(rounded),
            stream: self.stream,
            kept_whole: false,
        })
    }

    /// Serves a request of `size` bytes on this shard's stream: climbs the ladder, or
    /// after a release across shards (`released`) the part of it that follows. Inlined
    /// into the allocator's malloc: its outcome is matched there, never stored (the
    /// miss is out of line).
    #[inline(always)]
    pub fn malloc(
        &mut self,
        size: usize,
        released: Released,
        peers: &dyn Peers,
    ) -> Result<Outcome, Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        self.reclaim.tick();
        let req = self.request(size)?;
        if self.pending_count() > 0 && !self.capture_underway() {
            self.process_events();
        }
        let id = match self.take_own_cache(&req) {
            Some(id) => id,
            None => match self.miss(&req, released, peers)? {
                Ok(Grant::Own(id)) => id,
                Ok(Grant::Lent(ptr)) => return Ok(Outcome::Served(ptr)),
                Err(stop) => return Ok(stop),
            },
        };
        self.hand_out(id, &req).map(|(ptr, _)| Outcome::Served(ptr))
    }

    /// The rung `OwnCache`: a hot block of the exact size, else best fit in this
    /// stream's free lists. The hot cache holds handed-out small-pool blocks only, whose
    /// sizes are their rounded requests (at most `SMALL_SIZE`): a large request skips it.
    #[inline(always)]
    fn take_own_cache(&mut self, req: &Request) -> Option<BlockId> {
        let hot = match req.kind {
            PoolKind::Small => self.hot_take(req.rounded),
            PoolKind::Large => None,
        };
        hot.or_else(|| self.take_unmerged(req.kind, req.rounded))
            .or_else(|| self.get_own_free_block(req.kind, req.rounded))
    }

    /// The rest of the ladder, for a request the own cache could not serve. Looks at
    /// the device's reserved high-water mark before and after (`lending.rs`:
    /// steadiness), so that a rise by this shard's own growth counts from when it
    /// happened. Out of line: the fast path's frame stays the own cache's.
    #[inline(never)]
    fn miss(
        &mut self,
        req: &Request,
        released: Released,
        peers: &dyn Peers,
    ) -> Result<Result<Grant, Outcome>, Error> {
        self.note_growth();
        let found = self.climb(req, released, peers);
        self.note_growth();
        found
    }

    /// `miss` without the bookkeeping: each rung in turn until one serves or stops.
    fn climb(
        &mut self,
        req: &Request,
        released: Released,
        peers: &dyn Peers,
    ) -> Result<Result<Grant, Outcome>, Error> {
        let seg_size = self.segment_size(req.rounded).ok_or(Error::SizeTooLarge {
            requested: req.size,
        })?;
        self.poll_fences();
        let ladder = self.ladder;
        let mut c = Climb {
            req: *req,
            seg_size,
            grow_first: None,
            released_own: false,
            _retry_range: None,
        };
        for rung in ladder.climb(released) {
            match self.step(rung, &mut c, released, peers)? {
                Step::Next => {}
                Step::Take(grant) => return Ok(Ok(grant)),
                Step::Stop(outcome) => return Ok(Err(outcome)),
            }
        }
        let asked = self.failed_growth(&c.req, c.seg_size);
        Ok(Err(Outcome::OutOfMemory(
            self.out_of_memory(req.size, asked),
        )))
    }

    /// Runs one rung for the climb `c`.
    fn step(
        &mut self,
        rung: Rung,
        c: &mut Climb,
        released: Released,
        peers: &dyn Peers,
    ) -> Result<Step, Error> {
        let (req, seg_size) = (c.req, c.seg_size);
        let req = &req;
        let own = |id: Option<BlockId>| id.map_or(Step::Next, |id| Step::Take(Grant::Own(id)));
        let lent = |ptr| Step::Take(Grant::Lent(ptr));
        Ok(match rung {
            Rung::OwnCache => own(self.take_own_cache(req)),
            Rung::MergedCache => {
                if let Some(id) = self.take_merged_cache(req) {
                    return Ok(Step::Take(Grant::Own(id)));
                }
                c.req.kept_whole = self.keeps_whole_for(req);
                Step::Next
            }
            Rung::GarbageCollect => {
                if self.gc_enabled() {
                    self.garbage_collect(peers);
                }
                Step::Next
            }
            Rung::GrowBeforeBorrowing => {
                let first = self.grow_before_borrowing(req, seg_size);
                c.grow_first = Some(first);
                if first == GrowFirst::No {
                    return Ok(Step::Next);
                }
                let grown = self.grow(req, seg_size, peers)?;
                if grown.is_some() && first == GrowFirst::Repeat {
                    self.shared.regrowths.fetch_add(1, Ordering::Relaxed);
                }
                own(grown)
            }
            Rung::BorrowSegment => own(self.borrow_segment(req, seg_size, c.counting(), peers)?),
            Rung::BorrowBlock => {
                let fit = BestFit::KeepingWhole;
                self.borrow_block(req, c.counting(), fit, peers)
                    .map_or(Step::Next, lent)
            }
            Rung::WaitOverBudget if self.over_budget(seg_size) => self
                .pressure_rung(req, peers)
                .map_or(Step::Next, Step::Take),
            Rung::WaitOverBudget => Step::Next,
            Rung::Grow if c.grew_first() => Step::Next,
            Rung::Grow => own(self.grow(req, seg_size, peers)?),
            Rung::KeptWhole => own(self.take_kept_whole(req)),
            Rung::ReleaseOversize => {
                let released = !self.capture_underway()
                    && self.release_available_cached_blocks(req.kind, req.rounded);
                if !released {
                    return Ok(Step::Next);
                }
                own(self.alloc_segment(req, seg_size)?)
            }
            Rung::ReleaseFreePages => {
                if self.capture_underway() || self.vm_release_free(usize::MAX, 0) == 0 {
                    return Ok(Step::Next);
                }
                own(self.vm_grow(req.stream, req.kind, req.rounded)?)
            }
            Rung::PressureWait => self
                .pressure_rung(req, peers)
                .map_or(Step::Next, Step::Take),
            Rung::ReleaseClean if released != Released::Nothing => Step::Next,
            Rung::ReleaseClean => self.across_shards(c, Outcome::NeedsCleanRelease),
            Rung::ReleaseOthers => self.across_shards(c, Outcome::NeedsAllReleased),
            Rung::ReleaseOwn => {
                let (index, size) = (self.index, req.size);
                let range = (self.shared.markers)
                    .range_held(|| format!("npualloc.oom_retry {size}B dev{index}"));
                c._retry_range = Some(range);
                c.released_own = self.release_cached_blocks().is_ok();
                self.count_retry();
                Step::Next
            }
            Rung::FreeListsAgain => own(self.get_free_block(req.kind, req.rounded)),
            Rung::GrowAfterRelease if !c.released_own => Step::Next,
            Rung::GrowAfterRelease => own(self.regrow(req, seg_size)?),
            Rung::BorrowAfterRelease => {
                let fit = BestFit::Plain;
                self.borrow_block(req, Counting::Uncounted, fit, peers)
                    .map_or(Step::Next, lent)
            }
            Rung::SmallSpill => own(self.take_large_for_small(req)),
        })
    }

    /// A rung across shards: the caller's `outcome`, or during a graph capture (which
    /// must not synchronise) out of memory now.
    fn across_shards(&mut self, c: &Climb, outcome: Outcome) -> Step {
        if !self.capture_underway() {
            return Step::Stop(outcome);
        }
        let asked = self.failed_growth(&c.req, c.seg_size);
        Step::Stop(Outcome::OutOfMemory(self.out_of_memory(c.req.size, asked)))
    }

    /// The rung `MergedCache`: the hot cache merged into the free lists (its blocks may
    /// combine into a fit), best fit again.
    fn take_merged_cache(&mut self, req: &Request) -> Option<BlockId> {
        if self.flush_hot() {
            return self.get_own_free_block(req.kind, req.rounded);
        }
        None
    }

    /// Counts an allocation that needed caches released and a retry (PyTorch's
    /// `num_alloc_retries`).
    pub fn count_retry(&mut self) {
        self.acct.count_retry();
    }

    /// Counts an OOM and builds its error, with torch_npu's message.
    pub(super) fn out_of_memory(&mut self, size: usize, seg_size: usize) -> Error {
        let index = self.index;
        self.acct.count_oom();
        let info = self.dev.mem_info(index).ok();
        Error::OutOfMemory {
            requested: size,
            message: oom::message(
                self.dev.name(),
                index,
                size,
                seg_size,
                info,
                self.shared.allowed_max(),
                self.acct.stats(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, malloc_ok, shard};
    use super::super::{NoPeers, Released};
    use crate::device::MempoolId;
    use crate::error::Error;
    use crate::pool::PoolKind;

    #[test]
    fn a_request_is_sized_once_for_its_pool() {
        let (_sim, st) = shard("");
        let r = st.request(1000).unwrap();
        assert_eq!((r.size, r.rounded, r.kind), (1000, 1024, PoolKind::Small));
        assert_eq!(r.stream, st.stream);
        let r = st.request((3 << 20) + 1).unwrap();
        assert_eq!((r.rounded, r.kind), ((3 << 20) + 512, PoolKind::Large));
        assert!(matches!(
            st.request(usize::MAX),
            Err(Error::SizeTooLarge { .. })
        ));
    }

    #[test]
    fn request_padding_moves_a_request_across_a_rounding_step() {
        // torch_npu's preset pads by 32 bytes before rounding: 512 B takes 1 KiB, and
        // 2 MiB takes 2 MiB + 512 B (the device's own padding, 0 here, is not added).
        let (_sim, st) = shard(crate::config::TORCH_NPU_POLICY);
        assert_eq!(st.request(512).unwrap().rounded, 1024);
        assert_eq!(st.request(2 << 20).unwrap().rounded, (2 << 20) + 512);
        let (_sim, st) = shard(crate::config::PYTORCH_POLICY);
        assert_eq!(st.request(512).unwrap().rounded, 512);
    }

    #[test]
    fn the_own_cache_serves_a_repeat_without_a_device_malloc() {
        let (sim, mut st) = shard("");
        let p = malloc_ok(&mut st, 1000);
        free(&mut st, p);
        let q = malloc_ok(&mut st, 1000);
        assert_eq!(p, q);
        assert_eq!(sim.counters(0).mallocs, 1);
        check(&st);
    }

    #[test]
    fn only_the_last_rung_reports_out_of_memory() {
        let (_sim, mut st) = shard("");
        // 2 GiB on a 1 GiB device: the shard's own rungs fail, its climb stops at the
        // first rung across shards; after those, out of memory.
        assert!(matches!(
            st.malloc(2 << 30, Released::Nothing, &NoPeers).unwrap(),
            super::Outcome::NeedsCleanRelease
        ));
        assert_eq!(st.acct.stats().num_ooms, 0);
        let e = st
            .malloc(2 << 30, Released::Others, &NoPeers)
            .unwrap()
            .unwrap_oom();
        assert!(matches!(e, Error::OutOfMemory { .. }));
        assert_eq!(
            (st.acct.stats().num_ooms, st.acct.stats().num_alloc_retries),
            (1, 1)
        );
        check(&st);
    }

    #[test]
    fn a_capture_is_out_of_memory_at_once() {
        let (_sim, mut st) = shard("");
        st.begin_allocate_to_pool(MempoolId(1, 1)).unwrap();
        let e = st
            .malloc(2 << 30, Released::Nothing, &NoPeers)
            .unwrap()
            .unwrap_oom();
        assert!(matches!(e, Error::OutOfMemory { .. }));
        assert_eq!(st.acct.stats().num_alloc_retries, 0);
    }
}
