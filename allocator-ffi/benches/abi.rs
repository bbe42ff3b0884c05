//! The fast path as torch_npu calls it (issue #18): `npualloc_malloc` / `npualloc_free`
//! looked up with dlopen/dlsym in `libnpualloc.so` and called through function
//! pointers with a stream handle, over the ACL backend (fake runtime) and the simulated
//! device, side by side with a PyTorch-style reference allocator behind the same ABI over
//! the same fake runtime (`benches/reference/pytorch_style.cpp`) and glibc.
//!
//! Workload: one thread, a window of 64 live blocks; each step frees the oldest and
//! allocates the next size of a mix (the issue's eight sizes, or 4,096 sizes drawn from
//! the shipped traces), i.e. one malloc+free pair. Then 2 threads on 2 streams against
//! one. After criterion, an interleaved A/B summary prints medians, spread and the ratio
//! to the reference.
//!
//! Run: `cargo bench -p npualloc-ffi --bench abi` (builds `libnpualloc.so` with
//! `cargo build --release -p npualloc-ffi` first). Profiling: `ABI_PROFILE=kind:mix:steps`
//! (kind `acl`, `sim`, `ref`, `glibc`; mix `issue`, `trace` or a list of sizes such as
//! `8388608` or `512,4096`; npualloc's settings from `ABI_CONF`) runs only that loop, e.g.
//! under `valgrind --tool=callgrind`. See benches/README.md.

mod abi_support;

use std::hint::black_box;
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use abi_support::{trace_mix, Allocator, Kind, Window, ISSUE_MIX};
use criterion::Criterion;

struct Loaded {
    acl: Allocator,
    sim: Allocator,
    reference: Allocator,
    glibc: Allocator,
    /// Instances of their own for the 2-thread runs, which only ever see the issue mix
    /// on streams 0 and 1: a stream that starts beside another stream's large idle cache
    /// (the trace mix's) borrows from it, with events, until its own cache has grown.
    acl_threads: Allocator,
    reference_threads: Allocator,
    trace: Vec<usize>,
}

fn loaded() -> &'static Loaded {
    static L: OnceLock<Loaded> = OnceLock::new();
    L.get_or_init(|| Loaded {
        acl: Allocator::load(Kind::NpuallocAcl),
        sim: Allocator::load(Kind::NpuallocSim),
        reference: Allocator::load(Kind::Reference),
        glibc: Allocator::load(Kind::Glibc),
        acl_threads: Allocator::load(Kind::NpuallocAcl),
        reference_threads: Allocator::load(Kind::Reference),
        trace: trace_mix(),
    })
}

fn contenders(l: &Loaded) -> [(&'static str, &Allocator); 4] {
    [
        ("npualloc_acl", &l.acl),
        ("npualloc_sim", &l.sim),
        ("pytorch_ref", &l.reference),
        ("glibc", &l.glibc),
    ]
}

fn mixes(l: &Loaded) -> [(&'static str, &[usize]); 2] {
    [("issue_mix", &ISSUE_MIX), ("trace_mix", &l.trace)]
}

fn single_thread(c: &mut Criterion) {
    let l = loaded();
    for (mix_name, mix) in mixes(l) {
        let mut g = c.benchmark_group(format!("abi_{mix_name}"));
        for (name, a) in contenders(l) {
            let mut w = Window::new(a, mix, a.stream(0));
            // Warm up the caches: several passes over the mix.
            w.run(4 * mix.len().max(64) as u64);
            g.bench_function(name, |b| b.iter(|| black_box(&mut w).step()));
        }
        g.finish();
    }
}

/// `streams.len()` threads, each with its own window on its own stream, `iters` pairs
/// each; returns the slowest thread's time (all start together).
fn run_threads(a: &Allocator, mix: &[usize], streams: &[usize], iters: u64) -> Duration {
    let barrier = Barrier::new(streams.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .map(|&stream| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut w = Window::new(a, mix, stream);
                    w.run(2 * mix.len() as u64);
                    barrier.wait();
                    let start = Instant::now();
                    w.run(iters);
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

fn threads(c: &mut Criterion) {
    let l = loaded();
    let mut g = c.benchmark_group("abi_threads_issue_mix");
    for (name, a) in [
        ("npualloc_acl", &l.acl_threads),
        ("pytorch_ref", &l.reference_threads),
    ] {
        let streams = [a.stream(0), a.stream(1)];
        for n in [1usize, 2] {
            g.bench_function(format!("{name}_{n}t"), |b| {
                b.iter_custom(|iters| run_threads(a, &ISSUE_MIX, &streams[..n], iters))
            });
        }
    }
    g.finish();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Interleaved rounds (every contender once per round, order rotating), so load on the
/// machine hits all alike; prints median ns per pair, min–max and the ratio to the
/// reference.
fn summary(rounds: usize, steps: u64) {
    let l = loaded();
    println!("\nABI summary: {rounds} interleaved rounds of {steps} pairs (ns per pair: median [min, max], ratio to pytorch_ref)");
    for (mix_name, mix) in mixes(l) {
        let cs = contenders(l);
        let mut windows: Vec<_> = cs
            .iter()
            .map(|(_, a)| {
                let mut w = Window::new(a, mix, a.stream(0));
                w.run(4 * mix.len() as u64);
                w
            })
            .collect();
        let mut times = vec![Vec::new(); cs.len()];
        for r in 0..rounds {
            for k in 0..cs.len() {
                let i = (k + r) % cs.len();
                let start = Instant::now();
                windows[i].run(steps);
                times[i].push(start.elapsed().as_nanos() as f64 / steps as f64);
            }
        }
        let meds: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
        let reference = meds[2];
        for (i, (name, _)) in cs.iter().enumerate() {
            let (lo, hi) = times[i]
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), &t| (lo.min(t), hi.max(t)));
            println!(
                "  {mix_name:9} {name:13} {:7.1} ns [{lo:.1}, {hi:.1}]  ratio {:.2}",
                meds[i],
                meds[i] / reference
            );
        }
    }
    for (name, a) in [
        ("npualloc_acl", &l.acl_threads),
        ("pytorch_ref", &l.reference_threads),
    ] {
        let streams = [a.stream(0), a.stream(1)];
        let mut scale = Vec::new();
        for _ in 0..rounds {
            let one = run_threads(a, &ISSUE_MIX, &streams[..1], steps).as_nanos() as f64;
            let two = run_threads(a, &ISSUE_MIX, &streams, steps).as_nanos() as f64;
            scale.push(2.0 * one / two);
        }
        let (lo, hi) = scale
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        println!(
            "  2 threads on 2 streams / 1 thread, issue_mix, {name:13} {:.2}x [{lo:.2}, {hi:.2}]",
            median(&mut scale)
        );
    }
}

fn profile(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let kind = match parts[0] {
        "acl" => Kind::NpuallocAcl,
        "sim" => Kind::NpuallocSim,
        "ref" => Kind::Reference,
        "glibc" => Kind::Glibc,
        k => panic!("ABI_PROFILE kind '{k}': acl, sim, ref or glibc"),
    };
    let mix: Vec<usize> = match parts.get(1).copied().unwrap_or("issue") {
        "issue" => ISSUE_MIX.to_vec(),
        "trace" => trace_mix(),
        list => list
            .split(',')
            .map(|s| {
                s.parse()
                    .expect("ABI_PROFILE mix: issue, trace or sizes a,b,c")
            })
            .collect(),
    };
    let mix = &mix[..];
    let steps: u64 = parts.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // npualloc's settings for the profiled loop (`NPUALLOC_CONF` syntax), e.g. one of its
    // rules turned off (`scripts/rule_costs.py`).
    let conf = std::env::var("ABI_CONF").unwrap_or_default();
    let a = Allocator::load_with_conf(kind, &conf);
    let mut w = Window::new(&a, mix, a.stream(0));
    w.run(4 * mix.len() as u64);
    w.run(steps);
}

fn main() {
    if let Ok(spec) = std::env::var("ABI_PROFILE") {
        return profile(&spec);
    }
    // `cargo bench` passes --bench; `cargo test --benches` does not (test mode: each
    // benchmark once, a tiny summary).
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    single_thread(&mut c);
    threads(&mut c);
    c.final_summary();
    if bench_mode {
        summary(9, 200_000);
    } else {
        summary(1, 1_000);
    }
}
