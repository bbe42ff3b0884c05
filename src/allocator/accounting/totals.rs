//! Exact device-wide statistics over several stream shards (decision 024).
//!
//! Each shard keeps its own `DeviceStats` (the per-stream statistics). A device-wide
//! current value is the sum over shards, but a device-wide peak is the highest value
//! the *sum* took, which the shards' own peaks do not give once two shards change.
//! So, from the moment a second shard exists (`exact_stats:False` never starts the
//! logs), each shard also appends every change to a statistic with a peak to its own
//! [`StatLog`], under its own lock (nothing shared is written on the fast path): one
//! header word per operation (a stamp) and one word per change (statistic, its
//! aggregate, signed amount), packed where the change is made and appended out of
//! line (`StatLog::record`). Whether a change is logged is one flag,
//! `Shared::stats_logging` (clear with one stream): the hot functions (a found block
//! handed out, a caller's free) load it once and run a logged copy of their own when
//! it is set; other changes load it per group. A *merge* (on a statistics
//! query, a peak reset, or when a log reaches [`MERGE_AT`] words) locks every shard
//! in creation order with the [`Totals`] lock held, swaps their logs out, unlocks the
//! shards, and replays the logs k-way by stamp into device-wide current values and
//! peaks.
//!
//! Most merges replay nothing: while logging, a shard's own peaks cover only the
//! window since the last merge (its per-stream peaks keep the earlier ones apart,
//! `StatLog::saved`), and a window in which, for every statistic, the shards' window
//! peaks add up to no more than the device-wide peak cannot have raised it; its
//! currents are the shards' sums. A steady state gets there once its highest point
//! was seen. Windows that may have raised a peak (one thread alternating streams makes
//! most of them so: each shard's window peak counts the other's moments) are replayed,
//! about 20 instructions per logged change (`Totals::apply_op`).
//!
//! Quiet mode (`totals/quiet.rs`, decision 025): after a merge that can
//! give every shard, per statistic, an allowance at least its current value with the
//! allowances summing to at most the device-wide peak, the merge clears the flag and
//! the shards run the unlogged code, as one stream does: no stamp, no log write, and
//! no test of its own, since a quiet shard's peak is never above its allowance, so the
//! comparison with the peak that every increase makes already catches a value past
//! its allowance (in a cold handler, `StatLog::over_peak`). That change sets the flag
//! and is logged; every shard logs from its first load that sees the flag, until the
//! next merge. A replay then starts from each shard's value before its first logged
//! change (or its current value at the cut), which the quiet changes cannot have
//! pushed above any peak; `quiet.rs` gives the linearisation argument. A steady state
//! with several threads stays quiet from its first merge on, at the cost of one
//! stream.
//!
//! Stamps: `max(clock, this thread's last stamp + 1, this shard's last stamp + 1)`,
//! taken at an operation's first logged change. They increase along each shard's lock
//! order and along each thread's program order (so one thread alternating streams is
//! replayed exactly in its own order), and follow the clock between threads: the
//! x86-64 time-stamp counter or the aarch64 virtual counter (both synchronised across
//! cores), elsewhere (and under Miri) a process-wide atomic sequence. The replay order
//! is therefore a valid linearisation of all changes, and every device-wide peak is
//! the highest value its sum took along it. An operation that touches another shard
//! (lending, reclaiming another stream's segments) takes a new stamp for its next
//! change after the visit (`StatLog::record` sees that this thread stamped since), so
//! its changes on both shards replay in program order, whatever the code that visits.
//!
//! Invariants (checked by `Totals::replay` in debug builds and by the tests): after a
//! merge, every device-wide current equals the sum of the shards' currents at the cut;
//! a peak is never below its current. Memory: a log holds about `MERGE_AT` words,
//! plus what is logged between reaching it and the next malloc (which merges:
//! `Shared::ask_merge` makes every malloc's test of waiting frees take its slow
//! branch, so the fast paths test nothing for it); frees and other operations log
//! until then.

use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

mod quiet;
pub(crate) use quiet::allowances;

use crate::stats::{DeviceStats, Stat, StatArray, StatType};

/// Which statistic a change is to: the nine arrays of [`DeviceStats`] in field order,
/// then the two single oversize counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Allocation = 0,
    Segment,
    Active,
    InactiveSplit,
    AllocatedBytes,
    ReservedBytes,
    ActiveBytes,
    InactiveSplitBytes,
    RequestedBytes,
    /// `oversize_allocations` (no pools: use [`StatType::Aggregate`]).
    OversizeAllocations,
    /// `oversize_segments` (no pools: use [`StatType::Aggregate`]).
    OversizeSegments,
}

/// Every kind, in `Kind as usize` order.
const KINDS: [Kind; 11] = [
    Kind::Allocation,
    Kind::Segment,
    Kind::Active,
    Kind::InactiveSplit,
    Kind::AllocatedBytes,
    Kind::ReservedBytes,
    Kind::ActiveBytes,
    Kind::InactiveSplitBytes,
    Kind::RequestedBytes,
    Kind::OversizeAllocations,
    Kind::OversizeSegments,
];

impl Kind {
    /// The [`Stat`] of `stats` this kind and `pool` name (the oversize counters have
    /// one, whatever the pool).
    #[inline(always)]
    pub fn stat_mut(self, stats: &mut DeviceStats, pool: StatType) -> &mut Stat {
        match self {
            Kind::OversizeAllocations => &mut stats.oversize_allocations,
            Kind::OversizeSegments => &mut stats.oversize_segments,
            _ => &mut self.array_mut(stats).expect("an array kind")[pool],
        }
    }

    /// The [`StatArray`] of `stats` this kind names; `None` for the oversize counters.
    #[inline(always)]
    pub fn array_mut(self, stats: &mut DeviceStats) -> Option<&mut StatArray> {
        Some(match self {
            Kind::Allocation => &mut stats.allocation,
            Kind::Segment => &mut stats.segment,
            Kind::Active => &mut stats.active,
            Kind::InactiveSplit => &mut stats.inactive_split,
            Kind::AllocatedBytes => &mut stats.allocated_bytes,
            Kind::ReservedBytes => &mut stats.reserved_bytes,
            Kind::ActiveBytes => &mut stats.active_bytes,
            Kind::InactiveSplitBytes => &mut stats.inactive_split_bytes,
            Kind::RequestedBytes => &mut stats.requested_bytes,
            Kind::OversizeAllocations | Kind::OversizeSegments => return None,
        })
    }
}

/// Device-wide slots: 9 arrays × 3 pools (`kind * 3 + pool`), then the two oversize
/// counters (27, 28); 32 so that a 5-bit slot indexes without a bounds check. Slot
/// [`NO_SLOT`] is never read: the aggregate slot of a change to an oversize counter.
pub(crate) const SLOTS: usize = 32;
pub(crate) const NO_SLOT: usize = 31;

fn slot(kind: usize, pool: usize) -> usize {
    if kind < 9 {
        kind * 3 + pool
    } else {
        27 + (kind - 9)
    }
}

/// A log reaching this many words asks for a merge (256 KiB per shard: a merge
/// locks every shard, and merging every 4,096 words cost the 2-thread scaling
/// example about a quarter of its throughput on the development VM). Under Miri a
/// smaller log takes the same paths (the tests that fill one take minutes otherwise).
#[cfg(not(miri))]
pub(crate) const MERGE_AT: usize = 32768;
#[cfg(miri)]
pub(crate) const MERGE_AT: usize = 1024;

/// Tag of a header word (the rest is the stamp).
const HEADER: u64 = 1 << 63;
/// A change word: its slot (5 bits, 58-62) and the aggregate's slot (5 bits, 53-57;
/// [`NO_SLOT`] for the oversize counters, which have none) above a 53-bit signed amount
/// (±4 PiB). Both slots are in the word so that a replay applies it without a branch.
const AMOUNT_BITS: u32 = 53;
const AMOUNT_MASK: u64 = (1 << AMOUNT_BITS) - 1;

/// The change word of `delta` to `kind` in `pool` (see [`StatLog::record`]).
#[inline(always)]
pub(crate) fn pack(kind: Kind, pool: StatType, delta: i64) -> u64 {
    let k = kind as usize;
    let (own, agg) = match k < 9 {
        true => (slot(k, pool as usize), slot(k, 0)),
        false => (slot(k, 0), NO_SLOT),
    };
    ((own as u64) << 58) | ((agg as u64) << AMOUNT_BITS) | (delta as u64 & AMOUNT_MASK)
}

/// (slot, aggregate's slot, signed amount) of a change word.
#[inline(always)]
pub(crate) fn unpack(w: u64) -> (usize, usize, i64) {
    let own = ((w >> 58) & 0x1F) as usize;
    let agg = ((w >> AMOUNT_BITS) & 0x1F) as usize;
    // Sign-extend the amount.
    let delta = ((w << (64 - AMOUNT_BITS)) as i64) >> (64 - AMOUNT_BITS);
    (own, agg, delta)
}

/// What a statistics log needs of its allocator, and nothing more: the flag every shard
/// reads before a change (whether the shards log, `quiet.rs`), and a way to ask for a
/// merge when the log is full (the allocator merges at its next malloc, with no shard
/// lock held). The allocator's shared part (`Shared`) is the one implementation.
pub(crate) trait LogLink: Send + Sync {
    /// Whether the shards log their statistics changes (`Shared::stats_logging`).
    fn stats_logging(&self) -> &AtomicBool;
    /// A log is full: the next malloc merges (`Shared::ask_merge`).
    fn ask_merge(&self);
}

/// A shard's log mode (`quiet.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing is logged: one shard, or `exact_stats:False` (`Shared::stats_logging`
    /// stays clear).
    #[default]
    Off,
    /// Nothing logged since the last merge: the shard logs nothing while
    /// `Shared::stats_logging` is clear and its values stay within its allowances.
    Quiet,
    /// Every change is logged until the next merge (`Shared::stats_logging` is set).
    Loud,
}

/// One shard's log of changes since the last merge (see the module doc).
#[derive(Default)]
pub(crate) struct StatLog {
    /// Whether changes are logged: off, quiet or loud (`quiet.rs`).
    pub mode: Mode,
    words: Vec<u64>,
    /// Stamp of the operation under way; 0 before its first logged change.
    op: u64,
    /// This shard's last stamp.
    last: u64,
    /// The allocator's flag `stats_logging` (`quiet.rs`), and told when `words`
    /// reaches [`MERGE_AT`] ([`LogLink::ask_merge`]).
    link: Option<Arc<dyn LogLink>>,
    /// Whether this log asked for a merge since its last swap.
    asked: bool,
    /// While logging, the shard's own peaks cover only the window since the last
    /// merge (the bound that lets a merge skip its replay); its per-stream peaks are
    /// the larger of those and these, its peaks before the window.
    saved: [i64; SLOTS],
    /// The allowances of the window (`quiet.rs`).
    allow: [i64; SLOTS],
    /// Once loud in a window that began quiet: per slot, the shard's value just
    /// before its first logged change (`quiet.rs`).
    base: [i64; SLOTS],
}

impl StatLog {
    /// A log (off) that reads the flag of, and asks for merges from, `link`.
    pub fn new(link: Arc<dyn LogLink>) -> Self {
        StatLog {
            link: Some(link),
            ..StatLog::default()
        }
    }

    /// Turns logging on (loud), with room for a whole window: a log that grows while
    /// the allocator runs copies itself at each doubling (the spare buffers merges
    /// hand back keep their room).
    pub fn start(&mut self) {
        self.mode = Mode::Loud;
        self.words.reserve(MERGE_AT + 64);
    }

    /// A new operation begins (the shard's lock was just taken).
    #[inline]
    pub fn begin_op(&mut self) {
        self.op = 0;
    }

    /// Appends changes (words made by [`pack`] at the call site, where each word's
    /// statistic bits fold to a constant), in order. Out of line: the fast paths keep
    /// one test of the flag per group of changes and no call or saved register
    /// for it. A leaf while the log has room and is short of [`MERGE_AT`] (the buffer
    /// is reserved for a whole window): growing and asking for a merge are
    /// `record_slow`'s.
    #[cold]
    #[inline(never)]
    pub fn record<const N: usize>(&mut self, words: [u64; N]) {
        let len = self.words.len();
        if self.words.capacity() - len <= N || len + N + 1 >= MERGE_AT {
            return self.record_slow(words);
        }
        let head = self.new_header();
        let spare = &mut self.words.spare_capacity_mut()[..N + 1];
        let mut n = 0;
        if let Some(h) = head {
            spare[0].write(h);
            n = 1;
        }
        for (slot, w) in spare[n..].iter_mut().zip(words) {
            slot.write(w);
        }
        // SAFETY: the capacity holds `len + N + 1` words (tested above), and the `n + N`
        // after `len` were just written.
        unsafe { self.words.set_len(len + n + N) };
    }

    /// `record` when the buffer must grow or the log reaches [`MERGE_AT`].
    #[cold]
    #[inline(never)]
    fn record_slow<const N: usize>(&mut self, words: [u64; N]) {
        if let Some(h) = self.new_header() {
            self.words.push(h);
        }
        self.words.extend_from_slice(&words);
        if self.words.len() >= MERGE_AT && !self.asked {
            self.ask_merge();
        }
    }

    /// The header word of a new operation, or of a new stamp in the same one when
    /// this thread stamped a change on another shard since this operation's header
    /// (lending, reclaiming: visits inside the operation), so that the changes on both
    /// shards replay in program order; `None` when the changes join the operation's
    /// current header.
    #[inline(always)]
    fn new_header(&mut self) -> Option<u64> {
        if self.op != 0 && self.op == clock::last() {
            return None;
        }
        let s = clock::stamp(self.last);
        self.last = s;
        self.op = s;
        Some(HEADER | s)
    }

    #[cold]
    #[inline(never)]
    fn ask_merge(&mut self) {
        self.asked = true;
        if let Some(link) = &self.link {
            link.ask_merge();
        }
    }

    /// Starts a new window: the shard's peaks (`stats`, its own) fold into `saved`
    /// and restart from the current values.
    pub fn open_window(&mut self, stats: &mut DeviceStats) {
        for_slots(stats, |i, s| {
            self.saved[i] = self.saved[i].max(s.peak);
            s.peak = s.current;
        });
    }

    /// Writes the shard's per-stream peaks into `stats` (a copy of its own).
    pub fn stream_peaks(&self, stats: &mut DeviceStats) {
        for_slots(stats, |i, s| s.peak = s.peak.max(self.saved[i]));
    }

    /// Forgets the peaks before the window (the shard's peaks were reset).
    pub fn reset_saved(&mut self) {
        self.saved = [0; SLOTS];
    }

    /// Forgets the logged words (a merge that needs no replay), keeping the buffer.
    pub fn clear(&mut self) {
        self.op = 0;
        self.asked = false;
        self.words.clear();
    }

    /// Takes the logged words, leaving `spare` (emptied) in their place.
    pub fn swap(&mut self, spare: Vec<u64>) -> Vec<u64> {
        self.op = 0;
        self.asked = false;
        std::mem::replace(&mut self.words, spare)
    }
}

/// What a merge must do (`Totals::plan`), with the sums of the shards' currents.
#[derive(Clone, Copy)]
pub(crate) enum Plan {
    /// No peak can have risen: clear the logs in place (each stays in its shard's
    /// cache) and take the sums.
    Skip([i64; SLOTS]),
    /// Swap the logs out and replay them.
    Replay([i64; SLOTS]),
}

impl Plan {
    /// The sums of the shards' currents at the cut.
    pub fn sum(&self) -> [i64; SLOTS] {
        match self {
            Plan::Skip(s) | Plan::Replay(s) => *s,
        }
    }
}

/// Device-wide current values and peaks, rebuilt from the shards' logs.
pub(crate) struct Totals {
    /// Whether the logs are on (a second shard was created).
    pub enabled: bool,
    cur: [i64; SLOTS],
    peak: [i64; SLOTS],
    /// Emptied log buffers, swapped into the shards at the next merge.
    spare: Vec<Vec<u64>>,
    /// Whether the window since the last merge began in quiet mode (`quiet.rs`).
    pub quiet: bool,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            enabled: false,
            cur: [0; SLOTS],
            peak: [0; SLOTS],
            spare: Vec::new(),
            quiet: false,
        }
    }
}

impl Totals {
    /// Turns the logs on, starting from the statistics of the only shard so far (its
    /// current values and peaks are the device's). Call with that shard locked.
    pub fn enable(&mut self, only: Option<&DeviceStats>) {
        self.enabled = true;
        let mut base = only.copied().unwrap_or_default();
        for_slots(&mut base, |i, s| {
            self.cur[i] = s.current;
            self.peak[i] = s.peak.max(s.current);
        });
    }

    /// An empty buffer with room for a window, to swap into a shard's log.
    pub fn spare(&mut self) -> Vec<u64> {
        self.spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MERGE_AT + 64))
    }

    /// A whole merge of `logs` (one per shard, cut at the same moment as `shards`, the
    /// shards' statistics), as `CachingAllocator::cut` does it in two steps.
    #[cfg(test)]
    pub fn merge(&mut self, logs: Vec<Vec<u64>>, shards: &[&DeviceStats]) {
        match self.plan(shards) {
            Plan::Skip(sum) => self.cur = sum,
            Plan::Replay(sum) => self.replay(logs, sum, None),
        }
    }

    /// Whether a merge of a window that ended with the shards at `shards` must replay
    /// the logs (in stamp order, ties going to the earlier log), with the sums of the
    /// shards' currents.
    ///
    /// Skipped when no peak can rise: while logging, a shard's own peaks cover only the
    /// window since the last merge (`StatLog::open_window`), so when for every
    /// statistic the sum of the shards' window peaks is at most the device-wide peak,
    /// the window set no new peak and the currents are the shards' sums (a steady state
    /// gets there once its highest point was seen).
    pub fn plan(&self, shards: &[&DeviceStats]) -> Plan {
        let (mut bound, mut sum) = ([0i64; SLOTS], [0i64; SLOTS]);
        for st in shards {
            for_slots(&mut (**st).clone(), |i, s| {
                bound[i] += s.peak.max(s.current);
                sum[i] += s.current;
            });
        }
        if bound.iter().zip(&self.peak).all(|(b, p)| b <= p) {
            Plan::Skip(sum)
        } else {
            Plan::Replay(sum)
        }
    }

    /// Ends a merge: the window raised no peak, the currents are `sum`.
    pub fn skip(&mut self, sum: [i64; SLOTS]) {
        self.cur = sum;
    }

    /// Ends a merge by replaying `logs` (which end at currents `sum`); keeps their
    /// buffers for reuse.
    /// `start`: where the quiet changes left the shards, the sums of their bases, in a
    /// window that began in quiet mode (`quiet.rs`); else the last merge's currents.
    pub fn replay(&mut self, logs: Vec<Vec<u64>>, sum: [i64; SLOTS], start: Option<[i64; SLOTS]>) {
        if let Some(start) = start {
            self.cur = start;
            self.cur[NO_SLOT] = 0;
        }
        self.apply_logs(&logs);
        (self.cur[NO_SLOT], self.peak[NO_SLOT]) = (0, 0);
        debug_assert_eq!(self.cur, sum, "the logs replay to the shards' sums");
        self.cur = sum;
        for mut l in logs {
            l.clear();
            self.spare.push(l);
        }
    }

    /// Applies every logged change in stamp order: each step applies the next
    /// operation of the log whose next header has the smallest stamp (the merge is by
    /// operation; within one, changes are in order).
    fn apply_logs(&mut self, logs: &[Vec<u64>]) {
        let mut rest: Vec<&[u64]> = logs
            .iter()
            .map(|l| &l[..])
            .filter(|l| !l.is_empty())
            .collect();
        while !rest.is_empty() {
            let mut best = 0;
            for (i, l) in rest.iter().enumerate() {
                // Headers compare as their stamps (the same tag bit above each).
                if l[0] < rest[best][0] {
                    best = i;
                }
            }
            let l = rest[best];
            let used = self.apply_op(l);
            if used == l.len() {
                rest.swap_remove(best);
            } else {
                rest[best] = &l[used..];
            }
        }
    }

    /// Applies the operation `words` starts with (its header, then its changes up to
    /// the next header); returns how many words it took.
    #[inline]
    fn apply_op(&mut self, words: &[u64]) -> usize {
        debug_assert!(
            words[0] & HEADER != 0,
            "a log starts each operation with a header"
        );
        let (cur, peak) = (&mut self.cur, &mut self.peak);
        for (n, &w) in words.iter().enumerate().skip(1) {
            if w & HEADER != 0 {
                return n;
            }
            let (own, agg, delta) = unpack(w);
            // A decrease never raises a peak (a peak is never below its current value);
            // taking the larger is cheaper than asking.
            cur[own] += delta;
            peak[own] = peak[own].max(cur[own]);
            cur[agg] += delta;
            peak[agg] = peak[agg].max(cur[agg]);
        }
        words.len()
    }

    /// The device-wide peaks (as of the last merge's end).
    pub fn peaks(&self) -> [i64; SLOTS] {
        self.peak
    }

    /// Sets every peak to its current value (PyTorch's `resetPeakStats`).
    pub fn reset_peak(&mut self) {
        self.peak = self.cur;
    }

    /// Writes the device-wide current values and peaks into `out`.
    pub fn fill(&self, out: &mut DeviceStats) {
        for_slots(out, |i, s| {
            s.current = self.cur[i];
            s.peak = self.peak[i];
        });
    }

    /// Whether the device-wide currents equal `sum`'s (a merge's invariant).
    pub fn currents_match(&self, sum: &DeviceStats) -> bool {
        let mut ok = true;
        for_slots(&mut sum.clone(), |i, s| ok &= s.current == self.cur[i]);
        ok
    }
}

fn sum_stat(a: &mut Stat, b: &Stat) {
    a.current += b.current;
    a.allocated += b.allocated;
    a.freed += b.freed;
    a.peak = a.peak.max(b.peak);
}

fn sum_array(a: &mut StatArray, b: &StatArray) {
    for (x, y) in a.iter_mut().zip(b) {
        sum_stat(x, y);
    }
}

/// Several shards' statistics as one: the sums, and as peaks the larger of the
/// shards' peaks and the summed current (current values and peaks are then replaced
/// by the exact device-wide ones, `Totals::fill`).
pub(crate) fn sum_stats(per: &[DeviceStats]) -> DeviceStats {
    let mut out = DeviceStats {
        max_split_size: per[0].max_split_size,
        ..DeviceStats::default()
    };
    for s in per {
        for (a, b) in [
            (&mut out.allocation, &s.allocation),
            (&mut out.segment, &s.segment),
            (&mut out.active, &s.active),
            (&mut out.inactive_split, &s.inactive_split),
            (&mut out.allocated_bytes, &s.allocated_bytes),
            (&mut out.reserved_bytes, &s.reserved_bytes),
            (&mut out.active_bytes, &s.active_bytes),
            (&mut out.inactive_split_bytes, &s.inactive_split_bytes),
            (&mut out.requested_bytes, &s.requested_bytes),
        ] {
            sum_array(a, b);
        }
        sum_stat(&mut out.oversize_allocations, &s.oversize_allocations);
        sum_stat(&mut out.oversize_segments, &s.oversize_segments);
        out.num_alloc_retries += s.num_alloc_retries;
        out.num_ooms += s.num_ooms;
        out.num_sync_all_streams += s.num_sync_all_streams;
        out.num_device_alloc += s.num_device_alloc;
        out.num_device_free += s.num_device_free;
    }
    // The nine arrays (slots before 27), as before exact statistics existed.
    for_slots(&mut out, |i, s| {
        if i < 27 {
            s.peak = s.peak.max(s.current);
        }
    });
    out
}

/// Calls `f` with each slot and the statistic of `stats` it names.
fn for_slots(stats: &mut DeviceStats, mut f: impl FnMut(usize, &mut Stat)) {
    for (k, &kind) in KINDS.iter().enumerate() {
        for p in 0..if k < 9 { 3 } else { 1 } {
            f(slot(k, p), kind.stat_mut(stats, pool_of(p)));
        }
    }
}

/// The statistic of `stats` that slot `i` names (not [`NO_SLOT`]).
pub(crate) fn stat_at(stats: &mut DeviceStats, i: usize) -> &mut Stat {
    debug_assert_ne!(i, NO_SLOT);
    match i < 27 {
        true => KINDS[i / 3].stat_mut(stats, pool_of(i % 3)),
        false => KINDS[9 + i - 27].stat_mut(stats, StatType::Aggregate),
    }
}

fn pool_of(p: usize) -> StatType {
    match p {
        0 => StatType::Aggregate,
        1 => StatType::SmallPool,
        _ => StatType::LargePool,
    }
}

/// Stamps: a cross-core synchronised counter, made strictly increasing per thread and
/// per shard.
mod clock {
    use super::Cell;

    thread_local! {
        /// This thread's last stamp.
        static LAST: Cell<u64> = const { Cell::new(0) };
    }

    /// This thread's last stamp (0 before its first).
    #[inline]
    pub fn last() -> u64 {
        LAST.with(Cell::get)
    }

    /// A stamp after `shard_last`, after this thread's last one, and not before now.
    #[inline]
    pub fn stamp(shard_last: u64) -> u64 {
        let now = now() & !super::HEADER;
        LAST.with(|l| {
            let s = now.max(l.get() + 1).max(shard_last + 1);
            l.set(s);
            s
        })
    }

    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[inline]
    fn now() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 processor and only reads the counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(all(target_arch = "aarch64", not(miri)))]
    #[inline]
    fn now() -> u64 {
        let v: u64;
        // SAFETY: reading the virtual counter is allowed at EL0 on Linux and touches no
        // memory; the ISB keeps it after the instructions before it.
        unsafe { core::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) v, options(nostack)) };
        v
    }

    #[cfg(any(not(any(target_arch = "x86_64", target_arch = "aarch64")), miri))]
    #[inline]
    fn now() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(1);
        SEQ.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
