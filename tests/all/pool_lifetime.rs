//! The two pool-lifetime repros of issue #27 against the core: a graph pool lives as
//! long as its uses (one count per pool per device, over every stream that allocates
//! for it), whatever a cache release asks. Written with the calls a capture through the
//! older C ABI makes (`begin_allocate_to_pool` per routed stream), so they run on any
//! version of the allocator.

use npualloc::MempoolId;

use crate::common::*;

/// Two graphs share `pool`; g1 captures a 30 MiB intermediate on a side stream (forked
/// and joined by events, recorded on the capture stream, freed inside the capture);
/// g1 replays; g2 captures 1 MiB into the same pool; its tensor dies; g2 is reset;
/// `empty_cache`: the 30 MiB segment must still be the pool's (g1 replays into it).
#[test]
fn a_shared_pool_keeps_a_side_stream_segment_while_another_graph_lives() {
    let pool = MempoolId(0, 1);
    let (sim, a) = manual(1 << 30);
    let (cap, side) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
    // g1: the capture stream and the side stream it forks to allocate into the pool.
    a.begin_allocate_to_pool(pool, cap).unwrap();
    a.begin_allocate_to_pool(pool, side).unwrap();
    let out = a.malloc(4 * MIB, cap).unwrap();
    let inter = a.malloc(30 * MIB, side).unwrap();
    a.record_stream(inter, cap).unwrap();
    a.free(inter).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    let side_segment = |a: &npualloc::CachingAllocator| {
        a.segments()
            .into_iter()
            .find(|s| s.stream == side && s.address <= inter && inter < s.address + s.total_size)
            .map(|s| (s.pool_id, s.total_size))
    };
    assert_eq!(side_segment(&a), Some((Some(pool), 30 * MIB)));
    // g2 into the same pool.
    a.begin_allocate_to_pool(pool, cap).unwrap();
    let small = a.malloc(MIB, cap).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.free(small).unwrap();
    a.release_pool(pool).unwrap(); // g2.reset()
    a.empty_cache().unwrap();
    assert_eq!(
        side_segment(&a),
        Some((Some(pool), 30 * MIB)),
        "a segment g1 replays into went back to the device"
    );
    check(&a);
    // g1.reset(): its two uses go; then the memory goes back.
    a.free(out).unwrap();
    a.release_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(side_segment(&a), None);
    assert_drained(&sim, &a);
}

/// The keeper: an empty capture into a pool (graph trees and torchair make one), then a
/// warm-up on another stream that begins, allocates, ends and releases, then a real
/// capture into the same pool: the pool is still live (the keeper holds it).
#[test]
fn a_keeper_capture_keeps_its_pool_live_across_a_warm_up_release() {
    let pool = MempoolId(0, 1);
    let (sim, a) = manual(1 << 30);
    let (cap, warm) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
    a.begin_allocate_to_pool(pool, cap).unwrap();
    a.end_allocate_to_pool(pool).unwrap(); // the empty keeper capture
    a.begin_allocate_to_pool(pool, warm).unwrap();
    let w = a.malloc(2 * MIB, warm).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.free(w).unwrap();
    a.release_pool(pool).unwrap(); // the warm-up's use
    a.empty_cache().unwrap();
    a.begin_allocate_to_pool(pool, cap)
        .expect("the keeper still holds the pool");
    let x = a.malloc(MIB, cap).unwrap();
    assert_eq!(
        a.segments()
            .iter()
            .find(|s| s.stream == cap)
            .map(|s| s.pool_id),
        Some(Some(pool))
    );
    a.end_allocate_to_pool(pool).unwrap();
    a.free(x).unwrap();
    check(&a);
    a.release_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    assert_drained(&sim, &a);
}
