//! Many threads on several streams at once (threaded simulated device).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use npualloc::device::sim::SimMode;
use npualloc::{Device, StreamHandle};

use crate::common::*;

#[test]
fn threads_on_several_streams_never_overlap_and_balance() {
    stress("");
}

#[test]
fn threads_on_several_streams_with_expandable_segments() {
    // Small pages and a small device: pages are mapped, unmapped before growth (also
    // from other streams' shards) and mapped again while every thread runs.
    stress("expandable_segments:True,large_segment_size_mb:4");
}

/// A small deterministic random number generator (xorshift64) seeded with `seed`.
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

fn stress(conf: &str) {
    let (sim, a) = with(4 << 30, SimMode::Threaded, false, conf);
    let a = Arc::new(a);
    let streams: Vec<StreamHandle> = std::iter::once(StreamHandle::DEFAULT)
        .chain((0..3).map(|_| sim.create_stream(0).unwrap()))
        .collect();
    let live_ranges: Arc<Mutex<BTreeMap<usize, usize>>> = Arc::default();

    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (a, sim, streams, ranges) =
                (a.clone(), sim.clone(), streams.clone(), live_ranges.clone());
            std::thread::spawn(move || {
                let mut next = xorshift(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                let mine = streams[t];
                let mut live: Vec<(usize, usize)> = Vec::new();
                for _ in 0..3000 {
                    let r = next();
                    if live.len() < 16 && r % 3 != 0 {
                        let size = match r % 10 {
                            0 => (r >> 8) as usize % (24 << 20) + 1,
                            1..=3 => (r >> 8) as usize % (4 << 20) + 1,
                            _ => (r >> 8) as usize % 65536 + 1,
                        };
                        let p = a.malloc(size, mine).unwrap();
                        let mut map = ranges.lock();
                        if let Some((&s, &e)) = map.range(..p + size).next_back() {
                            assert!(
                                e <= p || s >= p + size,
                                "overlap: [{s:#x},{e:#x}) and [{p:#x},+{size})"
                            );
                        }
                        map.insert(p, p + size);
                        drop(map);
                        if r % 5 == 0 {
                            let other = streams[(r >> 20) as usize % streams.len()];
                            a.record_stream(p, other).unwrap();
                            sim.launch(0, other, |_| {}).unwrap();
                        }
                        live.push((p, size));
                    } else if !live.is_empty() {
                        let (p, _) = live.swap_remove((r >> 4) as usize % live.len());
                        // Out of the shared map before the free: afterwards another thread may get it.
                        ranges.lock().remove(&p);
                        a.free(p).unwrap();
                    }
                }
                for (p, _) in live {
                    ranges.lock().remove(&p);
                    a.free(p).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    check(&a);
    let s = a.stats();
    assert_eq!(s.allocation[0].current, 0);
    assert_eq!(s.allocation[0].allocated, s.allocation[0].freed);
    if conf.contains("expandable") {
        let c = sim.counters(0);
        assert!(c.unmaps > 0, "the run never unmapped: {c:?}");
    }
    sim.synchronize_device(0).unwrap();
    assert_drained(&sim, &a);
}

#[test]
fn blocks_freed_by_other_threads_find_their_shard() {
    // Allocations made on one thread (and stream) and freed on another: the free has no
    // usable hint and must search the shards, while both threads keep allocating.
    let (sim, a) = with(4 << 30, SimMode::Threaded, false, "");
    let a = Arc::new(a);
    let streams: Vec<StreamHandle> = (0..2).map(|_| sim.create_stream(0).unwrap()).collect();
    let (tx0, rx1) = std::sync::mpsc::channel::<usize>();
    let (tx1, rx0) = std::sync::mpsc::channel::<usize>();
    let handles: Vec<_> = [(0usize, tx0, rx0), (1, tx1, rx1)]
        .into_iter()
        .map(|(t, tx, rx)| {
            let (a, stream) = (a.clone(), streams[t]);
            std::thread::spawn(move || {
                for i in 0..4000usize {
                    let p = a.malloc(512 << (i % 12), stream).unwrap();
                    tx.send(p).unwrap();
                    while let Ok(q) = rx.try_recv() {
                        a.free(q).unwrap();
                    }
                }
                drop(tx);
                for q in rx {
                    a.free(q).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    check(&a);
    assert_eq!(a.stats().allocation[0].current, 0);
    assert_drained(&sim, &a);
}

/// Real asynchronous streams and memory, four threads each on its own stream, memory
/// moving between streams by lending: every block's last kernel (still queued when it
/// is freed) finds the token its first kernel wrote, and no kernel touches freed
/// memory. A borrower writing before the lender's queued work ran, or a lender taking
/// a block back before the borrower's, would overwrite a token first: this catches such
/// a bug only when the timing exposes it (a few runs in four with the dirty wait
/// removed); `lending.rs` checks the ordering deterministically.
#[test]
fn lent_memory_is_never_written_under_queued_work() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, "");
    let a = Arc::new(a);
    let streams: Vec<StreamHandle> = (0..4).map(|_| sim.create_stream(0).unwrap()).collect();
    let wrong = Arc::new(AtomicU64::new(0));
    const WORDS: usize = 16;
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (a, sim, mine, wrong) = (a.clone(), sim.clone(), streams[t], wrong.clone());
            std::thread::spawn(move || {
                let mut next = xorshift(0x2545_F491_4F6C_DD1D ^ (t as u64 + 1));
                let mut live: Vec<usize> = Vec::new();
                for i in 0..600u32 {
                    let r = next();
                    if live.len() < 8 && r % 3 != 0 {
                        let size = match r % 8 {
                            0 => (2 << 20) + (r >> 8) as usize % (6 << 20),
                            _ => 64 + (r >> 8) as usize % (256 << 10),
                        };
                        let p = a.malloc(size, mine).unwrap();
                        let token = (t as u32 * 100_000 + i) as f32;
                        let slow = r % 7 == 0;
                        sim.launch(0, mine, move |m| {
                            if slow {
                                std::thread::sleep(std::time::Duration::from_micros(300));
                            }
                            m.fill_f32(p, WORDS, token);
                        })
                        .unwrap();
                        live.push(p);
                        // Remember the token with the pointer (read back at the free).
                        live.push(token.to_bits() as usize);
                    } else if live.len() >= 2 {
                        let k = ((r >> 4) as usize % (live.len() / 2)) * 2;
                        let (p, token) = (live[k], f32::from_bits(live[k + 1] as u32));
                        live.drain(k..k + 2);
                        let wrong = wrong.clone();
                        sim.launch(0, mine, move |m| {
                            std::thread::sleep(std::time::Duration::from_micros(400));
                            let seen = m.read_f32(p, WORDS).unwrap_or_default();
                            if seen.iter().any(|&x| x != token) {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                        .unwrap();
                        a.free(p).unwrap(); // the check is still queued
                    }
                }
                for pair in live.chunks(2) {
                    a.free(pair[0]).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    sim.synchronize_device(0).unwrap();
    let c = sim.counters(0);
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "a token was overwritten: {c:?}"
    );
    // No record_stream in this test: every event recorded ordered a lending.
    assert!(c.event_records > 0, "nothing was lent: {c:?}");
    assert_eq!(c.violations, 0);
    check(&a);
    assert_drained(&sim, &a);
}
