//! Cross-stream lending: a stream borrows another stream's idle cached segment instead
//! of allocating, ordered on the device by an event, never waiting on the host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use npualloc::device::sim::{SimMemory, SimMode};
use npualloc::{Device, StreamHandle};

use crate::common::*;

/// Kernel runs: (name, start, end).
type Log = Arc<Mutex<Vec<(&'static str, Instant, Instant)>>>;

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
    check(&a);
    a.free(y).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn lending_is_off_when_asked() {
    let (sim, a) = with(
        1 << 30,
        SimMode::Manual,
        false,
        "lend_segments:False,reclaim_before_growth:False",
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
        let l = log.clone();
        let v = round as f32;
        sim.launch(0, StreamHandle::DEFAULT, move |m: &SimMemory| {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(3));
            m.fill_f32(x, N, v);
            l.lock().push(("lender", t, Instant::now()));
        })
        .unwrap();
        a.free(x).unwrap(); // the lender's kernel is still running
        let y = a.malloc(30 * MIB, s1).unwrap();
        let (l, out) = (log.clone(), a.malloc(N * 4, s1).unwrap());
        sim.launch(0, s1, move |m: &SimMemory| {
            let t = Instant::now();
            let d = m.read_f32(y, N).unwrap();
            m.write_f32(out, &d);
            l.lock().push(("borrower", t, Instant::now()));
        })
        .unwrap();
        sim.synchronize_device(0).unwrap();
        if y == x {
            lent += 1;
            let l = log.lock();
            let lender = l.iter().find(|e| e.0 == "lender").unwrap();
            let borrower = l.iter().find(|e| e.0 == "borrower").unwrap();
            assert!(
                borrower.1 >= lender.2,
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
