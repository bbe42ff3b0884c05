//! Property tests: random operation sequences on several streams, invariants after
//! every step, and no reuse of a block by any stream before the streams that used it
//! ran past their use, or before the reusing stream is ordered after that on the
//! device (cross-stream lending makes streams wait on each other's events).

use proptest::prelude::*;

use npualloc::{Error, StreamHandle};

use crate::common::*;

#[derive(Clone, Debug)]
enum Op {
    Malloc { size: usize, stream: usize },
    Free { pick: usize },
    Record { pick: usize, stream: usize },
    Launch { stream: usize },
    Complete { stream: usize },
    Step { stream: usize },
    EmptyCache,
    BeginPool { stream: usize },
    EndPool,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=4096,
        3 => 4097usize..=(1usize << 20),
        2 => ((1usize << 20) + 1)..=(10usize << 20),
        1 => (10usize << 20)..=(48usize << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (size(), 0..3usize).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        3 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Record { pick, stream }),
        2 => (0..3usize).prop_map(|stream| Op::Launch { stream }),
        2 => (0..3usize).prop_map(|stream| Op::Complete { stream }),
        1 => (0..3usize).prop_map(|stream| Op::Step { stream }),
        1 => Just(Op::EmptyCache),
        1 => (0..3usize).prop_map(|stream| Op::BeginPool { stream }),
        1 => Just(Op::EndPool),
    ]
}

struct Live {
    ptr: usize,
    size: usize,
    stream: usize,
    uses: Vec<usize>,
}

/// A freed range that no other stream may get before `stream` ran past its operation
/// `op` (or is ordered after it on the device).
struct Guard {
    start: usize,
    end: usize,
    stream: usize,
    op: u64,
}

/// Runs `ops` with settings `conf`; returns how many device allocations they needed.
fn run(ops: Vec<Op>, conf: &str) -> Result<u64, TestCaseError> {
    // 160 MiB: large requests hit the OOM and retry paths now and then.
    run_on(160 * MIB, ops, conf)
}

/// `run` on a device of `capacity` bytes.
fn run_on(capacity: usize, ops: Vec<Op>, conf: &str) -> Result<u64, TestCaseError> {
    let (sim, a) = with(
        capacity,
        npualloc::device::sim::SimMode::Manual,
        false,
        conf,
    );
    let streams: Vec<StreamHandle> = std::iter::once(StreamHandle::DEFAULT)
        .chain((0..2).map(|_| sim.create_stream(0).unwrap()))
        .collect();
    let mut live: Vec<Live> = Vec::new();
    let mut guards: Vec<Guard> = Vec::new();
    // The last operation queued on stream `s`, and whether it has run.
    let queued = |s: usize| sim.position(0, streams[s]).unwrap().0;
    let ran = |s: usize, op: u64| sim.position(0, streams[s]).unwrap().1 >= op;
    const POOL: npualloc::MempoolId = npualloc::MempoolId(1, 1);
    let mut capturing: Option<usize> = None; // the stream allocating to the pool
    let mut pool_uses = 0;

    for op in ops {
        let frees_before = sim.counters(0).frees;
        match op {
            Op::Malloc { size, stream } => match a.malloc(size, streams[stream]) {
                Ok(ptr) => {
                    let end = ptr + size;
                    if sim.counters(0).frees != frees_before {
                        // A device free synchronises the device on CUDA and ACL (the
                        // simulated one leaves queued work queued): everything queued
                        // before it ran, so no earlier guard can be violated.
                        guards.clear();
                    }
                    for l in &live {
                        prop_assert!(
                            end <= l.ptr || ptr >= l.ptr + l.size,
                            "overlapping allocations"
                        );
                    }
                    for g in &guards {
                        let overlaps = ptr < g.end && end > g.start;
                        let ordered = ran(g.stream, g.op)
                            || sim
                                .ordered_after(0, streams[stream], streams[g.stream], g.op)
                                .unwrap();
                        prop_assert!(
                            !overlaps || ordered,
                            "block reused on stream {stream} before stream {} finished its work \
                             (its op {}, at {:?}; new block {ptr:#x}+{size}, freed {:#x}..{:#x})",
                            g.stream,
                            g.op,
                            sim.position(0, streams[g.stream]).unwrap(),
                            g.start,
                            g.end
                        );
                    }
                    live.push(Live {
                        ptr,
                        size,
                        stream,
                        uses: vec![],
                    });
                }
                Err(Error::OutOfMemory { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(format!("malloc failed: {e}"))),
            },
            Op::Free { pick } if !live.is_empty() => {
                let l = live.swap_remove(pick % live.len());
                // Work queued so far on the allocation's stream and on the streams it
                // was used on may use it: no other stream may get it before that ran.
                for s in std::iter::once(l.stream).chain(l.uses.iter().copied()) {
                    guards.push(Guard {
                        start: l.ptr,
                        end: l.ptr + l.size,
                        stream: s,
                        op: queued(s),
                    });
                }
                a.free(l.ptr)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Record { pick, stream } if !live.is_empty() => {
                let i = pick % live.len();
                a.record_stream(live[i].ptr, streams[stream]).unwrap();
                if stream != live[i].stream && !live[i].uses.contains(&stream) {
                    live[i].uses.push(stream);
                }
            }
            Op::Launch { stream } => {
                sim.launch(0, streams[stream], |_| {}).unwrap();
            }
            Op::Complete { stream } => {
                sim.complete_stream(0, streams[stream]).unwrap();
            }
            Op::Step { stream } => {
                sim.step(0, streams[stream], 1).unwrap();
            }
            Op::EmptyCache => {
                a.empty_cache().unwrap();
            }
            Op::BeginPool { stream } if capturing.is_none() => {
                a.begin_allocate_to_pool(POOL, streams[stream]).unwrap();
                capturing = Some(stream);
                pool_uses += 1;
            }
            Op::EndPool if capturing.is_some() => {
                a.end_allocate_to_pool(POOL).unwrap();
                capturing = None;
            }
            _ => {}
        }
        guards.retain(|g| !ran(g.stream, g.op));
        a.check_invariants().map_err(TestCaseError::fail)?;
    }

    for l in live.drain(..) {
        a.free(l.ptr).unwrap();
    }
    if capturing.is_some() {
        a.end_allocate_to_pool(POOL).unwrap();
    }
    for _ in 0..pool_uses {
        a.release_pool(POOL).unwrap();
    }
    for s in &streams {
        sim.complete_stream(0, *s).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().map_err(TestCaseError::fail)?;
    let c = sim.counters(0);
    prop_assert_eq!(c.live_bytes, 0);
    prop_assert_eq!(c.events_created, c.events_destroyed);
    prop_assert_eq!(c.violations, 0);
    prop_assert_eq!(c.maps, c.unmaps);
    prop_assert_eq!(c.reservations, 0);
    Ok(c.mallocs + c.maps)
}

proptest! {
    // 200 cases in CI; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_keep_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, "")?;
    }

    #[test]
    fn random_sequences_keep_invariants_with_expandable_segments(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        run(ops, "expandable_segments:True,large_segment_size_mb:4")?;
    }

    /// Under a small reserve budget the pressure rung (a device-side wait for a pending
    /// free, `shard/pressure.rs`) runs at nearly every growth: every block it hands out
    /// must be ordered after the streams it was used on.
    #[test]
    fn random_sequences_keep_invariants_under_a_reserve_budget(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        run(ops, "reserve_budget_mb:8")?;
    }

    /// On a 64 MiB device growth fails often: the pressure rung takes this stream's
    /// pending frees and other streams' (lent after device-side waits, the rest of a
    /// split block marked for later takers); every block must be ordered after the
    /// streams it was used on.
    #[test]
    fn random_sequences_keep_invariants_on_a_small_device(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        run_on(32 * MIB, ops, "")?;
    }
}

/// A 10,000-operation random workload: the cache serves nearly every request.
#[test]
fn ten_thousand_op_workload_reuses_segments() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let ops: Vec<Op> = (0..10_000)
        .map(|_| op().new_tree(&mut runner).unwrap().current())
        .collect();
    let mallocs = ops
        .iter()
        .filter(|o| matches!(o, Op::Malloc { .. }))
        .count();
    let device_mallocs = run(ops, "").unwrap();
    eprintln!(
        "10,000-op workload: {mallocs} mallocs served with {device_mallocs} device allocations"
    );
    assert!(mallocs > 2000);
    assert!(
        device_mallocs * 5 < mallocs as u64,
        "{device_mallocs} device mallocs for {mallocs} requests"
    );
}
