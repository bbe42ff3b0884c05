//! Human-readable memory summaries: torch_npu's `torch.npu.memory_summary()` table, and
//! a short fragmentation account of where reserved memory goes.
//!
//! The table reproduces torch_npu 2.14's `memory_summary` character for character
//! (`torch_npu/npu/memory.py`: 75-column frame, `_format_size` switching units once the
//! row's first column reaches 768 units, `_format_count` at 750 thousand), so output of
//! [`MemorySummary`] and of `torch.npu.memory_summary()` over the same statistics compare
//! equal; the Python suite checks it against the real torch_npu.
//!
//! The fragmentation account comes from the segments (a snapshot), not the counters:
//! reserved = allocated + pending frees + cached free blocks, and the cached free bytes
//! split into those inside partly used segments (only a fitting request can use them)
//! and whole empty segments (`empty_cache` could return them).

use std::fmt;

use crate::snapshot::{BlockState, SegmentInfo};
use crate::stats::{format_size, DeviceStats, Stat, StatArray, StatType};

/// Where a device's reserved bytes go, from its segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fragmentation {
    /// Bytes of all segments.
    pub reserved: usize,
    /// Bytes of blocks handed out to callers.
    pub allocated: usize,
    /// Bytes freed by callers but still waiting for other streams' events.
    pub pending_free: usize,
    /// Cached free bytes inside segments that also hold allocated or pending blocks.
    pub free_in_used_segments: usize,
    /// Bytes of segments with no allocated or pending block.
    pub empty_segment_bytes: usize,
    /// Number of such segments.
    pub empty_segments: usize,
    /// Number of segments.
    pub segments: usize,
}

impl Fragmentation {
    /// Accounts for every block of `segments`.
    pub fn of(segments: &[SegmentInfo]) -> Self {
        let mut f = Fragmentation::default();
        for seg in segments {
            f.segments += 1;
            f.reserved += seg.total_size;
            let free: usize = seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Inactive)
                .map(|b| b.size)
                .sum();
            for b in &seg.blocks {
                match b.state {
                    BlockState::ActiveAllocated => f.allocated += b.size,
                    BlockState::ActivePendingFree => f.pending_free += b.size,
                    BlockState::Inactive => {}
                }
            }
            if free == seg.total_size {
                f.empty_segments += 1;
                f.empty_segment_bytes += free;
            } else {
                f.free_in_used_segments += free;
            }
        }
        f
    }

    /// Reserved bytes per allocated byte (0 when nothing is allocated).
    pub fn ratio(&self) -> f64 {
        if self.allocated == 0 {
            0.0
        } else {
            self.reserved as f64 / self.allocated as f64
        }
    }
}

impl fmt::Display for Fragmentation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reserved {} in {} segments = allocated {} + pending frees {} + cached free in \
             partly used segments {} + {} whole empty segments {}",
            format_size(self.reserved),
            self.segments,
            format_size(self.allocated),
            format_size(self.pending_free),
            format_size(self.free_in_used_segments),
            self.empty_segments,
            format_size(self.empty_segment_bytes),
        )?;
        if self.allocated > 0 {
            write!(f, " (reserved / allocated {:.3})", self.ratio())?;
        }
        Ok(())
    }
}

/// torch_npu's memory summary table for one device, optionally followed by the
/// fragmentation account. Displays as the text `torch.npu.memory_summary()` returns.
#[derive(Clone, Copy, Debug)]
pub struct MemorySummary<'a> {
    stats: &'a DeviceStats,
    device: Option<i64>,
    abbreviated: bool,
    fragmentation: Option<Fragmentation>,
}

impl<'a> MemorySummary<'a> {
    /// The table of `stats`, titled with `device` (no device number when `None`).
    pub fn new(stats: &'a DeviceStats, device: Option<i64>) -> Self {
        MemorySummary {
            stats,
            device,
            abbreviated: false,
            fragmentation: None,
        }
    }

    /// Only the "all" rows, as `memory_summary(abbreviated=True)`.
    pub fn abbreviated(mut self, abbreviated: bool) -> Self {
        self.abbreviated = abbreviated;
        self
    }

    /// Appends the fragmentation account below the table.
    pub fn with_fragmentation(mut self, fragmentation: Fragmentation) -> Self {
        self.fragmentation = Some(fragmentation);
        self
    }
}

/// `_format_size`: the value in the unit the row's first column chose.
fn size_cell(value: i64, row_reference: i64) -> String {
    const UNITS: [&str; 6] = ["B ", "KB", "MB", "GB", "TB", "PB"];
    let (mut v, mut reference, mut unit) = (value, row_reference as f64, 0);
    while unit + 1 < UNITS.len() && reference >= 768.0 * 1024.0 {
        v = v.div_euclid(1024);
        reference /= 1024.0;
        unit += 1;
    }
    format!("{v:7} {}", UNITS[unit])
}

/// `_format_count`: the count in the unit the row's first column chose.
fn count_cell(value: i64, row_reference: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let (mut v, mut reference, mut unit) = (value, row_reference as f64, 0);
    while unit + 1 < UNITS.len() && reference >= 750.0 * 1000.0 {
        v = v.div_euclid(1000);
        reference /= 1000.0;
        unit += 1;
    }
    format!("{v:7} {} ", UNITS[unit])
}

type Cell = fn(i64, i64) -> String;

/// One row: a name and the four columns, each scaled by `reference`'s column.
fn row(name: &str, stat: &Stat, reference: &Stat, cell: Cell) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        cell(stat.current, reference.current),
        cell(stat.peak, reference.peak),
        cell(stat.allocated, reference.allocated),
        cell(stat.freed, reference.freed),
    )
}

impl MemorySummary<'_> {
    fn lines(&self) -> Vec<String> {
        let s = self.stats;
        let rule = "-".repeat(75);
        let double = "=".repeat(75);
        let title = match self.device {
            Some(d) => format!(" {:16} PyTorch NPU memory summary, device ID {d:<18} ", ""),
            None => format!(" {:16} PyTorch NPU memory summary{:30} ", "", ""),
        };
        let mut lines = vec![
            double.clone(),
            title,
            rule.clone(),
            format!(
                "  {:9} NPU OOMs: {:<13} | {:6} npuMalloc retries: {:<9}  ",
                "", s.num_ooms, "", s.num_alloc_retries
            ),
            double.clone(),
            "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".into(),
        ];
        let metrics: [(&StatArray, &str, Cell); 8] = [
            (&s.allocated_bytes, "Allocated memory", size_cell),
            (&s.active_bytes, "Active memory", size_cell),
            (&s.reserved_bytes, "NPU reserved memory", size_cell),
            (&s.inactive_split_bytes, "Non-releasable memory", size_cell),
            (&s.allocation, "Allocations", count_cell),
            (&s.active, "Active allocs", count_cell),
            (&s.segment, "NPU reserved segments", count_cell),
            (&s.inactive_split, "Non-releasable allocs", count_cell),
        ];
        for (stats, name, cell) in metrics {
            lines.push(rule.clone());
            let all = &stats[StatType::Aggregate as usize];
            lines.push(row(name, all, all, cell));
            if !self.abbreviated {
                let large = &stats[StatType::LargePool as usize];
                let small = &stats[StatType::SmallPool as usize];
                lines.push(row("      from large pool", large, all, cell));
                lines.push(row("      from small pool", small, all, cell));
            }
        }
        for (stat, name) in [
            (&s.oversize_allocations, "Oversize allocations"),
            (&s.oversize_segments, "Oversize NPU segments"),
        ] {
            lines.push(rule.clone());
            lines.push(row(name, stat, stat, count_cell));
        }
        lines.push(double);
        lines
    }
}

impl fmt::Display for MemorySummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.lines() {
            writeln!(f, "|{line}|")?;
        }
        if let Some(frag) = &self.fragmentation {
            writeln!(f, "{frag}")?;
        }
        Ok(())
    }
}

impl fmt::Display for DeviceStats {
    /// The torch_npu memory summary table (no device number in the title).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        MemorySummary::new(self, None).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::StreamHandle;
    use crate::pool::PoolKind;
    use crate::snapshot::BlockInfo;

    fn stats() -> DeviceStats {
        let mut s = DeviceStats::default();
        crate::stats::increase(&mut s.allocated_bytes, StatType::LargePool, 3 << 30);
        crate::stats::increase(&mut s.allocated_bytes, StatType::SmallPool, 512);
        crate::stats::decrease(&mut s.allocated_bytes, StatType::SmallPool, 512);
        crate::stats::increase(&mut s.allocation, StatType::LargePool, 2);
        s.num_ooms = 3;
        s.num_alloc_retries = 12;
        s
    }

    #[test]
    fn every_line_is_framed_at_77_columns() {
        for device in [Some(0), Some(7), None] {
            let text = MemorySummary::new(&stats(), device).to_string();
            let lines: Vec<_> = text.lines().collect();
            // 6 header lines, 8 metrics × (rule + 3 rows), 2 × (rule + row), footer.
            assert_eq!(lines.len(), 6 + 8 * 4 + 2 * 2 + 1);
            for l in &lines {
                assert_eq!(l.chars().count(), 77, "{l:?}");
                assert!(l.starts_with('|') && l.ends_with('|'));
            }
        }
        let short = MemorySummary::new(&stats(), Some(0))
            .abbreviated(true)
            .to_string();
        assert_eq!(short.lines().count(), 6 + 8 * 2 + 2 * 2 + 1);
    }

    #[test]
    fn units_follow_the_rows_first_column() {
        let text = MemorySummary::new(&stats(), Some(1)).to_string();
        assert!(text.contains("device ID 1 "));
        assert!(text.contains("NPU OOMs: 3 "));
        assert!(text.contains("npuMalloc retries: 12 "));
        // 3 GiB stays under 768 Ki of MB, so MB; the small pool row uses the
        // aggregate's unit, so its 512 B peak and total allocated read "0 MB".
        let allocated = text
            .lines()
            .find(|l| l.contains("Allocated memory"))
            .unwrap();
        assert_eq!(
            allocated,
            "| Allocated memory      |    3072 MB |    3072 MB |    3072 MB |     512 B  |"
        );
        let small = text
            .lines()
            .find(|l| l.contains("from small pool"))
            .unwrap();
        assert!(small.ends_with("|       0 MB |       0 MB |       0 MB |     512 B  |"));
        let allocations = text.lines().find(|l| l.contains("Allocations")).unwrap();
        assert!(allocations.contains("|       2    |"));
    }

    #[test]
    fn counts_switch_to_thousands_at_750_thousand() {
        assert_eq!(count_cell(749_999, 749_999), " 749999   ");
        assert_eq!(count_cell(750_000, 750_000), "    750 K ");
        assert_eq!(count_cell(2_000_000_000, 2_000_000_000), "   2000 M ");
        assert_eq!(size_cell(786_431, 786_431), " 786431 B ");
        assert_eq!(size_cell(786_432, 786_432), "    768 KB");
    }

    fn block(size: usize, state: BlockState) -> BlockInfo {
        BlockInfo {
            address: 0,
            size,
            requested_size: 0,
            state,
            lent_to: None,
            dirty_on: Vec::new(),
        }
    }

    fn segment(blocks: Vec<BlockInfo>) -> SegmentInfo {
        SegmentInfo {
            address: 0,
            total_size: blocks.iter().map(|b| b.size).sum(),
            stream: StreamHandle(0),
            kind: PoolKind::Large,
            blocks,
            pool_id: None,
            is_expandable: false,
        }
    }

    #[test]
    fn fragmentation_splits_free_bytes_by_segment_use() {
        let segs = [
            segment(vec![
                block(4 << 20, BlockState::ActiveAllocated),
                block(1 << 20, BlockState::Inactive),
                block(2 << 20, BlockState::ActivePendingFree),
            ]),
            segment(vec![block(20 << 20, BlockState::Inactive)]),
        ];
        let f = Fragmentation::of(&segs);
        assert_eq!(f.reserved, 27 << 20);
        assert_eq!(f.allocated, 4 << 20);
        assert_eq!(f.pending_free, 2 << 20);
        assert_eq!(f.free_in_used_segments, 1 << 20);
        assert_eq!((f.empty_segments, f.empty_segment_bytes), (1, 20 << 20));
        assert_eq!(
            f.allocated + f.pending_free + f.free_in_used_segments + f.empty_segment_bytes,
            f.reserved
        );
        let line = f.to_string();
        assert!(line.contains("1 whole empty segments 20.00 MiB"), "{line}");
        assert!(line.contains("(reserved / allocated 6.750)"), "{line}");
    }
}
