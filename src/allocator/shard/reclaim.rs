//! The clocks of giving memory back: a shard's malloc calls (how long a cached block
//! has been idle), PyTorch's garbage-collection clock, and the back-off that keeps
//! reclaiming before growth (`release.rs`) from churning.
//!
//! Algorithm: every reclaimed segment is remembered with its size and the malloc clock
//! ([`RECENT_RECLAIMS`] at most). A new segment of a size reclaimed within the last
//! [`RECLAIM_WINDOW`] malloc calls means the workload needed it back: reclaiming
//! churns, so the idleness a segment needs before it may go back doubles (from
//! [`MIN_RECLAIM_IDLE`]). It never shrinks again: a cyclic workload stays cyclic.
//!
//! Invariants: the clocks only move forward; `min_idle` is 0 or at least
//! `MIN_RECLAIM_IDLE`; `recent` holds at most `RECENT_RECLAIMS` entries, oldest first.
//! Pure data: no device calls.

use std::collections::VecDeque;

use crate::pool::Stamp;

/// How many recent reclaims are remembered for churn detection.
const RECENT_RECLAIMS: usize = 64;
/// A reclaimed segment allocated again within this many malloc calls counts as churn.
const RECLAIM_WINDOW: u64 = 4096;
/// The idle requirement after the first churn.
const MIN_RECLAIM_IDLE: u64 = 64;

/// One shard's reclaim clocks and back-off (module doc).
#[derive(Default)]
pub(crate) struct Reclaim {
    /// PyTorch's garbage-collection clock (free-list searches with GC enabled).
    gc_calls: u64,
    /// Malloc calls so far (the clock of segment idleness).
    malloc_calls: u64,
    /// Idle time (malloc calls) a segment needs before it may be reclaimed.
    min_idle: u64,
    /// Recently reclaimed segments: (size, when).
    recent: VecDeque<(usize, u64)>,
}

impl Reclaim {
    /// A malloc call: the idleness clock moves.
    #[inline(always)]
    pub fn tick(&mut self) {
        self.malloc_calls += 1;
    }

    /// The idleness clock: malloc calls so far.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.malloc_calls
    }

    /// A free-list search with garbage collection enabled (PyTorch's `gc_count`).
    #[inline(always)]
    pub fn tick_gc(&mut self) {
        self.gc_calls += 1;
    }

    /// (garbage-collection clock, idleness clock): what a block freed now records
    /// (their stamps: the low 32 bits).
    #[inline(always)]
    pub fn clocks(&self) -> (Stamp, Stamp) {
        (self.gc_calls as Stamp, self.malloc_calls as Stamp)
    }

    /// Garbage-collection rounds since a block recorded `base`.
    pub fn gc_age(&self, base: Stamp) -> u64 {
        (self.gc_calls as Stamp).wrapping_sub(base) as u64
    }

    /// The idleness a segment needs before it may be reclaimed.
    pub fn min_idle(&self) -> u64 {
        self.min_idle
    }

    /// Whether a block freed at `freed_at` has been idle for `min_idle` malloc calls.
    pub fn idle_for(&self, freed_at: Stamp, min_idle: u64) -> bool {
        (self.malloc_calls as Stamp).wrapping_sub(freed_at) as u64 >= min_idle
    }

    /// A segment of `size` bytes was reclaimed now.
    pub fn note_reclaimed(&mut self, size: usize) {
        if self.recent.len() == RECENT_RECLAIMS {
            self.recent.pop_front();
        }
        self.recent.push_back((size, self.malloc_calls));
    }

    /// A new segment of `size` bytes: if one like it was reclaimed recently, reclaiming
    /// is churning (a cyclic workload needs it back), so demand longer idleness.
    pub fn note_segment_malloc(&mut self, size: usize) {
        if self.recent.is_empty() {
            return;
        }
        let now = self.malloc_calls;
        if let Some(i) =
            (self.recent.iter()).position(|&(s, at)| s == size && now - at <= RECLAIM_WINDOW)
        {
            self.recent.remove(i);
            self.min_idle = self.min_idle.saturating_mul(2).max(MIN_RECLAIM_IDLE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_needed_back_soon_doubles_the_idleness_asked() {
        let mut r = Reclaim::default();
        assert_eq!(r.min_idle(), 0);
        r.note_reclaimed(20 << 20);
        r.tick();
        r.note_segment_malloc(2 << 20); // another size: no churn
        assert_eq!(r.min_idle(), 0);
        r.note_segment_malloc(20 << 20);
        assert_eq!(r.min_idle(), MIN_RECLAIM_IDLE);
        r.note_segment_malloc(20 << 20); // that reclaim was counted once
        assert_eq!(r.min_idle(), MIN_RECLAIM_IDLE);
        r.note_reclaimed(20 << 20);
        r.note_segment_malloc(20 << 20);
        assert_eq!(r.min_idle(), 2 * MIN_RECLAIM_IDLE);
    }

    #[test]
    fn a_segment_needed_back_late_is_no_churn() {
        let mut r = Reclaim::default();
        r.note_reclaimed(20 << 20);
        for _ in 0..=RECLAIM_WINDOW {
            r.tick();
        }
        r.note_segment_malloc(20 << 20);
        assert_eq!(r.min_idle(), 0);
        assert!(r.idle_for(0, RECLAIM_WINDOW + 1));
        assert!(!r.idle_for(1, RECLAIM_WINDOW + 1));
    }

    #[test]
    fn only_the_latest_reclaims_are_remembered() {
        let mut r = Reclaim::default();
        r.note_reclaimed(1);
        for size in 2..=RECENT_RECLAIMS + 1 {
            r.note_reclaimed(size);
        }
        r.note_segment_malloc(1); // forgotten
        assert_eq!(r.min_idle(), 0);
        r.note_segment_malloc(2);
        assert_eq!(r.min_idle(), MIN_RECLAIM_IDLE);
    }
}
