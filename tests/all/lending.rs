//! Cross-stream lending: a stream borrows another stream's idle cached segment, or a
//! free block of it, instead of allocating, ordered on the device by events, never
//! waiting on the host.

use std::sync::Arc;

use npualloc::device::sim::{SimDevice, SimMode};
use npualloc::{CachingAllocator, Device, StreamHandle};

use crate::common::*;

/// A manual-mode device where stream 1 has borrowed an 8 MiB block of stream 0's
/// segment (a 4 MiB anchor keeps that segment from being lent whole):
/// (device, allocator, stream 1, anchor, the lent block).
fn with_a_lent_block() -> (Arc<SimDevice>, CachingAllocator, StreamHandle, usize, usize) {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let anchor = a.malloc(4 * MIB, S0).unwrap();
    let q = a.malloc(8 * MIB, s1).unwrap();
    assert_eq!(
        a.base_allocation(q).unwrap().0,
        a.base_allocation(anchor).unwrap().0,
        "not served from stream 0's segment"
    );
    (sim, a, s1, anchor, q)
}

/// Ends the capture of the tests' pool (7, 7) and drops its use.
fn end_capture(a: &CachingAllocator) {
    a.end_allocate_to_pool(npualloc::MempoolId(7, 7)).unwrap();
    a.release_pool(npualloc::MempoolId(7, 7)).unwrap();
}

/// A lending just happened: no device allocation, one event recorded on the lender
/// (`records` before), the borrower `s1` waits on the device, the host never waited.
#[track_caller]
fn assert_lent_on_the_device(
    sim: &SimDevice,
    a: &CachingAllocator,
    s1: StreamHandle,
    records: u64,
) {
    assert_eq!(a.stats().num_device_alloc, 1, "lending must not allocate");
    assert_eq!(sim.counters(0).event_records, records + 1);
    assert_eq!(
        sim.pending(0, s1).unwrap(),
        1,
        "stream 1 must wait on the device"
    );
    assert_eq!(
        sim.counters(0).synchronizations,
        0,
        "the host must not wait"
    );
    check(a);
}

#[test]
fn a_stream_borrows_an_idle_segment_instead_of_allocating() {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let x = a.malloc(30 * MIB, StreamHandle::DEFAULT).unwrap();
    sim.launch(0, StreamHandle::DEFAULT, |_| {}).unwrap(); // work on it still queued
    a.free(x).unwrap();
    let records = sim.counters(0).event_records;
    let y = a.malloc(30 * MIB, s1).unwrap();
    assert_eq!(y, x, "the idle segment was not lent");
    assert_lent_on_the_device(&sim, &a, s1, records);
    a.free(y).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn lending_is_off_when_asked() {
    let (sim, a) = with(
        1 << 30,
        SimMode::Manual,
        false,
        "lend_segments:False,lend_blocks:False,reclaim_before_growth:False",
    );
    let s1 = sim.create_stream(0).unwrap();
    let x = a.malloc(30 * MIB, StreamHandle::DEFAULT).unwrap();
    a.free(x).unwrap();
    let y = a.malloc(30 * MIB, s1).unwrap();
    assert_ne!(y, x);
    assert_eq!(a.stats().num_device_alloc, 2);
    a.free(y).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn borrowed_memory_is_used_only_after_the_lenders_work() {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, "");
    let s1 = sim.create_stream(0).unwrap();
    let log: Log = Arc::default();
    const N: usize = 1024;
    let mut lent = 0;
    for round in 0..20 {
        let x = a.malloc(30 * MIB, StreamHandle::DEFAULT).unwrap();
        let v = round as f32;
        kernel(&sim, StreamHandle::DEFAULT, &log, "lender", 3, move |m| {
            m.fill_f32(x, N, v);
        });
        a.free(x).unwrap(); // the lender's kernel is still running
        let y = a.malloc(30 * MIB, s1).unwrap();
        let out = a.malloc(N * 4, s1).unwrap();
        kernel(&sim, s1, &log, "borrower", 0, move |m| {
            let d = m.read_f32(y, N).unwrap();
            m.write_f32(out, &d);
        });
        sim.synchronize_device(0).unwrap();
        if y == x {
            lent += 1;
            assert!(
                span(&log, "borrower").0 >= span(&log, "lender").1,
                "round {round}: borrower ran before the lender finished"
            );
            assert!(sim
                .memory(0)
                .unwrap()
                .read_f32(out, N)
                .unwrap()
                .iter()
                .all(|&d| d == v));
        }
        log.lock().clear();
        a.free(y).unwrap();
        a.free(out).unwrap();
    }
    assert!(lent >= 10, "only {lent} of 20 rounds borrowed the segment");
    check(&a);
    assert_eq!(sim.counters(0).violations, 0);
    assert_drained(&sim, &a);
}

const S0: StreamHandle = StreamHandle::DEFAULT;

#[test]
fn a_stream_borrows_a_free_block_of_another_streams_segment() {
    let (sim, a) = manual(1 << 30);
    let s1 = sim.create_stream(0).unwrap();
    let anchor = a.malloc(4 * MIB, S0).unwrap(); // keeps the segment from being lent whole
    sim.launch(0, S0, |_| {}).unwrap(); // work queued on stream 0
    let records = sim.counters(0).event_records;
    let q = a.malloc(8 * MIB, s1).unwrap();
    assert_eq!(
        a.base_allocation(q).unwrap().0,
        a.base_allocation(anchor).unwrap().0,
        "not served from stream 0's segment"
    );
    assert_lent_on_the_device(&sim, &a, s1, records);
    // Stream 0's kernel has not run: stream 1 is held back at its wait (a stall).
    sim.step(0, s1, 1).unwrap();
    sim.note_stalls(0).unwrap();
    sim.note_stalls(0).unwrap();
    assert_eq!(sim.counters(0).stalled_waits, 1, "counted once");

    // Freed on stream 1: back in stream 0's pool at once, with a fence on stream 1.
    sim.launch(0, s1, |_| {}).unwrap();
    a.free(q).unwrap();
    assert_eq!(
        sim.counters(0).event_records,
        records + 2,
        "no fence recorded"
    );
    check(&a);
    // Stream 0 takes it before stream 1 ran: it waits on the device for stream 1.
    let before = sim.pending(0, S0).unwrap();
    let r = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(r, q);
    assert_eq!(
        sim.pending(0, S0).unwrap(),
        before + 1,
        "stream 0 did not wait"
    );
    assert_eq!(a.stats().num_device_alloc, 1);
    a.free(r).unwrap();

    // Once stream 1 has run past the fence, taking it needs no wait.
    // (Manual stepping: each stream waits on the other once, so step both twice.)
    for s in [s1, S0, s1, S0] {
        sim.complete_stream(0, s).unwrap();
    }
    assert_eq!(sim.pending(0, S0).unwrap() + sim.pending(0, s1).unwrap(), 0);
    let warm = a.malloc(512, S0).unwrap(); // polls the fence
    let before = sim.pending(0, S0).unwrap();
    let r = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(
        sim.pending(0, S0).unwrap(),
        before,
        "a clean block made stream 0 wait"
    );
    assert_eq!(sim.counters(0).synchronizations, 0);
    check(&a);
    for p in [r, warm, anchor] {
        a.free(p).unwrap();
    }
    assert_drained(&sim, &a);
}

#[test]
fn block_lending_is_off_when_asked() {
    let (sim, a) = with(1 << 30, SimMode::Manual, false, "lend_blocks:False");
    let s1 = sim.create_stream(0).unwrap();
    let anchor = a.malloc(4 * MIB, S0).unwrap();
    let q = a.malloc(8 * MIB, s1).unwrap();
    assert_ne!(
        a.base_allocation(q).unwrap().0,
        a.base_allocation(anchor).unwrap().0
    );
    assert_eq!(a.stats().num_device_alloc, 2);
    assert_eq!(sim.pending(0, s1).unwrap(), 0);
    a.free(q).unwrap();
    a.free(anchor).unwrap();
    assert_drained(&sim, &a);
}

/// Real asynchronous streams and memory: a lent block is written by the borrower only
/// after the lender's kernel on it finished, and taken back by the lender only after
/// the borrower's kernel on it finished.
#[test]
fn a_lent_block_is_ordered_after_the_lender_and_back_after_the_borrower() {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, "");
    let s1 = sim.create_stream(0).unwrap();
    let log: Log = Arc::default();
    const N: usize = 1024;
    let anchor = a.malloc(4 * MIB, S0).unwrap();
    let mut lent = 0;
    for round in 0..20 {
        let v = round as f32;
        let x = a.malloc(8 * MIB, S0).unwrap();
        kernel(&sim, S0, &log, "lender", 2, move |m| {
            m.fill_f32(x, N, v);
        });
        a.free(x).unwrap(); // the lender's kernel is still running
        let y = a.malloc(8 * MIB, s1).unwrap();
        kernel(&sim, s1, &log, "borrower", 2, move |m| {
            let seen = m.read_f32(y, 1).unwrap()[0];
            m.fill_f32(y, N, seen + 100.0);
        });
        a.free(y).unwrap(); // the borrower's kernel is still running
        let z = a.malloc(8 * MIB, S0).unwrap();
        let out = a.malloc(N * 4, S0).unwrap();
        kernel(&sim, S0, &log, "retaker", 0, move |m| {
            let d = m.read_f32(z, N).unwrap();
            m.write_f32(out, &d);
        });
        sim.synchronize_device(0).unwrap();
        if y == x && z == y {
            lent += 1;
            let (lender, borrower) = (span(&log, "lender"), span(&log, "borrower"));
            assert!(borrower.0 >= lender.1, "round {round}: borrower early");
            assert!(
                span(&log, "retaker").0 >= borrower.1,
                "round {round}: retaker early"
            );
            let got = sim.memory(0).unwrap().read_f32(out, N).unwrap();
            assert!(
                got.iter().all(|&d| d == v + 100.0),
                "round {round}: {got:?}"
            );
        }
        log.lock().clear();
        a.free(z).unwrap();
        a.free(out).unwrap();
    }
    assert!(lent >= 10, "only {lent} of 20 rounds lent the block");
    assert_eq!(
        sim.counters(0).synchronizations,
        20,
        "only the test's own waits"
    );
    check(&a);
    assert_eq!(sim.counters(0).violations, 0);
    a.free(anchor).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn no_event_is_recorded_on_a_capturing_borrower() {
    let (sim, a, s1, anchor, q) = with_a_lent_block();
    a.begin_allocate_to_pool(npualloc::MempoolId(7, 7), s1)
        .unwrap();
    let (records, queued) = (sim.counters(0).event_records, sim.pending(0, s1).unwrap());
    a.free(q).unwrap();
    assert_eq!(
        sim.counters(0).event_records,
        records,
        "an event during a capture"
    );
    assert_eq!(sim.pending(0, s1).unwrap(), queued);
    // Kept until the next full synchronisation: stream 0 cannot take it yet.
    let r = a.malloc(8 * MIB, S0).unwrap();
    assert_ne!(r, q);
    check(&a);
    end_capture(&a);
    a.free(r).unwrap();
    a.free(anchor).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn a_capture_begins_only_after_fences_on_its_stream_completed() {
    let (sim, a, s1, anchor, q) = with_a_lent_block();
    sim.launch(0, s1, |_| {}).unwrap();
    a.free(q).unwrap(); // dirty on stream 1, fence queued behind the kernel
    a.begin_allocate_to_pool(npualloc::MempoolId(7, 7), s1)
        .unwrap();
    assert_eq!(
        sim.pending(0, s1).unwrap(),
        0,
        "the fence was not waited for"
    );
    // Clean now: stream 0 takes it without waiting on the capturing stream.
    let before = (sim.pending(0, S0).unwrap(), sim.counters(0).event_records);
    let r = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(r, q);
    assert_eq!(
        (sim.pending(0, S0).unwrap(), sim.counters(0).event_records),
        before
    );
    check(&a);
    end_capture(&a);
    a.free(r).unwrap();
    a.free(anchor).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn snapshots_show_lent_and_dirty_blocks() {
    let (sim, a, s1, anchor, q) = with_a_lent_block();
    let block_at = |v: &serde_json::Value, addr: usize| {
        v["segments"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["blocks"].as_array().unwrap().clone())
            .find(|b| b["address"] == addr)
            .unwrap()
    };
    let v = npualloc::snapshot::snapshot(&[&a]);
    let lent = block_at(&v, q);
    assert_eq!(lent["lent_to_stream"], s1.0);
    assert_eq!(lent["state"], "active_allocated");
    assert!(block_at(&v, anchor).get("lent_to_stream").is_none());
    sim.launch(0, s1, |_| {}).unwrap();
    a.free(q).unwrap(); // its fence on stream 1 waits behind the kernel
    let v = npualloc::snapshot::snapshot(&[&a]);
    let back = block_at(&v, q);
    assert_eq!(back["state"], "inactive");
    assert_eq!(back["dirty_on_streams"], serde_json::json!([s1.0]));
    assert!(back.get("lent_to_stream").is_none());
    a.free(anchor).unwrap();
    for s in [s1, S0, s1] {
        sim.complete_stream(0, s).unwrap();
    }
    assert_drained(&sim, &a);
}
