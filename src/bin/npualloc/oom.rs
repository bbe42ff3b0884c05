//! What `npualloc replay` says when a replay runs out of memory: the first failure in
//! full, the segments then (`--oom-segments`), and advice that fits the replay.
//!
//! The allocator's message ends with the advice a process gets ("try setting
//! max_split_size_mb in NPUALLOC_CONF"); in the replay the settings are `--conf`, so that
//! sentence is replaced by [`advice`], which names the settings to try and the `tune`
//! command that tries them at this capacity. When live blocks that use at most a quarter
//! of their segments keep those segments, and releasing them would have made room for
//! the request that failed, [`pinned`] finds them and the advice says so first: the
//! cause is then the small live blocks, not the device's size.

use npualloc::replay::{OomEvent, OomSegment, ReplayReport};
use npualloc::stats::format_size;

use crate::out::note;

/// The last sentence of the allocator's out-of-memory message, meant for a process.
const PROCESS_ADVICE: &str = "If reserved but unallocated memory is large, try setting \
                              max_split_size_mb in NPUALLOC_CONF to avoid fragmentation.";

/// A segment counts as held by small blocks when at most 1 / `SMALL_USE` of it is in use.
const SMALL_USE: usize = 4;

/// Segments kept by small live blocks at an OOM.
#[derive(Debug, PartialEq, Eq)]
pub struct Pinned {
    /// How many.
    pub segments: usize,
    /// Their bytes.
    pub bytes: usize,
    /// The largest: (segment bytes, bytes in use).
    pub largest: (usize, usize),
    /// Device bytes free at the failure.
    pub free: usize,
}

/// The segments that blocks using at most a quarter of each keep on the device, when
/// releasing them would have left room for `request` bytes and the device's free bytes
/// did not.
pub fn pinned(segments: &[OomSegment], capacity: usize, request: u64) -> Option<Pinned> {
    let request = usize::try_from(request).unwrap_or(usize::MAX);
    let reserved: usize = segments.iter().map(|s| s.size).sum();
    let free = capacity.saturating_sub(reserved);
    let held: Vec<(usize, usize)> = segments
        .iter()
        .map(|s| (s.size, s.allocated + s.pending))
        .filter(|&(size, used)| used > 0 && used.saturating_mul(SMALL_USE) <= size)
        .collect();
    let bytes: usize = held.iter().map(|h| h.0).sum();
    let largest = held.iter().copied().max()?;
    (free < request && free + bytes >= request).then_some(Pinned {
        segments: held.len(),
        bytes,
        largest,
        free,
    })
}

/// `--capacity` as a user would write it.
fn capacity_arg(capacity: usize) -> String {
    const MIB: usize = 1 << 20;
    if capacity % MIB == 0 {
        format!("{}M", capacity / MIB)
    } else {
        capacity.to_string()
    }
}

/// The lines of advice after the first OOM of a replay of `trace`.
pub fn advice(trace: &str, o: &OomEvent, capacity: usize, listed: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = pinned(&o.segments, capacity, o.size) {
        out.push(format!(
            "  cause: small live blocks keep {} segment(s), {} in all (the largest: {} for {} \
             live); releasing them would have left {} free for the {} request, where the \
             device had {}{}",
            p.segments,
            format_size(p.bytes),
            format_size(p.largest.0),
            format_size(p.largest.1),
            format_size(p.free + p.bytes),
            format_size(o.size as usize),
            format_size(p.free),
            if listed {
                ""
            } else {
                " (--oom-segments lists every segment)"
            },
        ));
    }
    out.push(format!(
        "  to try: --conf max_split_size_mb:N (blocks over N MiB are not split), --conf \
         expandable_segments:True, or npualloc's switches off (e.g. --conf \
         adaptive_segments:False); `npualloc tune {trace} --capacity {}` tries each and \
         shows which fit this device",
        capacity_arg(capacity)
    ));
    out
}

/// Says what the first OOM of a run was, how many followed, and what to try.
pub fn report(r: &ReplayReport, label: &str, capacity: usize, segments: bool) {
    let Some(o) = &r.first_oom else { return };
    let message = o.message.strip_suffix(PROCESS_ADVICE).unwrap_or(&o.message);
    note!(
        "{} [{label}]: {} allocation(s) did not fit in a {} device. The first, event {} \
         (allocation {} of {} on stream {}, with {} live), failed:\n  {}",
        r.name,
        r.ooms,
        format_size(capacity),
        o.event + 1,
        o.id,
        crate::bytes(o.size),
        o.stream,
        format_size(o.live_requested),
        message.trim_end()
    );
    if r.ooms > 1 {
        note!(
            "  ({} more allocation(s) failed after it; the figures above are for a replay that skipped them)",
            r.ooms - 1
        );
    }
    if segments {
        note!("  segments then (size, stream, pool, allocated, pending free, free, largest free, blocks):");
        for s in &o.segments {
            note!(
                "    {:>10} s{} {} {:>10} {:>10} {:>10} {:>10} {}",
                format_size(s.size),
                s.stream,
                if s.small { "small" } else { "large" },
                format_size(s.allocated),
                format_size(s.pending),
                format_size(s.free),
                format_size(s.largest_free),
                s.blocks
            );
        }
    }
    for line in advice(&r.name, o, capacity, segments) {
        note!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn seg(size: usize, allocated: usize) -> OomSegment {
        OomSegment {
            size: size * MIB,
            stream: 0,
            small: size == 2,
            allocated: allocated * MIB,
            pending: 0,
            free: (size - allocated) * MIB,
            largest_free: (size - allocated) * MIB,
            blocks: 2,
        }
    }

    #[test]
    fn small_blocks_holding_the_room_a_request_needed_are_the_cause() {
        // 212 MiB device, a 20 MiB segment held by 3 MiB: 190 MiB free, 210 without it.
        let segs = [seg(2, 0), seg(20, 3)];
        let p = pinned(&segs, 212 * MIB, 196 * MIB as u64).unwrap();
        assert_eq!(
            p,
            Pinned {
                segments: 1,
                bytes: 20 * MIB,
                largest: (20 * MIB, 3 * MIB),
                free: 190 * MIB,
            }
        );
    }

    #[test]
    fn no_cause_when_the_blocks_are_large_or_releasing_would_not_help() {
        // Well used segments are not held by small blocks.
        assert_eq!(pinned(&[seg(20, 6)], 212 * MIB, 196 * MIB as u64), None);
        // Released, they would still leave too little.
        assert_eq!(pinned(&[seg(20, 3)], 212 * MIB, 300 * MIB as u64), None);
        // The device had room anyway (the failure lies elsewhere).
        assert_eq!(pinned(&[seg(20, 3)], 512 * MIB, 196 * MIB as u64), None);
        // Empty segments are not held.
        assert_eq!(pinned(&[seg(20, 0)], 212 * MIB, 196 * MIB as u64), None);
    }

    #[test]
    fn advice_names_conf_and_tune_at_this_capacity() {
        let o = OomEvent {
            event: 0,
            id: 0,
            size: 196 * MIB as u64,
            stream: 0,
            live_requested: 0,
            message: String::new(),
            segments: vec![seg(20, 3)],
        };
        let a = advice("t.trace", &o, 212 * MIB, false);
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(
            a[0].starts_with("  cause: small live blocks keep 1 segment(s)"),
            "{a:?}"
        );
        assert!(
            a[0].ends_with("(--oom-segments lists every segment)"),
            "{a:?}"
        );
        assert!(a[1].contains("--conf max_split_size_mb:N"), "{a:?}");
        assert!(
            a[1].contains("`npualloc tune t.trace --capacity 212M`"),
            "{a:?}"
        );
        assert!(a.iter().all(|l| !l.contains("NPUALLOC_CONF")));
        let a = advice("t.trace", &o, 512 * MIB + 1, true);
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(a[0].contains("--capacity 536870913`"), "{a:?}");
    }
}
