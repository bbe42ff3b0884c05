//! The device-wide statistics of a [`CachingAllocator`]: reading and resetting them,
//! and the merges of the shards' statistics logs (`accounting/totals.rs`) that make every
//! aggregate current value and peak exact over any number of streams and threads.

use std::sync::atomic::Ordering;

use super::accounting::totals::{allowances, sum_stats, Plan, Totals, SLOTS};
use super::shard::ShardState;
use super::CachingAllocator;
use crate::stats::DeviceStats;

impl CachingAllocator {
    /// A copy of the statistics (PyTorch's `DeviceStats`; its per-pool map is
    /// [`private_pool_stats`](Self::private_pool_stats)), taken with every shard
    /// locked: totals, counters and current values are the sums over the shards.
    ///
    /// Every aggregate current value and peak is exact whatever the number of streams
    /// and threads, as PyTorch's (one lock over all streams) are: a peak is the highest
    /// value the device-wide sum took since the last reset, including inside one
    /// operation. With one stream that is the shard's own peak; from the second stream
    /// on, every change to a statistic with a peak is also logged by its shard and the
    /// logs are replayed in the order the changes happened (`totals.rs`). Per-pool
    /// (small, large) peaks are exact the same way; the reserved-bytes peak is also
    /// bounded below by the device-wide reserve counter. With `exact_stats:False` no
    /// logs are kept: with several streams the aggregate peaks are then the larger of
    /// each stream's peak and the sum of the current values (a lower bound).
    pub fn stats(&self) -> DeviceStats {
        let mut totals = self.shared.totals.lock();
        let mut per = Vec::new();
        self.cut(&mut totals, false, |st| per.push(st.stats_snapshot()));
        let mut out = match per.len() {
            0 => DeviceStats {
                max_split_size: i64::try_from(self.shared.config.max_split_size)
                    .unwrap_or(i64::MAX),
                ..DeviceStats::default()
            },
            1 => per.pop().expect("one shard"),
            _ => sum_stats(&per),
        };
        if totals.enabled {
            debug_assert!(
                totals.currents_match(&out),
                "logs replay to the shards' sums"
            );
            totals.fill(&mut out);
        }
        drop(totals);
        out.reserved_bytes[0].peak = out.reserved_bytes[0]
            .peak
            .max(self.shared.reserved_peak.load(Ordering::Relaxed) as i64);
        out
    }

    /// Sets every peak statistic to its current value (PyTorch's `resetPeakStats`),
    /// per stream and device-wide, with every shard locked.
    pub fn reset_peak_stats(&self) {
        let mut totals = self.shared.totals.lock();
        self.cut(&mut totals, true, |st| {
            st.acct.reset_peak();
        });
        totals.reset_peak();
        self.shared
            .reserved_peak
            .store(self.shared.reserved(), Ordering::Relaxed);
        self.shared.private_reserved.lock().reset_peak();
    }

    /// Locks every shard in creation order (`totals` is held: the statistics' lock
    /// order), runs `f` on each with all of them held, and merges their statistics
    /// logs into `totals`: cleared in place when the window cannot have raised a peak,
    /// else swapped out and replayed after the shards are unlocked.
    ///
    /// No deadlock: a thread holding a shard takes others only with `try_lock`, and
    /// nothing waits for `totals` with a shard held.
    fn cut(&self, totals: &mut Totals, reset: bool, mut f: impl FnMut(&mut ShardState)) {
        let shards = self.shards.all();
        let mut guards: Vec<_> = shards.iter().map(|s| s.lock()).collect();
        guards.iter_mut().for_each(|st| f(st));
        if !totals.enabled {
            return;
        }
        let per: Vec<DeviceStats> = guards.iter().map(|st| *st.acct.stats()).collect();
        let refs: Vec<&DeviceStats> = per.iter().collect();
        let plan = totals.plan(&refs);
        // Quiet mode for the next window (`totals/quiet.rs`) when the allowances can be
        // given: against the peaks before this window's replay (which can only raise
        // them), or after a reset the currents.
        let rooms = allowances(&refs, &if reset { plan.sum() } else { totals.peaks() });
        self.shared
            .stats_logging
            .store(rooms.is_none(), Ordering::SeqCst);
        let mut logs = Vec::new();
        let mut start = totals.quiet.then_some([0i64; SLOTS]);
        for (k, st) in guards.iter_mut().enumerate() {
            let acct = &mut st.acct;
            if let Some(start) = &mut start {
                let base = acct.log_base();
                start.iter_mut().zip(base).for_each(|(s, b)| *s += b);
            }
            let spare = matches!(plan, Plan::Replay(_)).then(|| totals.spare());
            logs.extend(acct.cut_log(spare, rooms.as_ref().map(|r| r[k])));
        }
        self.shared.take_merge();
        drop(guards);
        match plan {
            Plan::Skip(sum) => totals.skip(sum),
            Plan::Replay(sum) => totals.replay(logs, sum, start),
        }
        totals.quiet = rooms.is_some();
    }

    /// Merges the statistics logs because one is full (`Shared::ask_merge`; called
    /// with no lock held).
    #[cold]
    #[inline(never)]
    pub(super) fn merge_logs(&self) {
        let mut totals = self.shared.totals.lock();
        if self.shared.merge_asked() {
            self.cut(&mut totals, false, |_| {});
        }
    }

    /// Zeroes the accumulated (`allocated`/`freed`) statistics and counters.
    pub fn reset_accumulated_stats(&self) {
        for s in self.shards.all() {
            s.lock().acct.reset_accumulated();
        }
        self.shared.private_reserved.lock().reset_accumulated();
    }
}
