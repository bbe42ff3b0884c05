//! Unit tests of the statistics logs and their merges.

use super::*;
use crate::allocator::shared::Shared;
use std::sync::atomic::Ordering;

/// Logs `changes` to `pool` as the statistics updates do.
fn rec<const N: usize>(l: &mut StatLog, pool: StatType, changes: [(Kind, i64); N]) {
    l.record(changes.map(|(k, d)| pack(k, pool, d)));
}

fn log() -> StatLog {
    StatLog {
        mode: Mode::Loud,
        ..StatLog::default()
    }
}

#[test]
fn words_round_trip() {
    for d in [0i64, 1, -1, 4 << 20, -(4 << 20), (1 << 52) - 1, -(1 << 52)] {
        let w = pack(Kind::RequestedBytes, StatType::LargePool, d);
        assert_eq!(w & HEADER, 0);
        assert_eq!(unpack(w), (8 * 3 + 2, 8 * 3, d));
    }
    let w = pack(Kind::OversizeSegments, StatType::Aggregate, -3);
    assert_eq!(unpack(w), (28, NO_SLOT, -3));
}

/// A shard's statistics with `kind` in `pool` at `current`, window peak `peak`.
fn shard(kind: Kind, pool: StatType, current: i64, peak: i64) -> DeviceStats {
    let mut s = DeviceStats::default();
    for p in [StatType::Aggregate, pool] {
        let st = kind.stat_mut(&mut s, p);
        (st.current, st.peak) = (current, peak);
    }
    s
}

#[test]
fn interleaved_logs_give_the_peak_of_the_sum() {
    // One thread: +4 on shard a, +6 on shard b, -4 on a, +1 on b. The sum peaks at
    // 10 after the second change; each shard's own peak (4, 7) says less.
    let (mut a, mut b) = (log(), log());
    let steps: [(bool, i64); 4] = [(true, 4), (false, 6), (true, -4), (false, 1)];
    for (on_a, d) in steps {
        let l = if on_a { &mut a } else { &mut b };
        l.begin_op();
        rec(l, StatType::SmallPool, [(Kind::AllocatedBytes, d)]);
    }
    let mut t = Totals::default();
    t.enable(None);
    let (sa, sb) = (
        shard(Kind::AllocatedBytes, StatType::SmallPool, 0, 4),
        shard(Kind::AllocatedBytes, StatType::SmallPool, 7, 7),
    );
    t.merge(vec![a.swap(Vec::new()), b.swap(Vec::new())], &[&sa, &sb]);
    let mut s = DeviceStats::default();
    t.fill(&mut s);
    let cp = |x: Stat| (x.current, x.peak);
    assert_eq!(cp(s.allocated_bytes[0]), (7, 10));
    assert_eq!(cp(s.allocated_bytes[1]), (7, 10));
    assert_eq!(cp(s.allocated_bytes[2]), (0, 0));
    t.reset_peak();
    t.fill(&mut s);
    assert_eq!(cp(s.allocated_bytes[0]), (7, 7));
}

#[test]
fn a_window_that_cannot_raise_a_peak_is_not_replayed() {
    // Device peak 10; the shards' window peaks sum to 9: the merge takes the sums
    // of the currents and skips the log (whose words are made up here: a replay
    // would raise the peak to 20).
    let mut t = Totals::default();
    t.enable(Some(&shard(Kind::Active, StatType::LargePool, 5, 10)));
    let mut a = log();
    a.begin_op();
    rec(
        &mut a,
        StatType::LargePool,
        [(Kind::Active, 15), (Kind::Active, -12)],
    );
    let (sa, sb) = (
        shard(Kind::Active, StatType::LargePool, 3, 5),
        shard(Kind::Active, StatType::LargePool, 4, 4),
    );
    t.merge(vec![a.swap(Vec::new())], &[&sa, &sb]);
    let mut s = DeviceStats::default();
    t.fill(&mut s);
    assert_eq!((s.active[0].current, s.active[0].peak), (7, 10));
    assert_eq!((s.active[2].current, s.active[2].peak), (7, 10));
}

#[test]
fn an_operation_replays_in_order_and_a_visit_to_another_shard_splits_it() {
    // Lending a segment: shard a's operation logs a change, then takes 5 bytes of
    // reserve from shard b (b: -5) and adds them (a: +5). The truth never exceeds
    // 5; had a's +5 shared a's first stamp (no new header after the visit: this
    // thread stamped b since), it would replay before b's -5: a false peak of 10.
    let (mut a, mut b) = (log(), log());
    let mut t = Totals::default();
    t.enable(Some(&shard(Kind::ReservedBytes, StatType::LargePool, 5, 5)));
    a.begin_op();
    rec(&mut a, StatType::SmallPool, [(Kind::Active, 1)]);
    b.begin_op();
    rec(&mut b, StatType::LargePool, [(Kind::ReservedBytes, -5)]);
    rec(&mut a, StatType::LargePool, [(Kind::ReservedBytes, 5)]);
    let mut sa = shard(Kind::ReservedBytes, StatType::LargePool, 5, 5);
    let one = Stat {
        current: 1,
        peak: 1,
        ..Stat::default()
    };
    (sa.active[0], sa.active[1]) = (one, one);
    let sb = shard(Kind::ReservedBytes, StatType::LargePool, 0, 5);
    t.merge(vec![a.swap(Vec::new()), b.swap(Vec::new())], &[&sa, &sb]);
    let mut s = DeviceStats::default();
    t.fill(&mut s);
    assert_eq!(
        (s.reserved_bytes[0].current, s.reserved_bytes[0].peak),
        (5, 5)
    );
    assert_eq!((s.active[0].current, s.active[0].peak), (1, 1));
}

#[test]
fn a_reserved_log_writes_each_operation_after_its_header() {
    // `start` reserves the window: `record` writes in place (its leaf path).
    let mut l = log();
    l.start();
    l.begin_op();
    rec(
        &mut l,
        StatType::SmallPool,
        [(Kind::Active, 1), (Kind::ActiveBytes, 512)],
    );
    rec(&mut l, StatType::LargePool, [(Kind::Segment, -1)]);
    l.begin_op();
    rec(&mut l, StatType::SmallPool, [(Kind::Allocation, 2)]);
    let w = &l.words;
    assert_eq!(w.len(), 6);
    assert!(w[0] & HEADER != 0 && w[4] & HEADER != 0 && w[0] < w[4]);
    assert_eq!(unpack(w[1]), (2 * 3 + 1, 2 * 3, 1));
    assert_eq!(unpack(w[2]), (6 * 3 + 1, 6 * 3, 512));
    assert_eq!(unpack(w[3]), (3 + 2, 3, -1));
    assert_eq!(unpack(w[5]), (1, 0, 2));
    assert!(w[1..4].iter().chain(&w[5..]).all(|x| x & HEADER == 0));
    assert_eq!(l.words.capacity(), MERGE_AT + 64, "no growth");
}

#[test]
fn a_reserved_full_log_asks_for_a_merge_once() {
    let mut l = log();
    l.start();
    l.begin_op();
    for _ in 0..MERGE_AT - 2 {
        rec(&mut l, StatType::SmallPool, [(Kind::Active, 1)]);
    }
    assert!(!l.asked);
    rec(&mut l, StatType::SmallPool, [(Kind::Active, 1)]);
    assert!(l.asked && l.words.len() == MERGE_AT);
}

#[test]
fn a_full_log_asks_for_a_merge_once() {
    let mut l = log();
    l.begin_op();
    for _ in 0..MERGE_AT - 2 {
        rec(&mut l, StatType::SmallPool, [(Kind::Active, 1)]);
    }
    assert!(!l.asked);
    rec(&mut l, StatType::SmallPool, [(Kind::Active, 1)]);
    assert!(l.asked);
}

#[test]
fn enabling_starts_from_the_only_shard() {
    let mut only = DeviceStats::default();
    crate::stats::increase(&mut only.active_bytes, StatType::LargePool, 8);
    crate::stats::decrease(&mut only.active_bytes, StatType::LargePool, 3);
    only.oversize_segments.increase(2);
    let mut t = Totals::default();
    t.enable(Some(&only));
    let mut s = DeviceStats::default();
    t.fill(&mut s);
    assert_eq!((s.active_bytes[0].current, s.active_bytes[0].peak), (5, 8));
    assert_eq!((s.active_bytes[2].current, s.active_bytes[2].peak), (5, 8));
    assert_eq!(s.oversize_segments.peak, 2);
    assert!(t.currents_match(&only));
}

#[test]
fn allowances_sum_to_at_most_the_peak() {
    // Slot of active, large pool (and its aggregate): device peak 10.
    let slot = 2 * 3 + 2;
    let mut peak = [0; SLOTS];
    (peak[slot], peak[6]) = (10, 10);
    let room = |a: &DeviceStats, b: &DeviceStats| {
        allowances(&[a, b], &peak).map(|r| (r[0][slot], r[1][slot], r[0][NO_SLOT] > 1 << 60))
    };
    // Window peaks 4 + 3 <= 10: allowances 4 + 1 and 3 + 1 (the slack 3 shared
    // evenly, rounded down), less the currents 2 and 3.
    let (a, b) = (
        shard(Kind::Active, StatType::LargePool, 2, 4),
        shard(Kind::Active, StatType::LargePool, 3, 3),
    );
    assert_eq!(room(&a, &b), Some((3, 1, true)));
    // Window peaks 8 + 6 > 10, currents 2 + 3: allowances 2 + 2 and 3 + 2.
    let (a, b) = (
        shard(Kind::Active, StatType::LargePool, 2, 8),
        shard(Kind::Active, StatType::LargePool, 3, 6),
    );
    assert_eq!(room(&a, &b), Some((2, 2, true)));
    // Currents above the peak (a window not replayed yet): no quiet mode.
    let (a, b) = (
        shard(Kind::Active, StatType::LargePool, 6, 6),
        shard(Kind::Active, StatType::LargePool, 5, 5),
    );
    assert_eq!(room(&a, &b), None);
}

/// A shard's accounting on an allocator of its own, quiet at a merge with `room`
/// (allowance less current) in every slot but the oversize counters'.
fn quiet_accounting(room: i64) -> (crate::allocator::accounting::Accounting, Arc<Shared>) {
    let (_sim, shared) = crate::allocator::shard::testing::device(1 << 30, "");
    let mut acct = crate::allocator::accounting::Accounting {
        log: StatLog::new(shared.clone()),
        ..Default::default()
    };
    acct.log.start();
    acct.log.open_window(&mut acct.stats);
    acct.log.go_quiet([room; SLOTS], &acct.stats);
    (acct, shared)
}

#[test]
fn a_quiet_group_passing_its_allowance_at_its_second_change_is_logged_whole() {
    // Allowances 100 in every slot. One group: +1 allocation (within), +200 allocated
    // bytes (past): the flag is set, the shard turns loud and logs the whole group
    // (the first change too), and its replay base is its value before the group.
    let (mut acct, shared) = quiet_accounting(100);
    acct.increase_all(StatType::SmallPool, &[(Kind::Allocation, 7)]);
    assert!(!acct.log.is_loud(), "within its allowance: quiet");
    let changes = [(Kind::Allocation, 1), (Kind::AllocatedBytes, 200)];
    acct.increase_all(StatType::SmallPool, &changes);
    assert!(
        shared.stats_logging.load(Ordering::SeqCst),
        "the flag is set"
    );
    assert!(acct.log.is_loud());
    let words = acct.log.swap(Vec::new());
    assert_eq!(words.len(), 3, "a header and both changes: {words:x?}");
    assert_ne!(words[0] & HEADER, 0);
    assert_eq!(
        &words[1..],
        &[
            pack(Kind::Allocation, StatType::SmallPool, 1),
            pack(Kind::AllocatedBytes, StatType::SmallPool, 200)
        ]
    );
    let base = acct.log.base(&acct.stats);
    let (count, bytes) = (slot(0, 1), slot(4, 1));
    assert_eq!((base[count], base[slot(0, 0)]), (7, 7));
    assert_eq!((base[bytes], base[slot(4, 0)]), (0, 0));
    // Loud from now on: a decrease is logged too.
    acct.decrease_all(StatType::SmallPool, &[(Kind::AllocatedBytes, 200)]);
    assert_eq!(acct.log.swap(Vec::new()).len(), 2);
}

#[test]
fn a_per_stream_peak_rises_through_a_quiet_window() {
    // Allowances 100: +60 allocated bytes and back stays quiet (nothing logged, the
    // flag clear), yet the shard's own peak is 60, and stays its per-stream peak
    // after the next merge restarts its window.
    let (mut acct, shared) = quiet_accounting(100);
    let big = [(Kind::AllocatedBytes, 60)];
    acct.increase_all(StatType::LargePool, &big);
    acct.decrease_all(StatType::LargePool, &big);
    assert!(!shared.stats_logging.load(Ordering::SeqCst));
    assert!(!acct.log.is_loud());
    assert!(acct.log.swap(Vec::new()).is_empty(), "nothing logged");
    let peaks = |s: &DeviceStats| (s.allocated_bytes[0].peak, s.allocated_bytes[2].peak);
    assert_eq!(peaks(&acct.stats), (60, 60));
    acct.log.open_window(&mut acct.stats);
    assert_eq!(peaks(&acct.stats), (0, 0), "a new window");
    let mut per_stream = acct.stats;
    acct.log.stream_peaks(&mut per_stream);
    assert_eq!(peaks(&per_stream), (60, 60));
}
