//! The allocator's speed: the fast path by size class against mimalloc, two threads on
//! two streams against one, the cross-stream cycle, and trace replay.
//!
//! Run: `cargo bench --bench fast_path` (benches/README.md; the figures: docs/results.md).

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mimalloc::MiMalloc;

use npualloc::device::sim::{SimConfig, SimDevice};
use npualloc::replay::{replay, ReplayOptions};
use npualloc::{CachingAllocator, Config, StreamHandle};

fn allocator() -> (Arc<SimDevice>, CachingAllocator) {
    let sim = SimDevice::new(SimConfig::default());
    let a = CachingAllocator::new(sim.clone(), 0, Config::default()).unwrap();
    (sim, a)
}

/// 512 B, 1 KiB, ..., 8 MiB in turn.
fn size_mix() -> Vec<usize> {
    (0..15).map(|i| 512usize << i).collect()
}

fn fast_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("malloc_free_pair");
    for size in [512usize, 64 << 10, 1 << 20, 8 << 20] {
        let (_sim, a) = allocator();
        a.free(a.malloc(size, StreamHandle::DEFAULT).unwrap())
            .unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let p = a.malloc(black_box(size), StreamHandle::DEFAULT).unwrap();
                a.free(black_box(p)).unwrap();
            })
        });
    }
    let sizes = size_mix();
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
    // The host-allocator reference: the same size mix through mimalloc.
    g.bench_function("mimalloc_mixed_512B_8MiB", |b| {
        let mut i = 0;
        b.iter(|| {
            let layout = Layout::from_size_align(sizes[i % sizes.len()], 512).unwrap();
            i += 1;
            // SAFETY: a non-zero-size layout; the pointer is freed with the same layout.
            unsafe {
                let p = MiMalloc.alloc(black_box(layout));
                assert!(!p.is_null());
                MiMalloc.dealloc(black_box(p), layout);
            }
        })
    });
    g.finish();
}

/// `threads` threads, each on its own stream, each doing `iters` pairs of the size mix.
fn run_threads(a: &CachingAllocator, streams: &[StreamHandle], iters: u64) -> Duration {
    let sizes = size_mix();
    let start = Instant::now();
    std::thread::scope(|s| {
        for &stream in streams {
            let sizes = &sizes;
            s.spawn(move || {
                for i in 0..iters as usize {
                    let p = a.malloc(sizes[i % sizes.len()], stream).unwrap();
                    a.free(black_box(p)).unwrap();
                }
            });
        }
    });
    start.elapsed()
}

fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads_streams");
    for threads in [1usize, 2] {
        let (sim, a) = allocator();
        let streams: Vec<StreamHandle> = (0..threads)
            .map(|_| sim.create_stream(0).unwrap())
            .collect();
        run_threads(&a, &streams, 1000); // warm every stream's cache
                                         // Throughput counts pairs done by all threads together.
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(BenchmarkId::from_parameter(threads), |b| {
            b.iter_custom(|iters| run_threads(&a, &streams, iters))
        });
    }
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
    // One event in all (none when a filter skipped this benchmark).
    assert!(
        a.event_counts().0 <= 1,
        "steady state must not create events"
    );
}

fn replay_speed(c: &mut Criterion) {
    let text = include_str!("../traces/t5_train.trace");
    let trace = npualloc::trace::parse(text, "t5_train.trace").unwrap();
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(trace.ops.len() as u64));
    g.sample_size(20);
    g.bench_function("t5_train", |b| {
        b.iter(|| {
            replay(&trace, &ReplayOptions::default(), |_| {})
                .unwrap()
                .events
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    fast_path,
    scaling,
    cross_stream_cycle,
    replay_speed
);
criterion_main!(benches);
