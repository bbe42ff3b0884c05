//! `npualloc tune`: the search of [`npualloc::replay::tune`], its table and its JSON.

use std::io::IsTerminal;

use serde_json::{json, Value};

use npualloc::replay::tune::{self, Outcome, Score, Tried, Tuning, GRID, ROUNDS};
use npualloc::stats::format_size;
use npualloc::trace::Trace;

use crate::out::{self, note, Stop};

fn mib(n: u64) -> String {
    format!("{} MiB", n >> 20)
}

fn cell(s: &Score) -> String {
    match s.capacity {
        Some(c) => format!(
            "{} x{:.3} {}/{}",
            mib(c),
            c as f64 / s.peak_requested.max(1) as f64,
            s.device_calls,
            s.host_syncs
        ),
        None => "does not fit".into(),
    }
}

fn verdict(o: &Outcome) -> String {
    match o {
        Outcome::Baseline => "baseline".into(),
        Outcome::Kept => "best so far".into(),
        Outcome::NotSmaller => "no better".into(),
        Outcome::MoreCalls => "more device calls or syncs".into(),
        Outcome::NoFit => "does not fit".into(),
        Outcome::Refused(e) => {
            // The allocator's reason, without its prefix and explanation.
            let e = e.trim_start_matches("invalid allocator config: ");
            format!("refused: {}", e.split(" (").next().unwrap_or(e))
        }
    }
}

/// The table of every setting tried.
pub fn table(traces: &[Trace], t: &Tuning) -> String {
    let mut head = vec!["#".to_string(), "change".into()];
    head.extend(traces.iter().map(|t| t.name.clone()));
    head.extend(["total".into(), "verdict".into()]);
    let rows: Vec<Vec<String>> = t
        .tried
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let mut r = vec![i.to_string(), x.change.clone()];
            if x.scores.is_empty() {
                r.extend(traces.iter().map(|_| "-".to_string()));
            } else {
                r.extend(x.scores.iter().map(cell));
            }
            r.push(x.total().map_or("-".into(), mib));
            r.push(verdict(&x.outcome));
            r
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            std::iter::once(&head)
                .chain(&rows)
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in std::iter::once(&head).chain(&rows) {
        let last = r.len() - 1;
        out.push(' ');
        for (c, (v, w)) in r.iter().zip(&widths).enumerate() {
            if c == last {
                out.push_str(&format!(" {v}"));
            } else if c == 1 {
                out.push_str(&format!(" {v:<w$}"));
            } else {
                out.push_str(&format!(" {v:>w$}"));
            }
        }
        out.push('\n');
    }
    out
}

/// The closing lines: the best setting and what it changes per trace.
pub fn summary(traces: &[Trace], t: &Tuning) -> String {
    let best = t.best_tried();
    let base = &t.tried[0];
    let mut out = if t.best.is_empty() {
        "best: the defaults (no setting tried does better without more device calls or syncs)\n"
            .to_string()
    } else {
        format!("best: {}\n", t.best)
    };
    for ((tr, b), s) in traces.iter().zip(&base.scores).zip(&best.scores) {
        if let (None, Some(sc)) = (b.capacity, s.capacity) {
            out.push_str(&format!(
                "  {}: the defaults do not fit within the limit; this fits in {}\n",
                tr.name,
                format_size(sc as usize)
            ));
        }
        if let (Some(bc), Some(sc)) = (b.capacity, s.capacity) {
            out.push_str(&format!(
                "  {}: min capacity {} -> {} ({:+.1}%), device calls {} -> {}, host syncs {} -> {}\n",
                tr.name,
                format_size(bc as usize),
                format_size(sc as usize),
                (sc as f64 - bc as f64) * 100.0 / bc.max(1) as f64,
                b.device_calls,
                s.device_calls,
                b.host_syncs,
                s.host_syncs
            ));
        }
    }
    out
}

fn score_json(s: &Score) -> Value {
    json!({"min_capacity": s.capacity, "peak_requested": s.peak_requested,
           "device_calls": s.device_calls, "host_syncs": s.host_syncs})
}

fn tried_json(t: &Tried) -> Value {
    json!({"conf": t.conf, "change": t.change, "outcome": verdict(&t.outcome),
           "total_min_capacity": t.total(),
           "traces": t.scores.iter().map(score_json).collect::<Vec<_>>()})
}

/// Runs the search, prints the table (or JSON) and the best setting.
pub fn run(traces: &[Trace], limit: usize, as_json: bool, quiet: bool) -> Result<(), Stop> {
    let show = !quiet && !as_json && std::io::stderr().is_terminal();
    if !as_json {
        out::print(format!(
            "tune: coordinate search over {} keys (at most {ROUNDS} rounds), each setting's \
             min capacity found per trace in 1 MiB steps up to {}; a setting must not raise \
             any trace's device calls (segment mallocs + page maps) or host syncs at its min \
             capacity above the defaults'. garbage_collection_threshold is not tried: it acts \
             only with a memory fraction, which a replay does not set.\n\
             cells: min capacity, x peak requested, device calls/host syncs\n",
            GRID.len(),
            format_size(limit)
        ))?;
    }
    let t = tune::tune(traces, limit, |x| {
        if show {
            note!(
                "  tried {}",
                if x.conf.is_empty() {
                    "(defaults)"
                } else {
                    &x.conf
                }
            );
        }
    })
    .map_err(|e| e.to_string())?;
    if as_json {
        let v = json!({
            "traces": traces.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            "best": t.best, "best_scores": t.best_tried().scores.iter().map(score_json).collect::<Vec<_>>(),
            "tried": t.tried.iter().map(tried_json).collect::<Vec<_>>(),
        });
        out::print(serde_json::to_string_pretty(&v).expect("serialisable") + "\n")
    } else {
        out::print(format!("{}\n{}", table(traces, &t), summary(traces, &t)))
    }
}
