//! Graph-private pools (aclgraph / reduce-overhead capture): isolation, reuse across
//! captures sharing a pool, release, deferred events, statistics.

use npualloc::allocator::BlockState;
use npualloc::{Error, MempoolId, Stat, StatType, StreamHandle};

use crate::common::*;

const P: MempoolId = MempoolId(7, 0);

#[test]
fn capture_memory_and_normal_memory_never_mix() {
    let (sim, a) = manual(1 << 30);
    let s = sim.create_stream(0).unwrap();
    let normal = a.malloc(4096, s).unwrap();
    let normal_segment = a.base_allocation(normal).unwrap().0;
    a.free(normal).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    let captured = a.malloc(4096, s).unwrap();
    assert_ne!(
        a.base_allocation(captured).unwrap().0,
        normal_segment,
        "capture reused the stream's own cached memory"
    );
    let captured_segment = a.base_allocation(captured).unwrap().0;
    a.end_allocate_to_pool(P).unwrap();
    a.free(captured).unwrap();
    // Back on the stream's own pool: the freed capture block is not handed out.
    let after = a.malloc(4096, s).unwrap();
    assert_ne!(a.base_allocation(after).unwrap().0, captured_segment);
    let segs = a.segments();
    assert!(segs.iter().any(|g| g.pool_id == Some(P)));
    assert!(segs.iter().any(|g| g.pool_id.is_none()));
    check(&a);
    a.free(after).unwrap();
    a.release_pool(P).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn captures_sharing_a_pool_reuse_its_blocks_and_release_returns_them() {
    let (sim, a) = manual(1 << 30);
    let s = sim.create_stream(0).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    let x = a.malloc(3 << 20, s).unwrap();
    a.free(x).unwrap();
    a.end_allocate_to_pool(P).unwrap();
    assert_eq!(a.private_pool_bytes(), 20 << 20);
    // The cache release keeps a pool that is still in use.
    a.empty_cache().unwrap();
    assert_eq!(a.private_pool_bytes(), 20 << 20);
    // A second capture into the same pool gets the same memory back.
    a.begin_allocate_to_pool(P, s).unwrap();
    let y = a.malloc(3 << 20, s).unwrap();
    assert_eq!(y, x);
    a.end_allocate_to_pool(P).unwrap();
    a.free(y).unwrap();
    let devices_mallocs = a.stats().num_device_alloc;
    a.release_pool(P).unwrap(); // use count 2 -> 1
    a.empty_cache().unwrap();
    assert_eq!(
        a.private_pool_bytes(),
        20 << 20,
        "released while a capture still uses it"
    );
    a.release_pool(P).unwrap(); // -> 0
    a.empty_cache().unwrap();
    assert_eq!(a.private_pool_bytes(), 0);
    assert_eq!(a.stats().num_device_alloc, devices_mallocs);
    // A pool with no use left may be begun again (PyTorch makes it anew).
    a.begin_allocate_to_pool(P, s).unwrap();
    assert_eq!(a.pool_use_count(P), 1);
    a.end_allocate_to_pool(P).unwrap();
    a.release_pool(P).unwrap();
    check(&a);
    assert_drained(&sim, &a);
}

/// Frees during a capture: no event call while it is underway; afterwards, one event
/// per stream the block was used on (before the capture or during it).
#[test]
fn frees_with_stream_uses_wait_for_the_end_of_the_capture() {
    let (sim, a) = manual(1 << 30);
    let s = sim.create_stream(0).unwrap();
    let other = sim.create_stream(0).unwrap();
    let pre = a.malloc(4096, s).unwrap();
    a.record_stream(pre, other).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    let x = a.malloc(4096, s).unwrap();
    a.record_stream(x, other).unwrap();
    a.free(x).unwrap();
    a.free(pre).unwrap();
    assert_eq!(
        sim.counters(0).event_records,
        0,
        "an event call during capture"
    );
    let states: Vec<_> = a.segments().iter().map(|g| g.blocks[0].state).collect();
    assert_eq!(states, [BlockState::ActivePendingFree; 2]);
    check(&a);
    a.end_allocate_to_pool(P).unwrap();
    assert_eq!(sim.counters(0).event_records, 2);
    sim.launch(0, other, |_| {}).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    // Event polling is skipped during the capture: the block is not yet reusable.
    let y = a.malloc(4096, s).unwrap();
    assert_ne!(y, x);
    a.end_allocate_to_pool(P).unwrap();
    sim.complete_stream(0, other).unwrap();
    let z = a.malloc(512, StreamHandle::DEFAULT).unwrap();
    a.free(y).unwrap();
    a.free(z).unwrap();
    check(&a);
    a.release_pool(P).unwrap();
    a.release_pool(P).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn pool_calls_are_checked() {
    let (sim, a) = manual(1 << 30);
    let s = sim.create_stream(0).unwrap();
    assert!(matches!(
        a.begin_allocate_to_pool(MempoolId(0, 0), s),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.end_allocate_to_pool(P),
        Err(Error::InvalidState(_))
    ));
    assert!(matches!(a.release_pool(P), Err(Error::UnknownPool { .. })));
    assert!(matches!(
        a.release_pool(MempoolId(0, 0)),
        Err(Error::InvalidArgument(_))
    ));
    a.begin_allocate_to_pool(P, s).unwrap();
    assert!(matches!(
        a.begin_allocate_to_pool(MempoolId(8, 0), s),
        Err(Error::InvalidState(_))
    ));
    a.end_allocate_to_pool(P).unwrap();
    a.release_pool(P).unwrap();
    check(&a);
    assert_drained(&sim, &a);
}

#[test]
fn an_out_of_memory_during_a_capture_reaches_the_oom_observers() {
    let (sim, a) = manual(64 * MIB);
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        a.attach_oom_observer(move |info| seen.lock().push(info.requested));
    }
    let s = sim.create_stream(0).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    let err = a.malloc(100 * MIB, s).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert_eq!(*seen.lock(), vec![100 * MIB]);
    a.end_allocate_to_pool(P).unwrap();
    a.release_pool(P).unwrap();
    check(&a);
    assert_drained(&sim, &a);
}

fn stat(current: usize, peak: usize, allocated: usize, freed: usize) -> Stat {
    let i = |v: usize| v as i64;
    Stat {
        current: i(current),
        peak: i(peak),
        allocated: i(allocated),
        freed: i(freed),
    }
}

/// torch 2.14's `reserved_bytes_by_private_pools`: one entry per pool that reserved
/// memory, device-wide over the streams allocating to it, kept after the pool gave its
/// memory back (current 0) until the resets, as PyTorch keeps it.
#[test]
fn reserved_bytes_by_private_pool_span_streams_and_outlive_the_pool_until_reset() {
    let (sim, a) = manual(1 << 30);
    let [s1, s2, s3] = [0; 3].map(|_| sim.create_stream(0).unwrap());
    let normal = a.malloc(4096, s1).unwrap();
    assert!(
        a.private_pool_stats().is_empty(),
        "ordinary memory is no pool's"
    );
    // An empty capture reserves nothing: no entry, as in PyTorch.
    a.begin_allocate_to_pool(MempoolId(9, 1), s3).unwrap();
    a.end_allocate_to_pool(MempoolId(9, 1)).unwrap();
    // Two streams allocate in one pool: a large and a small segment.
    a.begin_allocate_to_pool(P, s1).unwrap();
    a.begin_allocate_to_pool(P, s2).unwrap();
    let x = a.malloc(3 * MIB, s1).unwrap();
    let y = a.malloc(4096, s2).unwrap();
    let during = a.private_pool_stats();
    assert_eq!(during.len(), 1, "{during:?}");
    assert_eq!(during[0].id, P);
    let r = during[0].reserved_bytes;
    assert_eq!(
        r[StatType::Aggregate],
        stat(22 * MIB, 22 * MIB, 22 * MIB, 0)
    );
    assert_eq!(
        r[StatType::LargePool],
        stat(20 * MIB, 20 * MIB, 20 * MIB, 0)
    );
    assert_eq!(r[StatType::SmallPool], stat(2 * MIB, 2 * MIB, 2 * MIB, 0));
    assert_eq!(a.private_pool_bytes(), 22 * MIB);
    let reserved = a.stats().reserved_bytes[StatType::Aggregate].current;
    assert_eq!(
        reserved,
        24 * MIB as i64,
        "the pool's bytes are also reserved bytes"
    );
    a.end_allocate_to_pool(P).unwrap();
    a.end_allocate_to_pool(P).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap(); // the pool is still in use: it keeps its memory
    assert_eq!(a.private_pool_stats(), during);
    check(&a);
    a.release_pool(P).unwrap(); // one use per begin: s1's
    a.empty_cache().unwrap();
    assert_eq!(a.private_pool_stats(), during, "s2's use keeps the memory");
    a.release_pool(P).unwrap(); // s2's
    a.empty_cache().unwrap();
    let after = a.private_pool_stats()[0].reserved_bytes;
    assert_eq!(
        after[StatType::Aggregate],
        stat(0, 22 * MIB, 22 * MIB, 22 * MIB)
    );
    assert_eq!(
        after[StatType::SmallPool],
        stat(0, 2 * MIB, 2 * MIB, 2 * MIB)
    );
    check(&a);
    a.reset_peak_stats();
    let after = a.private_pool_stats()[0].reserved_bytes;
    assert_eq!(after[StatType::LargePool], stat(0, 0, 20 * MIB, 20 * MIB));
    a.reset_accumulated_stats();
    let after = a.private_pool_stats();
    assert_eq!(after.len(), 1, "the resets remove no entry");
    assert_eq!(after[0].reserved_bytes, [Stat::default(); 3]);
    a.free(normal).unwrap();
    assert_drained(&sim, &a);
}

/// While a graph capture is open, the runtime refuses queries, synchronisations and
/// frees from the capturing thread (CUDA's default capture mode; on an H200 with torch
/// 2.11 such a call from npualloc invalidated torch.cuda.graph's capture). Whatever the
/// streams hold — pending frees with events, idle empty segments another stream could
/// release, a device too full to grow — allocations during the capture, on the captured
/// stream and on others, make none of those calls, as PyTorch's allocator skips event
/// processing and cache release while a capture is underway.
#[test]
fn a_capture_makes_no_query_sync_or_free_on_any_stream() {
    let (sim, a) = manual(200 << 20);
    let s = sim.create_stream(0).unwrap();
    let other = sim.create_stream(0).unwrap();
    let third = sim.create_stream(0).unwrap();
    // A pending free on `other` (used on `third`, whose work has not run) and idle
    // empty segments on `other` that reclaiming before growth would release.
    let pending = a.malloc(8 << 20, other).unwrap();
    a.record_stream(pending, third).unwrap();
    sim.launch(0, third, |_| {}).unwrap();
    a.free(pending).unwrap();
    let idle: Vec<_> = (0..4).map(|_| a.malloc(30 << 20, other).unwrap()).collect();
    for p in idle {
        a.free(p).unwrap();
    }
    a.begin_allocate_to_pool(P, s).unwrap();
    sim.set_graph_capture(0, true);
    let mut live = Vec::new();
    for size in [4096, 3 << 20, 12 << 20, 512, 1 << 20, 25 << 20] {
        live.push(a.malloc(size, s).unwrap());
    }
    let x = live.pop().unwrap();
    a.record_stream(x, other).unwrap();
    a.free(x).unwrap();
    // Another stream allocates during the capture (eager work beside it).
    let y = a.malloc(2 << 20, other).unwrap();
    // Too large for what is left: out of memory at once, without releasing anything.
    assert!(matches!(
        a.malloc(150 << 20, s),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(matches!(
        a.malloc(150 << 20, other),
        Err(Error::OutOfMemory { .. })
    ));
    sim.set_graph_capture(0, false);
    let c = sim.counters(0);
    assert_eq!(
        c.capture_violations, 0,
        "unsafe calls during the capture: {c:?}"
    );
    a.end_allocate_to_pool(P).unwrap();
    check(&a);
    for p in live {
        a.free(p).unwrap();
    }
    a.free(y).unwrap();
    sim.complete_stream(0, third).unwrap();
    sim.complete_stream(0, other).unwrap();
    a.release_pool(P).unwrap();
    assert_drained(&sim, &a);
}
