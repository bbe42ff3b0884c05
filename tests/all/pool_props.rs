//! Property test of graph pools against a simple model: random pool uses and releases,
//! captures (begun and ended, empty ones too, routed by stream or per request, on
//! several streams), allocations inside and outside pools, frees (with uses recorded on
//! other streams before and during captures), streams running their work, cache
//! releases, checkpoints and restores. After every step the invariant checker passes
//! and what the allocator shows equals the model: each pool's use count, each pool's
//! live allocations, whether a capture is underway; a cache release keeps every
//! segment of a live pool and gives back those of a pool with no use and nothing
//! allocated (its pending frees are waited for); a checkpoint lists exactly the pool's
//! live allocations; a restore frees exactly the pool's allocations, brings back
//! exactly the checkpoint's allocated blocks, and leaves the checkpointed segments
//! carved into exactly the checkpointed blocks.

use std::collections::BTreeSet;

use proptest::prelude::*;

use npualloc::allocator::PoolCheckpoint;
use npualloc::{CachingAllocator, Error, MempoolId, StreamHandle};

use crate::common::*;

const STREAMS: usize = 3;
const POOLS: [MempoolId; 2] = [MempoolId(1, 0), MempoolId(0, 2)];

#[derive(Clone, Debug)]
enum Op {
    Incref {
        pool: usize,
    },
    PoolBegin {
        pool: usize,
        stream: usize,
    },
    Release {
        pool: usize,
    },
    LegacyBegin {
        pool: usize,
        stream: usize,
    },
    End {
        pool: usize,
    },
    CaptureBegin,
    CaptureEnd,
    Malloc {
        size: usize,
        stream: usize,
    },
    MallocIn {
        size: usize,
        stream: usize,
        pool: usize,
    },
    Free {
        pick: usize,
    },
    Record {
        pick: usize,
        stream: usize,
    },
    Complete {
        stream: usize,
    },
    EmptyCache,
    Checkpoint {
        pool: usize,
    },
    Restore {
        pick: usize,
    },
    CheckLive {
        pool: usize,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1usize..=4096,
        2 => 4097usize..=(1usize << 20),
        2 => ((1usize << 20) + 1)..=(6usize << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..STREAMS;
    let p = 0..POOLS.len();
    prop_oneof![
        2 => p.clone().prop_map(|pool| Op::Incref { pool }),
        2 => (p.clone(), s.clone()).prop_map(|(pool, stream)| Op::PoolBegin { pool, stream }),
        3 => p.clone().prop_map(|pool| Op::Release { pool }),
        1 => (p.clone(), s.clone()).prop_map(|(pool, stream)| Op::LegacyBegin { pool, stream }),
        1 => p.clone().prop_map(|pool| Op::End { pool }),
        1 => Just(Op::CaptureBegin),
        1 => Just(Op::CaptureEnd),
        4 => (size(), s.clone()).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        6 => (size(), s.clone(), p.clone())
            .prop_map(|(size, stream, pool)| Op::MallocIn { size, stream, pool }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        3 => (any::<usize>(), s.clone()).prop_map(|(pick, stream)| Op::Record { pick, stream }),
        2 => s.prop_map(|stream| Op::Complete { stream }),
        2 => Just(Op::EmptyCache),
        2 => p.clone().prop_map(|pool| Op::Checkpoint { pool }),
        2 => any::<usize>().prop_map(|pick| Op::Restore { pick }),
        2 => p.prop_map(|pool| Op::CheckLive { pool }),
    ]
}

/// A live allocation in the model.
struct Live {
    ptr: usize,
    pool: Option<usize>,
}

#[derive(Default)]
struct Model {
    uses: [u32; POOLS.len()],
    captures: u32,
    /// The pool each stream routes to.
    routes: [Option<usize>; STREAMS],
    live: Vec<Live>,
    /// Checkpoints of pools live since they were taken.
    saved: Vec<(usize, PoolCheckpoint)>,
}

impl Model {
    fn pool_set(&self, pool: usize) -> BTreeSet<usize> {
        self.live
            .iter()
            .filter(|l| l.pool == Some(pool))
            .map(|l| l.ptr)
            .collect()
    }

    fn release(&mut self, pool: usize) {
        self.uses[pool] -= 1;
        if self.uses[pool] == 0 {
            self.saved.retain(|(p, _)| *p != pool);
        }
    }

    fn end_capture(&mut self) {
        self.captures -= 1;
    }
}

fn streams(sim: &npualloc::device::sim::SimDevice) -> [StreamHandle; STREAMS] {
    [0; STREAMS].map(|_| sim.create_stream(0).unwrap())
}

fn pool_segments(a: &CachingAllocator, pool: usize) -> BTreeSet<usize> {
    a.segments_of(Some(POOLS[pool]))
        .iter()
        .map(|s| s.address)
        .collect()
}

/// Without lending and device-side waits (covered by their own tests): a cache release
/// then leaves nothing of a pool with no use and no allocation.
const CONF: &str = "lend_segments:False,lend_blocks:False,wait_before_growth:False";

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (sim, a) = with(4 << 30, npualloc::device::sim::SimMode::Manual, false, CONF);
    let ss = streams(&sim);
    let mut m = Model::default();
    for op in ops {
        step(&sim, &a, &ss, &mut m, op)?;
        a.check_invariants().map_err(TestCaseError::fail)?;
        for (i, &id) in POOLS.iter().enumerate() {
            prop_assert_eq!(a.pool_use_count(id), m.uses[i]);
            let set: Vec<usize> = m.pool_set(i).into_iter().collect();
            if m.uses[i] > 0 || !set.is_empty() {
                prop_assert!(a.pool_check_live(id, &set).unwrap(), "pool {} live set", i);
            }
        }
        prop_assert_eq!(a.captures_underway(), m.captures > 0);
    }
    Ok(())
}

fn step(
    sim: &npualloc::device::sim::SimDevice,
    a: &CachingAllocator,
    ss: &[StreamHandle; STREAMS],
    m: &mut Model,
    op: Op,
) -> Result<(), TestCaseError> {
    match op {
        Op::Incref { pool } => {
            a.pool_incref(POOLS[pool]).unwrap();
            m.uses[pool] += 1;
        }
        Op::PoolBegin { pool, stream } => {
            a.pool_begin(POOLS[pool], ss[stream]).unwrap();
            m.uses[pool] += 1;
        }
        Op::Release { pool } => {
            let r = a.release_pool(POOLS[pool]);
            if m.uses[pool] == 0 {
                prop_assert!(matches!(r, Err(Error::UnknownPool { .. })), "{:?}", r);
            } else {
                r.unwrap();
                m.release(pool);
            }
        }
        Op::LegacyBegin { pool, stream } => {
            if m.routes.contains(&Some(pool)) {
                return Ok(()); // one route per pool keeps `End` unambiguous
            }
            let r = a.begin_allocate_to_pool(POOLS[pool], ss[stream]);
            if m.routes[stream].is_some() {
                prop_assert!(matches!(r, Err(Error::InvalidState(_))), "{:?}", r);
            } else {
                r.unwrap();
                m.uses[pool] += 1;
                m.captures += 1;
                m.routes[stream] = Some(pool);
            }
        }
        Op::End { pool } => {
            let r = a.end_allocate_to_pool(POOLS[pool]);
            match m.routes.iter().position(|&r| r == Some(pool)) {
                None => prop_assert!(matches!(r, Err(Error::InvalidState(_)))),
                Some(s) => {
                    r.unwrap();
                    m.routes[s] = None;
                    m.end_capture();
                }
            }
        }
        Op::CaptureBegin => {
            a.capture_begin();
            m.captures += 1;
        }
        Op::CaptureEnd => {
            // Only the captures this op began: a route's mark ends with its route.
            let routed = m.routes.iter().filter(|r| r.is_some()).count() as u32;
            if m.captures > routed {
                a.capture_end().unwrap();
                m.end_capture();
            } else if m.captures == 0 {
                prop_assert!(a.capture_end().is_err());
            }
        }
        Op::Malloc { size, stream } => {
            let ptr = a.malloc(size, ss[stream]).unwrap();
            let pool = m.routes[stream];
            m.live.push(Live { ptr, pool });
        }
        Op::MallocIn { size, stream, pool } => {
            let r = a.malloc_in_pool(size, ss[stream], POOLS[pool]);
            if m.uses[pool] == 0 {
                prop_assert!(matches!(r, Err(Error::UnknownPool { .. })), "{:?}", r);
            } else {
                m.live.push(Live {
                    ptr: r.unwrap(),
                    pool: Some(pool),
                });
            }
        }
        Op::Free { pick } => {
            if m.live.is_empty() {
                return Ok(());
            }
            let l = m.live.swap_remove(pick % m.live.len());
            a.free(l.ptr).unwrap();
        }
        Op::Record { pick, stream } => {
            if m.live.is_empty() {
                return Ok(());
            }
            let i = pick % m.live.len();
            a.record_stream(m.live[i].ptr, ss[stream]).unwrap();
            sim.launch(0, ss[stream], |_| {}).unwrap(); // work that uses it
        }
        Op::Complete { stream } => {
            if m.captures > 0 {
                return Ok(()); // no host synchronisation during a capture
            }
            sim.complete_stream(0, ss[stream]).unwrap();
        }
        Op::EmptyCache => {
            let before: Vec<_> = (0..POOLS.len()).map(|p| pool_segments(a, p)).collect();
            a.empty_cache().unwrap();
            for (p, segs) in before.iter().enumerate() {
                let after = pool_segments(a, p);
                if m.uses[p] > 0 || m.captures > 0 {
                    prop_assert!(after.is_superset(segs), "pool {} lost a segment", p);
                } else if m.pool_set(p).is_empty() {
                    prop_assert!(after.is_empty(), "pool {} kept {:?}", p, after);
                }
            }
        }
        Op::Checkpoint { pool } => {
            if m.captures > 0 {
                return Ok(());
            }
            let r = a.pool_checkpoint(POOLS[pool]);
            if m.uses[pool] == 0 {
                prop_assert!(matches!(r, Err(Error::UnknownPool { .. })), "{:?}", r);
            } else {
                let c = r.unwrap();
                let allocated: BTreeSet<usize> = c
                    .segments()
                    .iter()
                    .flat_map(|s| s.blocks.iter().filter(|b| b.allocated).map(|b| b.ptr))
                    .collect();
                prop_assert_eq!(&allocated, &m.pool_set(pool));
                m.saved.push((pool, c));
            }
        }
        Op::Restore { pick } => {
            if m.captures > 0 || m.saved.is_empty() {
                return Ok(());
            }
            let (pool, c) = m.saved[pick % m.saved.len()].clone();
            let delta = a.pool_restore(&c).unwrap();
            let freed: BTreeSet<usize> = delta.freed.iter().copied().collect();
            prop_assert_eq!(freed, m.pool_set(pool));
            let want: Vec<(usize, usize)> = c
                .segments()
                .iter()
                .flat_map(|s| {
                    s.blocks
                        .iter()
                        .filter(|b| b.allocated)
                        .map(|b| (b.ptr, b.size))
                })
                .collect();
            prop_assert_eq!(&delta.allocated, &want);
            m.live.retain(|l| l.pool != Some(pool));
            for (ptr, _) in want {
                m.live.push(Live {
                    ptr,
                    pool: Some(pool),
                });
            }
            // The checkpointed segments hold exactly the checkpointed blocks; segments
            // made since are wholly free.
            let now = a.pool_checkpoint(POOLS[pool]).unwrap();
            for s in now.segments() {
                match c.segments().iter().find(|x| x.address() == s.address()) {
                    Some(old) => prop_assert_eq!(old, s),
                    None => prop_assert!(s.blocks.len() == 1 && !s.blocks[0].allocated),
                }
            }
        }
        Op::CheckLive { pool } => {
            let set: Vec<usize> = m.pool_set(pool).into_iter().collect();
            if let Some((_, rest)) = set.split_first() {
                prop_assert!(!a.pool_check_live(POOLS[pool], rest).unwrap());
                let mut more = set.clone();
                more.push(1);
                prop_assert!(!a.pool_check_live(POOLS[pool], &more).unwrap());
            } else if m.uses[pool] == 0 {
                let known = !pool_segments(a, pool).is_empty();
                prop_assert_eq!(a.pool_check_live(POOLS[pool], &[]).is_ok(), known);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn graph_pools_follow_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
