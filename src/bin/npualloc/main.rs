//! `npualloc`: replay allocation traces through the allocator on the simulated device,
//! and convert PyTorch / torch_npu memory snapshots into traces.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use npualloc::device::sim::AddressOrder;
use npualloc::replay::blame::{self, Blame};
use npualloc::replay::orders::{self, OrderRun};
use npualloc::replay::{self, svg, MinCapacity, ReplayOptions, ReplayReport};
use npualloc::snapshot::segments_json;
use npualloc::stats::format_size;
use npualloc::trace::frames::Stacks;
use npualloc::trace::{self, Trace};

mod oom;
mod out;
mod settings;
mod size;
mod tune;

use out::{note, Stop};

#[derive(Parser)]
#[command(
    name = "npualloc",
    version,
    about = "npualloc caching allocator tools (simulated device)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Arguments of `npualloc replay`.
#[derive(Args)]
struct ReplayArgs {
    /// Trace files (.trace, snapshot .pickle or .json).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Allocator settings (PyTorch syntax), `NAME=SETTINGS` to name the column; repeat to
    /// compare side by side. A leading `pytorch` stands for PyTorch's policy
    /// (`pytorch,expandable_segments:True`), `torch_npu` for torch_npu 2.14's (PyTorch's
    /// plus 32-byte request padding).
    #[arg(long = "conf")]
    confs: Vec<String>,
    /// Simulated device capacity: bytes, or a number with K, M, G or T (also KiB, MiB,
    /// GiB, TiB; powers of 1024), e.g. 64G, 1.5GiB, 512MiB.
    #[arg(long, default_value = "64G")]
    capacity: String,
    /// The order in which the simulated device hands out addresses: increasing,
    /// decreasing, shuffled:SEED or lowest-free.
    #[arg(long, default_value = "increasing")]
    address_order: AddressOrder,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
    /// Write the picture (SVG); several traces or settings add a suffix per run.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Write an HTML page with the table and the picture.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Write the allocator's state at peak reserved and the replay's events, in PyTorch's
    /// _snapshot() shape: a pickle for a .pickle or .pkl name (what torch's _memory_viz
    /// and memory_viz page read), JSON for any other; replay and convert read both.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Device trace to read from a snapshot (default: the first with events).
    #[arg(long)]
    device: Option<usize>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Replay each trace this many times in a row (what one repetition left live is
    /// freed before the next), to see steady state.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    repeat: u16,
    /// Also binary-search the smallest capacity (1 MiB steps, up to --capacity) at which
    /// each replay completes with no OOM, and report the replay there.
    #[arg(long)]
    min_capacity: bool,
    /// At peak reserved, list the top call sites by live bytes and by bytes wasted, per
    /// stream (needs a snapshot or trace with frames to name call sites).
    #[arg(long)]
    blame: bool,
    /// With an OOM: list every segment just after the first one failed (after the last
    /// rung released what it could): stream, pool, bytes allocated, pending, free.
    #[arg(long)]
    oom_segments: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Replay traces (.trace, a PyTorch snapshot .pickle, or a snapshot as JSON) and report
    /// fragmentation and speed.
    Replay(ReplayArgs),
    /// Derive a multi-stream case (comm, branch, rr4) from a single-stream trace.
    Derive {
        /// The single-stream trace.
        trace: PathBuf,
        /// comm (a communication stream 16–256 allocations late), comm<N> (exactly N late:
        /// comm16, comm64, comm256), branch (a side branch), rr4 (4 streams).
        #[arg(long)]
        case: String,
        /// Output trace file (`-`: stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Search allocator settings for the smallest device each trace runs on, without more
    /// device calls or host syncs than the defaults; prints what it tried and the best.
    Tune {
        /// Trace files (.trace, snapshot .pickle or .json).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Largest simulated device tried: bytes, or a number with K, M, G or T (also KiB,
        /// MiB, GiB, TiB; powers of 1024), e.g. 64G, 1.5GiB.
        #[arg(long, default_value = "64G")]
        capacity: String,
        /// Device trace to read from a snapshot.
        #[arg(long)]
        device: Option<usize>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
        /// No progress lines.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Convert a PyTorch / torch_npu memory snapshot (pickle, or JSON) into a text trace.
    Convert {
        /// The snapshot: `torch.npu.memory._dump_snapshot()`'s pickle, or a snapshot as JSON
        /// (`npualloc replay --snapshot s.json`).
        snapshot: PathBuf,
        /// Output trace file (`-`: stdout).
        #[arg(short, long)]
        output: PathBuf,
        /// Device trace to convert (default: the first with events).
        #[arg(long)]
        device: Option<usize>,
    },
}

/// `--capacity`: a size ([`size::parse_size`]) that leaves room for an allocation.
fn parse_capacity(s: &str) -> Result<usize, String> {
    let n = size::parse_size(s).map_err(|e| format!("--capacity '{s}': {e}"))?;
    if n == 0 {
        return Err(format!(
            "--capacity '{s}': a device of 0 bytes cannot hold any allocation; give the \
             simulated device's size, e.g. 64G (the default) or 80MiB"
        ));
    }
    usize::try_from(n)
        .map_err(|_| format!("--capacity '{s}': larger than this machine's address space"))
}

/// A trace as read, with the stacks of its allocations (empty when it has none).
struct Loaded {
    trace: Trace,
    stacks: Stacks,
}

/// Reads a text trace or a snapshot pickle; what a conversion added or left out is
/// said on stderr.
fn load(path: &Path, device: Option<usize>) -> Result<Loaded, String> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let snapshot = if is_pickle(path) || bytes.first() == Some(&PICKLE_PROTO) {
        Some(trace::pickle::read_snapshot(&bytes, &name, device))
    } else if is_json(path, &bytes) {
        Some(trace::pickle::read_json_snapshot(&bytes, &name, device))
    } else {
        None
    };
    let loaded = if let Some(s) = snapshot {
        let s = s.map_err(|e| e.to_string())?;
        for line in s.notes.lines() {
            note!("note: {name}: {line}");
        }
        Loaded {
            stacks: s.stacks(),
            trace: s.trace,
        }
    } else {
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("{name}: not UTF-8 text (a .trace file is text)"))?;
        let (trace, stacks) =
            trace::frames::parse_with_stacks(&text, &name).map_err(|e| e.to_string())?;
        Loaded { trace, stacks }
    };
    if loaded.trace.ops.is_empty() {
        return Err(format!(
            "{name}: no events (the trace is empty or holds only its header)"
        ));
    }
    Ok(loaded)
}

/// A bar that stays hidden until `run_one` decides to show it.
fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

fn run_one(trace: &Trace, opts: &ReplayOptions, quiet: bool) -> Result<ReplayReport, String> {
    let bar = progress_bar(trace.ops.len());
    bar.set_message(trace.name.clone());
    let start = Instant::now();
    let show = !quiet && std::io::stderr().is_terminal();
    let mut shown = false;
    let report = replay::replay(trace, opts, |done| {
        // Only traces that take over a second of work get a bar.
        if show && !shown && start.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position(done as u64);
    })
    .map_err(|e| format!("{}: {e}", trace.name))?;
    bar.finish_and_clear();
    if let Err(e) = &report.invariants {
        return Err(format!(
            "{}: allocator invariant broken after replay: {e}",
            trace.name
        ));
    }
    Ok(report)
}

fn bytes(n: u64) -> String {
    format!("{} ({n})", format_size(n as usize))
}

/// Formats one table cell of a report.
type Cell = fn(&ReplayReport) -> String;

/// The rows `--min-capacity` adds: the search's result and the replay at it.
fn min_rows(m: &MinCapacity) -> Vec<String> {
    match m {
        MinCapacity::Fits {
            capacity, at_min, ..
        } => vec![
            bytes(*capacity),
            format!("{:.3}", m.ratio().unwrap_or(0.0)),
            at_min.device_mallocs.to_string(),
            at_min.host_syncs.to_string(),
            at_min.stalled_waits.to_string(),
            at_min.device_waits.to_string(),
            at_min.retries.to_string(),
        ],
        MinCapacity::NoFit { limit, ooms } => {
            let mut v = vec![format!(
                "none: {ooms} OOMs at {}",
                format_size(*limit as usize)
            )];
            v.resize(MIN_ROWS.len(), "-".into());
            v
        }
    }
}

const MIN_ROWS: [&str; 7] = [
    "min capacity",
    "min cap / requested",
    "  device mallocs",
    "  host syncs",
    "  stalled waits",
    "  device waits",
    "  retries",
];

/// The side-by-side table of one trace's runs, one column per setting (`labels`).
fn table(reports: &[ReplayReport], labels: &[String], mins: &[MinCapacity]) -> String {
    let rows: Vec<(&str, Cell)> = vec![
        ("events", |r| r.events.to_string()),
        ("allocations", |r| r.allocations.to_string()),
        ("peak requested", |r| bytes(r.peak_requested)),
        ("peak allocated", |r| bytes(r.peak_allocated)),
        ("peak reserved", |r| bytes(r.peak_reserved)),
        ("reserved / requested", |r| format!("{:.3}", r.ratio())),
        ("floor / requested", |r| format!("{:.3}", r.floor_ratio())),
        ("device mallocs", |r| r.device_mallocs.to_string()),
        ("device frees", |r| r.device_frees.to_string()),
        ("page maps", |r| r.page_maps.to_string()),
        ("page unmaps", |r| r.page_unmaps.to_string()),
        ("host syncs", |r| r.host_syncs.to_string()),
        ("stalled waits", |r| r.stalled_waits.to_string()),
        ("device waits", |r| r.device_waits.to_string()),
        ("retries", |r| r.retries.to_string()),
        ("OOMs", |r| r.ooms.to_string()),
        ("replay speed", |r| {
            format!("{:.2} M events/s", r.events_per_sec() / 1e6)
        }),
    ];
    let cols: Vec<Vec<String>> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            std::iter::once(labels.get(i).cloned().unwrap_or_default())
                .chain(rows.iter().map(|(_, f)| f(r)))
                .chain(mins.get(i).map(min_rows).unwrap_or_default())
                .collect()
        })
        .collect();
    let mut names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    if !mins.is_empty() {
        names.extend(MIN_ROWS);
    }
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| c.iter().map(|s| s.len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for i in 0..=names.len() {
        let name = if i == 0 { "" } else { names[i - 1] };
        out.push_str(&format!("  {name:<22}"));
        for (c, w) in cols.iter().zip(&widths) {
            out.push_str(&format!("  {:>w$}", c[i], w = *w));
        }
        out.push('\n');
    }
    out
}

fn min_json(m: &MinCapacity) -> Value {
    match m {
        MinCapacity::Fits {
            capacity,
            at_min,
            replays,
            ..
        } => json!({
            "bytes": capacity, "over_requested": m.ratio(),
            "device_mallocs": at_min.device_mallocs, "device_frees": at_min.device_frees,
            "host_syncs": at_min.host_syncs, "stalled_waits": at_min.stalled_waits,
            "device_waits": at_min.device_waits,
            "retries": at_min.retries, "peak_reserved": at_min.peak_reserved,
            "replays": replays,
        }),
        MinCapacity::NoFit { limit, ooms } => json!({
            "bytes": null, "does_not_fit_in": limit, "ooms": ooms,
        }),
    }
}

/// A setting's figures under each address order, and their spread ([lowest, highest]).
fn orders_json(runs: &[OrderRun]) -> Value {
    let each: Vec<Value> = runs
        .iter()
        .map(|r| {
            json!({"order": r.order.to_string(), "peak_reserved": r.peak_reserved,
                   "min_capacity": r.min_capacity})
        })
        .collect();
    json!({
        "runs": each,
        "peak_reserved": orders::spread(runs, |r| Some(r.peak_reserved)),
        "min_capacity": orders::spread(runs, |r| r.min_capacity),
    })
}

fn report_json(r: &ReplayReport, min: Option<&MinCapacity>) -> Value {
    let mut v = json!({
        "trace": r.name, "conf": r.conf, "events": r.events, "allocations": r.allocations,
        "peak_requested": r.peak_requested, "peak_allocated": r.peak_allocated,
        "peak_reserved": r.peak_reserved, "reserved_over_requested": r.ratio(),
        "pending_floor": r.pending_floor, "floor_over_requested": r.floor_ratio(),
        "device_mallocs": r.device_mallocs, "device_frees": r.device_frees,
        "page_maps": r.page_maps, "page_unmaps": r.page_unmaps, "host_syncs": r.host_syncs,
        "stalled_waits": r.stalled_waits, "device_waits": r.device_waits,
        "retries": r.retries, "ooms": r.ooms, "seconds": r.seconds,
        "events_per_sec": r.events_per_sec(),
        "empty_segment_bytes_at_peak": svg::empty_segment_bytes(&r.peak_segments),
        "reserved_after_drain": r.reserved_after_drain,
        "memory_short": r.memory_short,
    });
    if let Some(m) = min {
        v["min_capacity"] = min_json(m);
    }
    v
}

/// Frames as PyTorch's snapshots write them.
fn frames_json(stack: Option<&trace::frames::Stack>) -> Value {
    let frames: Vec<Value> = stack
        .map(|s| {
            s.iter()
                .map(|f| json!({"filename": f.filename, "line": f.line, "name": f.name}))
                .collect()
        })
        .unwrap_or_default();
    Value::Array(frames)
}

/// The state at peak in PyTorch's snapshot shape, with the trace's frames on the actions
/// and on the blocks live at the peak.
fn snapshot_json(r: &ReplayReport, t: &Trace, stacks: &Stacks) -> Value {
    let id_of = |event: usize| match t.ops.get(event) {
        Some(trace::Op::Alloc { id, .. } | trace::Op::Free { id }) => Some(*id),
        _ => None,
    };
    let traces: Vec<Value> = r
        .actions
        .iter()
        .map(|a| {
            let frames = frames_json(id_of(a.event).and_then(|id| stacks.get(&id)));
            json!({"action": a.action, "addr": a.addr, "size": a.size, "stream": a.stream, "time_us": a.event, "frames": frames})
        })
        .collect();
    let mut segments = segments_json(0, &r.peak_segments);
    if !stacks.is_empty() {
        let ids = blame::ids_at_peak(t, r);
        for b in segments
            .iter_mut()
            .filter_map(|s| s["blocks"].as_array_mut())
            .flatten()
        {
            let id = b["address"].as_u64().and_then(|a| ids.get(&(a as usize)));
            if let Some(stack) = id.and_then(|id| stacks.get(id)) {
                b["frames"] = frames_json(Some(stack));
            }
        }
    }
    json!({ "segments": segments, "device_traces": [traces] })
}

/// `out.svg` for a single run; `out-<trace>-<setting>.svg` when there are several.
fn named(path: &Path, r: &ReplayReport, label: &str, many: bool) -> PathBuf {
    if !many {
        return path.to_path_buf();
    }
    let part = |p: Option<&std::ffi::OsStr>| p.map(|s| s.to_string_lossy().into_owned());
    let stem = part(path.file_stem()).unwrap_or_default();
    let trace = part(Path::new(&r.name).file_stem()).unwrap_or_default();
    let name = format!("{stem}-{trace}-{}", settings::file_part(label));
    match part(path.extension()) {
        Some(ext) => path.with_file_name(format!("{name}.{ext}")),
        None => path.with_file_name(name),
    }
}

/// Whether `path` names a pickle (`.pickle` / `.pkl`).
fn is_pickle(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "pickle" || e == "pkl")
}

/// The first byte of a pickle of protocol 2 or later (the PROTO opcode), whatever the
/// file's name.
const PICKLE_PROTO: u8 = 0x80;

/// Whether a file is a JSON snapshot: named `.json`, or starting with `{` or `[`, which
/// no text trace does.
fn is_json(path: &Path, bytes: &[u8]) -> bool {
    path.extension().is_some_and(|e| e == "json")
        || bytes
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| matches!(b, b'{' | b'['))
}

/// Writes an output file and says so on stderr; `-` is stdout.
fn write(path: &Path, content: impl AsRef<[u8]>, what: &str) -> Result<(), Stop> {
    if path == Path::new("-") {
        return out::print(content);
    }
    std::fs::write(path, content).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    note!("wrote {what} to {}", path.display());
    Ok(())
}

/// One trace's runs, one per setting, in `--conf` order.
struct TraceRuns {
    trace: Trace,
    stacks: Stacks,
    reports: Vec<ReplayReport>,
    mins: Vec<MinCapacity>,
    blames: Vec<Blame>,
    /// Per setting, with `--json` and address ties: its figures under each address order.
    orders: Vec<Option<Vec<OrderRun>>>,
}

/// An HTML page: per trace, the settings' table and their pictures side by side.
fn html_page(runs: &[TraceRuns], labels: &[String]) -> String {
    let mut body = String::new();
    for t in runs {
        body.push_str(&format!(
            "<h2>{}</h2>\n<pre>{}</pre>\n<div class=\"runs\">",
            html_escape(&t.trace.name),
            html_escape(&table(&t.reports, labels, &t.mins))
        ));
        for (r, label) in t.reports.iter().zip(labels) {
            body.push_str(&format!(
                "<figure><figcaption>{}</figcaption>{}</figure>",
                html_escape(label),
                svg::render_with(r, &blame::block_notes(&t.trace, &t.stacks, r))
            ));
        }
        body.push_str("</div>\n");
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>npualloc replay</title>\
         <style>body{{font-family:Helvetica,Arial,sans-serif;margin:24px}}pre{{font-size:13px}}\
         .runs{{display:flex;flex-wrap:wrap;gap:16px}}figure{{margin:0}}\
         figcaption{{font-weight:bold;margin-bottom:4px}}</style></head>\
         <body><h1>npualloc replay (simulated device)</h1>\n{body}</body></html>\n"
    )
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Replays every trace under every setting; `Ok(false)` when some replay ran out of
/// memory (reported on stderr).
fn replay_cmd(args: ReplayArgs) -> Result<bool, Stop> {
    let capacity = parse_capacity(&args.capacity)?;
    let settings = settings::parse_all(&args.confs)?;
    let labels: Vec<String> = settings.iter().map(|s| s.label.clone()).collect();
    let detail = args.blame || args.svg.is_some() || args.html.is_some() || args.snapshot.is_some();
    let many = args.traces.len() * settings.len() > 1;
    let mut fits = true;
    let mut runs = Vec::new();
    for path in &args.traces {
        let loaded = load(path, args.device)?;
        let n = args.repeat.into();
        let mut t = TraceRuns {
            trace: loaded.trace.repeated(n),
            stacks: blame::repeat_stacks(&loaded.trace, &loaded.stacks, n),
            reports: Vec::new(),
            mins: Vec::new(),
            blames: Vec::new(),
            orders: Vec::new(),
        };
        for setting in &settings {
            let opts = ReplayOptions {
                conf: setting.conf.clone(),
                capacity,
                detail,
                address_order: args.address_order,
            };
            let r = run_one(&t.trace, &opts, args.quiet)?;
            oom::report(&r, &setting.label, capacity, args.oom_segments);
            fits &= r.ooms == 0;
            if let Some(p) = &args.svg {
                let out = named(p, &r, &setting.label, many);
                let notes = blame::block_notes(&t.trace, &t.stacks, &r);
                write(&out, svg::render_with(&r, &notes), "the picture")?;
            }
            if let Some(p) = &args.snapshot {
                let out = named(p, &r, &setting.label, many);
                let json = snapshot_json(&r, &t.trace, &t.stacks);
                if is_pickle(&out) {
                    let bytes = npualloc::pickle::to_pickle(&json);
                    write(&out, bytes, "the snapshot (pickle)")?;
                } else {
                    write(&out, json.to_string(), "the snapshot (JSON)")?;
                }
            }
            if args.min_capacity {
                let search = ReplayOptions {
                    detail: false,
                    ..opts
                };
                let m = replay::min_capacity(&t.trace, &search)
                    .map_err(|e| format!("{}: {e}", t.trace.name))?;
                t.mins.push(m);
            }
            if args.blame {
                t.blames.push(blame::blame(&t.trace, &t.stacks, &r));
            }
            let by_address =
                args.json && orders::depends_on_addresses(&setting.conf).unwrap_or(false);
            t.orders.push(if by_address {
                let o = ReplayOptions {
                    conf: setting.conf.clone(),
                    capacity,
                    detail: false,
                    address_order: args.address_order,
                };
                let runs = orders::across_orders(&t.trace, &o, args.min_capacity)
                    .map_err(|e| format!("{}: {e}", t.trace.name))?;
                Some(runs)
            } else {
                None
            });
            t.reports.push(r);
        }
        if !args.json {
            out::print(format!(
                "{} ({} events)\n{}\n",
                t.trace.name,
                t.trace.ops.len(),
                table(&t.reports, &labels, &t.mins)
            ))?;
            for (b, label) in t.blames.iter().zip(&labels) {
                out::print(format!("[{label}] {}\n", b.text()))?;
            }
        }
        runs.push(t);
    }
    if !args.json {
        let legend = settings::legend(&settings);
        if !legend.is_empty() {
            out::print(format!("settings:\n{}\n", legend.join("\n")))?;
        }
    }
    if args.json {
        let v: Vec<Value> = runs
            .iter()
            .flat_map(|t| {
                t.reports
                    .iter()
                    .zip(&labels)
                    .enumerate()
                    .map(|(i, (r, label))| {
                        let mut v = report_json(r, t.mins.get(i));
                        v["label"] = json!(label);
                        if let Some(b) = t.blames.get(i) {
                            v["blame"] = b.json();
                        }
                        if let Some(Some(runs)) = t.orders.get(i) {
                            v["address_orders"] = orders_json(runs);
                        }
                        v
                    })
            })
            .collect();
        out::print(serde_json::to_string_pretty(&v).expect("serialisable") + "\n")?;
    }
    if let Some(p) = &args.html {
        write(p, html_page(&runs, &labels), "the page")?;
    }
    Ok(fits)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => match replay_cmd(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(3),
            Err(e) => Err(e),
        },
        Command::Derive {
            trace,
            case,
            output,
        } => derive_cmd(&trace, &case, &output),
        Command::Tune {
            traces,
            capacity,
            device,
            json,
            quiet,
        } => (|| {
            let limit = parse_capacity(&capacity)?;
            let loaded: Vec<Trace> = traces
                .iter()
                .map(|p| load(p, device).map(|l| l.trace))
                .collect::<Result<_, _>>()?;
            tune::run(&loaded, limit, json, quiet)
        })(),
        Command::Convert {
            snapshot,
            output,
            device,
        } => convert_cmd(&snapshot, &output, device),
    };
    match result {
        Ok(()) | Err(Stop::Closed) => ExitCode::SUCCESS,
        Err(Stop::Error(e)) => {
            note!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `npualloc derive`: a multi-stream case written to `output`.
fn derive_cmd(trace: &Path, case: &str, output: &Path) -> Result<(), Stop> {
    let t = load(trace, None)?;
    let d = trace::derive::derive(&t.trace, case).ok_or_else(|| {
        format!(
            "unknown case '{case}': expected one of {} or comm<N>",
            trace::derive::CASES.join(", ")
        )
    })?;
    let mut out = Vec::new();
    d.write_to(&mut out).map_err(|e| e.to_string())?;
    write(output, out, &format!("{} events", d.ops.len()))
}

/// `npualloc convert`: a snapshot written as a text trace with its frames.
fn convert_cmd(snapshot: &Path, output: &Path, device: Option<usize>) -> Result<(), Stop> {
    let t = load(snapshot, device)?;
    let mut out = Vec::new();
    trace::frames::write_with_stacks(&t.trace, &t.stacks, &mut out).map_err(|e| e.to_string())?;
    let what = format!(
        "{} events ({} allocations with frames)",
        t.trace.ops.len(),
        t.stacks.len()
    );
    write(output, out, &what)
}
