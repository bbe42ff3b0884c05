//! The replay picture: bytes over time (reserved, allocated, requested) and a map of
//! every segment at the moment of peak reserved, blocks coloured by state.

use std::fmt::Write;

use super::{ReplayReport, Sample};
use crate::snapshot::{BlockState, SegmentInfo};
use crate::stats::format_size;

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const CHART_TOP: f64 = 84.0;
const CHART_H: f64 = 300.0;
const MAP_TOP: f64 = CHART_TOP + CHART_H + 120.0;
const MAP_ROWS: usize = 16;
const ROW_H: f64 = 20.0;
const ROW_GAP: f64 = 6.0;

const C_RESERVED: &str = "#d9480f";
const C_ALLOCATED: &str = "#1c7ed6";
const C_LENT: &str = "#7048e8";
const C_REQUESTED: &str = "#2b8a3e";
const C_PENDING: &str = "#f59f00";
const C_INACTIVE: &str = "#dee2e6";
const C_EMPTY_SEG: &str = "#adb5bd";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The 1, 2 or 5 times a power of ten nearest above `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1.0).log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * p)
}

/// At most `buckets` samples, keeping each bucket's maxima.
fn downsample(t: &[Sample], buckets: usize) -> Vec<Sample> {
    if t.len() <= buckets {
        return t.to_vec();
    }
    let per = t.len().div_ceil(buckets);
    t.chunks(per)
        .map(|c| Sample {
            event: c[0].event,
            requested: c.iter().map(|s| s.requested).max().unwrap_or(0),
            allocated: c.iter().map(|s| s.allocated).max().unwrap_or(0),
            reserved: c.iter().map(|s| s.reserved).max().unwrap_or(0),
        })
        .collect()
}

/// Bytes in segments whose blocks are all inactive.
pub fn empty_segment_bytes(segments: &[SegmentInfo]) -> usize {
    segments
        .iter()
        .filter(|s| s.blocks.iter().all(|b| b.state == BlockState::Inactive))
        .map(|s| s.total_size)
        .sum()
}

fn chart(out: &mut String, r: &ReplayReport) {
    let pts = downsample(&r.timeline, PLOT_W as usize);
    // Power-of-two byte ticks (0, 512 MiB, 1 GiB, ...) and 1-2-5 event ticks.
    let top = r.peak_reserved.max(r.peak_requested).max(1);
    let ystep = top.div_ceil(5).next_power_of_two();
    let yticks = top.div_ceil(ystep);
    let ymax = (ystep * yticks) as f64 * 1.04;
    let xmax = (r.events.max(2) - 1) as f64;
    let xstep = nice_step(xmax / 6.0);
    let x = |e: usize| LEFT + e as f64 / xmax * PLOT_W;
    let y = |b: u64| CHART_TOP + CHART_H - b as f64 / ymax * CHART_H;
    // Axes and grid.
    for i in 0..=yticks {
        let v = (ystep * i) as f64;
        let yy = y(v as u64);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e9ecef"/>"##,
            LEFT + PLOT_W
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" class="small">{}</text>"##,
            LEFT - 6.0,
            yy + 4.0,
            format_size(v as usize)
        );
    }
    for i in 0..=(xmax / xstep) as usize {
        let e = (xstep * i as f64) as usize;
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="small">{e}</text>"##,
            x(e),
            CHART_TOP + CHART_H + 16.0
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="small">event</text>"##,
        LEFT + PLOT_W / 2.0,
        CHART_TOP + CHART_H + 32.0
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{CHART_TOP}" width="{PLOT_W}" height="{CHART_H}" fill="none" stroke="#868e96"/>"##
    );
    for (color, get) in [
        (C_RESERVED, (|s: &Sample| s.reserved) as fn(&Sample) -> u64),
        (C_ALLOCATED, |s: &Sample| s.allocated),
        (C_REQUESTED, |s: &Sample| s.requested),
    ] {
        let mut d = String::new();
        for (i, s) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                x(s.event),
                y(get(s))
            );
        }
        let _ = writeln!(
            out,
            r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.6"/>"##
        );
    }
    // The peak marker.
    let px = x(r.peak_event);
    let _ = writeln!(
        out,
        r##"<line x1="{px:.1}" y1="{CHART_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#495057" stroke-dasharray="4 3"/>"##,
        CHART_TOP + CHART_H
    );
    let anchor = if px > LEFT + PLOT_W * 0.7 {
        "end"
    } else {
        "start"
    };
    let dx = if anchor == "end" { -4.0 } else { 4.0 };
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="{anchor}" class="small">peak reserved {} at event {}</text>"##,
        px + dx,
        CHART_TOP + 14.0,
        format_size(r.peak_reserved as usize),
        r.peak_event
    );
    // Legend.
    let items = [
        (
            C_RESERVED,
            format!("reserved (peak {})", format_size(r.peak_reserved as usize)),
        ),
        (
            C_ALLOCATED,
            format!(
                "allocated (peak {})",
                format_size(r.peak_allocated as usize)
            ),
        ),
        (
            C_REQUESTED,
            format!(
                "requested (peak {})",
                format_size(r.peak_requested as usize)
            ),
        ),
    ];
    for (i, (c, label)) in items.iter().enumerate() {
        let lx = LEFT + i as f64 * 300.0;
        let ly = CHART_TOP - 12.0;
        let _ = writeln!(
            out,
            r##"<rect x="{lx}" y="{:.1}" width="14" height="4" fill="{c}"/>"##,
            ly - 4.0
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{ly:.1}" class="small">{}</text>"##,
            lx + 20.0,
            esc(label)
        );
    }
}

fn segment_map(out: &mut String, r: &ReplayReport) {
    let segs = &r.peak_segments;
    let total: usize = segs.iter().map(|s| s.total_size).sum();
    let empty = empty_segment_bytes(segs);
    let (mut allocated, mut pending) = (0usize, 0usize);
    for b in segs.iter().flat_map(|s| &s.blocks) {
        match b.state {
            BlockState::ActiveAllocated => allocated += b.size,
            BlockState::ActivePendingFree => pending += b.size,
            BlockState::Inactive => {}
        }
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" class="h2">Segments at peak reserved (event {}): {} in {} segments</text>"##,
        MAP_TOP - 44.0,
        r.peak_event,
        format_size(total),
        segs.len()
    );
    let pct = |n: usize| {
        if total == 0 {
            0.0
        } else {
            n as f64 * 100.0 / total as f64
        }
    };
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" class="small">Each row is {} of device memory; segments in address order, separated by dark ticks.</text>"##,
        MAP_TOP - 8.0,
        format_size(total.div_ceil(MAP_ROWS).max(1)),
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" class="small">allocated {} ({:.1}%), pending free {} ({:.1}%), cached free {} ({:.1}%), of which in wholly empty segments {} ({:.1}%)</text>"##,
        MAP_TOP - 24.0,
        format_size(allocated),
        pct(allocated),
        format_size(pending),
        pct(pending),
        format_size(total - allocated - pending),
        pct(total - allocated - pending),
        format_size(empty),
        pct(empty),
    );
    if total == 0 {
        return;
    }
    let per_row = total.div_ceil(MAP_ROWS) as f64;
    let scale = PLOT_W / per_row;
    // Paint runs of equal colour, splitting at row ends.
    let mut pos = 0f64; // bytes from the start
    let paint = |out: &mut String, start: f64, len: f64, color: &str| {
        let (mut s, mut left) = (start, len);
        while left > 0.0 {
            let row = (s / per_row).floor();
            let in_row = s - row * per_row;
            let take = left.min(per_row - in_row);
            let _ = writeln!(
                out,
                r##"<rect x="{:.2}" y="{:.1}" width="{:.2}" height="{ROW_H}" fill="{color}"/>"##,
                LEFT + in_row * scale,
                MAP_TOP + row * (ROW_H + ROW_GAP),
                (take * scale).max(0.3)
            );
            s += take;
            left -= take;
        }
    };
    let mut boundaries = Vec::new();
    for seg in segs {
        boundaries.push(pos);
        let seg_empty = seg.blocks.iter().all(|b| b.state == BlockState::Inactive);
        let mut run: Option<(&str, f64, f64)> = None;
        for b in &seg.blocks {
            let color = match b.state {
                BlockState::ActiveAllocated if b.lent_to.is_some() => C_LENT,
                BlockState::ActiveAllocated => C_ALLOCATED,
                BlockState::ActivePendingFree => C_PENDING,
                BlockState::Inactive if seg_empty => C_EMPTY_SEG,
                BlockState::Inactive => C_INACTIVE,
            };
            run = match run {
                Some((c, s, l)) if c == color => Some((c, s, l + b.size as f64)),
                Some((c, s, l)) => {
                    paint(out, s, l, c);
                    Some((color, pos, b.size as f64))
                }
                None => Some((color, pos, b.size as f64)),
            };
            pos += b.size as f64;
        }
        if let Some((c, s, l)) = run {
            paint(out, s, l, c);
        }
    }
    // Segment boundaries as thin dark ticks.
    for b in boundaries {
        let row = (b / per_row).floor();
        let xx = LEFT + (b - row * per_row) * scale;
        let yy = MAP_TOP + row * (ROW_H + ROW_GAP);
        let _ = writeln!(
            out,
            r##"<line x1="{xx:.2}" y1="{yy:.1}" x2="{xx:.2}" y2="{:.1}" stroke="#212529" stroke-width="1"/>"##,
            yy + ROW_H
        );
    }
    let ly = MAP_TOP + MAP_ROWS as f64 * (ROW_H + ROW_GAP) + 12.0;
    for (i, (c, label)) in [
        (C_ALLOCATED, "allocated"),
        (C_LENT, "lent to another stream"),
        (C_PENDING, "pending free (events)"),
        (C_INACTIVE, "cached free, segment in use"),
        (C_EMPTY_SEG, "wholly empty segment"),
    ]
    .iter()
    .enumerate()
    {
        let lx = LEFT + i as f64 * 196.0;
        let _ = writeln!(
            out,
            r##"<rect x="{lx}" y="{ly:.1}" width="14" height="12" fill="{c}" stroke="#868e96"/>"##
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" class="small">{label}</text>"##,
            lx + 20.0,
            ly + 10.0
        );
    }
}

/// The SVG picture of a replay (needs a report made with `detail`).
pub fn render(r: &ReplayReport) -> String {
    let height = MAP_TOP + MAP_ROWS as f64 * (ROW_H + ROW_GAP) + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">"##
    );
    out.push_str("<style>.small{font-size:12px;fill:#343a40}.h1{font-size:18px;font-weight:bold;fill:#212529}.h2{font-size:15px;font-weight:bold;fill:#212529}</style>\n");
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let conf = if r.conf.is_empty() {
        "default settings".to_string()
    } else {
        r.conf.clone()
    };
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="24" class="h1">{}</text>"##,
        esc(&r.name)
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="44" class="small">peak reserved / peak requested = {:.3} with {}; {}, {} events (simulated device)</text>"##,
        r.ratio(),
        esc(&conf),
        device_calls(r),
        r.events
    );
    chart(&mut out, r);
    segment_map(&mut out, r);
    out.push_str("</svg>\n");
    out
}

/// What the run asked of the device: segment mallocs, and page mappings if any.
fn device_calls(r: &ReplayReport) -> String {
    if r.page_maps == 0 {
        format!("{} device mallocs", r.device_mallocs)
    } else {
        format!(
            "{} page maps, {} unmaps, {} host syncs",
            r.page_maps, r.page_unmaps, r.host_syncs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsample_keeps_maxima() {
        let t: Vec<Sample> = (0..10)
            .map(|i| Sample {
                event: i,
                requested: i as u64,
                allocated: 0,
                reserved: 10 - i as u64,
            })
            .collect();
        let d = downsample(&t, 2);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].requested, 4);
        assert_eq!(d[0].reserved, 10);
        assert_eq!(d[1].requested, 9);
    }
}
