//! Multi-stream cases derived from single-stream traces, for measuring how per-stream
//! pools strand memory (the lending work of the virtual-memory issue).
//!
//! Rules (deterministic; "group" = a run of consecutive allocations):
//! - `comm`: a communication stream (1) uses every third allocation of at least 1 MiB
//!   (`r id 1` right after it) and completes (`s 1`) after a lag of 16–256 allocations
//!   (drawn per completion from a fixed-seed generator), like gradients handed to a
//!   collective that runs behind the compute stream.
//! - `comm<N>` (`comm16`, `comm64`, `comm256`, any N ≥ 1): the same with a fixed lag of
//!   N allocations, so the communication lag is a parameter of the measurement.
//! - `branch`: alternate groups of 48 allocations run on a side-branch stream (1); at
//!   the end of each side group, its tensors still alive are used by the main stream
//!   (`r id 0`), and each stream completes (`s 0`, `s 1`) at every group boundary.
//! - `rr4`: groups of 48 allocations rotate over four streams (0–3); at each boundary,
//!   the finishing group's live tensors are used by the next stream (`r id <next>`)
//!   and the finishing stream completes.
//!
//! Frees stay where the original trace has them (a free is on its allocation's stream).

use std::collections::HashMap;

use super::{Op, Trace};

/// The derived cases (besides `comm<N>`, see [`LAG_CASES`]).
pub const CASES: [&str; 3] = ["comm", "branch", "rr4"];

/// The communication cases with a fixed lag that issue #16 measures (`comm<N>` takes any
/// lag N ≥ 1).
pub const LAG_CASES: [&str; 3] = ["comm16", "comm64", "comm256"];

/// The lag of a communication case: `comm` → `Some(None)` (drawn, 16–256), `comm<N>` →
/// `Some(Some(N))`; anything else `None`.
fn comm_lag(case: &str) -> Option<Option<usize>> {
    let rest = case.strip_prefix("comm")?;
    if rest.is_empty() {
        return Some(None);
    }
    match rest.parse::<usize>() {
        Ok(n) if n >= 1 && !rest.starts_with('+') => Some(Some(n)),
        _ => None,
    }
}

const GROUP: usize = 48;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Derives case `case` (one of [`CASES`]) from a single-stream trace.
pub fn derive(trace: &Trace, case: &str) -> Option<Trace> {
    let mut out = Vec::with_capacity(trace.ops.len() * 5 / 4);
    let mut live: HashMap<u64, u32> = HashMap::new(); // id -> stream
    let mut allocs = 0usize;
    match case {
        _ if comm_lag(case).is_some() => {
            let fixed = comm_lag(case).flatten();
            let mut rng = Lcg(0x5EED);
            let mut large = 0usize;
            let mut pending = false;
            let mut due = 0usize;
            for op in &trace.ops {
                out.push(*op);
                if let Op::Alloc { id, size, .. } = *op {
                    allocs += 1;
                    if size >= 1 << 20 {
                        large += 1;
                        if large % 3 == 0 {
                            out.push(Op::Record { id, stream: 1 });
                            if !pending {
                                pending = true;
                                due = allocs
                                    + fixed.unwrap_or_else(|| 16 + (rng.next() % 241) as usize);
                            }
                        }
                    }
                    if pending && allocs >= due {
                        out.push(Op::Sync { stream: 1 });
                        pending = false;
                    }
                }
            }
        }
        "branch" | "rr4" => {
            let streams: usize = if case == "branch" { 2 } else { 4 };
            let stream_of_group = |g: usize| (g % streams) as u32;
            for op in &trace.ops {
                match *op {
                    Op::Alloc { id, size, .. } => {
                        let g = allocs / GROUP;
                        let s = stream_of_group(g);
                        out.push(Op::Alloc {
                            id,
                            size,
                            stream: s,
                        });
                        live.insert(id, s);
                        allocs += 1;
                        if allocs % GROUP == 0 {
                            // Group boundary: the finishing group's survivors are used next
                            // (on a branch, by the main stream; a main group has none to hand).
                            let user = if streams == 2 {
                                0
                            } else {
                                stream_of_group(g + 1)
                            };
                            let mut ids: Vec<u64> = live
                                .iter()
                                .filter(|&(_, &st)| st == s && st != user)
                                .map(|(&i, _)| i)
                                .collect();
                            ids.sort_unstable();
                            out.extend(ids.iter().map(|&id| Op::Record { id, stream: user }));
                            out.push(Op::Sync { stream: s });
                            if streams == 2 {
                                out.push(Op::Sync { stream: 1 - s });
                            }
                        }
                    }
                    Op::Free { id } => {
                        live.remove(&id);
                        out.push(*op);
                    }
                    other => out.push(other),
                }
            }
        }
        _ => return None,
    }
    Some(Trace {
        name: format!("{}+{case}", trace.name),
        ops: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse;

    fn base() -> Trace {
        let mut text = String::new();
        for i in 0..200u64 {
            text += &format!("a {i} {} 0\n", if i % 2 == 0 { 2 << 20 } else { 4096 });
            if i >= 3 {
                text += &format!("f {}\n", i - 3);
            }
        }
        parse(&text, "base").unwrap()
    }

    #[test]
    fn derived_cases_are_valid_traces_with_the_promised_shape() {
        let b = base();
        for case in CASES.into_iter().chain(LAG_CASES) {
            let d = derive(&b, case).unwrap();
            // Re-parsing validates ids, frees and records.
            let mut text = Vec::new();
            d.write_to(&mut text).unwrap();
            let again = parse(std::str::from_utf8(&text).unwrap(), case).unwrap();
            assert_eq!(again.ops, d.ops);
            let allocs = d
                .ops
                .iter()
                .filter(|o| matches!(o, Op::Alloc { .. }))
                .count();
            assert_eq!(allocs, 200, "{case}");
            assert_eq!(d.peak_requested(), b.peak_requested(), "{case}");
            let streams: std::collections::BTreeSet<u32> = d
                .ops
                .iter()
                .filter_map(|o| match o {
                    Op::Alloc { stream, .. } | Op::Record { stream, .. } | Op::Sync { stream } => {
                        Some(*stream)
                    }
                    _ => None,
                })
                .collect();
            let want: Vec<u32> = match case {
                "branch" => vec![0, 1],
                c if c.starts_with("comm") => vec![0, 1],
                _ => vec![0, 1, 2, 3],
            };
            assert_eq!(streams.into_iter().collect::<Vec<_>>(), want, "{case}");
            assert!(
                d.ops.iter().any(|o| matches!(o, Op::Record { .. })),
                "{case}"
            );
        }
        assert!(derive(&b, "nope").is_none());
        assert!(derive(&b, "comm0").is_none());
        assert!(derive(&b, "comm+4").is_none());
    }

    #[test]
    fn the_comm_lag_is_a_parameter_and_comm_keeps_its_drawn_lags() {
        let b = base();
        // The stream completes exactly `lag` allocations after its first pending use.
        let gaps = |d: &Trace| {
            let (mut allocs, mut first, mut out) = (0usize, None, Vec::new());
            for op in &d.ops {
                match op {
                    Op::Alloc { .. } => allocs += 1,
                    Op::Record { .. } if first.is_none() => first = Some(allocs),
                    Op::Sync { stream: 1 } => out.push(allocs - first.take().unwrap()),
                    _ => {}
                }
            }
            out
        };
        for lag in [16, 64] {
            let d = derive(&b, &format!("comm{lag}")).unwrap();
            let g = gaps(&d);
            assert!(!g.is_empty());
            assert!(g.iter().all(|&x| x == lag), "comm{lag}: {g:?}");
            assert_eq!(d.name, format!("base+comm{lag}"));
        }
        let mut text = String::new();
        for i in 0..3000u64 {
            text += &format!("a {i} {} 0\nf {i}\n", 2 << 20);
        }
        let long = parse(&text, "long").unwrap();
        let drawn = gaps(&derive(&long, "comm").unwrap());
        assert!(drawn.iter().all(|&x| (16..=256).contains(&x)), "{drawn:?}");
        assert!(drawn.windows(2).any(|w| w[0] != w[1]), "{drawn:?}");
    }
}
