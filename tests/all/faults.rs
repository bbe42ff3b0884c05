//! Fault injection: device failures at every point leave the allocator consistent.

use npualloc::device::sim::InjectedFailure;
use npualloc::{Error, StreamHandle};

use crate::common::*;

const S0: StreamHandle = StreamHandle::DEFAULT;

/// A scenario making several device allocations, with frees in between.
fn scenario(a: &npualloc::CachingAllocator, s1: StreamHandle) -> Vec<Result<usize, Error>> {
    let mut out = Vec::new();
    let sizes = [4096, 3 * MIB, 30 * MIB, 100, 12 * MIB, 2 * MIB, 700 << 10];
    let mut live = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let stream = if i % 2 == 0 { S0 } else { s1 };
        let r = a.malloc(n, stream);
        if let Ok(p) = r {
            live.push(p);
        }
        out.push(r);
        if i % 3 == 2 {
            if let Some(p) = live.pop() {
                a.free(p).unwrap();
            }
        }
        check(a);
    }
    for p in live {
        a.free(p).unwrap();
    }
    out
}

#[test]
fn device_malloc_failure_at_each_point_is_recovered_or_reported() {
    for kind in [InjectedFailure::OutOfMemory, InjectedFailure::RuntimeError] {
        for nth in 1..=8 {
            let (sim, a) = manual(1 << 30);
            let s1 = sim.create_stream(0).unwrap();
            sim.fail_nth_malloc(0, nth, kind);
            let results = scenario(&a, s1);
            let failures = results.iter().filter(|r| r.is_err()).count();
            match kind {
                // An injected OOM is retried after releasing the cache, so at most one request fails.
                InjectedFailure::OutOfMemory => {
                    assert!(failures <= 1, "{kind:?} #{nth}: {results:?}")
                }
                InjectedFailure::RuntimeError => {
                    for r in results.iter().filter_map(|r| r.as_ref().err()) {
                        assert!(matches!(r, Error::Device(_)), "{r}");
                        assert!(r.to_string().contains("507899"), "{r}");
                    }
                }
            }
            check(&a);
            assert_drained(&sim, &a);
        }
    }
}

#[test]
fn injected_oom_on_empty_cache_is_reported_not_panicked() {
    let (sim, a) = manual(1 << 30);
    sim.fail_nth_malloc(0, 1, InjectedFailure::OutOfMemory);
    // Nothing is cached, so after the release-and-retry the retry itself succeeds.
    let p = a.malloc(4096, S0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.free(p).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn event_creation_failure_parks_the_block_until_a_full_sync() {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let p = a.malloc(4096, S0).unwrap();
    a.record_stream(p, s1).unwrap();
    sim.fail_nth_event_create(0, 1);
    a.free(p).unwrap();
    check(&a);
    sim.complete_stream(0, s1).unwrap();
    // Without an event nothing proves s1 is done: the block is not reused.
    let q = a.malloc(4096, S0).unwrap();
    assert_ne!(q, p);
    a.free(q).unwrap();
    // empty_cache synchronises the device and releases it.
    assert_drained(&sim, &a);
}
