//! A short allocator scenario on the simulated device in manual mode, small enough for
//! Miri (`cargo +nightly miri test --test miri`); it also runs as an ordinary test.
//! It goes through the state machine's main paths: split and reuse on one stream, a
//! block used on a second stream (its free waits for that stream's work through an
//! event), lending across streams, expandable segments, an injected device failure,
//! and a full drain.

use npualloc::device::sim::{InjectedFailure, SimConfig, SimDevice, SimMode};
use npualloc::{CachingAllocator, Config, Device, StreamHandle};

const S0: StreamHandle = StreamHandle::DEFAULT;

fn drained(sim: &SimDevice, a: &CachingAllocator) {
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    let c = sim.counters(0);
    assert_eq!(c.live_bytes, 0, "{c:?}");
    assert_eq!(c.events_created, c.events_destroyed, "{c:?}");
    assert_eq!(c.maps, c.unmaps, "{c:?}");
    assert_eq!(c.violations, 0, "{c:?}");
    assert_eq!(a.stats().allocated_bytes[0].current, 0);
}

fn scenario(conf: &str) {
    let sim = SimDevice::new(SimConfig {
        devices: 1,
        capacity: 64 << 20,
        backed: false,
        mode: SimMode::Manual,
        ..SimConfig::default()
    });
    let a = CachingAllocator::new(sim.clone(), 0, Config::parse(conf).unwrap()).unwrap();
    let s1 = sim.create_stream(0).unwrap();

    // One stream: split, free, reuse at once.
    let p = a.malloc(1000, S0).unwrap();
    let q = a.malloc(3 << 20, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.malloc(1000, S0).unwrap(), p);
    a.check_invariants().unwrap();

    // Used on s1: not reused before s1's queued work ran.
    a.record_stream(q, s1).unwrap();
    sim.launch(0, s1, |_| {}).unwrap();
    a.free(q).unwrap();
    let r = a.malloc(3 << 20, S0).unwrap();
    assert_ne!(r, q);
    sim.complete_stream(0, s1).unwrap();
    a.free(r).unwrap();
    a.check_invariants().unwrap();

    // Another stream's requests (lending may serve them from stream 0's cache).
    let l = a.malloc(2 << 20, s1).unwrap();
    a.free(l).unwrap();

    // A device failure is reported, and the allocator stays consistent.
    sim.fail_nth_malloc(0, 1, InjectedFailure::RuntimeError);
    assert!(a.malloc(40 << 20, S0).is_err());
    a.check_invariants().unwrap();
    a.free(p).unwrap();
    sim.synchronize_device(0).unwrap();
    drained(&sim, &a);
}

#[test]
fn manual_scenario_default_settings() {
    scenario("");
}

#[test]
fn manual_scenario_expandable_segments() {
    scenario("expandable_segments:True,large_segment_size_mb:4");
}

#[test]
fn manual_scenario_pytorch_policy() {
    scenario(npualloc::config::PYTORCH_POLICY);
}
