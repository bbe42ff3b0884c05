//! Exact statistics, in one place: each shard's own counts ([`Accounting`], what a
//! shard holds counted as PyTorch's `DeviceStats`), and the logs of their changes and
//! the device-wide totals rebuilt from them (`totals.rs`, `totals/quiet.rs`). The
//! allocator's statistics methods that read, reset and merge them are
//! `../statistics.rs`.
//!
//! Invariant (checked by `../invariants.rs`): `reserved` and every current statistic of
//! a shard equal a recount of its blocks; device-wide, see `totals.rs`.

pub(crate) mod totals;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::stats::{DeviceStats, StatType};
pub(crate) use totals::Kind;
use totals::{pack, stat_at, unpack, Mode, StatLog, NO_SLOT, SLOTS};

/// What the shard holds, counted as PyTorch's statistics.
#[derive(Default)]
pub(crate) struct Accounting {
    /// PyTorch's statistics of this shard, but for the accumulated counts: a decrease
    /// only lowers `current` (one store fewer per decrease on the fast paths), and
    /// `freed` holds the statistic's `current` at the last reset of the accumulated
    /// counts, from which [`snapshot`](Self::snapshot) derives the true `freed`
    /// (`allocated` − `current` + that); an array's aggregate `allocated` is not kept
    /// either (one store fewer per increase): it is the sum of its pools'. Read it
    /// through `snapshot`, or for `current` and `peak`.
    stats: DeviceStats,
    /// Device bytes this shard holds.
    reserved: usize,
    /// Highest `reserved` of this shard (sizes its adaptive segments).
    reserved_hwm: usize,
    /// Pending frees taken under memory pressure by a device-side wait (`pressure.rs`).
    device_waits: u64,
    /// This shard's changes to statistics with a peak, for the device-wide peaks
    /// (`totals.rs`).
    log: StatLog,
}

impl Accounting {
    /// Adds `amount` to `kind` in `pool` and in the aggregate (the oversize counters
    /// take [`StatType::Aggregate`]), logged or not as the flag says.
    #[inline(always)]
    pub fn increase(&mut self, kind: Kind, pool: StatType, amount: usize) {
        self.increase_all(pool, &[(kind, amount)]);
    }

    /// Subtracts `amount` from `kind` in `pool` and in the aggregate, and logs it.
    #[inline(always)]
    pub fn decrease(&mut self, kind: Kind, pool: StatType, amount: usize) {
        self.decrease_all(pool, &[(kind, amount)]);
    }

    /// Whether the changes about to be made are logged: one load of
    /// `Shared::stats_logging` (`totals/quiet.rs`); a quiet shard that sees it set
    /// turns loud; not loaded at all while the logs are off (one stream: a test of the
    /// shard's own mode, as before quiet mode). The slow paths call it per group of
    /// changes (a visit to another shard may come between two groups); the hot
    /// functions once per operation, through [`logging_by`](Self::logging_by).
    #[inline(always)]
    pub fn logging(&mut self) -> bool {
        if self.log.mode == Mode::Off {
            return false;
        }
        let on = self.log.flag();
        self.heed(on)
    }

    /// [`logging`](Self::logging) for the hot functions: `flag` is the shard's
    /// `Shared::stats_logging` (one load fewer than through the log), not loaded at
    /// all while the logs are off (one stream: a test of the shard's own mode, as
    /// before quiet mode).
    #[inline(always)]
    pub fn logging_by(&mut self, flag: &AtomicBool) -> bool {
        if self.log.mode == Mode::Off {
            return false;
        }
        let on = flag.load(Ordering::Acquire);
        self.heed(on)
    }

    #[inline(always)]
    fn heed(&mut self, on: bool) -> bool {
        if on && !self.log.is_loud() {
            self.log.wake(&self.stats);
        }
        on
    }

    /// Several increases in `pool`, in order, with one load of the flag (the fast paths
    /// make their changes in groups: a shard that logs nothing pays one test per group).
    #[inline(always)]
    pub fn increase_all<const N: usize>(&mut self, pool: StatType, changes: &[(Kind, usize); N]) {
        let logged = self.logging();
        self.increase_all_as(logged, pool, changes);
    }

    /// `increase_all` where the caller knows whether the changes are logged (`logged`, a
    /// constant in the copies `free_lists.rs` dispatches to: no test at all). Returns
    /// whether the shard logs from now on: `logged`, or a quiet shard's group that
    /// passed its allowance (the changes after it, in the same operation, are logged).
    ///
    /// Each statistic's new value is compared with its peak (and raises it), as without
    /// the logs; a group that raised one takes the cold handler with the group's words,
    /// which tests a quiet shard's allowances (`StatLog::over_peak`,
    /// `totals/quiet.rs`).
    #[inline(always)]
    pub fn increase_all_as<const N: usize>(
        &mut self,
        logged: bool,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) -> bool {
        debug_assert_eq!(logged, self.log.is_loud(), "a loud shard logs every change");
        // One branch on the pool, then every statistic at a constant offset (a pool
        // index known only at run time is recomputed for each statistic).
        let passed = match pool {
            StatType::SmallPool => self.add_all::<1, N>(pool, changes),
            StatType::LargePool => self.add_all::<2, N>(pool, changes),
            StatType::Aggregate => self.add_all::<0, N>(pool, changes),
        };
        if passed {
            return true;
        }
        if logged {
            self.log.record(words(pool, changes, 1));
        }
        logged
    }

    /// Several decreases in `pool`, in order, with one load of the flag.
    #[inline(always)]
    pub fn decrease_all<const N: usize>(&mut self, pool: StatType, changes: &[(Kind, usize); N]) {
        let logged = self.logging();
        self.decrease_all_as(logged, pool, changes);
    }

    /// `decrease_all` where the caller knows whether the changes are logged (see
    /// `increase_all_as`; a decrease passes no peak and no allowance).
    #[inline(always)]
    pub fn decrease_all_as<const N: usize>(
        &mut self,
        logged: bool,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) {
        debug_assert_eq!(logged, self.log.is_loud(), "a loud shard logs every change");
        match pool {
            StatType::SmallPool => self.sub_all::<1, N>(changes),
            StatType::LargePool => self.sub_all::<2, N>(changes),
            StatType::Aggregate => self.sub_all::<0, N>(changes),
        }
        if logged {
            self.log.record(words(pool, changes, -1));
        }
    }

    /// `increase_all`'s updates, pool `P` (`pool`). Each new value is compared with its
    /// peak, a compare and a branch per statistic as the plain peak update was; a
    /// value past its peak leaves the group to the cold [`rose`](Self::rose) (which
    /// makes the rest of it). Returns whether that logged the group.
    #[inline(always)]
    fn add_all<const P: usize, const N: usize>(
        &mut self,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) -> bool {
        for (i, &(kind, amount)) in changes.iter().enumerate() {
            let a = amount as i64;
            match kind.array_mut(&mut self.stats) {
                Some(arr) => {
                    debug_assert_ne!(P, 0, "a change to an array names its pool");
                    // The aggregate's `allocated` is the pools' sum (`snapshot`).
                    let agg = &mut arr[StatType::Aggregate as usize];
                    agg.current += a;
                    if agg.current > agg.peak {
                        return self.rose(i, true, words(pool, changes, 1));
                    }
                    let own = &mut arr[P];
                    own.current += a;
                    own.allocated += a;
                    if own.current > own.peak {
                        return self.rose(i + 1, false, words(pool, changes, 1));
                    }
                }
                None => {
                    let s = kind.stat_mut(&mut self.stats, StatType::Aggregate);
                    s.current += a;
                    s.allocated += a;
                    if s.current > s.peak {
                        return self.rose(i + 1, false, words(pool, changes, 1));
                    }
                }
            }
        }
        false
    }

    /// An increase group (`words`) took a value past its peak: its first `done` changes
    /// are made, and change `done`'s aggregate too when `agg_done`. Makes the rest,
    /// raises the peaks, and tests a quiet shard's allowances (`StatLog::over_peak`).
    /// Returns whether the group was logged.
    #[cold]
    #[inline(never)]
    fn rose<const N: usize>(&mut self, done: usize, agg_done: bool, words: [u64; N]) -> bool {
        for (k, &w) in words.iter().enumerate().skip(done) {
            let (own, agg, delta) = unpack(w);
            let s = stat_at(&mut self.stats, own);
            s.current += delta;
            s.allocated += delta;
            if agg != NO_SLOT && !(k == done && agg_done) {
                stat_at(&mut self.stats, agg).current += delta;
            }
        }
        for &w in &words {
            let (own, agg, _) = unpack(w);
            for i in [own, agg].into_iter().filter(|&i| i != NO_SLOT) {
                let s = stat_at(&mut self.stats, i);
                s.peak = s.peak.max(s.current);
            }
        }
        self.log.over_peak(&self.stats, words)
    }

    /// `decrease_all`'s updates, pool `P`: `current` only (see [`stats`](Self::stats)).
    #[inline(always)]
    fn sub_all<const P: usize, const N: usize>(&mut self, changes: &[(Kind, usize); N]) {
        for &(kind, amount) in changes {
            let a = amount as i64;
            match kind.array_mut(&mut self.stats) {
                Some(arr) => {
                    arr[StatType::Aggregate as usize].current -= a;
                    arr[P].current -= a;
                }
                None => kind.stat_mut(&mut self.stats, StatType::Aggregate).current -= a,
            }
        }
    }

    /// The shard's statistics with every `freed` derived (see [`stats`](Self::stats)).
    pub fn snapshot(&self) -> DeviceStats {
        let mut s = self.stats;
        s.for_each_array(|arr| arr[0].allocated = arr[1].allocated + arr[2].allocated);
        s.for_each_stat(|st| st.freed += st.allocated - st.current);
        s
    }

    /// Zeroes the accumulated counts (`allocated`, `freed`, the event counters).
    pub fn reset_accumulated(&mut self) {
        self.stats.reset_accumulated();
        self.stats.for_each_stat(|st| st.freed = st.current);
    }

    /// Adds a signed `net` change (nothing when zero).
    #[inline(always)]
    pub fn apply_net(&mut self, kind: Kind, pool: StatType, net: i64) {
        match net.cmp(&0) {
            std::cmp::Ordering::Greater => self.increase(kind, pool, net as usize),
            std::cmp::Ordering::Less => self.decrease(kind, pool, net.unsigned_abs() as usize),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// The accounting of a shard whose statistics log is `log` (off until the logs go
    /// on).
    pub fn new(log: StatLog) -> Self {
        Accounting {
            log,
            ..Accounting::default()
        }
    }

    /// The shard's statistics as kept (see the field; [`snapshot`](Self::snapshot)
    /// derives the accumulated counts).
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// The shard's statistics with every `freed` derived and its per-stream peaks its
    /// own (`StatLog::stream_peaks`).
    pub fn stream_snapshot(&self) -> DeviceStats {
        let mut s = self.snapshot();
        self.log.stream_peaks(&mut s);
        s
    }

    /// Device bytes this shard holds.
    #[inline]
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// The highest `reserved` of this shard.
    #[inline]
    pub fn reserved_hwm(&self) -> usize {
        self.reserved_hwm
    }

    /// `bytes` more device memory held (its high-water mark follows).
    pub fn add_reserved(&mut self, bytes: usize) {
        self.reserved += bytes;
        self.reserved_hwm = self.reserved_hwm.max(self.reserved);
    }

    /// `bytes` of device memory given back.
    pub fn sub_reserved(&mut self, bytes: usize) {
        self.reserved -= bytes;
    }

    /// `n` device mallocs (segments, or pages mapped).
    pub fn count_device_mallocs(&mut self, n: i64) {
        self.stats.num_device_alloc += n;
    }

    /// `n` device frees (segments, or pages unmapped).
    pub fn count_device_frees(&mut self, n: i64) {
        self.stats.num_device_free += n;
    }

    /// A synchronisation of every pending free (PyTorch's `num_sync_all_streams`).
    pub fn count_sync_all_streams(&mut self) {
        self.stats.num_sync_all_streams += 1;
    }

    /// An allocation that needed caches released and a retry (PyTorch's
    /// `num_alloc_retries`).
    pub fn count_retry(&mut self) {
        self.stats.num_alloc_retries += 1;
    }

    /// An allocation that failed with out of memory (PyTorch's `num_ooms`).
    pub fn count_oom(&mut self) {
        self.stats.num_ooms += 1;
    }

    /// A pending free taken under memory pressure by a device-side wait.
    pub fn count_device_wait(&mut self) {
        self.device_waits += 1;
    }

    /// Pending frees taken by a device-side wait so far (tests).
    #[cfg(test)]
    pub fn device_waits(&self) -> u64 {
        self.device_waits
    }

    /// A new operation begins on the shard (its lock was just taken): the log's next
    /// change takes a new stamp.
    #[inline]
    pub fn begin_op(&mut self) {
        self.log.begin_op();
    }

    /// The logs go on while this shard already exists (the second shard's creation):
    /// loud, a window from its values now.
    pub fn start_logging(&mut self) {
        self.log.start();
        self.log.open_window(&mut self.stats);
    }

    /// A shard created while the logs are on: quiet until its allowance is known.
    pub fn start_logging_quiet(&mut self) {
        self.log.start();
        self.log.start_quiet();
    }

    /// The shard's values before its first logged change in a window that began quiet
    /// (`StatLog::base`), where a merge's replay starts from.
    pub fn log_base(&self) -> [i64; SLOTS] {
        self.log.base(&self.stats)
    }

    /// A merge cuts this shard's log: swapped out for `spare` and returned (to be
    /// replayed), or with no spare cleared in place; then a new window opens, quiet
    /// within the allowance `room`, or loud.
    pub fn cut_log(
        &mut self,
        spare: Option<Vec<u64>>,
        room: Option<[i64; SLOTS]>,
    ) -> Option<Vec<u64>> {
        let logged = match spare {
            Some(spare) => Some(self.log.swap(spare)),
            None => {
                self.log.clear();
                None
            }
        };
        self.log.open_window(&mut self.stats);
        match room {
            Some(room) => self.log.go_quiet(room, &self.stats),
            None => self.log.go_loud(),
        }
        logged
    }

    /// Sets every peak to its current value (PyTorch's `resetPeakStats`).
    pub fn reset_peak(&mut self) {
        self.stats.reset_peak();
        self.log.reset_saved();
    }
}

/// The log words of `changes` to `pool`, each amount times `sign` (a plain loop, fully
/// unrolled: `array::map` is a call, which would make the changes live on the stack
/// before the test of the log).
#[inline(always)]
fn words<const N: usize>(pool: StatType, changes: &[(Kind, usize); N], sign: i64) -> [u64; N] {
    let mut w = [0; N];
    for i in 0..N {
        w[i] = pack(changes[i].0, pool, sign * changes[i].1 as i64);
    }
    w
}
