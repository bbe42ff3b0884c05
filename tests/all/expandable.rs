//! Expandable (virtual-memory) segments on the simulated device: growth by mapping
//! pages, coalescing across pages, page-by-page return, synchronisation before
//! unmapping, out of memory, graph pools, refusal without virtual memory.

use npualloc::device::sim::{InjectedFailure, SimConfig, SimDevice, SimMode};
use npualloc::{CachingAllocator, Config, Error, StreamHandle};

use crate::common::*;

/// Fixed pages (`large_segment_size_mb`, 20 MiB), as PyTorch's: these tests check the
/// mapping mechanics page by page. The default's adaptive pages: `adaptive_pages_*`.
const ON: &str = "expandable_segments:True,adaptive_pages:False";
const S0: StreamHandle = StreamHandle::DEFAULT;

fn expandable(capacity: usize) -> (std::sync::Arc<SimDevice>, CachingAllocator) {
    with(capacity, SimMode::Manual, false, ON)
}

#[test]
fn growth_maps_pages_next_to_the_free_tail() {
    let (sim, a) = expandable(1 << 30);
    let x = a.malloc(30 * MIB, S0).unwrap();
    // 30 MiB on 20 MiB pages: two pages mapped, one call each.
    assert_eq!(a.stats().reserved_bytes[0].current, 40 * MIB as i64);
    assert_eq!(sim.counters(0).maps, 2);
    assert_eq!(a.stats().num_device_alloc, 2);
    // 15 MiB: the 10 MiB free tail plus one more page, contiguous with `x`.
    let y = a.malloc(15 * MIB, S0).unwrap();
    assert_eq!(
        y,
        x + 30 * MIB,
        "new pages did not merge with the free tail"
    );
    assert_eq!(a.stats().reserved_bytes[0].current, 60 * MIB as i64);
    assert_eq!(sim.counters(0).maps, 3);
    // One run of mapped pages is one segment.
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!(segs[0].total_size, 60 * MIB);
    assert_eq!(a.stats().segment[0].current, 1);
    check(&a);
    // Freed blocks merge across page boundaries and serve a request spanning them.
    a.free(x).unwrap();
    a.free(y).unwrap();
    let z = a.malloc(55 * MIB, S0).unwrap();
    assert_eq!(z, x);
    assert_eq!(sim.counters(0).maps, 3, "a cached run must not map again");
    a.free(z).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn a_freed_tail_goes_back_page_by_page() {
    let (sim, a) = expandable(1 << 30);
    let keep = a.malloc(10 * MIB, S0).unwrap();
    let tail = a.malloc(50 * MIB, S0).unwrap();
    assert_eq!(a.stats().reserved_bytes[0].current, 60 * MIB as i64);
    a.free(tail).unwrap();
    a.empty_cache().unwrap();
    // Pages 1 and 2 were wholly free; page 0 still holds `keep`.
    let s = a.stats();
    assert_eq!(s.reserved_bytes[0].current, 20 * MIB as i64);
    assert_eq!(s.num_device_free, 2);
    assert_eq!(sim.counters(0).unmaps, 2);
    assert_eq!(sim.counters(0).live_bytes, 20 * MIB);
    assert_eq!(sim.counters(0).reservations, 1, "the range is still in use");
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].total_size, 20 * MIB);
    check(&a);
    // The rest of page 0 is still there to use.
    let again = a.malloc(10 * MIB, S0).unwrap();
    assert_eq!(again, keep + 10 * MIB);
    a.free(again).unwrap();
    a.free(keep).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn a_free_hole_splits_the_run_and_mapping_it_again_joins_it() {
    let (sim, a) = expandable(1 << 30);
    let left = a.malloc(20 * MIB, S0).unwrap();
    let mid = a.malloc(40 * MIB, S0).unwrap();
    let right = a.malloc(20 * MIB, S0).unwrap();
    a.free(mid).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().segment[0].current, 2, "the hole splits the run");
    assert_eq!(a.segments().len(), 2);
    assert_eq!(a.stats().reserved_bytes[0].current, 40 * MIB as i64);
    check(&a);
    let again = a.malloc(40 * MIB, S0).unwrap();
    assert_eq!(again, mid, "the lowest hole that fits is mapped again");
    assert_eq!(
        a.stats().segment[0].current,
        1,
        "mapping the hole joins the runs"
    );
    check(&a);
    for p in [left, again, right] {
        a.free(p).unwrap();
    }
    assert_drained(&sim, &a);
}

#[test]
fn unmapping_waits_for_work_queued_on_the_stream() {
    let (sim, a) = expandable(1 << 30);
    let x = a.malloc(40 * MIB, S0).unwrap();
    // A kernel writing the block is still queued when the block is freed (legal: the
    // stream orders it before any reuse), then the cache is emptied.
    sim.launch(0, S0, move |m| {
        assert!(m.write(x + 39 * MIB, &[1; 4096]));
    })
    .unwrap();
    a.free(x).unwrap();
    assert_eq!(sim.pending(0, S0).unwrap(), 1);
    a.empty_cache().unwrap();
    let c = sim.counters(0);
    assert_eq!(
        sim.pending(0, S0).unwrap(),
        0,
        "unmapped before the stream ran"
    );
    assert_eq!(c.violations, 0, "the kernel touched unmapped memory");
    assert_eq!(c.unmaps, 2);
    assert_drained(&sim, &a);
}

#[test]
fn out_of_memory_gives_back_free_pages_then_fails_cleanly() {
    let (sim, a) = expandable(100 * MIB);
    let s1 = sim.create_stream(0).unwrap();
    // Stream 1 caches 60 MiB of free pages; stream 0 needs them.
    let x = a.malloc(60 * MIB, s1).unwrap();
    a.free(x).unwrap();
    let y = a.malloc(80 * MIB, S0).unwrap();
    check(&a);
    assert_eq!(sim.counters(0).live_bytes, 80 * MIB);
    // Nothing left to give back: a clear error, bookkeeping intact.
    match a.malloc(40 * MIB, S0) {
        Err(Error::OutOfMemory { message, .. }) => {
            assert!(message.contains("out of memory"), "{message}")
        }
        other => panic!("expected OOM, got {other:?}"),
    }
    check(&a);
    assert_eq!(a.stats().num_ooms, 1);
    a.free(y).unwrap();
    let z = a.malloc(90 * MIB, S0).unwrap();
    a.free(z).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn a_failed_mapping_loses_nothing() {
    let (sim, a) = expandable(1 << 30);
    let x = a.malloc(4 * MIB, S0).unwrap();
    let before = a.stats();
    // The second page of a two-page grow fails with a runtime error.
    sim.fail_nth_malloc(0, 2, InjectedFailure::RuntimeError);
    let err = a.malloc(50 * MIB, S0).unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    check(&a);
    let after = a.stats();
    assert_eq!(
        after.reserved_bytes[0].current,
        before.reserved_bytes[0].current
    );
    let c = sim.counters(0);
    assert_eq!(c.live_bytes, 20 * MIB, "the first page was not rolled back");
    assert_eq!(c.maps - c.unmaps, 1);
    // An out-of-memory mapping is retried after releasing the cache.
    sim.fail_nth_malloc(0, 1, InjectedFailure::OutOfMemory);
    let y = a.malloc(30 * MIB, S0).unwrap();
    check(&a);
    a.free(x).unwrap();
    a.free(y).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn page_sizes_follow_the_settings() {
    let (sim, a) = with(
        1 << 30,
        SimMode::Manual,
        false,
        "expandable_segments:True,adaptive_pages:False,large_segment_size_mb:4,small_segment_size_mb:4",
    );
    let big = a.malloc(5 * MIB, S0).unwrap();
    let small = a.malloc(1000, S0).unwrap();
    let s = a.stats();
    assert_eq!(
        s.reserved_bytes[2].current,
        8 * MIB as i64,
        "large pool: two 4 MiB pages"
    );
    assert_eq!(
        s.reserved_bytes[1].current,
        4 * MIB as i64,
        "small pool: one 4 MiB page"
    );
    assert_eq!(sim.counters(0).maps, 3);
    a.free(big).unwrap();
    a.free(small).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn graph_pools_get_their_own_expandable_segment() {
    let (sim, a) = expandable(1 << 30);
    let normal = a.malloc(4 * MIB, S0).unwrap();
    a.free(normal).unwrap();
    const P: npualloc::MempoolId = npualloc::MempoolId(3, 4);
    a.begin_allocate_to_pool(P, S0).unwrap();
    let captured = a.malloc(4 * MIB, S0).unwrap();
    a.end_allocate_to_pool(P).unwrap();
    assert_ne!(
        captured, normal,
        "capture reused the stream's own free pages"
    );
    let segs = a.segments();
    let seg = segs.iter().find(|g| g.pool_id == Some(P)).unwrap();
    assert!(seg.is_expandable);
    a.free(captured).unwrap();
    // Not released yet: emptying the cache keeps the pool's pages.
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[0].current, 20 * MIB as i64);
    // The pool's mapped pages are its reserved bytes; unmapping gives them back.
    let pool = a.private_pool_stats()[0];
    assert_eq!(
        (pool.id, pool.reserved_bytes[0].current),
        (P, 20 * MIB as i64)
    );
    check(&a);
    a.release_pool(P).unwrap();
    assert_drained(&sim, &a);
    let pool = a.private_pool_stats()[0].reserved_bytes[0];
    assert_eq!(
        (pool.current, pool.peak, pool.freed),
        (0, 20 * MIB as i64, 20 * MIB as i64)
    );
}

#[test]
fn cross_stream_frees_still_wait_for_their_events() {
    let (sim, a) = expandable(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let x = a.malloc(8 * MIB, S0).unwrap();
    sim.launch(0, s1, |_| {}).unwrap();
    a.record_stream(x, s1).unwrap();
    a.free(x).unwrap();
    let y = a.malloc(8 * MIB, S0).unwrap();
    assert_ne!(y, x, "reused before stream 1 finished");
    sim.complete_stream(0, s1).unwrap();
    a.free(y).unwrap();
    let z = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(z, x);
    a.free(z).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn refused_clearly_without_virtual_memory() {
    let sim = SimDevice::new(SimConfig {
        vm_granularity: 0,
        ..SimConfig::default()
    });
    let err = CachingAllocator::new(sim.clone(), 0, Config::parse(ON).unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("expandable_segments") && msg.contains("virtual"),
        "{msg}"
    );
    // A page size the device cannot map is refused too.
    let sim = SimDevice::new(SimConfig {
        vm_granularity: 4 << 20,
        ..SimConfig::default()
    });
    let conf = Config::parse("expandable_segments:True,large_segment_size_mb:6").unwrap();
    let msg = CachingAllocator::new(sim, 0, conf).unwrap_err().to_string();
    assert!(msg.contains("granularity"), "{msg}");
}

#[test]
fn backed_memory_spanning_pages_reads_back() {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, ON);
    let x = a.malloc(30 * MIB, S0).unwrap();
    let n = 1024;
    let at = x + 20 * MIB - 2048; // across the first page boundary
    sim.launch(0, S0, move |m| {
        assert!(m.fill_f32(at, n, 2.5));
    })
    .unwrap();
    sim.complete_stream(0, S0).unwrap();
    let got = sim.memory(0).unwrap().read_f32(at, n).unwrap();
    assert!(got.iter().all(|v| *v == 2.5));
    a.free(x).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn a_fragmented_reservation_spills_into_another() {
    // 100 MiB device: the large pool reserves 9/8 of it, six 20 MiB pages.
    let (sim, a) = expandable(100 * MIB);
    let p: Vec<usize> = (0..5).map(|_| a.malloc(20 * MIB, S0).unwrap()).collect();
    a.free(p[1]).unwrap();
    a.free(p[3]).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(sim.counters(0).reservations, 1);
    // No two adjacent free pages are left in the range: a second one is reserved.
    let q = a.malloc(40 * MIB, S0).unwrap();
    assert_eq!(sim.counters(0).reservations, 2);
    assert!(q < p[0] || q > p[4], "placed inside the first reservation");
    check(&a);
    for x in [p[0], p[2], p[4], q] {
        a.free(x).unwrap();
    }
    assert_drained(&sim, &a);
}

#[test]
fn idle_streams_are_not_synchronised_before_unmapping() {
    let (sim, a) = expandable(1 << 30);
    let x = a.malloc(40 * MIB, S0).unwrap();
    a.free(x).unwrap();
    // Growing past the high-water mark unmaps the idle pages first.
    let y = a.malloc(70 * MIB, S0).unwrap();
    let c = sim.counters(0);
    assert!(c.unmaps > 0, "nothing was unmapped before growth: {c:?}");
    assert_eq!(c.synchronizations, 0, "an idle stream was synchronised");
    assert_eq!(c.violations, 0);
    check(&a);
    a.free(y).unwrap();
    assert_drained(&sim, &a);
}
