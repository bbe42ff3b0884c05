//! A long soak: four threads, each on its own stream and lending memory to the others,
//! on a small threaded simulated device with backed memory, while device mallocs, event
//! creations, records and queries (and page maps) fail at random points.
//!
//! Every allocation gets a token written by a kernel on its stream; every use on
//! another stream and every free queue a kernel that checks the token is still there,
//! so memory reused before the streams that used it ran is caught (as is a kernel
//! touching memory that was released: the device counts it as a violation). Every
//! phase all threads meet and the allocator's invariants are checked. At the end
//! nothing is allocated, nothing is reserved after `empty_cache` and no event is left.
//!
//! Operations: `NPUALLOC_SOAK_OPS` (all threads together; default 1,000,000, what CI
//! runs); allocator settings: `NPUALLOC_SOAK_CONF` (default: none).
//! `cargo test --release --test all soak -- --nocapture` prints the figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use npualloc::device::sim::{InjectedFailure, SimMode};
use npualloc::{Device, Error, StreamHandle};

use crate::common::*;

const THREADS: usize = 4;
/// Operations per thread between two invariant checks.
const PHASE: u64 = 5_000;
/// Each thread moves its fault kind's failure point every this many operations.
const REARM: u64 = 128;
/// Bytes of token at the start of each allocation.
const TOKEN_BYTES: usize = 64;

fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

fn soak_ops() -> u64 {
    match std::env::var("NPUALLOC_SOAK_OPS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("NPUALLOC_SOAK_OPS='{v}' is not a number")),
        Err(_) => 1_000_000,
    }
}

fn token_bytes(token: u64) -> Vec<u8> {
    token.to_le_bytes().repeat(TOKEN_BYTES / 8)
}

#[derive(Default)]
struct Figures {
    ops: AtomicU64,
    mallocs: AtomicU64,
    frees: AtomicU64,
    cross_uses: AtomicU64,
    failed_mallocs: AtomicU64,
    checks: AtomicU64,
    wrong: AtomicU64,
}

/// Queues a kernel on `stream` that checks `p` still holds `token`.
fn queue_check(
    sim: &npualloc::device::sim::SimDevice,
    stream: StreamHandle,
    p: usize,
    token: u64,
    f: &Arc<Figures>,
) {
    let f = f.clone();
    sim.launch(0, stream, move |m| {
        f.checks.fetch_add(1, Ordering::Relaxed);
        if m.read(p, TOKEN_BYTES) != Some(token_bytes(token)) {
            f.wrong.fetch_add(1, Ordering::Relaxed);
        }
    })
    .unwrap();
}

#[test]
fn soak_four_threads_with_random_device_faults() {
    let conf = std::env::var("NPUALLOC_SOAK_CONF").unwrap_or_default();
    soak(&conf, soak_ops());
}

/// The same with expandable segments (page maps fail too). It ended with pages still
/// mapped before #17 item 8 was fixed (a lent block freed while event creation failed
/// stayed unfenced, and `empty_cache` never unmapped it).
#[test]
fn soak_expandable_segments_with_random_device_faults() {
    soak("expandable_segments:True", soak_ops() / 4);
}

fn soak(conf: &str, total: u64) {
    let per_thread = total.div_ceil(THREADS as u64);
    let phases = per_thread.div_ceil(PHASE);
    let (sim, a) = with(256 << 20, SimMode::Threaded, true, conf);
    let a = Arc::new(a);
    let streams: Vec<StreamHandle> = (0..THREADS)
        .map(|_| sim.create_stream(0).unwrap())
        .collect();
    let figures = Arc::new(Figures::default());
    let barrier = Arc::new(Barrier::new(THREADS));

    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (a, sim, streams, f, barrier) = (
                a.clone(),
                sim.clone(),
                streams.clone(),
                figures.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let mut next = xorshift(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) * 0x1000_0001));
                let mine = streams[t];
                let mut live: Vec<(usize, u64)> = Vec::new();
                let mut serial = 0u64;
                for phase in 0..phases {
                    let ops = PHASE.min(per_thread - phase * PHASE);
                    for i in 0..ops {
                        let r = next();
                        f.ops.fetch_add(1, Ordering::Relaxed);
                        if i % REARM == 0 {
                            // Thread t sets the next failure point of fault kind t (one
                            // not reached yet is replaced).
                            let nth = 1 + (r >> 40) % REARM;
                            match t {
                                0 => sim.fail_nth_malloc(
                                    0,
                                    nth / 8 + 1,
                                    if r % 2 == 0 {
                                        InjectedFailure::OutOfMemory
                                    } else {
                                        InjectedFailure::RuntimeError
                                    },
                                ),
                                1 => sim.fail_nth_event_create(0, nth),
                                2 => sim.fail_nth_event_record(0, nth),
                                _ => sim.fail_nth_event_query(0, nth),
                            }
                        }
                        if live.len() < 12 && (live.is_empty() || r % 3 != 0) {
                            let size = match r % 20 {
                                0 => (4 << 20) + (r >> 8) as usize % (20 << 20),
                                1..=3 => (64 << 10) + (r >> 8) as usize % (4 << 20),
                                _ => TOKEN_BYTES + (r >> 8) as usize % (64 << 10),
                            };
                            match a.malloc(size, mine) {
                                Ok(p) => {
                                    serial += 1;
                                    let token = (t as u64 + 1) << 48 | serial;
                                    sim.launch(0, mine, move |m| {
                                        m.write(p, &token_bytes(token));
                                    })
                                    .unwrap();
                                    live.push((p, token));
                                    f.mallocs.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(Error::OutOfMemory { .. } | Error::Device(_)) => {
                                    f.failed_mallocs.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("malloc({size}): unexpected error {e}"),
                            }
                        } else if r % 4 == 0 {
                            // Use on another stream, ordered after the token's write.
                            let (p, token) = live[(r >> 4) as usize % live.len()];
                            let other =
                                streams[(t + 1 + (r >> 12) as usize % (THREADS - 1)) % THREADS];
                            let Ok(ev) = sim.event_create(0) else {
                                continue;
                            };
                            if sim.event_record(0, ev, mine).is_ok() {
                                sim.stream_wait_event(0, other, ev).unwrap();
                                queue_check(&sim, other, p, token, &f);
                                a.record_stream(p, other).unwrap();
                                f.cross_uses.fetch_add(1, Ordering::Relaxed);
                            }
                            sim.event_destroy(0, ev).unwrap();
                        } else {
                            let (p, token) = live.swap_remove((r >> 4) as usize % live.len());
                            queue_check(&sim, mine, p, token, &f);
                            a.free(p).unwrap();
                            f.frees.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    barrier.wait();
                    if t == 0 {
                        check(&a);
                        assert_eq!(
                            f.wrong.load(Ordering::Relaxed),
                            0,
                            "a token was overwritten in phase {phase}"
                        );
                    }
                    barrier.wait();
                }
                for (p, token) in live {
                    queue_check(&sim, mine, p, token, &f);
                    a.free(p).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // No failure is due any more (0 turns each off).
    sim.fail_nth_malloc(0, 0, InjectedFailure::OutOfMemory);
    sim.fail_nth_event_create(0, 0);
    sim.fail_nth_event_record(0, 0);
    sim.fail_nth_event_query(0, 0);
    sim.synchronize_device(0).unwrap();
    let c = sim.counters(0);
    let f = &figures;
    println!(
        "soak ({conf:?}): {} operations on {THREADS} threads ({} mallocs, {} failed, {} frees, {} uses on other streams), {} token checks, {} injected faults fired, {} device mallocs, {} events created",
        f.ops.load(Ordering::Relaxed),
        f.mallocs.load(Ordering::Relaxed),
        f.failed_mallocs.load(Ordering::Relaxed),
        f.frees.load(Ordering::Relaxed),
        f.cross_uses.load(Ordering::Relaxed),
        f.checks.load(Ordering::Relaxed),
        c.injected_faults,
        c.mallocs,
        c.events_created,
    );
    assert_eq!(
        f.wrong.load(Ordering::Relaxed),
        0,
        "a token was overwritten: {c:?}"
    );
    assert_eq!(f.ops.load(Ordering::Relaxed), per_thread * THREADS as u64);
    assert!(c.injected_faults > 0, "no fault fired: {c:?}");
    assert!(f.cross_uses.load(Ordering::Relaxed) > 0);
    check(&a);
    assert_eq!(a.stats().allocation[0].current, 0);
    assert_drained(&sim, &a);
}
