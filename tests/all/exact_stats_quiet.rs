//! Exact statistics through quiet mode (`totals/quiet.rs`): after a merge the shards
//! log nothing while each stays within its allowance; a shard that passes its
//! allowance turns every shard's log back on, and the peaks stay the true ones.

use npualloc::device::sim::SimMode;
use npualloc::stats::DeviceStats;
use npualloc::{CachingAllocator, DevicePtr, StreamHandle};

use crate::common::*;

/// Requested bytes and allocation counts, all / small / large, as
/// `(current, peak)` pairs.
fn tracked(s: &DeviceStats) -> [(i64, i64); 6] {
    let r = &s.requested_bytes;
    let a = &s.allocation;
    [r[0], r[1], r[2], a[0], a[1], a[2]].map(|x| (x.current, x.peak))
}

/// The same six values of a live set (size of each allocation).
fn brute(live: &[(DevicePtr, usize)]) -> [i64; 6] {
    let small = |n: usize| n <= MIB;
    let bytes =
        |f: &dyn Fn(usize) -> bool| live.iter().filter(|l| f(l.1)).map(|l| l.1 as i64).sum();
    let count = |f: &dyn Fn(usize) -> bool| live.iter().filter(|l| f(l.1)).count() as i64;
    [
        bytes(&|_| true),
        bytes(&small),
        bytes(&|n| !small(n)),
        count(&|_| true),
        count(&small),
        count(&|n| !small(n)),
    ]
}

/// A deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One thread drives `streams` streams; the brute-force running sums and their
/// running maxima are checked at every query (each query is a merge: the shards go
/// quiet after it).
struct Driver {
    a: CachingAllocator,
    streams: Vec<StreamHandle>,
    live: Vec<(DevicePtr, usize)>,
    max: [i64; 6],
}

impl Driver {
    fn new(n: usize, conf: &str) -> Self {
        let (sim, a) = with(1 << 36, SimMode::Manual, false, conf);
        let streams = default_and_new_streams(&sim, n);
        Driver {
            a,
            streams,
            live: Vec::new(),
            max: [0; 6],
        }
    }

    fn malloc(&mut self, stream: usize, size: usize) {
        let p = self.a.malloc(size, self.streams[stream]).unwrap();
        self.live.push((p, size));
        let now = brute(&self.live);
        self.max
            .iter_mut()
            .zip(now)
            .for_each(|(m, n)| *m = (*m).max(n));
    }

    /// Frees the live allocation at `index` (modulo the live count).
    fn free(&mut self, index: usize) {
        if !self.live.is_empty() {
            let (p, _) = self.live.swap_remove(index % self.live.len());
            self.a.free(p).unwrap();
        }
    }

    fn query(&mut self, what: &str) {
        let now = brute(&self.live);
        let want: Vec<(i64, i64)> = now.iter().zip(self.max).map(|(&c, m)| (c, m)).collect();
        assert_eq!(tracked(&self.a.stats()).to_vec(), want, "{what}");
    }

    fn reset(&mut self) {
        self.a.reset_peak_stats();
        self.max = brute(&self.live);
    }
}

#[test]
fn a_shard_passing_its_allowance_turns_the_other_shards_logs_on() {
    // Window peaks 10 MiB + 10 MiB = the device peak: the merge gives each shard an
    // allowance of 10 MiB and both go quiet. Stream 1 takes 10 MiB within its
    // allowance (not logged); stream 0 takes 10 MiB + 4 KiB, past its own: the sum is
    // a new peak, 20 MiB + 4 KiB, which only the quiet change of stream 1 explains.
    // Stream 1 then frees before the next merge: had it not started logging when the
    // flag was set, the merge would count its 10 MiB as absent all window.
    // Without lending each stream's blocks (and statistics) stay on its own shard.
    let mut d = Driver::new(3, "lend_segments:False,lend_blocks:False");
    for _ in 0..3 {
        d.malloc(0, 10 * MIB);
        d.malloc(1, 10 * MIB);
        d.free(1);
        d.free(0);
        d.query("warm-up");
    }
    d.malloc(1, 10 * MIB);
    d.malloc(0, 10 * MIB + 4096);
    let s1 = d.live.iter().position(|l| l.1 == 10 * MIB).unwrap();
    d.free(s1);
    d.query("after stream 0 passed its allowance");
    // And again with the roles swapped, after a peak reset (allowances = currents).
    d.reset();
    d.query("after the reset");
    d.malloc(0, 3 * MIB);
    d.malloc(1, 5 * MIB);
    d.free(0);
    d.query("after the reset's window");
    // A stream's first allocation in quiet mode: its shard has no allowance. (The
    // merge above replayed a window past the peak and left the logs on; a merge with
    // nothing new enters quiet mode.)
    d.query("a merge into quiet mode");
    d.malloc(2, 64 * MIB);
    d.query("after a new stream's first allocation");
}

#[test]
fn a_quiet_allocation_passing_its_allowance_after_its_first_change_is_logged() {
    // Each stream peaks at three 2 MiB blocks, both at once: the device peaks (6
    // allocations, 12 MiB) are the window peaks' sums, and the merge gives each shard
    // exactly its window peaks as allowances (3 allocations, 6 MiB). Stream 1 takes its
    // three blocks again, quietly; then stream 0 takes one 8 MiB block: its count (the
    // first change of the group) stays within the allowance, its bytes (the second on)
    // pass it. Only the logged group can tell the merge about the new peak, 14 MiB.
    let mut d = Driver::new(2, "lend_segments:False,lend_blocks:False");
    for _ in 0..2 {
        for s in [0, 1, 0, 1, 0, 1] {
            d.malloc(s, 2 * MIB);
        }
        while !d.live.is_empty() {
            d.free(0);
        }
        d.query("warm-up");
    }
    for _ in 0..3 {
        d.malloc(1, 2 * MIB);
    }
    d.malloc(0, 8 * MIB);
    while !d.live.is_empty() {
        d.free(0);
    }
    d.query("after stream 0 passed its allowance at the group's second change");
}

#[test]
fn one_thread_on_three_streams_with_queries_and_resets_keeps_the_true_peaks() {
    // Random sizes on random streams, a query every few steps (each a merge into
    // quiet mode when the allowances can be given), now and then a peak reset:
    // every query's currents and peaks equal the brute-force running sums and maxima.
    for (seed, conf) in [
        (3u64, ""),
        (17, "lend_segments:False,lend_blocks:False"),
        (99, ""),
    ] {
        let mut d = Driver::new(3, conf);
        let mut r = Rng(seed);
        for i in 0..3000 {
            if d.live.len() > 4 && r.next() % 2 == 0 {
                d.free(r.next() as usize);
            } else {
                let size = match r.next() % 3 {
                    0 => 512 * (1 + r.next() as usize % 64),
                    1 => 1 + r.next() as usize % (2 << 20),
                    _ => (2 << 20) + r.next() as usize % (32 << 20),
                };
                d.malloc(r.next() as usize % 3, size);
            }
            if r.next() % 7 == 0 {
                d.query(&format!("seed {seed} step {i}"));
            }
            if r.next() % 151 == 0 {
                d.reset();
            }
        }
        d.query(&format!("seed {seed} end"));
        while !d.live.is_empty() {
            d.free(0);
        }
        d.query(&format!("seed {seed} all freed"));
        check(&d.a);
    }
}

/// Thread `t`'s allocation sizes in round `r`: thread 0 a growing total (a new
/// peak every round), the others the same random sizes every round (their shards stay
/// within their allowances: their changes are logged only because thread 0's are).
fn sizes(t: usize, r: usize) -> Vec<usize> {
    if t == 0 {
        return vec![(4 << 20) + r * (1 << 19) + 4096, 512 * (1 + r)];
    }
    let mut g = Rng(0x9E37_79B9 ^ ((t as u64) << 32));
    (0..1 + g.next() as usize % 4)
        .map(|_| match g.next() % 3 {
            0 => 512 * (1 + g.next() as usize % 128),
            1 => 1 + g.next() as usize % (2 << 20),
            _ => (2 << 20) + g.next() as usize % (8 << 20),
        })
        .collect()
}

#[test]
fn threads_allocating_and_freeing_between_queries_report_the_true_peak() {
    for conf in ["lend_segments:False,lend_blocks:False", ""] {
        threads_between_queries(conf);
    }
}

fn threads_between_queries(conf: &str) {
    // Each round: every thread allocates its sizes, a barrier, every thread frees
    // them, a barrier. The main thread queries only after a round's frees (and not
    // after every round): the round's peak is reached while the shards are quiet or
    // just woken, and must be found by the next merge. In any order of the threads'
    // operations the sum peaks at the round's total (allocations only before the
    // middle barrier, frees only after it), so the true peak is the largest round
    // total.
    const THREADS: usize = 4;
    const ROUNDS: usize = 40;
    // Per round: the allocations live, one wait; freed, then two (the main thread
    // looks, or not, between them).
    let (a, barrier, workers) = round_workers(1 << 36, conf, THREADS, ROUNDS, sizes, (1, 2));
    let (mut req, mut count) = (0i64, 0i64);
    for r in 0..ROUNDS {
        barrier.wait();
        let all: Vec<usize> = (0..THREADS).flat_map(|t| sizes(t, r)).collect();
        req = req.max(all.iter().sum::<usize>() as i64);
        count = count.max(all.len() as i64);
        barrier.wait();
        if r % 2 == 1 {
            let s = a.stats();
            assert_eq!(s.requested_bytes[0].current, 0);
            assert_eq!(
                (s.requested_bytes[0].peak, s.allocation[0].peak),
                (req, count),
                "round {r} {conf:?}"
            );
        }
        barrier.wait();
    }
    workers.into_iter().for_each(|w| w.join().unwrap());
    let s = a.stats();
    assert_eq!(
        (s.requested_bytes[0].peak, s.allocation[0].peak),
        (req, count)
    );
    check(&a);
}
