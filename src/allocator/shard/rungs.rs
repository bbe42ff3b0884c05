//! The ladder's rungs and their order, as data: [`Rung`] names each step of the miss
//! path, [`Ladder`] is the list one allocator's policy asks for, built once. What each
//! rung does, and the climb over the list, is `ladder.rs`. A leaf: pure data.

use super::request::Released;
use crate::config::Config;
use crate::policy::Policy;

/// One rung of the ladder (`ladder.rs`'s module doc: what each tries, in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rung {
    /// A hot block of the exact size, else best fit in this stream's free lists.
    OwnCache,
    /// The hot cache merged into the free lists, best fit again; on a miss, whether
    /// best fit's block is a segment kept whole for the request (`Request::kept_whole`).
    MergedCache,
    /// PyTorch's garbage collection of old cached blocks.
    GarbageCollect,
    /// A repeat borrower or a steady stream grows its own cache before it borrows.
    GrowBeforeBorrowing,
    /// A wholly free segment of another stream.
    BorrowSegment,
    /// A free block of another stream.
    BorrowBlock,
    /// Past the reserve budget: a device-side wait for a pending free before growth.
    WaitOverBudget,
    /// A new segment (or pages), unless the climb grew first.
    Grow,
    /// The segment kept whole for the request, growth having failed.
    KeptWhole,
    /// Oversize cached blocks of this stream back, then a new segment.
    ReleaseOversize,
    /// Free pages of this stream back, then pages mapped.
    ReleaseFreePages,
    /// A device-side wait for a pending free that fits.
    PressureWait,
    /// Across shards: every stream's cached segments that need no host wait back.
    ReleaseClean,
    /// Across shards: the other streams' caches back.
    ReleaseOthers,
    /// This stream's pending frees synchronised and its cache back.
    ReleaseOwn,
    /// Best fit again in this stream's free lists.
    FreeListsAgain,
    /// A new segment (or pages) with nothing given back first.
    GrowAfterRelease,
    /// Another stream's free block, plain best fit.
    BorrowAfterRelease,
    /// A small request takes a block of this stream's large pool.
    SmallSpill,
}

/// Rungs in the longest ladder.
const MAX_RUNGS: usize = 19;

/// The rungs of one allocator's ladder, in order; built once from its settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ladder {
    rungs: [Rung; MAX_RUNGS],
    len: usize,
    /// Where a climb after `ReleaseOthers` goes on past the cache rungs.
    after_others: usize,
}

impl Ladder {
    /// The ladder of `policy`, with PyTorch's settings `config` (`ladder.rs`).
    pub fn new(policy: &Policy, config: &Config) -> Ladder {
        use Rung::*;
        let p = policy;
        let mut l = Ladder {
            rungs: [OwnCache; MAX_RUNGS],
            len: 0,
            after_others: 0,
        };
        l.push(OwnCache, true);
        l.push(MergedCache, true);
        l.push(GarbageCollect, config.garbage_collection_threshold > 0.0);
        l.push(GrowBeforeBorrowing, p.grows_before_borrowing());
        l.push(BorrowSegment, p.lend_segments);
        l.push(BorrowBlock, p.lend_blocks);
        l.push(
            WaitOverBudget,
            p.pressure_wait && config.reserve_budget.is_some(),
        );
        l.push(Grow, true);
        l.push(KeptWhole, p.keep_whole);
        l.push(ReleaseOversize, config.max_split_size != usize::MAX);
        l.push(ReleaseFreePages, p.expandable_segments);
        l.push(PressureWait, p.pressure_wait);
        l.push(ReleaseClean, p.release_clean);
        l.push(ReleaseOthers, true);
        l.after_others = l.len;
        l.push(ReleaseOwn, true);
        l.push(FreeListsAgain, p.look_again);
        l.push(GrowAfterRelease, true);
        l.push(BorrowAfterRelease, p.look_again && p.lend_blocks);
        l.push(SmallSpill, p.small_spill);
        l
    }

    fn push(&mut self, rung: Rung, wanted: bool) {
        if wanted {
            self.rungs[self.len] = rung;
            self.len += 1;
        }
    }

    /// The rungs in order.
    pub fn rungs(&self) -> &[Rung] {
        &self.rungs[..self.len]
    }

    /// The rungs a miss climbs (the own cache was tried): every other one, or after
    /// `ReleaseOthers` the merged cache and the rungs after it.
    pub fn climb(&self, released: Released) -> impl Iterator<Item = Rung> + '_ {
        let from = match released {
            Released::Others => self.after_others,
            Released::Nothing | Released::Clean => 2,
        };
        let rungs = self.rungs();
        rungs[1..2].iter().chain(&rungs[from..]).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{Ladder, Released, Rung};
    use crate::config::{Config, PYTORCH_POLICY};
    use crate::policy::Policy;

    fn ladder(conf: &str) -> Vec<Rung> {
        let config = Config::parse(conf).unwrap();
        Ladder::new(&Policy::from_config(&config), &config)
            .rungs()
            .to_vec()
    }

    #[test]
    fn each_setting_builds_its_own_ladder() {
        use Rung::*;
        assert_eq!(
            ladder(""),
            [
                OwnCache,
                MergedCache,
                GrowBeforeBorrowing,
                BorrowSegment,
                BorrowBlock,
                Grow,
                KeptWhole,
                PressureWait,
                ReleaseClean,
                ReleaseOthers,
                ReleaseOwn,
                FreeListsAgain,
                GrowAfterRelease,
                BorrowAfterRelease,
                SmallSpill,
            ]
        );
        // PyTorch's malloc: the cache, GC, grow, release oversize and grow, release
        // everything and grow.
        assert_eq!(
            ladder(&format!(
                "{PYTORCH_POLICY},max_split_size_mb:64,garbage_collection_threshold:0.5"
            )),
            [
                OwnCache,
                MergedCache,
                GarbageCollect,
                Grow,
                ReleaseOversize,
                ReleaseOthers,
                ReleaseOwn,
                GrowAfterRelease,
            ]
        );
        assert_eq!(
            ladder("expandable_segments:True,reserve_budget_mb:100"),
            [
                OwnCache,
                MergedCache,
                BorrowBlock,
                Grow,
                ReleaseFreePages,
                ReleaseOthers,
                ReleaseOwn,
                FreeListsAgain,
                GrowAfterRelease,
                BorrowAfterRelease,
            ]
        );
        assert!(ladder("reserve_budget_mb:100").contains(&WaitOverBudget));
    }

    #[test]
    fn a_climb_after_the_others_released_looks_at_the_caches_then_goes_on_past_them() {
        let l = Ladder::new(&Policy::npualloc(), &Config::default());
        let rungs: Vec<Rung> = l.climb(Released::Others).collect();
        assert_eq!(rungs[0], Rung::MergedCache);
        assert_eq!(rungs[1], Rung::ReleaseOwn);
        let all: Vec<Rung> = l.climb(Released::Nothing).collect();
        assert_eq!(all, l.rungs()[1..]);
    }
}
