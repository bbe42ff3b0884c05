//! A tight malloc+free loop on one stream, for profilers (`perf record`, callgrind).
//!
//! Run: `cargo run --release --example pair_loop -- [pairs]`; `PAIR_STREAMS=2` makes
//! the one thread alternate its pairs between two streams (the device-wide
//! statistics then combine two shards).

use std::hint::black_box;
use std::time::Instant;

use npualloc::device::sim::{SimConfig, SimDevice};
use npualloc::{CachingAllocator, Config, StreamHandle};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let sim = SimDevice::new(SimConfig::default());
    let conf = std::env::var("NPUALLOC_CONF").unwrap_or_default();
    let a = CachingAllocator::new(sim.clone(), 0, Config::parse(&conf).unwrap()).unwrap();
    let streams = match std::env::var("PAIR_STREAMS").as_deref() {
        Ok("2") => vec![StreamHandle::DEFAULT, sim.create_stream(0).unwrap()],
        _ => vec![StreamHandle::DEFAULT],
    };
    let max_shift: usize = std::env::var("PAIR_MAX_SHIFT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let min_shift: usize = std::env::var("PAIR_MIN_SHIFT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let sizes: Vec<usize> = (0..64)
        .map(|i| 512usize << (min_shift + i % (max_shift - min_shift)))
        .collect();
    for &s in &sizes {
        for &st in &streams {
            a.free(a.malloc(s, st).unwrap()).unwrap();
        }
    }
    let t = Instant::now();
    for i in 0..n {
        let p = a
            .malloc(black_box(sizes[i % 64]), streams[i % streams.len()])
            .unwrap();
        a.free(black_box(p)).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let s = a.stats();
    println!(
        "{ns:.1} ns per malloc+free pair ({n} pairs; device mallocs {}, frees {})",
        s.num_device_alloc, s.num_device_free
    );
}
