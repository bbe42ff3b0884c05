//! Helpers shared by the integration tests.

use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use npualloc::device::sim::{SimConfig, SimDevice, SimMemory, SimMode};
use npualloc::{CachingAllocator, Config, StreamHandle};

pub const MIB: usize = 1 << 20;

/// A manual-mode, unbacked simulated device of `capacity` bytes and its allocator.
pub fn manual(capacity: usize) -> (Arc<SimDevice>, CachingAllocator) {
    with(capacity, SimMode::Manual, false, "")
}

/// A simulated device with the given mode, backing and allocator settings.
pub fn with(
    capacity: usize,
    mode: SimMode,
    backed: bool,
    conf: &str,
) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = SimDevice::new(SimConfig {
        devices: 1,
        capacity,
        backed,
        mode,
        ..SimConfig::default()
    });
    let alloc = CachingAllocator::new(sim.clone(), 0, Config::parse(conf).unwrap()).unwrap();
    (sim, alloc)
}

/// Kernel runs: (name, start, end).
pub type Log = Arc<Mutex<Vec<(&'static str, Instant, Instant)>>>;

/// Queues a kernel that logs when it ran; `delay` makes it slow.
pub fn kernel(
    sim: &SimDevice,
    s: StreamHandle,
    log: &Log,
    name: &'static str,
    delay_ms: u64,
    f: impl FnOnce(&SimMemory) + Send + 'static,
) {
    let log = log.clone();
    sim.launch(0, s, move |m: &SimMemory| {
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(delay_ms));
        f(m);
        log.lock().push((name, start, Instant::now()));
    })
    .unwrap();
}

/// When kernel `name` ran: (start, end).
pub fn span(log: &Log, name: &str) -> (Instant, Instant) {
    let l = log.lock();
    let e = l
        .iter()
        .find(|e| e.0 == name)
        .unwrap_or_else(|| panic!("{name} never ran"));
    (e.1, e.2)
}

/// Asserts the allocator's invariants, with the failing one in the message.
#[track_caller]
pub fn check(alloc: &CachingAllocator) {
    if let Err(e) = alloc.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

/// Frees nothing, empties the cache and asserts that the device holds no memory or events.
#[track_caller]
pub fn assert_drained(sim: &SimDevice, alloc: &CachingAllocator) {
    alloc.empty_cache().unwrap();
    check(alloc);
    let c = sim.counters(0);
    assert_eq!(c.live_bytes, 0, "device bytes still live: {c:?}");
    assert_eq!(c.live_allocations, 0);
    assert_eq!(c.events_created, c.events_destroyed, "leaked events: {c:?}");
    assert_eq!(c.mallocs, c.frees);
    assert_eq!(c.maps, c.unmaps, "pages still mapped: {c:?}");
    assert_eq!(c.reservations, 0, "address ranges still reserved: {c:?}");
    assert_eq!(c.violations, 0, "device misuse: {c:?}");
    let s = alloc.stats();
    assert_eq!(s.reserved_bytes[0].current, 0);
    assert_eq!(s.allocated_bytes[0].current, 0);
    assert_eq!(s.active[0].current, 0);
}

/// Compiles the test C library `tests/<src>` (with `flags`) into the shared library `out`.
pub fn build_c_library(src: &str, flags: &[&str], out: &std::path::Path) {
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(src);
    let status = std::process::Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-fvisibility=hidden",
            "-Wall",
            "-Werror",
        ])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .expect("run cc to build a test library");
    assert!(status.success(), "building {} failed", src.display());
}

/// A manual-mode simulated device of `capacity` bytes with `conf`, and `threads`
/// threads on their own streams (thread 0 on the default stream), each running `rounds`
/// rounds: allocate `sizes(t, r)`, wait `waits.0` times at the returned barrier (the
/// round's allocations live), free them, wait `waits.1` times. The barrier counts the
/// threads and the caller, whose waits set what each test observes between them.
pub fn round_workers(
    capacity: usize,
    conf: &str,
    threads: usize,
    rounds: usize,
    sizes: fn(usize, usize) -> Vec<usize>,
    waits: (usize, usize),
) -> (Arc<CachingAllocator>, Arc<Barrier>, Vec<JoinHandle<()>>) {
    let (sim, a) = with(capacity, SimMode::Manual, false, conf);
    let a = Arc::new(a);
    let streams = default_and_new_streams(&sim, threads);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers = (0..threads)
        .map(|t| {
            let (a, b, stream) = (a.clone(), barrier.clone(), streams[t]);
            std::thread::spawn(move || {
                for r in 0..rounds {
                    let ptrs: Vec<_> = sizes(t, r)
                        .into_iter()
                        .map(|n| a.malloc(n, stream).unwrap())
                        .collect();
                    (0..waits.0).for_each(|_| {
                        b.wait();
                    });
                    ptrs.into_iter().for_each(|p| a.free(p).unwrap());
                    (0..waits.1).for_each(|_| {
                        b.wait();
                    });
                }
            })
        })
        .collect();
    (a, barrier, workers)
}

/// `n` streams for `n` threads: the default stream, then `n - 1` new streams of `sim`.
pub fn default_and_new_streams(sim: &SimDevice, n: usize) -> Vec<StreamHandle> {
    (0..n)
        .map(|i| {
            if i == 0 {
                StreamHandle::DEFAULT
            } else {
                sim.create_stream(0).unwrap()
            }
        })
        .collect()
}
