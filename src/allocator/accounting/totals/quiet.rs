//! Quiet mode: the shards log nothing while no device-wide peak can rise, and a quiet
//! shard runs the same code as a shard that logs nothing at all.
//!
//! A shard's log is off (one shard, or `exact_stats:False`), quiet or loud
//! ([`Mode`]). At a merge (every shard locked) each shard gets, per statistic, an
//! *allowance* at least its current value, the allowances of a statistic summing to
//! at most its device-wide peak ([`allowances`]). Then the merge clears
//! `Shared::stats_logging` and every shard goes quiet. While every shard is within
//! its allowances, the sum of the currents is at most the peak: nothing that happens
//! quietly can raise a peak.
//!
//! The cost of a quiet change is nil beyond the unlogged one. Whether an operation's
//! changes are logged is one load of the flag: set → the logged copy (a quiet shard
//! wakes first: it turns loud, its base is its value then); clear → the plain copy,
//! the one a shard that logs nothing runs. The two hot functions (a found block handed
//! out, a caller's free) load it once per operation (and not at all while the logs
//! are off: one stream tests its own mode, as before), every other change once per
//! group. The allowance test costs nothing either: an increase already compares each
//! statistic's new value with its peak, and a quiet shard's (window) peak is never
//! above its allowance (it starts at the current value at the merge, at most the
//! allowance, and rises quietly only within it), so a value past its allowance is
//! past its peak. That comparison's branch, not taken at steady state, leaves the
//! group for a cold, out-of-line handler (`Accounting::rose`, given the group's
//! words, constants at the call site, and how much of the group is made), which
//! makes the rest of the group, raises the peaks and calls [`StatLog::over_peak`]:
//! when the shard is quiet and a value passed its allowance, it *passes the
//! allowance*: sets the flag (SeqCst) before logging, turns loud with as base its
//! values before the group (the current values less the group's changes), and logs
//! the whole group. From then on the shard logs every change (a group after the
//! pass, in the same plain copy, is told so by the handler's return), and so does
//! every other shard from its first load of the flag that sees it set. Decreases cost nothing extra. A shard created in
//! quiet mode has no allowance: its first increase passes it.
//!
//! Replay (`Totals::replay`) starts from the sums of the shards' bases (each shard's
//! value just before its first logged change, or its value at the cut when it logged
//! nothing) and applies the logged changes in stamp order. Why that is a valid
//! linearisation: a quiet change is made by an operation (or group) whose load of the
//! flag read "clear", so (coherence of the one flag) that load reads before the
//! store that set it, and no logged change happens before the load (a logged change
//! comes after that store in its thread, or after a load that saw it; whatever
//! happens after it through a shard lock or program order sees the flag set:
//! write-read coherence). A hot function makes no visit to another shard between its
//! load and its last change and takes no other lock (but for the return of a lent
//! block, whose capture test may take the capturing streams' lock: `free` loads the
//! flag again after it), so nothing logged on another shard happens before any of
//! its changes through a lock either; the slow paths that visit other shards
//! (lending, reclaiming) load the flag per group. So ordering
//! every quiet change before every logged one contradicts no happens-before edge,
//! and within a shard the quiet changes all precede the logged ones (a shard turns
//! loud at its first logged change and never goes quiet again before the next
//! merge). Along that order the quiet prefix keeps every shard within its allowance
//! (a shard's value at any point of it is its start value or a quiet value, each
//! tested against the allowance by the peak comparison), so it raises no peak; it
//! ends at the bases; the logged suffix is ordered by stamps as before. Visits change
//! the visited shard's statistics through its own log, so they obey its mode and
//! allowance. Per-stream peaks stay exact: an increase raises the shard's own peaks
//! whatever its mode.
//!
//! Orderings: the loads are Acquire (only per-location coherence and the
//! happens-before the shard locks give are used; on x86-64 any load is a plain
//! `mov`), the rare store SeqCst. The merge writes the flag with every shard locked,
//! so every operation after it (which takes a shard lock) sees its value or a later
//! one. The flag has a cache line of its own (`Shared::stats_logging`).

use std::sync::atomic::Ordering;

use super::{for_slots, stat_at, unpack, Mode, StatLog, NO_SLOT, SLOTS};
use crate::stats::DeviceStats;

/// The room of the aggregate slot of the oversize counters (never read).
const UNBOUNDED: i64 = i64::MAX / 4;

impl StatLog {
    /// Whether `Shared::stats_logging` is set (a log with no allocator never logs).
    #[inline(always)]
    pub fn flag(&self) -> bool {
        self.link
            .as_ref()
            .is_some_and(|l| l.stats_logging().load(Ordering::Acquire))
    }

    /// Whether the shard logs every change (until the next merge).
    #[inline(always)]
    pub fn is_loud(&self) -> bool {
        self.mode == Mode::Loud
    }

    /// The flag was seen set: a quiet shard turns loud, its base its values now (before
    /// the changes about to be logged).
    #[cold]
    #[inline(never)]
    pub fn wake(&mut self, stats: &DeviceStats) {
        debug_assert_ne!(
            self.mode,
            Mode::Off,
            "the flag is clear while the logs are off"
        );
        if self.mode == Mode::Quiet {
            for_slots(&mut stats.clone(), |i, s| self.base[i] = s.current);
        }
        self.mode = Mode::Loud;
    }

    /// An increase group (`words`, already applied to `stats`, the shard's own
    /// statistics, whose peaks were raised) took a value past its peak: when the shard is
    /// quiet and a value passed its allowance, passes it (see the module doc). Returns
    /// whether it logged the group (the shard is loud from now on).
    #[cold]
    #[inline(never)]
    pub fn over_peak<const N: usize>(&mut self, stats: &DeviceStats, words: [u64; N]) -> bool {
        if self.mode != Mode::Quiet {
            return false;
        }
        let mut stats = *stats;
        let mut passed = false;
        for &w in &words {
            let (own, agg, _) = unpack(w);
            for i in [own, agg].into_iter().filter(|&i| i != NO_SLOT) {
                passed |= stat_at(&mut stats, i).current > self.allow[i];
            }
        }
        if !passed {
            return false;
        }
        if let Some(link) = &self.link {
            link.stats_logging().store(true, Ordering::SeqCst);
        }
        for_slots(&mut stats, |i, s| self.base[i] = s.current);
        for &w in &words {
            let (own, agg, delta) = unpack(w);
            self.base[own] -= delta;
            self.base[agg] -= delta;
        }
        self.mode = Mode::Loud;
        self.record(words);
        true
    }

    /// Enters quiet mode with `room` (allowance less current, per slot) at a merge of
    /// the shard at `stats` (whose peaks were just restarted from its currents).
    pub fn go_quiet(&mut self, room: [i64; SLOTS], stats: &DeviceStats) {
        self.mode = Mode::Quiet;
        for_slots(&mut stats.clone(), |i, s| {
            self.allow[i] = s.current + room[i]
        });
        self.allow[NO_SLOT] = UNBOUNDED;
    }

    /// In a window that began quiet, at the cut (the shard at `stats`): per slot, the
    /// shard's value before its first logged change, or its current value when it
    /// logged nothing (the replay's start, `Totals::replay`).
    pub fn base(&self, stats: &DeviceStats) -> [i64; SLOTS] {
        let mut out = [0; SLOTS];
        for_slots(&mut stats.clone(), |i, s| {
            out[i] = match self.mode {
                Mode::Loud => self.base[i],
                Mode::Quiet | Mode::Off => s.current,
            }
        });
        out
    }

    /// Logs every change until the next merge (a merge that could give no allowances;
    /// the flag is set).
    pub fn go_loud(&mut self) {
        self.mode = Mode::Loud;
    }

    /// A shard created while the logs are on: quiet with no allowance (its first
    /// increase passes it), or loud from its first change when the flag is set.
    pub fn start_quiet(&mut self) {
        self.mode = Mode::Quiet;
        self.allow = [0; SLOTS];
        self.allow[NO_SLOT] = UNBOUNDED;
    }
}

/// Every shard's room (allowance less current, per slot) for a quiet window after a
/// cut at `shards` (their currents and window peaks) with device-wide peaks at least
/// `peak`; `None` when some statistic's currents already sum above `peak`.
///
/// A statistic's allowances are the shards' window peaks when those sum to at most
/// the peak (a steady state stays quiet), else their currents, plus an even share of
/// what is left of the peak.
pub(crate) fn allowances(
    shards: &[&DeviceStats],
    peak: &[i64; SLOTS],
) -> Option<Vec<[i64; SLOTS]>> {
    let n = shards.len();
    let (mut cur, mut top) = (vec![[0i64; SLOTS]; n], vec![[0i64; SLOTS]; n]);
    for (k, st) in shards.iter().enumerate() {
        for_slots(&mut (**st).clone(), |i, s| {
            cur[k][i] = s.current;
            top[k][i] = s.peak.max(s.current);
        });
    }
    let mut rooms = vec![[0i64; SLOTS]; n];
    for i in (0..SLOTS).filter(|&i| i != NO_SLOT) {
        let bound: i64 = top.iter().map(|t| t[i]).sum();
        let sum: i64 = cur.iter().map(|c| c[i]).sum();
        let (from, slack) = if bound <= peak[i] {
            (&top, peak[i] - bound)
        } else if sum <= peak[i] {
            (&cur, peak[i] - sum)
        } else {
            return None;
        };
        for k in 0..n {
            rooms[k][i] = from[k][i] + slack / n as i64 - cur[k][i];
        }
    }
    for r in &mut rooms {
        r[NO_SLOT] = UNBOUNDED;
    }
    Some(rooms)
}
