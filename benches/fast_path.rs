//! Fast path: malloc + free of a cached block on one stream, single thread.
//!
//! Run: `cargo bench --bench fast_path`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

use npualloc::device::sim::{SimConfig, SimDevice};
use npualloc::{CachingAllocator, Config, StreamHandle};

fn allocator() -> (Arc<SimDevice>, CachingAllocator) {
    let sim = SimDevice::new(SimConfig::default());
    let a = CachingAllocator::new(sim.clone(), 0, Config::default()).unwrap();
    (sim, a)
}

fn fast_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("malloc_free_pair");
    for size in [512usize, 64 << 10, 1 << 20, 8 << 20] {
        let (_sim, a) = allocator();
        // Warm the cache so the pair never reaches the device.
        a.free(a.malloc(size, StreamHandle::DEFAULT).unwrap())
            .unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let p = a.malloc(black_box(size), StreamHandle::DEFAULT).unwrap();
                a.free(black_box(p)).unwrap();
            })
        });
    }
    // A mix from 512 B to 8 MiB, a pair per size in turn.
    let sizes: Vec<usize> = (0..64).map(|i| 512usize << (i % 15)).collect();
    let (_sim, a) = allocator();
    for &s in &sizes {
        a.free(a.malloc(s, StreamHandle::DEFAULT).unwrap()).unwrap();
    }
    g.bench_function("mixed_512B_8MiB", |b| {
        let mut i = 0;
        b.iter(|| {
            let size = sizes[i % sizes.len()];
            i += 1;
            let p = a.malloc(black_box(size), StreamHandle::DEFAULT).unwrap();
            a.free(black_box(p)).unwrap();
        })
    });
    g.finish();
}

fn cross_stream_cycle(c: &mut Criterion) {
    let (sim, a) = allocator();
    let side = sim.create_stream(0).unwrap();
    c.bench_function("cross_stream_cycle", |b| {
        b.iter(|| {
            let p = a.malloc(64 << 10, StreamHandle::DEFAULT).unwrap();
            a.record_stream(p, side).unwrap();
            a.free(p).unwrap();
            sim.complete_stream(0, side).unwrap();
        })
    });
    assert_eq!(a.event_counts().0, 1, "steady state must not create events");
}

criterion_group!(benches, fast_path, cross_stream_cycle);
criterion_main!(benches);
