//! Blame at the peak: which call sites hold the memory reserved at the moment of peak
//! reserved, as live blocks and as waste, per stream.
//!
//! A *call site* is one stack frame of the allocation's stack: the innermost frame in a
//! Python file outside PyTorch's own package (no directory of its path is named
//! `torch`; `torchvision` is not PyTorch's), else the innermost Python frame, else the
//! innermost frame; an allocation without frames is blamed on `(no frames)`.
//!
//! Every reserved byte at the peak goes to exactly one call site:
//! - an allocated block to its own allocation's site (*live*, the block's rounded size);
//! - a block freed but pending (events of other streams) to its own site (*pending*);
//! - the cached free blocks of a segment that also holds allocated or pending blocks to
//!   the sites of those blocks, split in proportion to their sizes (*free in used
//!   segments*: they keep the segment from going back to the device);
//! - a wholly free segment to the site of the last allocation made in it before the
//!   peak (*empty segments*: the cache kept it after that allocation was freed).
//!
//! A byte no allocation of the trace can be tied to (which would be a bug) is counted as
//! unattributed. The stream of a site's row is the stream its allocations were made on.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use serde_json::{json, Value};

use super::ReplayReport;
use crate::snapshot::BlockState;
use crate::stats::format_size;
use crate::trace::frames::{show, Frame, Stacks};
use crate::trace::{Op, Trace};

/// How many call sites each list shows.
pub const TOP: usize = 10;

/// The bytes one call site holds at the peak.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Site {
    /// `name (file:line)`, or `(no frames)`.
    pub site: String,
    /// The stack of the first allocation blamed on it, innermost first.
    pub stack: Vec<String>,
    /// Bytes of its allocated blocks.
    pub live: u64,
    /// Its allocated blocks.
    pub blocks: usize,
    /// Bytes of its blocks freed but pending.
    pub pending: u64,
    /// Its share of the cached free bytes of segments it has blocks in.
    pub free_in_used: u64,
    /// Bytes of wholly free segments whose last allocation was its.
    pub empty: u64,
}

impl Site {
    /// Bytes reserved but not allocated that are blamed on it.
    pub fn wasted(&self) -> u64 {
        self.pending + self.free_in_used + self.empty
    }
}

/// The call sites of one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamSites {
    /// The trace's stream label.
    pub stream: u32,
    /// Every site with bytes at the peak, by live bytes, largest first.
    pub sites: Vec<Site>,
}

/// Where the memory reserved at the peak went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blame {
    /// Event index of peak reserved.
    pub peak_event: usize,
    /// Reserved bytes then (the sum of segment sizes).
    pub reserved: u64,
    /// Allocated block bytes.
    pub live: u64,
    /// Pending free block bytes.
    pub pending: u64,
    /// Cached free bytes inside segments in use.
    pub free_in_used: u64,
    /// Bytes of wholly free segments.
    pub empty: u64,
    /// Bytes no allocation of the trace could be tied to.
    pub unattributed: u64,
    /// Whether any allocation had frames.
    pub has_frames: bool,
    /// Per stream, in stream order.
    pub streams: Vec<StreamSites>,
}

/// The frame that names a call site (see the module documentation).
pub fn site_frame(stack: &[Frame]) -> Option<&Frame> {
    let py = |f: &&Frame| f.filename.ends_with(".py");
    let in_torch = |f: &&Frame| f.filename.split(['/', '\\']).any(|c| c == "torch");
    stack
        .iter()
        .filter(py)
        .find(|f| !in_torch(f))
        .or_else(|| stack.iter().find(py))
        .or_else(|| stack.first())
}

/// Allocation id of each block address at the peak (allocated or pending: the last
/// allocation made there), and of the last allocation made at each address, with when.
struct AtPeak {
    last: BTreeMap<usize, (usize, u64)>, // address -> (event, id)
}

fn at_peak(trace: &Trace, r: &ReplayReport) -> AtPeak {
    let mut last = BTreeMap::new();
    for a in r.actions.iter().take_while(|a| a.event <= r.peak_event) {
        if a.action == "alloc" {
            if let Some(Op::Alloc { id, .. }) = trace.ops.get(a.event) {
                last.insert(a.addr, (a.event, *id));
            }
        }
    }
    AtPeak { last }
}

/// Blames the memory reserved at `r`'s peak (a replay of `trace` made with `detail`) on
/// the call sites of `stacks`.
pub fn blame(trace: &Trace, stacks: &Stacks, r: &ReplayReport) -> Blame {
    let streams: HashMap<u64, u32> = trace.allocations().map(|(id, _, s)| (id, s)).collect();
    let peak = at_peak(trace, r);
    let mut b = Blame {
        peak_event: r.peak_event,
        has_frames: !stacks.is_empty(),
        ..Blame::default()
    };
    // (stream, site) -> Site
    let mut sites = Sites::new();
    for seg in &r.peak_segments {
        let total = seg.total_size as u64;
        b.reserved += total;
        let used: Vec<(u64, u64)> = seg
            .blocks
            .iter()
            .filter(|x| x.state != BlockState::Inactive)
            .filter_map(|x| Some((peak.last.get(&x.address)?.1, x.size as u64)))
            .collect();
        let active: u64 = seg
            .blocks
            .iter()
            .filter(|x| x.state != BlockState::Inactive)
            .map(|x| x.size as u64)
            .sum();
        let free = total - active;
        for x in &seg.blocks {
            let size = x.size as u64;
            let id = peak.last.get(&x.address).map(|l| l.1);
            match (x.state, id) {
                (BlockState::ActiveAllocated, Some(id)) => {
                    let s = site_entry(&mut sites, stacks, &streams, id);
                    s.live += size;
                    s.blocks += 1;
                    b.live += size;
                }
                (BlockState::ActivePendingFree, Some(id)) => {
                    site_entry(&mut sites, stacks, &streams, id).pending += size;
                    b.pending += size;
                }
                (BlockState::Inactive, _) => {}
                (_, None) => b.unattributed += size,
            }
        }
        if active == 0 {
            b.empty += free;
            let end = seg.address.saturating_add(seg.total_size);
            let last = peak
                .last
                .range(seg.address..end)
                .max_by_key(|(_, (event, _))| *event);
            match last {
                Some((_, &(_, id))) => site_entry(&mut sites, stacks, &streams, id).empty += free,
                None => b.unattributed += free,
            }
            continue;
        }
        b.free_in_used += free;
        let known: u64 = used.iter().map(|(_, s)| s).sum();
        if known == 0 {
            b.unattributed += free;
            continue;
        }
        // Shares by size, the rounding remainder to the largest block.
        let mut given = 0u64;
        for &(id, size) in &used {
            let share = (free as u128 * size as u128 / known as u128) as u64;
            site_entry(&mut sites, stacks, &streams, id).free_in_used += share;
            given += share;
        }
        if let Some(&(id, _)) = used.iter().max_by_key(|(_, s)| *s) {
            site_entry(&mut sites, stacks, &streams, id).free_in_used += free - given;
        }
    }
    let mut by_stream: BTreeMap<u32, Vec<Site>> = BTreeMap::new();
    for ((stream, _), s) in sites {
        by_stream.entry(stream).or_default().push(s);
    }
    b.streams = by_stream
        .into_iter()
        .map(|(stream, mut sites)| {
            sites.sort_by(|x, y| y.live.cmp(&x.live).then(x.site.cmp(&y.site)));
            StreamSites { stream, sites }
        })
        .collect();
    b
}

type Sites = BTreeMap<(u32, String), Site>;

/// The row of allocation `id`'s (stream, call site), made on first use.
fn site_entry<'a>(
    sites: &'a mut Sites,
    stacks: &Stacks,
    streams: &HashMap<u64, u32>,
    id: u64,
) -> &'a mut Site {
    let stack = stacks.get(&id);
    let name = stack
        .and_then(|s| site_frame(s))
        .map_or_else(|| "(no frames)".to_string(), show);
    let stream = streams.get(&id).copied().unwrap_or(0);
    sites.entry((stream, name.clone())).or_insert_with(|| Site {
        site: name,
        stack: stack
            .map(|s| s.iter().map(show).collect())
            .unwrap_or_default(),
        ..Site::default()
    })
}

fn by_waste(sites: &[Site]) -> Vec<&Site> {
    let mut v: Vec<&Site> = sites.iter().filter(|s| s.wasted() > 0).collect();
    v.sort_by(|x, y| y.wasted().cmp(&x.wasted()).then(x.site.cmp(&y.site)));
    v
}

fn size(n: u64) -> String {
    format_size(n as usize)
}

impl Blame {
    /// The text report: per stream, the top call sites by live bytes and by bytes wasted.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "blame at peak reserved (event {}): {} reserved = {} allocated + {} pending free \
             + {} cached free in used segments + {} in wholly empty segments",
            self.peak_event,
            size(self.reserved),
            size(self.live),
            size(self.pending),
            size(self.free_in_used),
            size(self.empty)
        );
        let _ = writeln!(
            out,
            "  (free bytes of a segment in use are split among the call sites of its blocks by \
             size; an empty segment goes to the site of the last allocation made in it)"
        );
        if !self.has_frames {
            let _ = writeln!(
                out,
                "  the trace has no frames: record with torch's _record_memory_history() to see call sites"
            );
        }
        if self.unattributed > 0 {
            let _ = writeln!(out, "  unattributed: {}", size(self.unattributed));
        }
        for s in &self.streams {
            let _ = writeln!(out, "stream {}: top call sites by live bytes", s.stream);
            for site in s.sites.iter().filter(|x| x.live > 0).take(TOP) {
                let _ = writeln!(
                    out,
                    "  {:>12} {:>6} blocks  {}",
                    size(site.live),
                    site.blocks,
                    site.site
                );
            }
            let waste = by_waste(&s.sites);
            if waste.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "stream {}: top call sites by bytes wasted (free in used segments + pending free + empty segments)",
                s.stream
            );
            for site in waste.into_iter().take(TOP) {
                let _ = writeln!(
                    out,
                    "  {:>12} = {} + {} + {}  {}",
                    size(site.wasted()),
                    size(site.free_in_used),
                    size(site.pending),
                    size(site.empty),
                    site.site
                );
            }
        }
        out
    }

    /// The report as JSON: totals, and per stream the top sites by live bytes and by
    /// bytes wasted.
    pub fn json(&self) -> Value {
        let site = |s: &Site| {
            json!({
                "site": s.site, "stack": s.stack, "live": s.live, "blocks": s.blocks,
                "wasted": s.wasted(), "free_in_used_segments": s.free_in_used,
                "pending_free": s.pending, "empty_segments": s.empty,
            })
        };
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                json!({
                    "stream": s.stream,
                    "by_live": s.sites.iter().filter(|x| x.live > 0).take(TOP).map(site).collect::<Vec<_>>(),
                    "by_waste": by_waste(&s.sites).into_iter().take(TOP).map(site).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "peak_event": self.peak_event, "reserved": self.reserved, "allocated": self.live,
            "pending_free": self.pending, "free_in_used_segments": self.free_in_used,
            "empty_segments": self.empty, "unattributed": self.unattributed,
            "has_frames": self.has_frames, "streams": streams,
        })
    }
}

/// Hover text of each block at the peak that belongs to an allocation: its id, stream
/// and stack (innermost first, at most 8 frames).
pub fn block_notes(trace: &Trace, stacks: &Stacks, r: &ReplayReport) -> HashMap<usize, String> {
    let streams: HashMap<u64, u32> = trace.allocations().map(|(id, _, s)| (id, s)).collect();
    let peak = at_peak(trace, r);
    let mut out = HashMap::new();
    for b in r.peak_segments.iter().flat_map(|s| &s.blocks) {
        if b.state == BlockState::Inactive {
            continue;
        }
        let Some(&(_, id)) = peak.last.get(&b.address) else {
            continue;
        };
        let mut note = format!(
            "allocation {id} (trace stream {})",
            streams.get(&id).copied().unwrap_or(0)
        );
        if let Some(stack) = stacks.get(&id) {
            for f in stack.iter().take(8) {
                let _ = write!(note, "\n  {}", show(f));
            }
            if stack.len() > 8 {
                let _ = write!(note, "\n  ... {} more frames", stack.len() - 8);
            }
        }
        out.insert(b.address, note);
    }
    out
}

/// The allocation id of each allocated or pending-free block at `r`'s peak, by address.
pub fn ids_at_peak(trace: &Trace, r: &ReplayReport) -> HashMap<usize, u64> {
    let peak = at_peak(trace, r);
    r.peak_segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .filter_map(|b| Some((b.address, peak.last.get(&b.address)?.1)))
        .collect()
}

/// `stacks` of a trace carried over to its [`Trace::repeated`] form (ids renumbered
/// densely per repetition).
pub fn repeat_stacks(trace: &Trace, stacks: &Stacks, n: usize) -> Stacks {
    if n <= 1 || stacks.is_empty() {
        return stacks.clone();
    }
    let allocs: Vec<u64> = trace.allocations().map(|(id, _, _)| id).collect();
    let span = allocs.len().max(1) as u64;
    let mut out = Stacks::new();
    for (j, id) in (0u64..).zip(&allocs) {
        if let Some(s) = stacks.get(id) {
            for k in 0..n as u64 {
                out.insert(k * span + j, s.clone());
            }
        }
    }
    out
}
