//! The replay picture: bytes over time (reserved, allocated, requested), the same
//! zoomed in around the peak, and a map of every segment at the moment of peak
//! reserved, blocks coloured by state with a strip in the colour of the segment's
//! stream. Hovering a block shows its address, size, state and stream, and the
//! allocation and its frames when the caller knows them ([`render_with`]).
//!
//! Allocated bytes are drawn as a wide pale band under the thin requested line, so both
//! show where they coincide (they differ only by rounding). The zoomed panel spans a
//! window of events around the peak with both axes fitted to it; a peak at the last
//! event sits at the window's right with a margin after it.

use std::collections::HashMap;
use std::fmt::Write;

use super::{ReplayReport, Sample};
use crate::snapshot::{BlockState, SegmentInfo};
use crate::stats::format_size;

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const CHART_TOP: f64 = 84.0;
const CHART_H: f64 = 260.0;
const ZOOM_TOP: f64 = CHART_TOP + CHART_H + 84.0;
const ZOOM_H: f64 = 200.0;
const MAP_TOP: f64 = ZOOM_TOP + ZOOM_H + 120.0;
const MAP_ROWS: usize = 16;
const ROW_H: f64 = 20.0;
const ROW_GAP: f64 = 6.0;

// Colours: the Okabe–Ito palette (Okabe and Ito, "Color Universal Design", 2008), whose
// eight colours stay distinct with every common colour-vision deficiency; greys for what
// is not in use.
const OKABE_ITO: [&str; 8] = [
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
];
const C_RESERVED: &str = OKABE_ITO[6]; // vermillion
const C_ALLOCATED: &str = OKABE_ITO[5]; // blue
const C_LENT: &str = OKABE_ITO[7]; // reddish purple
const C_REQUESTED: &str = OKABE_ITO[0]; // black
const C_PENDING: &str = OKABE_ITO[1]; // orange
const C_INACTIVE: &str = "#dee2e6";
const C_EMPTY_SEG: &str = "#adb5bd";
/// Stream strip colours, by the order of the stream's label among the segments'.
const C_STREAMS: [&str; 8] = [
    OKABE_ITO[3],
    OKABE_ITO[1],
    OKABE_ITO[5],
    OKABE_ITO[7],
    OKABE_ITO[6],
    OKABE_ITO[2],
    OKABE_ITO[4],
    OKABE_ITO[0],
];
/// Most characters of a 12 px line between the left margin and the right edge (about
/// 6.6 px each in Helvetica), and of the 18 px title.
const SMALL_LINE_CHARS: usize = 150;
const TITLE_LINE_CHARS: usize = 95;
/// Line heights of the title's and the subtitle's wrapped lines.
const TITLE_LINE_H: f64 = 22.0;
const LINE_H: f64 = 16.0;

/// How far a header of `title` and `subtitle` lines pushes the rest down (0 for one of
/// each).
fn header_extra(title: usize, subtitle: usize) -> f64 {
    title.saturating_sub(1) as f64 * TITLE_LINE_H + subtitle.saturating_sub(1) as f64 * LINE_H
}
/// Height of the stream strip over each row.
const STRIP_H: f64 = 4.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `text` in lines of at most `max` characters, each cut after the last of `breaks` that
/// fits (mid-word only when a word alone is longer than a line).
fn wrap(text: &str, max: usize, breaks: &[char]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut rest: Vec<char> = text.chars().collect();
    while rest.len() > max {
        let cut = rest[..max]
            .iter()
            .rposition(|c| breaks.contains(c))
            .map_or(max, |i| i + 1);
        lines.push(
            rest[..cut]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_string(),
        );
        rest.drain(..cut);
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
    }
    lines.push(rest.into_iter().collect());
    lines
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

/// A plot of `pts` over events `x0..=x1` (a margin after `x1` when it is the last
/// event) and bytes `lo..=hi`, `top`/`h` its place on the page.
struct Panel {
    x0: f64,
    x1: f64,
    lo: u64,
    hi: u64,
    top: f64,
    h: f64,
}

impl Panel {
    fn x(&self, e: usize) -> f64 {
        LEFT + (e as f64 - self.x0) / (self.x1 - self.x0).max(1.0) * PLOT_W
    }
    fn y(&self, b: u64) -> f64 {
        let span = (self.hi - self.lo).max(1) as f64;
        self.top + self.h - (b.saturating_sub(self.lo)) as f64 / span * self.h
    }
}

/// Byte ticks between `lo` and `hi`: a power of two times 1 MiB-ish steps, at most ~6.
fn byte_ticks(lo: u64, hi: u64) -> (u64, u64, u64) {
    let step = ((hi - lo).max(1) / 5).max(1).next_power_of_two();
    let first = lo.div_ceil(step);
    let last = hi / step;
    (step, first, last)
}

fn draw_panel(out: &mut String, r: &ReplayReport, p: &Panel, pts: &[Sample]) {
    let (ystep, first, last) = byte_ticks(p.lo, p.hi);
    for i in first..=last {
        let v = ystep * i;
        let yy = p.y(v);
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
    let xstep = nice_step((p.x1 - p.x0) / 6.0);
    let mut e = (p.x0 / xstep).ceil() * xstep;
    while e <= p.x1 {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="small">{}</text>"##,
            p.x(e as usize),
            p.top + p.h + 16.0,
            e as usize
        );
        e += xstep;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{}" width="{PLOT_W}" height="{}" fill="none" stroke="#868e96"/>"##,
        p.top, p.h
    );
    // Reserved, then allocated as a wide pale band, then requested thin on top.
    for (color, width, opacity, get) in [
        (
            C_RESERVED,
            1.6,
            1.0,
            (|s: &Sample| s.reserved) as fn(&Sample) -> u64,
        ),
        (C_ALLOCATED, 6.0, 0.35, |s: &Sample| s.allocated),
        (C_REQUESTED, 1.4, 1.0, |s: &Sample| s.requested),
    ] {
        let mut d = String::new();
        for (i, s) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                p.x(s.event),
                p.y(get(s))
            );
        }
        let _ = writeln!(
            out,
            r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="{width}" stroke-opacity="{opacity}" stroke-linejoin="round"/>"##
        );
    }
    let px = p.x(r.peak_event);
    let _ = writeln!(
        out,
        r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{:.1}" stroke="#495057" stroke-dasharray="4 3"/>"##,
        p.top,
        p.top + p.h
    );
    let (anchor, dx) = if px > LEFT + PLOT_W * 0.7 {
        ("end", -4.0)
    } else {
        ("start", 4.0)
    };
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="{anchor}" class="small">peak reserved {} at event {}</text>"##,
        px + dx,
        p.top + 14.0,
        format_size(r.peak_reserved as usize),
        r.peak_event
    );
}

/// Events shown in the zoomed panel: about 1/16 of the trace (at least 40 events, at
/// most one per pixel column) around the peak, shifted to stay inside the trace.
fn zoom_window(events: usize, peak: usize) -> (usize, usize) {
    let last = events.saturating_sub(1);
    let w = (events / 16).clamp(40, PLOT_W as usize).min(last);
    let x0 = peak.saturating_sub(w / 2).min(last - w);
    (x0, x0 + w)
}

fn chart(out: &mut String, r: &ReplayReport) {
    let last = r.events.max(2) - 1;
    let top = r.peak_reserved.max(r.peak_requested).max(1);
    let (step, _, _) = byte_ticks(0, top);
    let main = Panel {
        x0: 0.0,
        // A margin after the last event, so a peak there is not on the frame.
        x1: last as f64 * 1.02,
        lo: 0,
        hi: (top.div_ceil(step) * step).max(top + top / 25),
        top: CHART_TOP,
        h: CHART_H,
    };
    draw_panel(out, r, &main, &downsample(&r.timeline, PLOT_W as usize));
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="small">event</text>"##,
        LEFT + PLOT_W / 2.0,
        CHART_TOP + CHART_H + 32.0
    );
    // The zoomed panel: the window around the peak, bytes fitted to it.
    let (z0, z1) = zoom_window(r.events, r.peak_event);
    let window: Vec<Sample> = r
        .timeline
        .iter()
        .filter(|s| (z0..=z1).contains(&s.event))
        .copied()
        .collect();
    let lo = window.iter().map(|s| s.requested).min().unwrap_or(0);
    let hi = window
        .iter()
        .map(|s| s.reserved.max(s.requested))
        .max()
        .unwrap_or(1);
    let pad = ((hi - lo) / 10).max(1 << 20);
    let zoom = Panel {
        x0: z0 as f64,
        x1: z1 as f64
            + if z1 + 1 >= r.events {
                (z1 - z0) as f64 * 0.05
            } else {
                0.0
            },
        lo: lo.saturating_sub(pad),
        hi: hi + pad,
        top: ZOOM_TOP,
        h: ZOOM_H,
    };
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" class="h2">Around the peak: events {z0} to {z1}</text>"##,
        ZOOM_TOP - 12.0
    );
    draw_panel(out, r, &zoom, &downsample(&window, PLOT_W as usize));
    // Legend.
    let items = [
        (
            C_RESERVED,
            format!("reserved (peak {})", format_size(r.peak_reserved as usize)),
        ),
        (
            C_ALLOCATED,
            format!(
                "allocated, pale band (peak {})",
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
        let (h, o) = if *c == C_ALLOCATED {
            (6.0, 0.35)
        } else {
            (3.0, 1.0)
        };
        let _ = writeln!(
            out,
            r##"<rect x="{lx}" y="{:.1}" width="14" height="{h}" fill="{c}" fill-opacity="{o}"/>"##,
            ly - 3.0 - h / 2.0
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{ly:.1}" class="small">{}</text>"##,
            lx + 20.0,
            esc(label)
        );
    }
}

fn segment_map(out: &mut String, r: &ReplayReport, notes: &HashMap<usize, String>) {
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
    // Each block is its own rectangle(s), split at row ends, with its hover text; the
    // segment's stream is the strip over it.
    let label: HashMap<usize, u32> = r.streams.iter().map(|(l, h)| (*h, *l)).collect();
    let mut order: Vec<u32> = segs
        .iter()
        .map(|s| label.get(&s.stream.0).copied().unwrap_or(u32::MAX))
        .collect();
    order.sort_unstable();
    order.dedup();
    let colour =
        |l: u32| C_STREAMS[order.iter().position(|o| *o == l).unwrap_or(0) % C_STREAMS.len()];
    let paint =
        |out: &mut String, start: f64, len: f64, color: &str, y_off: f64, h: f64, title: &str| {
            let (mut s, mut left) = (start, len);
            while left > 0.0 {
                let row = (s / per_row).floor();
                let in_row = s - row * per_row;
                let take = left.min(per_row - in_row);
                let _ = write!(
                    out,
                    r##"<rect x="{:.2}" y="{:.1}" width="{:.2}" height="{h}" fill="{color}">"##,
                    LEFT + in_row * scale,
                    MAP_TOP + row * (ROW_H + ROW_GAP) + y_off,
                    (take * scale).max(0.3)
                );
                if title.is_empty() {
                    out.push_str("</rect>\n");
                } else {
                    let _ = writeln!(out, "<title>{}</title></rect>", esc(title));
                }
                s += take;
                left -= take;
            }
        };
    let mut pos = 0f64; // bytes from the start
    let mut boundaries = Vec::new();
    for seg in segs {
        boundaries.push(pos);
        let stream = label.get(&seg.stream.0).copied().unwrap_or(u32::MAX);
        let seg_empty = seg.blocks.iter().all(|b| b.state == BlockState::Inactive);
        let stream_text = if stream == u32::MAX {
            format!("stream handle {}", seg.stream.0)
        } else {
            format!("stream {stream}")
        };
        paint(
            out,
            pos,
            seg.total_size as f64,
            colour(stream),
            0.0,
            STRIP_H,
            &format!(
                "segment at {:#x}: {}, {stream_text}{}",
                seg.address,
                format_size(seg.total_size),
                if seg.is_expandable {
                    ", expandable"
                } else {
                    ""
                }
            ),
        );
        for b in &seg.blocks {
            let (color, state) = match b.state {
                BlockState::ActiveAllocated if b.lent_to.is_some() => {
                    (C_LENT, "allocated, lent to another stream")
                }
                BlockState::ActiveAllocated => (C_ALLOCATED, "allocated"),
                BlockState::ActivePendingFree => (C_PENDING, "pending free"),
                BlockState::Inactive if seg_empty => (C_EMPTY_SEG, "cached free, segment empty"),
                BlockState::Inactive => (C_INACTIVE, "cached free"),
            };
            let mut title = format!(
                "{:#x}: {} ({} requested), {state}, {stream_text}",
                b.address,
                format_size(b.size),
                format_size(b.requested_size)
            );
            if let Some(note) = notes.get(&b.address) {
                let _ = write!(title, "\n{note}");
            }
            paint(
                out,
                pos,
                b.size as f64,
                color,
                STRIP_H,
                ROW_H - STRIP_H,
                &title,
            );
            pos += b.size as f64;
        }
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
    let ly = ly + 22.0;
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" class="small">strip over each segment: its stream</text>"##,
        ly + 10.0
    );
    for (i, l) in order.iter().enumerate().take(C_STREAMS.len()) {
        let lx = LEFT + 220.0 + i as f64 * 90.0;
        let name = if *l == u32::MAX {
            "other".to_string()
        } else {
            format!("stream {l}")
        };
        let _ = writeln!(
            out,
            r##"<rect x="{lx}" y="{ly:.1}" width="14" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" class="small">{name}</text>"##,
            colour(*l),
            lx + 20.0,
            ly + 10.0
        );
    }
}

/// The SVG picture of a replay (needs a report made with `detail`).
pub fn render(r: &ReplayReport) -> String {
    render_with(r, &HashMap::new())
}

/// [`render`], with `notes[address]` added to the hover text of the block there (its
/// allocation and frames, from [`super::blame::block_notes`]).
pub fn render_with(r: &ReplayReport, notes: &HashMap<usize, String>) -> String {
    let conf = if r.conf.is_empty() {
        "default settings".to_string()
    } else {
        r.conf.clone()
    };
    let title = wrap(&r.name, TITLE_LINE_CHARS, &['/', '-', '_', '.']);
    let subtitle = wrap(
        &format!(
            "peak reserved / peak requested = {:.3} with {}; {}, {} events (simulated device)",
            r.ratio(),
            conf,
            device_calls(r),
            r.events
        ),
        SMALL_LINE_CHARS,
        &[',', ' ', ';'],
    );
    // Lines past the first of each push everything below them down.
    let extra = header_extra(title.len(), subtitle.len());
    let height = MAP_TOP + MAP_ROWS as f64 * (ROW_H + ROW_GAP) + 62.0 + extra;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">"##
    );
    out.push_str("<style>.small{font-size:12px;fill:#343a40}.h1{font-size:18px;font-weight:bold;fill:#212529}.h2{font-size:15px;font-weight:bold;fill:#212529}</style>\n");
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let mut y = 24.0;
    for line in &title {
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="{y:.1}" class="h1">{}</text>"##,
            esc(line)
        );
        y += TITLE_LINE_H;
    }
    y -= TITLE_LINE_H - 20.0;
    for line in &subtitle {
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="{y:.1}" class="small">{}</text>"##,
            esc(line)
        );
        y += LINE_H;
    }
    let _ = writeln!(out, r##"<g transform="translate(0,{extra:.1})">"##);
    chart(&mut out, r);
    segment_map(&mut out, r, notes);
    out.push_str("</g>\n</svg>\n");
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

    fn small_report(text: &str) -> ReplayReport {
        let t = crate::trace::parse(text, "small.trace").unwrap();
        let opts = crate::replay::ReplayOptions {
            detail: true,
            ..Default::default()
        };
        crate::replay::replay(&t, &opts, |_| {}).unwrap()
    }

    #[test]
    fn a_peak_at_the_end_gets_a_zoomed_window_with_a_margin() {
        // 1,000 events, the peak at the last: the window ends there, 62 events wide.
        assert_eq!(zoom_window(1000, 999), (937, 999));
        assert_eq!(zoom_window(1000, 500), (469, 531));
        assert_eq!(zoom_window(1000, 0), (0, 62));
        assert_eq!(zoom_window(10, 9), (0, 9));
        assert_eq!(zoom_window(1, 0), (0, 0));
        let mut text: String = (0..300).map(|i| format!("a {i} 1024 0\nf {i}\n")).collect();
        text.push_str("a 999 104857600 1\n");
        let r = small_report(&text);
        assert_eq!(r.peak_event, 600);
        let svg = render(&r);
        assert!(svg.contains("Around the peak: events 560 to 600"), "{svg}");
        // The peak marker of the zoomed panel stands inside the frame, not on its edge.
        let marker = svg
            .lines()
            .filter(|l| l.contains("stroke-dasharray"))
            .nth(1)
            .unwrap();
        let x: f64 = marker.split('"').nth(1).unwrap().parse().unwrap();
        assert!(
            x < LEFT + PLOT_W - 20.0 && x > LEFT + PLOT_W * 0.8,
            "{marker}"
        );
    }

    #[test]
    fn lines_stream_strips_and_hover_details() {
        let r = small_report("a 0 1000 0\na 1 3000000 1\na 2 2000 0\nf 2\n");
        let mut notes = HashMap::new();
        let ptr = r.actions[0].addr;
        notes.insert(ptr, "allocation 0\n  forward (model.py:12)".to_string());
        let svg = render_with(&r, &notes);
        // Allocated is a wide pale band, drawn before the thin requested line.
        let band = svg
            .find(&format!(r##"stroke="{C_ALLOCATED}" stroke-width="6""##))
            .unwrap();
        let req = svg
            .find(&format!(r##"stroke="{C_REQUESTED}" stroke-width="1.4""##))
            .unwrap();
        assert!(band < req);
        // Each stream's segments carry its colour; the legend names both streams.
        assert!(svg.contains(&format!(r##"fill="{}"><title>segment at"##, C_STREAMS[0])));
        assert!(svg.contains(&format!(r##"fill="{}"><title>segment at"##, C_STREAMS[1])));
        assert!(svg.contains(">stream 0</text>") && svg.contains(">stream 1</text>"));
        // Hover text: address, size, state, stream, and the caller's note.
        let title =
            format!("<title>{ptr:#x}: 1024 bytes (1000 bytes requested), allocated, stream 0");
        let at = svg.find(&title).unwrap_or_else(|| panic!("{svg}"));
        assert!(svg[at..].starts_with(&format!(
            "{title}\nallocation 0\n  forward (model.py:12)</title>"
        )));
        assert!(svg.contains("cached free, stream 0"));
    }

    /// The text of every `<text>` element, with its class.
    fn texts(svg: &str) -> Vec<(&str, &str)> {
        svg.split("<text ")
            .skip(1)
            .map(|t| {
                let class = t
                    .split("class=\"")
                    .nth(1)
                    .and_then(|c| c.split('"').next())
                    .unwrap_or("");
                let body = t.split('>').nth(1).unwrap_or("");
                (class, body.split("</text").next().unwrap_or(""))
            })
            .collect()
    }

    #[test]
    fn long_settings_and_names_wrap_inside_the_picture() {
        let text = "a 0 1000 0\na 1 3000000 0\nf 0\n";
        let t = crate::trace::parse(text, "small.trace").unwrap();
        let conf = crate::config::PYTORCH_POLICY.to_string() + ",max_split_size_mb:128";
        let opts = crate::replay::ReplayOptions {
            detail: true,
            conf: conf.clone(),
            ..Default::default()
        };
        let mut r = crate::replay::replay(&t, &opts, |_| {}).unwrap();
        r.name = format!(
            "/data/{}/traces/run.trace",
            "very_long_folder_name-".repeat(8)
        );
        let svg = render(&r);
        for (class, body) in &texts(&svg) {
            let max = if *class == "h1" {
                TITLE_LINE_CHARS
            } else {
                SMALL_LINE_CHARS
            };
            assert!(body.chars().count() <= max, "{class}: {body}");
        }
        // Nothing is lost: the header's lines put together are the name and the subtitle.
        let header = texts(&svg[..svg.find("<g transform").unwrap()]);
        let squeeze = |v: Vec<&str>| v.concat().replace(' ', "");
        let h1: Vec<&str> = header.iter().filter(|t| t.0 == "h1").map(|t| t.1).collect();
        assert!(h1.len() > 1, "{h1:?}");
        assert_eq!(squeeze(h1), r.name);
        let sub: Vec<&str> = header
            .iter()
            .filter(|t| t.0 == "small")
            .map(|t| t.1)
            .collect();
        assert!(sub.len() > 1, "{sub:?}");
        assert!(squeeze(sub).contains(&conf), "{svg}");
        // What follows moved down by the extra lines, and the picture grew with it.
        let plain = render(&small_report(text));
        let height = |svg: &str| -> f64 {
            let h = svg.split("height=\"").nth(1).unwrap();
            h[..h.find('"').unwrap()].parse().unwrap()
        };
        let extra = header_extra(
            header.iter().filter(|t| t.0 == "h1").count(),
            header.iter().filter(|t| t.0 == "small").count(),
        );
        assert!(extra > 0.0);
        assert_eq!(height(&svg), height(&plain) + extra);
        assert!(svg.contains(&format!(r##"<g transform="translate(0,{extra:.1})">"##)));
    }

    #[test]
    fn wrap_breaks_after_separators_and_keeps_every_character() {
        assert_eq!(wrap("short", 10, &[',']), ["short"]);
        assert_eq!(wrap("aaa,bbb,ccc", 8, &[',']), ["aaa,bbb,", "ccc"]);
        assert_eq!(wrap("abcdefghij", 4, &[',']), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("one two three", 8, &[' ']), ["one two", "three"]);
    }

    #[test]
    fn colours_are_okabe_ito_or_grey() {
        let greys = [C_INACTIVE, C_EMPTY_SEG];
        for c in [C_RESERVED, C_ALLOCATED, C_LENT, C_REQUESTED, C_PENDING]
            .into_iter()
            .chain(C_STREAMS)
        {
            assert!(OKABE_ITO.contains(&c) || greys.contains(&c), "{c}");
        }
        // The chart's three series and the map's three block states each differ.
        let chart = [C_RESERVED, C_ALLOCATED, C_REQUESTED];
        let map = [C_ALLOCATED, C_LENT, C_PENDING];
        for set in [&chart[..], &map[..], &C_STREAMS[..]] {
            let distinct: std::collections::HashSet<_> = set.iter().collect();
            assert_eq!(distinct.len(), set.len(), "{set:?}");
        }
    }

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
