//! The seed scenario on the simulated device, with and without `record_stream`.
//!
//! `A` is zeroed on the main stream; on `second_stream` a long chain of work runs, then
//! `B = A + 1`; `A` is freed on the host; `C` is allocated on the main stream and filled
//! with ones. With `record_stream(A, second_stream)` the allocator keeps A's memory from
//! C until second_stream is done with it, so B is all ones.
//!
//! Run: `cargo run --release --example seed_scenario`

use std::sync::Arc;

use npualloc::device::sim::{SimConfig, SimDevice, SimMemory, SimMode};
use npualloc::{CachingAllocator, Config, Device, StreamHandle};

const N: usize = 1 << 16; // floats per tensor
const MAIN: StreamHandle = StreamHandle::DEFAULT;

fn run(
    sim: &Arc<SimDevice>,
    a: &CachingAllocator,
    second: StreamHandle,
    record: bool,
) -> (bool, bool) {
    let ev = sim.event_create(0).unwrap();
    let a_ptr = a.malloc(N * 4, MAIN).unwrap();
    sim.launch(0, MAIN, move |m: &SimMemory| {
        m.fill_f32(a_ptr, N, 0.0);
    })
    .unwrap();
    sim.event_record(0, ev, MAIN).unwrap();
    sim.stream_wait_event(0, second, ev).unwrap();
    // The long chain: the side stream is busy while the host runs ahead.
    sim.launch(0, second, |_: &SimMemory| {
        std::thread::sleep(std::time::Duration::from_millis(2))
    })
    .unwrap();
    let b_ptr = a.malloc(N * 4, second).unwrap();
    sim.launch(0, second, move |m: &SimMemory| {
        let v: Vec<f32> = m
            .read_f32(a_ptr, N)
            .unwrap()
            .iter()
            .map(|x| x + 1.0)
            .collect();
        m.write_f32(b_ptr, &v);
    })
    .unwrap();
    if record {
        a.record_stream(a_ptr, second).unwrap();
    }
    a.free(a_ptr).unwrap();
    let c_ptr = a.malloc(N * 4, MAIN).unwrap();
    sim.launch(0, MAIN, move |m: &SimMemory| {
        m.fill_f32(c_ptr, N, 1.0);
    })
    .unwrap();
    sim.synchronize_device(0).unwrap();
    let b_ok = sim
        .memory(0)
        .unwrap()
        .read_f32(b_ptr, N)
        .unwrap()
        .iter()
        .all(|&x| x == 1.0);
    let reused = c_ptr == a_ptr;
    a.free(b_ptr).unwrap();
    a.free(c_ptr).unwrap();
    sim.event_destroy(0, ev).unwrap();
    (b_ok, reused)
}

fn main() {
    let sim = SimDevice::new(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        backed: true,
        mode: SimMode::Threaded,
        ..SimConfig::default()
    });
    let a = CachingAllocator::new(sim.clone(), 0, Config::default()).unwrap();
    let second = sim.create_stream(0).unwrap();
    const RUNS: usize = 100;
    for record in [false, true] {
        let mut wrong = 0;
        let mut reused = 0;
        for _ in 0..RUNS {
            let (ok, r) = run(&sim, &a, second, record);
            wrong += usize::from(!ok);
            reused += usize::from(r);
        }
        println!(
            "{:<28} B wrong in {wrong:>3}/{RUNS} runs; C reused A's memory in {reused:>3}/{RUNS} runs",
            if record { "with record_stream(A, s2):" } else { "without record_stream:" }
        );
    }
    a.check_invariants().expect("allocator invariants");
    let s = a.stats();
    let c = sim.counters(0);
    println!(
        "device mallocs {}, events created {}, event records {}, peak reserved {} bytes",
        s.num_device_alloc, c.events_created, c.event_records, s.reserved_bytes[0].peak
    );
}
