//! Graph-private pools (aclgraph / reduce-overhead capture): isolation, reuse across
//! captures sharing a pool, release, deferred events, statistics.

use npualloc::allocator::BlockState;
use npualloc::{Error, MempoolId, StreamHandle};

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
    assert!(matches!(
        a.begin_allocate_to_pool(P, s),
        Err(Error::InvalidState(_))
    ));
    check(&a);
    assert_drained(&sim, &a);
}

#[test]
fn frees_with_stream_uses_wait_for_the_end_of_the_capture() {
    let (sim, a) = manual(1 << 30);
    let s = sim.create_stream(0).unwrap();
    let other = sim.create_stream(0).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    let x = a.malloc(4096, s).unwrap();
    a.record_stream(x, other).unwrap();
    a.free(x).unwrap();
    assert_eq!(
        sim.counters(0).event_records,
        0,
        "an event call during capture"
    );
    assert_eq!(
        a.segments()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    check(&a);
    a.end_allocate_to_pool(P).unwrap();
    assert_eq!(sim.counters(0).event_records, 1);
    sim.complete_stream(0, other).unwrap();
    a.begin_allocate_to_pool(P, s).unwrap();
    // Event polling is skipped during the capture: the block is not yet reusable.
    let y = a.malloc(4096, s).unwrap();
    assert_ne!(y, x);
    a.end_allocate_to_pool(P).unwrap();
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
    assert!(matches!(a.release_pool(P), Err(Error::InvalidArgument(_))));
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
