//! Multi-stream cases derived from single-stream traces, for measuring how per-stream
//! pools strand memory (the lending work of the virtual-memory issue).
//!
//! Rules (deterministic; "group" = a run of consecutive allocations):
//! - `comm`: a communication stream (1) uses every third allocation of at least 1 MiB
//!   (`r id 1` right after it) and completes (`s 1`) after a lag of 16–256 allocations
//!   (drawn per completion from a fixed-seed generator), like gradients handed to a
//!   collective that runs behind the compute stream.
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

/// The derived cases.
pub const CASES: [&str; 3] = ["comm", "branch", "rr4"];

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
        "comm" => {
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
                                due = allocs + 16 + (rng.next() % 241) as usize;
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
        for case in CASES {
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
                "comm" | "branch" => vec![0, 1],
                _ => vec![0, 1, 2, 3],
            };
            assert_eq!(streams.into_iter().collect::<Vec<_>>(), want, "{case}");
            assert!(
                d.ops.iter().any(|o| matches!(o, Op::Record { .. })),
                "{case}"
            );
        }
        assert!(derive(&b, "nope").is_none());
    }
}
