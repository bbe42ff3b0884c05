//! Replays a trace through the allocator on the simulated device (unbacked memory,
//! manual stream completion following the trace's `s` lines), measuring fragmentation
//! and speed.
//!
//! Stream semantics: work on a stream counts as pending from an `r` on it until the
//! next `s` for it; a free's event on a stream with no pending work completes at once.
//! What a stream has completed stays owed to it when a device-side wait (cross-stream
//! lending) holds it back: it runs as soon as the waited-for stream gets there.

pub mod blame;
pub mod capacity;
pub mod orders;
pub mod svg;
pub mod tune;

pub use capacity::{min_capacity, min_capacity_at_most, MinCapacity};

use std::sync::Arc;
use std::time::Instant;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::device::sim::{AddressOrder, SimConfig, SimDevice, SimMode};
use crate::snapshot::SegmentInfo;
use crate::trace::{Op, Trace};
use crate::{CachingAllocator, Config, Error, StreamHandle};

/// Replay settings.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Allocator settings string (PyTorch syntax).
    pub conf: String,
    /// Simulated device capacity in bytes.
    pub capacity: usize,
    /// Record the usage timeline and the segment map at peak (for pictures).
    pub detail: bool,
    /// The order in which the simulated device hands out addresses.
    pub address_order: AddressOrder,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            conf: String::new(),
            capacity: 64 << 30,
            detail: false,
            address_order: AddressOrder::Increasing,
        }
    }
}

/// Usage after one event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Event index.
    pub event: usize,
    /// Requested bytes of live allocations.
    pub requested: u64,
    /// Allocated (rounded) bytes.
    pub allocated: u64,
    /// Reserved device bytes.
    pub reserved: u64,
}

/// What a replay measured.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    /// Trace name.
    pub name: String,
    /// Settings used.
    pub conf: String,
    /// Events replayed.
    pub events: usize,
    /// Allocation events.
    pub allocations: usize,
    /// Largest sum of requested bytes of live allocations.
    pub peak_requested: u64,
    /// Largest sum of live bytes plus freed bytes still in use on another stream: what
    /// any allocator must reserve unless streams wait for each other
    /// ([`Trace::pending_floor`](crate::trace::Trace::pending_floor)).
    pub pending_floor: u64,
    /// Peak allocated (rounded block) bytes.
    pub peak_allocated: u64,
    /// Peak reserved device bytes.
    pub peak_reserved: u64,
    /// Device allocations made (whole segments).
    pub device_mallocs: u64,
    /// Device frees made (whole segments).
    pub device_frees: u64,
    /// Pages mapped into expandable segments (one runtime mapping each).
    pub page_maps: u64,
    /// Pages unmapped.
    pub page_unmaps: u64,
    /// Times the host blocked on the device (event, stream or device synchronisation).
    pub host_syncs: u64,
    /// Device-side waits (cross-stream lending) that held a stream back: the stream
    /// waited for had not got there yet, so work was serialised behind it.
    pub stalled_waits: u64,
    /// Device-side waits queued (`stream_wait_event`): lending's and those the
    /// pressure rung inserted instead of growing (`shard/pressure.rs`).
    pub device_waits: u64,
    /// Allocations that needed the cache released and a retry.
    pub retries: u64,
    /// Allocations that failed with out of memory.
    pub ooms: u64,
    /// The first allocation that did not fit (`None` when every one did).
    pub first_oom: Option<OomEvent>,
    /// Wall time of the replay loop.
    pub seconds: f64,
    /// Usage over time (only with `detail`).
    pub timeline: Vec<Sample>,
    /// Segments at the moment of peak reserved (only with `detail`).
    pub peak_segments: Vec<SegmentInfo>,
    /// Event index of peak reserved.
    pub peak_event: usize,
    /// Allocator actions in PyTorch's trace vocabulary (only with `detail`).
    pub actions: Vec<Action>,
    /// The trace's stream labels and the device stream handles they became, by label.
    pub streams: Vec<(u32, usize)>,
    /// Reserved bytes left after freeing everything and emptying the cache.
    pub reserved_after_drain: u64,
    /// Result of the invariant check at the end (before draining).
    pub invariants: Result<(), String>,
    /// Whether the replay ended in the memory-short regime (Note [the memory-short
    /// regime] in `policy.rs`): a growth the device could hold when empty failed.
    pub memory_short: bool,
}

impl ReplayReport {
    /// The pending floor / peak requested: the least ratio reachable without
    /// cross-stream waits.
    pub fn floor_ratio(&self) -> f64 {
        if self.peak_requested == 0 {
            0.0
        } else {
            self.pending_floor as f64 / self.peak_requested as f64
        }
    }

    /// Peak reserved / peak requested.
    pub fn ratio(&self) -> f64 {
        if self.peak_requested == 0 {
            0.0
        } else {
            self.peak_reserved as f64 / self.peak_requested as f64
        }
    }

    /// Events per second of the replay loop.
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }
}

/// An allocation of the trace that failed with out of memory, and the state then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// Event index in the trace (0-based).
    pub event: usize,
    /// Allocation id.
    pub id: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Stream label.
    pub stream: u32,
    /// Requested bytes of the allocations live at that moment.
    pub live_requested: u64,
    /// The allocator's error: torch_npu's out-of-memory text with capacity, free,
    /// allocated and reserved bytes.
    pub message: String,
    /// Every segment just after the failure (after the last rung released what it
    /// could): what held the device then.
    pub segments: Vec<OomSegment>,
}

/// One segment at the first OOM, summed up (`npualloc replay --oom-segments`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomSegment {
    /// Device bytes.
    pub size: usize,
    /// The stream it serves (device handle).
    pub stream: usize,
    /// Small or large pool.
    pub small: bool,
    /// Bytes handed out (lent blocks included).
    pub allocated: usize,
    /// Bytes freed by their caller but waiting for other streams.
    pub pending: usize,
    /// Bytes cached and reusable.
    pub free: usize,
    /// The largest cached block.
    pub largest_free: usize,
    /// Blocks in the segment.
    pub blocks: usize,
}

impl OomSegment {
    fn of(s: &SegmentInfo) -> Self {
        use crate::snapshot::BlockState;
        let sum = |st: BlockState| -> usize {
            s.blocks
                .iter()
                .filter(|b| b.state == st)
                .map(|b| b.size)
                .sum()
        };
        OomSegment {
            size: s.total_size,
            stream: s.stream.0,
            small: s.kind == crate::pool::PoolKind::Small,
            allocated: sum(BlockState::ActiveAllocated),
            pending: sum(BlockState::ActivePendingFree),
            free: sum(BlockState::Inactive),
            largest_free: s
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Inactive)
                .map(|b| b.size)
                .max()
                .unwrap_or(0),
            blocks: s.blocks.len(),
        }
    }
}

/// One allocator action, as PyTorch's snapshot `device_traces` record them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    /// `alloc` or `free_requested`.
    pub action: &'static str,
    /// Address.
    pub addr: usize,
    /// Requested bytes.
    pub size: u64,
    /// Stream handle.
    pub stream: usize,
    /// Event index (stands in for `time_us`).
    pub event: usize,
}

/// The trace's streams on the simulated device (manual mode). A stream is *busy* from
/// an `r` on it until its next `s`; an idle stream runs whatever is queued on it. Work
/// a stream has completed in the trace's terms but that a device-side wait (lending)
/// holds back is owed to it and runs as soon as the waited-for stream gets there.
///
/// After each event only the streams whose queue changed (the device's change log),
/// the streams that just became idle and the streams still owed work are visited, so
/// a step costs what changed, not the number of streams.
struct Streams {
    sim: Arc<SimDevice>,
    handles: HashMap<u32, StreamHandle>,
    busy: HashSet<StreamHandle>,
    /// Work owed to a stream (only entries above 0).
    owed: HashMap<StreamHandle, u64>,
    /// Streams to look at in the next settle: changed or just idle.
    touched: HashSet<StreamHandle>,
    /// Streams visited by settles so far (what a settle costs).
    visits: u64,
}

impl Streams {
    fn new(sim: Arc<SimDevice>) -> Result<Self, Error> {
        sim.changed_streams(0)?; // start the change log
        Ok(Streams {
            sim,
            handles: HashMap::from_iter([(0, StreamHandle::DEFAULT)]),
            busy: HashSet::default(),
            owed: HashMap::default(),
            touched: HashSet::default(),
            visits: 0,
        })
    }

    /// The device stream of trace stream `label` (created on first use). Label 0 is the
    /// default stream, answered without the map: it is looked up on every event of a
    /// single-stream trace.
    fn handle(&mut self, label: u32) -> Result<StreamHandle, Error> {
        if label == 0 {
            return Ok(StreamHandle::DEFAULT);
        }
        if let Some(s) = self.handles.get(&label) {
            return Ok(*s);
        }
        if self.handles.len() < 2 {
            // `settle` leaves the change log alone while there is one stream: what it
            // logged since is looked at from now on.
            self.touched.extend(self.sim.changed_streams(0)?);
        }
        let s = self.sim.create_stream(0)?;
        self.handles.insert(label, s);
        Ok(s)
    }

    /// An `r` on `s`: it has work queued that later frees may wait for.
    fn mark_busy(&mut self, s: StreamHandle) {
        self.busy.insert(s);
    }

    /// An `s` for `s`: it has completed everything queued on it so far (the `settle`
    /// after the event runs it, as any idle stream).
    fn sync(&mut self, s: StreamHandle) {
        if self.busy.remove(&s) {
            self.touched.insert(s);
        }
    }

    /// After an event: idle streams run what was queued on them; a stream still held
    /// back by a wait then counts as stalled on the stream it waits for. With one
    /// stream nothing is ever queued on it, and nothing is done (the change log is
    /// read when a second stream appears).
    #[inline]
    fn settle(&mut self) -> Result<(), Error> {
        if self.handles.len() < 2 {
            return Ok(());
        }
        self.settle_streams()
    }

    fn settle_streams(&mut self) -> Result<(), Error> {
        self.touched.extend(self.sim.changed_streams(0)?);
        // An idle stream is owed all it has queued (a stream neither changed nor just
        // idle already is: its owed count and its queue moved together).
        self.visits += self.touched.len() as u64;
        for &s in &self.touched {
            if !self.busy.contains(&s) {
                match self.sim.pending(0, s)? {
                    0 => self.owed.remove(&s),
                    n => self.owed.insert(s, n),
                };
            }
        }
        self.run()?;
        // Only a stream whose queue changed can newly be held at a wait.
        self.touched.extend(self.sim.changed_streams(0)?);
        self.sim.note_stalls_on(0, self.touched.drain())?;
        Ok(())
    }

    /// Runs owed work until no stream can make progress (the result does not depend on
    /// the order streams are stepped in: running work only lets more work run).
    fn run(&mut self) -> Result<(), Error> {
        loop {
            let mut progress = false;
            self.visits += self.owed.len() as u64;
            for (s, n) in self.owed.iter_mut() {
                let ran = self.sim.step(0, *s, *n as usize)? as u64;
                *n -= ran;
                progress |= ran > 0;
            }
            self.owed.retain(|_, n| *n > 0);
            if !progress {
                return Ok(());
            }
        }
    }
}

struct Live {
    ptr: usize,
    stream: usize,
    size: u64,
}

/// Replays `trace`; `progress` is called every 4096 events with the count done.
pub fn replay(
    trace: &Trace,
    opts: &ReplayOptions,
    mut progress: impl FnMut(usize),
) -> Result<ReplayReport, Error> {
    let config = Config::parse(&opts.conf)?;
    let sim = SimDevice::new(SimConfig {
        devices: 1,
        capacity: opts.capacity,
        backed: false,
        mode: SimMode::Manual,
        address_order: opts.address_order,
        ..SimConfig::default()
    });
    let alloc = CachingAllocator::new(sim.clone(), 0, config)?;
    let mut streams = Streams::new(sim.clone())?;
    let mut live: HashMap<u64, Live> = HashMap::with_capacity_and_hasher(1024, Default::default());

    let (mut requested, mut peak_requested, mut allocations) = (0u64, 0u64, 0usize);
    let (mut peak_reserved_seen, mut peak_event) = (0u64, 0usize);
    // The statistics' aggregate peak is a lower bound when several streams allocate
    // (per-stream peaks): with more than one stream, sum the streams after each
    // allocation (only a malloc raises allocated bytes, so this sees every peak).
    let mut peak_allocated_seen = 0u64;
    let mut timeline = Vec::new();
    let mut peak_segments = Vec::new();
    let mut actions = Vec::new();
    let mut first_oom = None;
    let start = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, stream } => {
                allocations += 1;
                let s = streams.handle(stream)?;
                match alloc.malloc(size as usize, s) {
                    Ok(ptr) => {
                        if opts.detail {
                            actions.push(Action {
                                action: "alloc",
                                addr: ptr,
                                size,
                                stream: s.0,
                                event: i,
                            });
                        }
                        live.insert(
                            id,
                            Live {
                                ptr,
                                stream: s.0,
                                size,
                            },
                        );
                        requested += size;
                        peak_requested = peak_requested.max(requested);
                    }
                    Err(e @ Error::OutOfMemory { .. }) => {
                        first_oom.get_or_insert_with(|| OomEvent {
                            event: i,
                            id,
                            size,
                            stream,
                            live_requested: requested,
                            message: e.to_string(),
                            segments: alloc.segments().iter().map(OomSegment::of).collect(),
                        });
                    }
                    Err(Error::ZeroSize) => {}
                    Err(e) => return Err(e),
                }
            }
            Op::Free { id } => {
                if let Some(l) = live.remove(&id) {
                    alloc.free(l.ptr)?;
                    if opts.detail {
                        actions.push(Action {
                            action: "free_requested",
                            addr: l.ptr,
                            size: l.size,
                            stream: l.stream,
                            event: i,
                        });
                    }
                    requested -= l.size;
                }
            }
            Op::Record { id, stream } => {
                let s = streams.handle(stream)?;
                if let Some(l) = live.get(&id) {
                    alloc.record_stream(l.ptr, s)?;
                    streams.mark_busy(s);
                }
            }
            Op::Sync { stream } => {
                let s = streams.handle(stream)?;
                streams.sync(s);
            }
        }
        streams.settle()?;
        if streams.handles.len() > 1 && matches!(op, Op::Alloc { .. }) {
            peak_allocated_seen = peak_allocated_seen.max(alloc.usage().allocated as u64);
        }
        if opts.detail {
            let u = alloc.usage();
            timeline.push(Sample {
                event: i,
                requested,
                allocated: u.allocated as u64,
                reserved: u.reserved as u64,
            });
            if u.reserved as u64 > peak_reserved_seen {
                peak_reserved_seen = u.reserved as u64;
                peak_event = i;
                peak_segments = alloc.segments();
            }
        }
        if i % 4096 == 4095 {
            progress(i + 1);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    progress(trace.ops.len());
    let stats = alloc.stats();
    let counters = sim.counters(0);
    let invariants = alloc.check_invariants();
    let memory_short = alloc.regime() == crate::policy::Regime::MemoryShort;

    // Drain: free what the trace left live, let every stream finish, empty the cache.
    for (_, l) in live.drain() {
        alloc.free(l.ptr)?;
    }
    for s in streams.handles.values() {
        sim.complete_stream(0, *s)?;
    }
    alloc.empty_cache()?;
    let mut stream_labels: Vec<(u32, usize)> =
        streams.handles.iter().map(|(l, h)| (*l, h.0)).collect();
    stream_labels.sort_unstable();
    Ok(ReplayReport {
        name: trace.name.clone(),
        conf: opts.conf.clone(),
        events: trace.ops.len(),
        allocations,
        // What the trace asks for, also when allocations failed (then fewer were live).
        peak_requested: if first_oom.is_some() {
            trace.peak_requested()
        } else {
            peak_requested
        },
        pending_floor: trace.pending_floor(),
        peak_allocated: (stats.allocated_bytes[0].peak as u64).max(peak_allocated_seen),
        peak_reserved: stats.reserved_bytes[0].peak as u64,
        device_mallocs: counters.mallocs,
        device_frees: counters.frees,
        page_maps: counters.maps,
        page_unmaps: counters.unmaps,
        host_syncs: counters.synchronizations,
        stalled_waits: counters.stalled_waits,
        device_waits: counters.stream_waits,
        retries: stats.num_alloc_retries as u64,
        ooms: stats.num_ooms as u64,
        first_oom,
        seconds,
        timeline,
        peak_segments,
        peak_event,
        actions,
        streams: stream_labels,
        reserved_after_drain: alloc.usage().reserved as u64,
        invariants,
        memory_short,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A settle visits what changed: with 1,000 streams that each queued work once,
    /// 10,000 syncs of the default stream visit a handful of streams, not 10 million
    /// (the settle before visited every stream after every event).
    #[test]
    fn settle_costs_what_changed_not_the_stream_count() {
        let sim = SimDevice::new(SimConfig {
            devices: 1,
            mode: SimMode::Manual,
            ..SimConfig::default()
        });
        let mut streams = Streams::new(sim.clone()).unwrap();
        for label in 1..=1000 {
            let s = streams.handle(label).unwrap();
            sim.launch(0, s, |_| {}).unwrap();
            streams.mark_busy(s);
            streams.settle().unwrap();
        }
        let before = streams.visits;
        assert!(before <= 2 * 1000, "{before}");
        for _ in 0..10_000 {
            streams.sync(StreamHandle::DEFAULT);
            streams.settle().unwrap();
        }
        assert_eq!(streams.visits, before);
        // Work queued on a busy stream runs once it is synced, and only then.
        let s = streams.handle(7).unwrap();
        assert_eq!(sim.pending(0, s).unwrap(), 1);
        streams.sync(s);
        streams.settle().unwrap();
        assert_eq!(sim.pending(0, s).unwrap(), 0);
        assert_eq!(sim.pending(0, streams.handle(8).unwrap()).unwrap(), 1);
    }

    #[test]
    fn a_replay_that_ran_short_says_so() {
        // Two live 30 MiB blocks, then 40 MiB: on a 64 MiB device the growth fails
        // though an empty device could hold it (memory short); uncapped it does not.
        let t =
            crate::trace::parse("a 0 31457280 0\na 1 31457280 0\na 2 41943040 0\n", "t").unwrap();
        let capped = ReplayOptions {
            capacity: 64 << 20,
            ..Default::default()
        };
        let r = replay(&t, &capped, |_| {}).unwrap();
        assert_eq!((r.ooms, r.memory_short), (1, true));
        let r = replay(&t, &ReplayOptions::default(), |_| {}).unwrap();
        assert!(!r.memory_short);
    }
}
