//! torchair's multi-stream examples with tagged streams and events, on the simulated
//! device with real asynchronous streams and backed memory: numeric results and the
//! ordering rule (work after a wait never starts before the recorded work finished).

//!
//! (Moved from the core's integration tests with the registry; the helpers below are
//! copies of `tests/all/common.rs`'s.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use npualloc_core::device::sim::{SimConfig, SimDevice, SimMemory, SimMode};
use npualloc_core::{CachingAllocator, Config, Device, StreamHandle};

use super::TagRegistry;

const N: usize = 256;
const MAIN: StreamHandle = StreamHandle::DEFAULT;

fn read(sim: &SimDevice, p: usize) -> Vec<f32> {
    sim.memory(0).unwrap().read_f32(p, N).unwrap()
}

fn setup() -> (Arc<SimDevice>, CachingAllocator, TagRegistry, Log) {
    let (sim, a) = with(1 << 30, SimMode::Threaded, true, "");
    (sim, a, TagRegistry::default(), Log::default())
}

fn fill(sim: &SimDevice, s: StreamHandle, log: &Log, name: &'static str, p: usize, v: f32) {
    kernel(sim, s, log, name, 0, move |m| {
        m.fill_f32(p, N, v);
    });
}

/// The multi-stream model: tags '1' and '2' name two streams, events "66" and "77"
/// order them. main: add = in1 + in2, record "66"; stream '1': wait "66",
/// mm = add * in3; stream '2': mul = in4 * 2 (slow), record "77"; main: wait "77",
/// out = mul + 1, then wait for stream '1' through event "66" re-recorded there.
#[test]
fn torchair_multi_stream_model_66_77() {
    let (sim, a, tags, log) = setup();
    let s1 = sim.create_stream(0).unwrap();
    let s2 = sim.create_stream(0).unwrap();
    tags.tag_stream("1", s1).unwrap();
    tags.tag_stream("2", s2).unwrap();
    tags.event_create("66").unwrap();
    tags.event_create("77").unwrap();
    let [in1, in2, in3, in4, add, mm, mul, out] = [0; 8].map(|_| a.malloc(N * 4, MAIN).unwrap());
    for (p, v) in [(in1, 1.0), (in2, 2.0), (in3, 3.0), (in4, 4.0)] {
        sim.memory(0).unwrap().fill_f32(p, N, v);
    }
    kernel(&sim, MAIN, &log, "add", 20, move |m| {
        let (x, y) = (m.read_f32(in1, N).unwrap(), m.read_f32(in2, N).unwrap());
        m.write_f32(
            add,
            &x.iter().zip(&y).map(|(a, b)| a + b).collect::<Vec<_>>(),
        );
    });
    tags.event_record(&*sim, "66", MAIN).unwrap();
    let stream1 = tags.stream_of("1").unwrap();
    tags.event_wait(&*sim, "66", stream1).unwrap();
    kernel(&sim, stream1, &log, "mm", 0, move |m| {
        let (x, y) = (m.read_f32(add, N).unwrap(), m.read_f32(in3, N).unwrap());
        m.write_f32(
            mm,
            &x.iter().zip(&y).map(|(a, b)| a * b).collect::<Vec<_>>(),
        );
    });
    a.record_stream(add, stream1).unwrap();
    let stream2 = tags.stream_of("2").unwrap();
    a.record_stream(in4, stream2).unwrap();
    a.record_stream(mul, stream2).unwrap();
    kernel(&sim, stream2, &log, "mul", 20, move |m| {
        let x = m.read_f32(in4, N).unwrap();
        m.write_f32(mul, &x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    });
    tags.event_record(&*sim, "77", stream2).unwrap();
    tags.event_wait(&*sim, "77", MAIN).unwrap();
    kernel(&sim, MAIN, &log, "out", 0, move |m| {
        let x = m.read_f32(mul, N).unwrap();
        m.write_f32(out, &x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    });
    sim.synchronize_device(0).unwrap();
    assert!(read(&sim, mm).iter().all(|&v| v == 9.0));
    assert!(read(&sim, out).iter().all(|&v| v == 9.0));
    assert!(
        span(&log, "mm").0 >= span(&log, "add").1,
        "stream '1' ran before event 66"
    );
    assert!(
        span(&log, "out").0 >= span(&log, "mul").1,
        "main ran before event 77"
    );
    for p in [in1, in2, in3, in4, add, mm, mul, out] {
        a.free(p).unwrap();
    }
    tags.clear(&*sim);
    assert_drained(&sim, &a);
}

/// npu_tagged_event_record: main writes X slowly and records the event; stream '1'
/// waits on it and copies X. The copy never starts before the write finished.
#[test]
fn tagged_event_record_orders_streams() {
    let (sim, a, tags, log) = setup();
    let s1 = sim.create_stream(0).unwrap();
    tags.tag_stream("1", s1).unwrap();
    tags.event_create("ev").unwrap();
    for round in 0..20 {
        let x = a.malloc(N * 4, MAIN).unwrap();
        let y = a.malloc(N * 4, s1).unwrap();
        let v = round as f32;
        kernel(&sim, MAIN, &log, "write", 5, move |m| {
            m.fill_f32(x, N, v);
        });
        tags.event_record(&*sim, "ev", MAIN).unwrap();
        tags.event_wait(&*sim, "ev", s1).unwrap();
        kernel(&sim, s1, &log, "copy", 0, move |m| {
            let d = m.read_f32(x, N).unwrap();
            m.write_f32(y, &d);
        });
        a.record_stream(x, s1).unwrap();
        a.free(x).unwrap();
        sim.synchronize_device(0).unwrap();
        assert!(read(&sim, y).iter().all(|&d| d == v), "round {round}");
        assert!(span(&log, "copy").0 >= span(&log, "write").1);
        log.lock().clear();
        a.free(y).unwrap();
    }
    // The tagged event and the allocator's pooled events (the cross-stream free; y is
    // a block lent by the main stream's segment, which takes an ordering event and a
    // fence) are reused: a few in all, however many rounds (each round uses three).
    let created = sim.counters(0).events_created;
    assert!(created <= 5, "{created} events for 20 rounds");
    tags.clear(&*sim);
    assert_drained(&sim, &a);
}

/// npu_record_tagged_stream: the seed scenario with the side stream named by a tag.
/// A long matmul chain runs on 'second_stream'; B = A + 1 there; A is recorded on the
/// tag and deleted; C = ones reuses memory only after second_stream is done with A.
#[test]
fn record_tagged_stream_protects_a_from_reuse() {
    let (sim, a, tags, log) = setup();
    let second = sim.create_stream(0).unwrap();
    tags.tag_stream("second_stream", second).unwrap();
    let mut wrong = 0;
    for _ in 0..100 {
        let ev = sim.event_create(0).unwrap();
        let pa = a.malloc(N * 4, MAIN).unwrap();
        fill(&sim, MAIN, &log, "zeros", pa, 0.0);
        sim.event_record(0, ev, MAIN).unwrap();
        let s = tags.stream_of("second_stream").unwrap();
        sim.stream_wait_event(0, s, ev).unwrap();
        kernel(&sim, s, &log, "matmul chain", 2, |_| {});
        let pb = a.malloc(N * 4, s).unwrap();
        kernel(&sim, s, &log, "B = A + 1", 0, move |m| {
            let x = m.read_f32(pa, N).unwrap();
            m.write_f32(pb, &x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
        });
        a.record_stream(pa, tags.stream_of("second_stream").unwrap())
            .unwrap(); // npu_record_tagged_stream(A, 'second_stream')
        a.free(pa).unwrap();
        let pc = a.malloc(N * 4, MAIN).unwrap();
        fill(&sim, MAIN, &log, "ones", pc, 1.0);
        sim.synchronize_device(0).unwrap();
        wrong += usize::from(!read(&sim, pb).iter().all(|&v| v == 1.0));
        assert!(read(&sim, pc).iter().all(|&v| v == 1.0));
        a.free(pb).unwrap();
        a.free(pc).unwrap();
        sim.event_destroy(0, ev).unwrap();
        log.lock().clear();
    }
    assert_eq!(wrong, 0);
    tags.clear(&*sim);
    assert_drained(&sim, &a);
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
