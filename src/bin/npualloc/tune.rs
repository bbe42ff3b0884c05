//! `npualloc tune`: the search of [`npualloc::replay::tune`], its table and its JSON.

use std::io::IsTerminal;

use serde_json::{json, Value};

use npualloc::replay::tune::{
    self, Outcome, Score, Tried, Tuning, GRID, MIN_CALLS_GAIN_PERCENT, MIN_CAPACITY_GAIN_PERCENT,
    ROUNDS,
};
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
        Outcome::BelowMinimumGain => "better by less than the minimum gain".into(),
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

/// The minimum gain, in words.
fn rule() -> String {
    format!(
        "needs at least {MIN_CAPACITY_GAIN_PERCENT}% less memory in all (total min capacity), \
         or as little with at least {MIN_CALLS_GAIN_PERCENT}% fewer device calls plus host syncs"
    )
}

/// `total` against `base`'s: bytes saved and the share.
fn saving(total: u64, base: u64) -> String {
    let saved = base as i128 - total as i128;
    format!(
        "{} {} of {} ({:.2}%)",
        if saved >= 0 { "saves" } else { "costs" },
        format_size(saved.unsigned_abs() as usize),
        format_size(base as usize),
        saved as f64 * 100.0 / base.max(1) as f64
    )
}

/// The closing lines: the best setting, or, when the defaults stay best, the setting
/// that came closest; what it changes per trace and in all.
pub fn summary(traces: &[Trace], t: &Tuning) -> String {
    let base = &t.tried[0];
    let (mut out, shown) = if t.best.is_empty() {
        let head = format!(
            "best: the defaults: no setting tried {}, without more device calls or host syncs \
             than the defaults\n",
            rule()
        );
        match t.closest_below_minimum() {
            Some(c) => (
                head + &format!("closest: {} (below the minimum gain)\n", c.conf),
                c,
            ),
            None => return head,
        }
    } else {
        (format!("best: {}\n", t.best), t.best_tried())
    };
    for ((tr, b), s) in traces.iter().zip(&base.scores).zip(&shown.scores) {
        match (b.capacity, s.capacity) {
            (None, Some(sc)) => out.push_str(&format!(
                "  {}: the defaults do not fit within the limit; this fits in {}\n",
                tr.name,
                format_size(sc as usize)
            )),
            (Some(bc), Some(sc)) => out.push_str(&format!(
                "  {}: min capacity {} -> {} ({:+.1}%), device calls {} -> {}, host syncs {} -> {}\n",
                tr.name,
                format_size(bc as usize),
                format_size(sc as usize),
                (sc as f64 - bc as f64) * 100.0 / bc.max(1) as f64,
                b.device_calls,
                s.device_calls,
                b.host_syncs,
                s.host_syncs
            )),
            _ => {}
        }
    }
    if let (Some(bt), Some(st)) = (base.total(), shown.total()) {
        out.push_str(&format!(
            "  in all: {}; device calls + host syncs {} -> {}\n",
            saving(st, bt),
            base.cost(),
            shown.cost(),
        ));
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
             min capacity found per trace in 1 MiB steps up to {}; a change is kept if, against \
             the best so far, it {}, and it raises no trace's device calls (segment mallocs + \
             page maps) or host syncs at its min capacity above the defaults'. \
             garbage_collection_threshold is not tried: it acts only with a memory fraction, \
             which a replay does not set.\n\
             cells: min capacity, x peak requested, device calls/host syncs\n",
            GRID.len(),
            format_size(limit),
            rule()
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
            "min_gain_percent": {"capacity": MIN_CAPACITY_GAIN_PERCENT, "calls": MIN_CALLS_GAIN_PERCENT},
            "closest_below_min_gain": t.closest_below_minimum().map(|c| c.conf.clone()),
            "tried": t.tried.iter().map(tried_json).collect::<Vec<_>>(),
        });
        out::print(serde_json::to_string_pretty(&v).expect("serialisable") + "\n")
    } else {
        out::print(format!("{}\n{}", table(traces, &t), summary(traces, &t)))
    }
}
