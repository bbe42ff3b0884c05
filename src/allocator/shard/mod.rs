//! One stream's shard state: its blocks, free lists, events, lending and statistics,
//! behind the shard's mutex. Each concern lives in its own file, all `impl ShardState`:
//!
//! | file | concern |
//! |---|---|
//! | `request.rs` | the values the miss path passes between rungs (a leaf) |
//! | `ladder.rs` | the miss path: the ladder of rungs, own cache → lending → grow → release |
//! | `grow.rs` | new segments (or pages) and their sizes |
//! | `free_lists.rs` | best fit, split, hot cache, merge; block statistics |
//! | `lazy_merge.rs` | a free's merge deferred to the next operation, invisibly |
//! | `events.rs` | frees, `record_stream`, cross-stream events, parked frees |
//! | `ordering.rs` | device-side waits between streams, fences, dirty marks (shared by lending and release) |
//! | `lending.rs` | lending segments and blocks to other streams' shards |
//! | `pressure.rs` | memory pressure: a device-side wait for a pending free instead of growth |
//! | `keep_whole.rs` | memory pressure: a whole free segment kept for a request of its size |
//! | `release.rs` | giving segments back: cache release, reclaim before growth, GC |
//! | `capture.rs` | graph-private pools and capture |
//! | `expandable.rs` | expandable segments: mapping and unmapping pages |
//! | `inspect.rs` | read-only views for statistics and snapshots |
//!
//! Invariants (see `../invariants.rs`, which checks them):
//! - every block belongs to exactly one segment, whose blocks tile it;
//! - free blocks are exactly the free-list entries, and never neighbours;
//! - allocated blocks are exactly the pointer-map entries;
//! - a block's phase is one of allocated, lent, awaiting (with as many waits as its queued events plus parked and deferred frees), free (in its free list) or hot (in the hot cache);
//! - a lent block is allocated here for another stream's caller (`stream_uses[0]`); a
//!   dirty block is free and has marks in `dirty`, and only such blocks have marks;
//! - `reserved` and every current statistic equal a recount of the blocks.

mod capture;
mod events;
mod expandable;
mod free_lists;
mod grow;
mod inspect;
mod keep_whole;
mod ladder;
mod lazy_merge;
mod lending;
mod ordering;
mod pressure;
mod release;
mod request;
mod small_spill;

pub use capture::PrivatePool;
use ladder::Ladder;
use lazy_merge::LazyMerge;
pub(crate) use request::{Outcome, Released};

use rustc_hash::FxHashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use slab::Slab;

use super::shared::Shared;
use super::totals::{pack, stat_at, unpack, Kind, Mode, StatLog, NO_SLOT};
use crate::device::{Device, DeviceIndex, StreamHandle};
use crate::error::Error;
use crate::pool::{Block, BlockId, PoolTag, PtrTable, StreamMap, VmSegment};
use crate::stats::{DeviceStats, StatType};
use crate::stream::{DirtyMarks, EventPool, Fences, PendingFrees};

/// Access to the other streams' shards from inside one shard's slow path.
pub(crate) trait Peers {
    /// Calls `f` on each other shard whose lock is free right now, until it returns false.
    fn visit(&self, f: &mut dyn FnMut(&mut ShardState) -> bool);
}

/// No other shards (tests of one shard).
#[cfg(test)]
pub(crate) struct NoPeers;

#[cfg(test)]
impl Peers for NoPeers {
    fn visit(&self, _: &mut dyn FnMut(&mut ShardState) -> bool) {}
}

/// One stream's shard: its blocks and free lists, and the state of each concern.
pub(super) struct ShardState {
    /// The stream this shard serves (its own pools are keyed by it).
    pub stream: StreamHandle,
    /// The device this shard allocates on (the allocator's, shared by every shard).
    pub dev: Arc<dyn Device>,
    /// Its index.
    pub index: DeviceIndex,
    /// Settings and device-wide counters shared with the other streams' shards.
    pub shared: Arc<Shared>,
    /// Every block of this shard's segments.
    pub blocks: Slab<Block>,
    /// This shard's live allocations: pointer → block.
    pub ptrs: PtrTable,
    /// Free lists and hot caches, per pool (the stream's own, graph-private ones).
    pub pools: StreamMap,
    /// Streams the device confirmed (checked once each).
    pub known_streams: FxHashSet<StreamHandle>,
    /// Expandable segments (`Block::vm` names an entry).
    pub vm: Slab<VmSegment>,
    /// Statistics and reserved bytes.
    pub acct: Accounting,
    /// Frees waiting for events or a synchronisation (`events.rs`).
    pub waits: Waits,
    /// Graph-private pools and capture (`capture.rs`).
    pub capture: Capture,
    /// Fences and dirty marks of lent blocks (`lending.rs`, `ordering.rs`).
    pub lending: Lending,
    /// The clocks and back-off of giving memory back (`release.rs`).
    pub reclaim: Reclaim,
    /// The miss path's rungs, in order (`ladder.rs`), built from the settings.
    ladder: Ladder,
    /// The merge a free deferred to the next operation, if any (`lazy_merge.rs`).
    lazy: Option<LazyMerge>,
}

/// What the shard holds, counted as PyTorch's statistics.
#[derive(Default)]
pub(super) struct Accounting {
    /// PyTorch's statistics of this shard, but for the accumulated counts: a decrease
    /// only lowers `current` (one store fewer per decrease on the fast paths), and
    /// `freed` holds the statistic's `current` at the last reset of the accumulated
    /// counts, from which [`snapshot`](Self::snapshot) derives the true `freed`
    /// (`allocated` − `current` + that); an array's aggregate `allocated` is not kept
    /// either (one store fewer per increase): it is the sum of its pools'. Read it
    /// through `snapshot`, or for `current` and `peak`.
    pub stats: DeviceStats,
    /// Device bytes this shard holds.
    pub reserved: usize,
    /// Highest `reserved` of this shard (sizes its adaptive segments).
    pub reserved_hwm: usize,
    /// Pending frees taken under memory pressure by a device-side wait (`pressure.rs`).
    pub device_waits: u64,
    /// This shard's changes to statistics with a peak, for the device-wide peaks
    /// (`../totals.rs`).
    pub log: StatLog,
}

impl Accounting {
    /// Adds `amount` to `kind` in `pool` and in the aggregate (the oversize counters
    /// take [`StatType::Aggregate`]), logged or not as the flag says.
    #[inline(always)]
    pub fn increase(&mut self, kind: Kind, pool: StatType, amount: usize) {
        self.increase_all(pool, &[(kind, amount)]);
    }

    /// Subtracts `amount` from `kind` in `pool` and in the aggregate, and logs it.
    #[inline(always)]
    pub fn decrease(&mut self, kind: Kind, pool: StatType, amount: usize) {
        self.decrease_all(pool, &[(kind, amount)]);
    }

    /// Whether the changes about to be made are logged: one load of
    /// `Shared::stats_logging` (`../totals/quiet.rs`); a quiet shard that sees it set
    /// turns loud; not loaded at all while the logs are off (one stream: a test of the
    /// shard's own mode, as before quiet mode). The slow paths call it per group of
    /// changes (a visit to another shard may come between two groups); the hot
    /// functions once per operation, through [`logging_by`](Self::logging_by).
    #[inline(always)]
    pub fn logging(&mut self) -> bool {
        if self.log.mode == Mode::Off {
            return false;
        }
        let on = self.log.flag();
        self.heed(on)
    }

    /// [`logging`](Self::logging) for the hot functions: `flag` is the shard's
    /// `Shared::stats_logging` (one load fewer than through the log), not loaded at
    /// all while the logs are off (one stream: a test of the shard's own mode, as
    /// before quiet mode).
    #[inline(always)]
    pub fn logging_by(&mut self, flag: &AtomicBool) -> bool {
        if self.log.mode == Mode::Off {
            return false;
        }
        let on = flag.load(Ordering::Acquire);
        self.heed(on)
    }

    #[inline(always)]
    fn heed(&mut self, on: bool) -> bool {
        if on && !self.log.is_loud() {
            self.log.wake(&self.stats);
        }
        on
    }

    /// Several increases in `pool`, in order, with one load of the flag (the fast paths
    /// make their changes in groups: a shard that logs nothing pays one test per group).
    #[inline(always)]
    pub fn increase_all<const N: usize>(&mut self, pool: StatType, changes: &[(Kind, usize); N]) {
        let logged = self.logging();
        self.increase_all_as(logged, pool, changes);
    }

    /// `increase_all` where the caller knows whether the changes are logged (`logged`, a
    /// constant in the copies `free_lists.rs` dispatches to: no test at all). Returns
    /// whether the shard logs from now on: `logged`, or a quiet shard's group that
    /// passed its allowance (the changes after it, in the same operation, are logged).
    ///
    /// Each statistic's new value is compared with its peak (and raises it), as without
    /// the logs; a group that raised one takes the cold handler with the group's words,
    /// which tests a quiet shard's allowances (`StatLog::over_peak`,
    /// `../totals/quiet.rs`).
    #[inline(always)]
    pub fn increase_all_as<const N: usize>(
        &mut self,
        logged: bool,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) -> bool {
        debug_assert_eq!(logged, self.log.is_loud(), "a loud shard logs every change");
        // One branch on the pool, then every statistic at a constant offset (a pool
        // index known only at run time is recomputed for each statistic).
        let passed = match pool {
            StatType::SmallPool => self.add_all::<1, N>(pool, changes),
            StatType::LargePool => self.add_all::<2, N>(pool, changes),
            StatType::Aggregate => self.add_all::<0, N>(pool, changes),
        };
        if passed {
            return true;
        }
        if logged {
            self.log.record(words(pool, changes, 1));
        }
        logged
    }

    /// Several decreases in `pool`, in order, with one load of the flag.
    #[inline(always)]
    pub fn decrease_all<const N: usize>(&mut self, pool: StatType, changes: &[(Kind, usize); N]) {
        let logged = self.logging();
        self.decrease_all_as(logged, pool, changes);
    }

    /// `decrease_all` where the caller knows whether the changes are logged (see
    /// `increase_all_as`; a decrease passes no peak and no allowance).
    #[inline(always)]
    pub fn decrease_all_as<const N: usize>(
        &mut self,
        logged: bool,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) {
        debug_assert_eq!(logged, self.log.is_loud(), "a loud shard logs every change");
        match pool {
            StatType::SmallPool => self.sub_all::<1, N>(changes),
            StatType::LargePool => self.sub_all::<2, N>(changes),
            StatType::Aggregate => self.sub_all::<0, N>(changes),
        }
        if logged {
            self.log.record(words(pool, changes, -1));
        }
    }

    /// `increase_all`'s updates, pool `P` (`pool`). Each new value is compared with its
    /// peak, a compare and a branch per statistic as the plain peak update was; a
    /// value past its peak leaves the group to the cold [`rose`](Self::rose) (which
    /// makes the rest of it). Returns whether that logged the group.
    #[inline(always)]
    fn add_all<const P: usize, const N: usize>(
        &mut self,
        pool: StatType,
        changes: &[(Kind, usize); N],
    ) -> bool {
        for (i, &(kind, amount)) in changes.iter().enumerate() {
            let a = amount as i64;
            match kind.array_mut(&mut self.stats) {
                Some(arr) => {
                    debug_assert_ne!(P, 0, "a change to an array names its pool");
                    // The aggregate's `allocated` is the pools' sum (`snapshot`).
                    let agg = &mut arr[StatType::Aggregate as usize];
                    agg.current += a;
                    if agg.current > agg.peak {
                        return self.rose(i, true, words(pool, changes, 1));
                    }
                    let own = &mut arr[P];
                    own.current += a;
                    own.allocated += a;
                    if own.current > own.peak {
                        return self.rose(i + 1, false, words(pool, changes, 1));
                    }
                }
                None => {
                    let s = kind.stat_mut(&mut self.stats, StatType::Aggregate);
                    s.current += a;
                    s.allocated += a;
                    if s.current > s.peak {
                        return self.rose(i + 1, false, words(pool, changes, 1));
                    }
                }
            }
        }
        false
    }

    /// An increase group (`words`) took a value past its peak: its first `done` changes
    /// are made, and change `done`'s aggregate too when `agg_done`. Makes the rest,
    /// raises the peaks, and tests a quiet shard's allowances (`StatLog::over_peak`).
    /// Returns whether the group was logged.
    #[cold]
    #[inline(never)]
    fn rose<const N: usize>(&mut self, done: usize, agg_done: bool, words: [u64; N]) -> bool {
        for (k, &w) in words.iter().enumerate().skip(done) {
            let (own, agg, delta) = unpack(w);
            let s = stat_at(&mut self.stats, own);
            s.current += delta;
            s.allocated += delta;
            if agg != NO_SLOT && !(k == done && agg_done) {
                stat_at(&mut self.stats, agg).current += delta;
            }
        }
        for &w in &words {
            let (own, agg, _) = unpack(w);
            for i in [own, agg].into_iter().filter(|&i| i != NO_SLOT) {
                let s = stat_at(&mut self.stats, i);
                s.peak = s.peak.max(s.current);
            }
        }
        self.log.over_peak(&self.stats, words)
    }

    /// `decrease_all`'s updates, pool `P`: `current` only (see [`stats`](Self::stats)).
    #[inline(always)]
    fn sub_all<const P: usize, const N: usize>(&mut self, changes: &[(Kind, usize); N]) {
        for &(kind, amount) in changes {
            let a = amount as i64;
            match kind.array_mut(&mut self.stats) {
                Some(arr) => {
                    arr[StatType::Aggregate as usize].current -= a;
                    arr[P].current -= a;
                }
                None => kind.stat_mut(&mut self.stats, StatType::Aggregate).current -= a,
            }
        }
    }

    /// The shard's statistics with every `freed` derived (see [`stats`](Self::stats)).
    pub fn snapshot(&self) -> DeviceStats {
        let mut s = self.stats;
        s.for_each_array(|arr| arr[0].allocated = arr[1].allocated + arr[2].allocated);
        s.for_each_stat(|st| st.freed += st.allocated - st.current);
        s
    }

    /// Zeroes the accumulated counts (`allocated`, `freed`, the event counters).
    pub fn reset_accumulated(&mut self) {
        self.stats.reset_accumulated();
        self.stats.for_each_stat(|st| st.freed = st.current);
    }

    /// Adds a signed `net` change (nothing when zero).
    #[inline(always)]
    pub fn apply_net(&mut self, kind: Kind, pool: StatType, net: i64) {
        match net.cmp(&0) {
            std::cmp::Ordering::Greater => self.increase(kind, pool, net as usize),
            std::cmp::Ordering::Less => self.decrease(kind, pool, net.unsigned_abs() as usize),
            std::cmp::Ordering::Equal => {}
        }
    }
}

/// The log words of `changes` to `pool`, each amount times `sign` (a plain loop, fully
/// unrolled: `array::map` is a call, which would make the changes live on the stack
/// before the test of the log).
#[inline(always)]
fn words<const N: usize>(pool: StatType, changes: &[(Kind, usize); N], sign: i64) -> [u64; N] {
    let mut w = [0; N];
    for i in 0..N {
        w[i] = pack(changes[i].0, pool, sign * changes[i].1 as i64);
    }
    w
}

/// Frees waiting before their blocks can be reused.
#[derive(Default)]
pub(super) struct Waits {
    /// Events recorded at free time, per stream, in order.
    pub pending: PendingFrees,
    /// Blocks whose events could not be recorded: each holds one wait until the next
    /// full synchronisation.
    pub parked: Vec<BlockId>,
    /// Idle events for reuse.
    pub events: EventPool,
}

/// Graph-private pools of this stream and the capture under way.
#[derive(Default)]
pub(super) struct Capture {
    /// Graph-private pools; `PrivateTag::new(i)` is entry `i`.
    pub private: Vec<PrivatePool>,
    /// The private pool allocations go to while a graph capture is under way.
    pub capturing: PoolTag,
    /// Frees with stream uses made during a capture: their events are recorded when it
    /// ends (event calls are not allowed while capturing).
    pub deferred: Vec<BlockId>,
}

/// Both sides of block lending.
#[derive(Default)]
pub(super) struct Lending {
    /// How far the streams this shard lent blocks to have run.
    pub fences: Fences,
    /// Which free blocks streams they were lent to may still use (`Block::dirty`).
    pub dirty: DirtyMarks,
    /// The borrower's side: borrows per request size since the device last grew
    /// (`lending.rs`: a steady borrower grows its own cache instead).
    pub(super) borrowed: lending::Borrowed,
    /// When this shard saw the device's reserved high-water mark rise (`lending.rs`:
    /// a steady stream keeps its memory).
    pub(super) steadiness: lending::Steadiness,
}

/// Clocks and back-off of reclaiming (idle segments, garbage collection).
#[derive(Default)]
pub(super) struct Reclaim {
    /// PyTorch's garbage-collection clock (free-list searches with GC enabled).
    pub gc_calls: u64,
    /// Number of malloc calls so far (the clock of segment idleness).
    pub malloc_calls: u64,
    /// Idle time (malloc calls) a segment needs before it may be reclaimed; doubles
    /// whenever a reclaimed segment has to be allocated again soon after.
    pub min_idle: u64,
    /// Recently reclaimed segments: (size, when).
    pub recent: std::collections::VecDeque<(usize, u64)>,
}

impl ShardState {
    /// The shard of `stream` on the allocator whose shared part is `shared`.
    pub fn new(stream: StreamHandle, shared: Arc<Shared>) -> Self {
        let mut known_streams = FxHashSet::default();
        known_streams.insert(StreamHandle::DEFAULT);
        let log = StatLog::new(shared.clone());
        let ladder = Ladder::new(&shared.policy, &shared.config);
        ShardState {
            stream,
            dev: shared.device.clone(),
            index: shared.index,
            shared,
            blocks: Slab::new(),
            ptrs: PtrTable::default(),
            pools: StreamMap::default(),
            known_streams,
            vm: Slab::new(),
            acct: Accounting {
                log,
                ..Accounting::default()
            },
            waits: Waits::default(),
            capture: Capture::default(),
            lending: Lending::default(),
            reclaim: Reclaim::default(),
            ladder,
            lazy: None,
        }
    }

    /// Checks `s` with the device the first time this shard sees it.
    pub fn check_stream(&mut self, s: StreamHandle) -> Result<(), Error> {
        let index = self.index;
        if !self.known_streams.contains(&s) {
            self.dev.check_stream(index, s)?;
            self.known_streams.insert(s);
        }
        Ok(())
    }

    fn gc_enabled(&self) -> bool {
        self.shared.allowed_max().is_some() && self.shared.config.garbage_collection_threshold > 0.0
    }
}

/// Shards on a simulated device for the unit tests of each concern.
#[cfg(test)]
pub(super) mod testing {
    use std::cell::RefCell;
    use std::sync::Arc;

    use super::{Peers, ShardState, Shared};
    use crate::config::Config;
    use crate::device::sim::{SimConfig, SimDevice};
    use crate::device::{DevicePtr, StreamHandle};
    use crate::pool::BlockId;

    /// A manual-mode simulated device of `capacity` bytes and the shared part of its
    /// allocator with settings `conf`.
    pub fn device(capacity: usize, conf: &str) -> (Arc<SimDevice>, Arc<Shared>) {
        let sim = SimDevice::new(SimConfig {
            capacity,
            ..SimConfig::default()
        });
        let shared = Shared::new(sim.clone(), 0, Config::parse(conf).unwrap(), 0);
        (sim, Arc::new(shared))
    }

    /// The shard of the default stream on a 1 GiB device.
    pub fn shard(conf: &str) -> (Arc<SimDevice>, ShardState) {
        shard_on(1 << 30, conf)
    }

    /// The shard of the default stream on a device of `capacity` bytes.
    pub fn shard_on(capacity: usize, conf: &str) -> (Arc<SimDevice>, ShardState) {
        let (sim, shared) = device(capacity, conf);
        (sim, ShardState::new(StreamHandle::DEFAULT, shared))
    }

    /// The block of live allocation `ptr`.
    pub fn id_of(st: &ShardState, ptr: DevicePtr) -> BlockId {
        *st.ptrs.get(&ptr).expect("a live allocation of this shard")
    }

    /// Frees allocation `ptr`.
    pub fn free(st: &mut ShardState, ptr: DevicePtr) {
        let id = st
            .ptrs
            .remove(&ptr)
            .expect("a live allocation of this shard");
        st.free(id);
    }

    /// Panics with the broken invariant, if any. A deferred merge must be completed
    /// first (`finish_merge`), as `CachingAllocator::check_invariants` does.
    #[track_caller]
    pub fn check(st: &ShardState) {
        assert!(st.lazy.is_none(), "a merge is deferred: finish_merge first");
        if let Err(e) = crate::allocator::invariants::check(st) {
            panic!("invariant broken: {e}");
        }
    }

    /// Other shards, visited in order when their cell is not borrowed.
    pub struct Others<'a>(pub Vec<&'a RefCell<ShardState>>);

    impl Peers for Others<'_> {
        fn visit(&self, f: &mut dyn FnMut(&mut ShardState) -> bool) {
            for s in &self.0 {
                if let Ok(mut st) = s.try_borrow_mut() {
                    st.finish_merge();
                    if !f(&mut st) {
                        break;
                    }
                }
            }
        }
    }
}
