//! Cross-stream lifetime: record_stream, events, reuse only after completion, and
//! the seed scenarios with real asynchronous streams on backed memory.

use std::sync::Arc;

use npualloc::allocator::BlockState;
use npualloc::device::sim::{SimDevice, SimMemory, SimMode};
use npualloc::{CachingAllocator, Device, StreamHandle};

use crate::common::*;

const MAIN: StreamHandle = StreamHandle::DEFAULT;

#[test]
fn block_used_elsewhere_waits_for_that_stream() {
    let (sim, a) = manual(1 << 30);
    let side = sim.create_stream(0).unwrap();
    let p = a.malloc(4096, MAIN).unwrap();
    a.record_stream(p, side).unwrap();
    a.record_stream(p, side).unwrap(); // recorded twice: still one event
    a.record_stream(p, MAIN).unwrap(); // own stream: no-op
    sim.launch(0, side, |_| {}).unwrap(); // work on the side stream still queued
    a.free(p).unwrap();
    assert_eq!(sim.counters(0).event_records, 1);
    check(&a);
    let q = a.malloc(4096, MAIN).unwrap();
    assert_ne!(q, p, "reused while the side stream may still read it");
    assert_eq!(
        a.segments()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    sim.complete_stream(0, side).unwrap();
    let r = a.malloc(4096, MAIN).unwrap();
    assert_eq!(r, p, "not reused after the side stream completed");
    check(&a);
    a.free(q).unwrap();
    a.free(r).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn slow_stream_does_not_hold_back_blocks_of_fast_streams() {
    let (sim, a) = manual(1 << 30);
    let slow = sim.create_stream(0).unwrap();
    let fast = sim.create_stream(0).unwrap();
    let p = a.malloc(8192, MAIN).unwrap();
    let q = a.malloc(8192, MAIN).unwrap();
    a.record_stream(p, slow).unwrap();
    a.record_stream(q, fast).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    sim.complete_stream(0, fast).unwrap();
    let r = a.malloc(8192, MAIN).unwrap();
    assert_eq!(r, q);
    check(&a);
    a.free(r).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn block_used_on_two_streams_waits_for_both() {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let s2 = sim.create_stream(0).unwrap();
    let p = a.malloc(4096, MAIN).unwrap();
    a.record_stream(p, s1).unwrap();
    a.record_stream(p, s2).unwrap();
    a.free(p).unwrap();
    assert_eq!(sim.counters(0).event_records, 2);
    sim.complete_stream(0, s1).unwrap();
    let q = a.malloc(4096, MAIN).unwrap();
    assert_ne!(q, p);
    sim.complete_stream(0, s2).unwrap();
    let r = a.malloc(4096, MAIN).unwrap();
    assert_eq!(r, p);
    a.free(q).unwrap();
    a.free(r).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn erase_stream_forgets_a_use() {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let p = a.malloc(4096, MAIN).unwrap();
    a.record_stream(p, s1).unwrap();
    a.erase_stream(p, s1).unwrap();
    a.free(p).unwrap();
    assert_eq!(sim.counters(0).event_records, 0);
    assert_eq!(a.malloc(4096, MAIN).unwrap(), p);
    a.free(p).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn steady_state_cross_stream_cycle_creates_no_events() {
    let (sim, a) = manual(1 << 30);
    let side = sim.create_stream(0).unwrap();
    for _ in 0..200 {
        let p = a.malloc(64 << 10, MAIN).unwrap();
        a.record_stream(p, side).unwrap();
        a.free(p).unwrap();
        sim.complete_stream(0, side).unwrap();
    }
    let (created, idle) = a.event_counts();
    assert_eq!(created, 1, "events must come from the pool");
    assert_eq!(sim.counters(0).events_created, 1);
    assert_eq!(sim.counters(0).event_records, 200);
    // The last cycle's event is reclaimed by the next malloc.
    let p = a.malloc(512, MAIN).unwrap();
    assert_eq!(a.event_counts().1, idle + 1);
    a.free(p).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn empty_cache_synchronises_pending_frees() {
    let (sim, a) = manual(1 << 30);
    let side = sim.create_stream(0).unwrap();
    let p = a.malloc(30 * MIB, MAIN).unwrap();
    a.record_stream(p, side).unwrap();
    sim.launch(0, side, |_| {}).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.stats().num_sync_all_streams, 0);
    a.empty_cache().unwrap();
    assert_eq!(a.stats().num_sync_all_streams, 1);
    assert_eq!(sim.pending(0, side).unwrap(), 0);
    assert_drained(&sim, &a);
}

// ---- the seed scenario on backed memory with real asynchronous streams --------------

const N: usize = 1024; // floats per tensor

/// A kernel chain long enough that the host runs ahead of the side stream.
fn long_chain(sim: &SimDevice, stream: StreamHandle, scratch: usize) {
    for _ in 0..4 {
        sim.launch(0, stream, move |m: &SimMemory| {
            // A small matmul on scratch memory: real work that takes a while.
            let x = m.read_f32(scratch, 64 * 64).unwrap();
            let mut y = vec![0f32; 64 * 64];
            for i in 0..64 {
                for k in 0..64 {
                    let xik = x[i * 64 + k];
                    for j in 0..64 {
                        y[i * 64 + j] += xik * x[k * 64 + j] * 1e-3;
                    }
                }
            }
            m.write_f32(scratch, &y);
        })
        .unwrap();
    }
}

fn add_one(sim: &SimDevice, stream: StreamHandle, src: usize, dst: usize) {
    sim.launch(0, stream, move |m: &SimMemory| {
        let v: Vec<f32> = m
            .read_f32(src, N)
            .unwrap()
            .iter()
            .map(|x| x + 1.0)
            .collect();
        m.write_f32(dst, &v);
    })
    .unwrap();
}

fn fill(sim: &SimDevice, stream: StreamHandle, dst: usize, value: f32) {
    sim.launch(0, stream, move |m: &SimMemory| {
        m.fill_f32(dst, N, value);
    })
    .unwrap();
}

/// One run of the seed scenario; returns whether B came out all ones.
fn seed_run(
    sim: &Arc<SimDevice>,
    a: &CachingAllocator,
    second: StreamHandle,
    scratch: usize,
    record: bool,
) -> bool {
    let bytes = N * 4;
    let ev = sim.event_create(0).unwrap();
    let a_ptr = a.malloc(bytes, MAIN).unwrap();
    fill(sim, MAIN, a_ptr, 0.0); // A = zeros
    sim.event_record(0, ev, MAIN).unwrap(); // second_stream.wait_stream(main)
    sim.stream_wait_event(0, second, ev).unwrap();
    long_chain(sim, second, scratch);
    let b_ptr = a.malloc(bytes, second).unwrap();
    add_one(sim, second, a_ptr, b_ptr); // B = A + 1 on second_stream
    if record {
        a.record_stream(a_ptr, second).unwrap();
    }
    a.free(a_ptr).unwrap(); // del A
    let c_ptr = a.malloc(bytes, MAIN).unwrap(); // C = ones on the main stream
    fill(sim, MAIN, c_ptr, 1.0);
    sim.synchronize_device(0).unwrap();
    let b = sim.memory(0).unwrap().read_f32(b_ptr, N).unwrap();
    let c = sim.memory(0).unwrap().read_f32(c_ptr, N).unwrap();
    assert!(c.iter().all(|&x| x == 1.0));
    a.free(b_ptr).unwrap();
    a.free(c_ptr).unwrap();
    sim.event_destroy(0, ev).unwrap();
    b.iter().all(|&x| x == 1.0)
}

fn seed_setup(conf: &str) -> (Arc<SimDevice>, CachingAllocator, StreamHandle, usize) {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, conf);
    let second = sim.create_stream(0).unwrap();
    let scratch = a.malloc(64 * 64 * 4, second).unwrap();
    sim.memory(0).unwrap().fill_f32(scratch, 64 * 64, 0.5);
    (sim, a, second, scratch)
}

#[test]
fn seed_scenario_with_record_stream_is_always_correct() {
    // Default settings: the default stream borrows blocks of second_stream's segment.
    let (sim, a, second, scratch) = seed_setup("");
    for run in 0..1000 {
        assert!(
            seed_run(&sim, &a, second, scratch, true),
            "B corrupted in run {run}"
        );
    }
    check(&a);
    a.free(scratch).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn seed_scenario_without_record_stream_corrupts() {
    // Proves the mechanism matters: without record_stream, C reuses A's memory while
    // second_stream still has to read it. Without lending: a borrowed block would make
    // the default stream wait for second_stream, which hides the missing record.
    let (sim, a, second, scratch) = seed_setup("lend_blocks:False");
    let corrupted = (0..50)
        .filter(|_| !seed_run(&sim, &a, second, scratch, false))
        .count();
    assert!(
        corrupted > 0,
        "the unsafe variant never corrupted B in 50 runs"
    );
    check(&a);
    a.free(scratch).unwrap();
    assert_drained(&sim, &a);
}

/// torchair's multi-stream example: tagged streams '1' and '2', an event recorded on
/// the main stream and waited on by stream '1', B used on stream '1' and recorded there,
/// `del B`, then `C = ones` and `C.add_(2)` on the main stream.
#[test]
fn torchair_tagged_stream_example() {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, "");
    let s1 = sim.create_stream(0).unwrap(); // npu_stream_switch('1')
    let s2 = sim.create_stream(0).unwrap(); // npu_stream_switch('2')
    let scratch = a.malloc(64 * 64 * 4, s1).unwrap();
    sim.memory(0).unwrap().fill_f32(scratch, 64 * 64, 0.5);
    for _ in 0..200 {
        let ev = sim.event_create(0).unwrap(); // npu_create_tagged_event("66")
        let bytes = N * 4;
        // Main stream: B = x + y with x = 2, y = 3.
        let b = a.malloc(bytes, MAIN).unwrap();
        fill(&sim, MAIN, b, 5.0);
        sim.event_record(0, ev, MAIN).unwrap(); // npu_tagged_event_record
                                                // Stream '1': wait, then D = B * 2 after other work.
        sim.stream_wait_event(0, s1, ev).unwrap(); // npu_tagged_event_wait
        long_chain(&sim, s1, scratch);
        let d = a.malloc(bytes, s1).unwrap();
        sim.launch(0, s1, move |m: &SimMemory| {
            let v: Vec<f32> = m.read_f32(b, N).unwrap().iter().map(|x| x * 2.0).collect();
            m.write_f32(d, &v);
        })
        .unwrap();
        // Stream '2': independent work E = 7.
        let e = a.malloc(bytes, s2).unwrap();
        fill(&sim, s2, e, 7.0);
        a.record_stream(b, s1).unwrap(); // npu_record_tagged_stream(B, '1')
        a.free(b).unwrap(); // del B
        let c = a.malloc(bytes, MAIN).unwrap(); // C = ones
        fill(&sim, MAIN, c, 1.0);
        sim.launch(0, MAIN, move |m: &SimMemory| {
            let v: Vec<f32> = m.read_f32(c, N).unwrap().iter().map(|x| x + 2.0).collect();
            m.write_f32(c, &v); // C.add_(2)
        })
        .unwrap();
        sim.synchronize_device(0).unwrap();
        let mem = sim.memory(0).unwrap();
        assert!(
            mem.read_f32(d, N).unwrap().iter().all(|&x| x == 10.0),
            "D wrong"
        );
        assert!(
            mem.read_f32(c, N).unwrap().iter().all(|&x| x == 3.0),
            "C wrong"
        );
        assert!(
            mem.read_f32(e, N).unwrap().iter().all(|&x| x == 7.0),
            "E wrong"
        );
        for p in [c, d, e] {
            a.free(p).unwrap();
        }
        sim.event_destroy(0, ev).unwrap();
    }
    check(&a);
    a.free(scratch).unwrap();
    assert_drained(&sim, &a);
}
