//! Aggregate throughput of malloc+free pairs: one thread on one stream against two
//! threads on two streams (the mixed 512 B-8 MiB sizes), with a pure-compute loop as
//! the machine's own scaling reference.
//!
//! Run: `cargo run --release --example scaling` (settings from `NPUALLOC_CONF`).
//!
//! For instruction counts (callgrind runs threads one after the other, so the count
//! per pair stays meaningful): `SCALING_ONLY=1` runs only one thread on one stream,
//! `SCALING_ONLY=2` only two threads on two streams (as in round 1: the second shard
//! is created by them), each `SCALING_PAIRS` pairs (default 5,000,000), e.g.
//! `SCALING_ONLY=2 SCALING_PAIRS=100000 valgrind --tool=callgrind
//! target/release/examples/scaling`, at two sizes, difference / pairs difference.

use std::hint::black_box;
use std::time::Instant;

use npualloc::device::sim::{SimConfig, SimDevice};
use npualloc::{CachingAllocator, Config, StreamHandle};

fn pairs_per_run() -> usize {
    std::env::var("SCALING_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000_000)
}

fn pairs(a: &CachingAllocator, stream: StreamHandle) {
    let sizes: Vec<usize> = (0..15).map(|i| 512usize << i).collect();
    for i in 0..pairs_per_run() {
        let p = a.malloc(sizes[i % sizes.len()], stream).unwrap();
        a.free(black_box(p)).unwrap();
    }
}

fn compute(_: &CachingAllocator, _: StreamHandle) {
    let mut x = 1u64;
    for i in 0..pairs_per_run() * 20 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i as u64);
    }
    black_box(x);
}

fn ratio(
    a: &CachingAllocator,
    streams: &[StreamHandle],
    f: fn(&CachingAllocator, StreamHandle),
) -> f64 {
    let t = Instant::now();
    f(a, streams[0]);
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::thread::scope(|s| {
        for &st in &streams[..2] {
            s.spawn(move || f(a, st));
        }
    });
    2.0 * one / t.elapsed().as_secs_f64()
}

fn main() {
    let sim = SimDevice::new(SimConfig::default());
    let conf = std::env::var("NPUALLOC_CONF").unwrap_or_default();
    let a = CachingAllocator::new(sim.clone(), 0, Config::parse(&conf).unwrap()).unwrap();
    let streams = [sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap()];
    match std::env::var("SCALING_ONLY").as_deref() {
        Ok("1") => return pairs(&a, streams[0]),
        Ok("2") => {
            std::thread::scope(|s| {
                for &st in &streams {
                    let a = &a;
                    s.spawn(move || pairs(a, st));
                }
            });
            return a.check_invariants().unwrap();
        }
        _ => {}
    }
    for round in 1..=3 {
        let alloc = ratio(&a, &streams, pairs);
        let cpu = ratio(&a, &streams, compute);
        println!("round {round}: allocator 2-thread/1-thread throughput {alloc:.2}x; pure compute {cpu:.2}x");
    }
    a.check_invariants().unwrap();
}
