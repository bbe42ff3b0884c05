//! Quiet mode: the shards log nothing while no device-wide peak can rise.
//!
//! At a merge (every shard locked) each shard gets, per statistic, an *allowance*
//! at least its current value, the allowances of a statistic summing to at most its
//! device-wide peak ([`allowances`]). Then the merge clears `Shared::stats_logging`
//! and every shard goes quiet: a change is not logged while the flag is clear and the
//! shard stays within its allowances (`StatLog::room`, the allowance less the current
//! value, tracked by `StatLog::log_or_stay_quiet`, inlined where the logged copies of
//! the fast paths log: constant slots, no call). While every shard is within its allowances, the sum of the currents is
//! at most the peak: nothing that happens quietly can raise a peak.
//!
//! The first change that would pass a shard's allowance sets the flag (SeqCst)
//! before it is logged; from then on that shard logs every change, and so does every
//! other shard from its first change that sees the flag set (each group of changes
//! loads it, under the shard's lock, before it is logged or not). A shard created in
//! quiet mode has no allowance: its first increase sets the flag.
//!
//! Replay (`Totals::replay`) starts from the sums of the shards' currents at the cut
//! less everything logged (each shard's value just before its first logged change,
//! or its value at the cut when it logged nothing) and applies the logged changes in
//! stamp order. Why that is a valid linearisation: a quiet change loaded "clear"
//! before it was made, so (coherence of the one flag) its load reads before the
//! store that set the flag, and no logged change happens before it (a logged change
//! comes after that store in its thread, or after a load that saw it; whatever
//! happens after it, through a shard lock or program order, sees the flag set:
//! write-read coherence). So ordering every quiet change before every logged one
//! contradicts no happens-before edge, and within a shard the quiet changes all
//! precede the logged ones (a shard never goes quiet again before the next merge).
//! Along that order the quiet prefix keeps every shard within its allowance (a
//! shard's value at any point of it is its start value or a quiet value), so it
//! raises no peak; it ends at the replay's start; the logged suffix is ordered by
//! stamps as before. Visits (lending, reclaiming) change the visited shard's
//! statistics through its own `StatLog`, so they obey its mode and allowance.
//!
//! Orderings: the load is Acquire (only per-location coherence and the
//! happens-before the shard locks give are used; on x86-64 any load is a plain
//! `mov`), the rare store SeqCst. The merge writes the flag with every shard locked,
//! so every operation after it (which takes a shard lock) sees its value or a later
//! one.

use std::sync::atomic::Ordering;

use super::{for_slots, unpack, StatLog, NO_SLOT, SLOTS};
use crate::stats::DeviceStats;

/// The room of the aggregate slot of the oversize counters (never read).
const UNBOUNDED: i64 = i64::MAX / 4;

impl StatLog {
    /// Logs `words` (already applied to the shard's statistics, made by `pack` where
    /// each word's statistic bits fold to constants), unless the shard is quiet and
    /// stays so. Inlined into the logged copies: in quiet mode a group costs its room
    /// updates (constant slots), not a call.
    #[inline(always)]
    pub fn log_or_stay_quiet<const N: usize>(&mut self, words: [u64; N]) {
        if self.quiet {
            if let Some(shared) = &self.wants_merge {
                if !shared.stats_logging.load(Ordering::Acquire) {
                    let mut fits = true;
                    for &w in &words {
                        let (own, agg, delta) = unpack(w);
                        self.room[own] -= delta;
                        self.room[agg] -= delta;
                        fits &= (self.room[own] | self.room[agg]) >= 0;
                    }
                    if fits {
                        return;
                    }
                    return self.pass_allowance(words);
                }
            }
            self.quiet = false;
        }
        self.record(words);
    }

    /// `words` pass the shard's allowance: sets the flag (every shard logs from its next
    /// change) and logs them; the base (`base`) is the value before them.
    #[cold]
    #[inline(never)]
    fn pass_allowance<const N: usize>(&mut self, words: [u64; N]) {
        for &w in &words {
            let (own, agg, delta) = unpack(w);
            self.room[own] += delta;
            self.room[agg] += delta;
        }
        if let Some(shared) = &self.wants_merge {
            shared.stats_logging.store(true, Ordering::SeqCst);
        }
        self.quiet = false;
        self.record(words);
    }

    /// Enters quiet mode with `room` (allowance less current, per slot) at a merge of
    /// the shard at `stats`.
    pub fn go_quiet(&mut self, room: [i64; SLOTS], stats: &DeviceStats) {
        self.quiet = true;
        self.room = room;
        for_slots(&mut stats.clone(), |i, s| {
            self.allow[i] = s.current + room[i]
        });
    }

    /// In a window that began quiet, at the cut (the shard at `stats`): per slot, the
    /// shard's value before its first logged change, or its current value when it
    /// logged nothing (the replay's start, `Totals::replay`).
    pub fn base(&self, stats: &DeviceStats) -> [i64; SLOTS] {
        let mut out = [0; SLOTS];
        for_slots(&mut stats.clone(), |i, s| {
            out[i] = match self.quiet {
                true => s.current,
                false => self.allow[i] - self.room[i],
            }
        });
        out
    }

    /// Logs every change until the next merge.
    pub fn go_loud(&mut self) {
        self.quiet = false;
    }

    /// A shard created while the logs are on: quiet with no allowance (its first
    /// increase sets the flag), or logging at once when the flag is set.
    pub fn start_quiet(&mut self) {
        self.quiet = true;
        self.room = [0; SLOTS];
        self.room[NO_SLOT] = UNBOUNDED;
        self.allow = [0; SLOTS];
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
