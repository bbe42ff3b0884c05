//! The caching allocator of one device.
//!
//! `malloc`: poll pending frees, then climb the shard's ladder (`shard/ladder.rs`: the
//! rungs in order, one list built from the [`Policy`] — PyTorch's own cache, garbage
//! collection, growth and release rungs, with npualloc's between them); the two rungs
//! that release other streams' caches run here, with no shard lock held
//! (`last_resort.rs`).
//!
//! Locking: each stream has its own shard (block arena, free lists, events, statistics)
//! behind its own mutex, found without a lock; blocks are reused on their own stream,
//! or lent to another under device-side ordering (a borrower takes the lender's lock
//! with `try_lock` only, never waiting). Threads working on different streams do not contend; device-wide
//! counters (reserved bytes, the memory fraction) are atomics touched only on slow
//! paths; device-wide statistics are rebuilt from per-shard logs (`accounting/`) under
//! the statistics lock, which is taken before any shard lock and never with one held. Each shard maps its own live pointers to blocks: a free goes to the shard of
//! the allocation's stream when the caller names it (torch does), else to the shard of
//! this thread's last allocation, else searches the shards. Device calls are made with
//! the shard's mutex held, as PyTorch does by default; the last-resort cache release
//! takes the other shards' mutexes one at a time with its own released.
//!
//! Layout: `shards.rs` the stream → shard table (boxed shards, found without a lock);
//! `shared.rs` what the shards share (the device context: device, index, settings and
//! policy, profiler markers; device-wide counters and the memory-short regime);
//! `accounting/` exact statistics (each shard's counts, the logs and device-wide
//! totals) and `statistics.rs` the methods that read and merge them; `shard/` one
//! stream's shard state,
//! one file per concern; `last_resort.rs` the ladder's rungs across shards; `oom.rs`
//! torch_npu's out-of-memory message; `invariants.rs` the checker that recounts a
//! shard.

mod accounting;
mod graph_pools;
mod history;
mod invariants;
mod last_resort;
mod oom;
mod pools;
mod shard;
mod shards;
mod shared;
mod statistics;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::Config;
use crate::device::{Device, DeviceIndex, DevicePtr, MempoolId, StreamHandle};
use crate::error::Error;
use crate::policy::{Policy, Regime};
use crate::pool::BlockId;
use crate::profiling::Mstx;
use crate::stats::PrivatePoolStats;
use shard::{Outcome, Peers, Released, ShardState};
use shards::{Shard, ShardTable};
use shared::Shared;

pub use crate::snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use graph_pools::NO_POOL;
pub use history::{TraceAction, TraceEvent, Tracer};
pub use pools::{PoolCheckpoint, RestoreDelta};
pub use shard::{CheckpointBlock, CheckpointSegment};
pub use shards::MAX_STREAMS;

/// Current memory use of one allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of live allocations (rounded block sizes).
    pub allocated: usize,
    /// Device bytes held.
    pub reserved: usize,
}

/// What out-of-memory observers are told (PyTorch's `OutOfMemoryObserver` arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomInfo {
    /// Device index.
    pub device: DeviceIndex,
    /// Bytes the failed request asked for.
    pub requested: usize,
    /// The memory-fraction cap if one is set, else the device's total memory.
    pub capacity: usize,
    /// Device memory the runtime reports free.
    pub free: usize,
}

/// A callback run after an allocation fails with out of memory.
pub type OomObserver = Arc<dyn Fn(OomInfo) + Send + Sync>;

/// A thread-safe caching allocator for one device.
pub struct CachingAllocator {
    device: Arc<dyn Device>,
    index: DeviceIndex,
    shared: Arc<Shared>,
    shards: ShardTable,
    /// Distinguishes allocators in the per-thread hint.
    id: u64,
    observers: RwLock<Vec<OomObserver>>,
}

/// This thread's state on the allocator's paths, in one thread-local (each one a
/// separate `__tls_get_addr` call in a shared library).
struct ThreadState {
    /// (allocator id, shard index) of this thread's last allocation: where its next
    /// free most likely belongs.
    last_shard: std::cell::Cell<(u64, u32)>,
    /// Depth of nested C ABI panic boundaries on this thread ([`boundary_depth`]).
    boundary: std::cell::Cell<u32>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            last_shard: std::cell::Cell::new((0, 0)),
            boundary: std::cell::Cell::new(0),
        }
    };
}

/// Adds `delta` to this thread's panic-boundary depth and returns the new depth (the C
/// library's panic boundary: kept in the allocator's thread-local, whose address a
/// malloc computes anyway, so an entry point makes one thread-local lookup, not two).
#[doc(hidden)]
#[inline]
pub fn boundary_depth(delta: i32) -> u32 {
    THREAD.with(|t| {
        let d = t.boundary.get().wrapping_add_signed(delta);
        t.boundary.set(d);
        d
    })
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.device.name())
            .field("device", &self.index)
            .finish()
    }
}

impl CachingAllocator {
    /// Creates the allocator of device `index` with `config`. Never inlined: its
    /// `Shared` is over-aligned (`OwnLine`), which would make a caller that inlines it
    /// (a benchmark's loop) realign its stack frame and lose a register.
    #[inline(never)]
    pub fn new(device: Arc<dyn Device>, index: i64, config: Config) -> Result<Self, Error> {
        let count = device.device_count();
        if index < 0 || index as u64 >= count as u64 {
            return Err(Error::InvalidDevice {
                device: index,
                count,
            });
        }
        let padding = device.request_padding();
        if config.expandable_segments {
            let granularity = device.vm_granularity(index as DeviceIndex).map_err(|e| {
                Error::InvalidConfig(format!(
                    "expandable_segments:True needs virtual memory, which the {} backend \
                     cannot give: {e}",
                    device.name()
                ))
            })?;
            for page in [config.small_page, config.large_page] {
                if page % granularity != 0 {
                    return Err(Error::InvalidConfig(format!(
                        "expandable page size {page} is not a multiple of the device's \
                         mapping granularity {granularity}"
                    )));
                }
            }
        }
        Ok(CachingAllocator {
            device: device.clone(),
            index: index as DeviceIndex,
            shared: Arc::new(Shared::new(device, index as DeviceIndex, config, padding)),
            shards: ShardTable::new(),
            id: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            observers: RwLock::new(Vec::new()),
        })
    }

    /// Uses `markers` for profiler ranges instead of the process-wide mstx library.
    /// Call it before the first allocation: shards already created keep the markers they
    /// were created with.
    pub fn with_markers(mut self, markers: Arc<Mstx>) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.markers = markers,
            None => log::warn!("with_markers after the first allocation is ignored"),
        }
        self
    }

    /// The device index this allocator serves.
    pub fn device_index(&self) -> DeviceIndex {
        self.index
    }

    /// The backend beneath.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The shard of `stream`, created (after checking the stream) on first use. The
    /// lookup is inlined into the fast path; creation is out of line.
    #[inline]
    fn shard(&self, stream: StreamHandle) -> Result<(u32, &Shard), Error> {
        match self.shards.get(stream) {
            Some(found) => Ok(found),
            None => self.new_shard(stream),
        }
    }

    /// Creates the shard of `stream` (or finds one another thread just created).
    #[cold]
    #[inline(never)]
    fn new_shard(&self, stream: StreamHandle) -> Result<(u32, &Shard), Error> {
        self.device.check_stream(self.index, stream)?;
        // Shards are created under the statistics lock: the second one turns the
        // statistics logs on (unless `exact_stats:False`), starting from the first
        // shard's statistics.
        let mut totals = self.shared.totals.lock();
        if self.shared.config.exact_stats && !totals.enabled && self.shards.get(stream).is_none() {
            let shards = self.shards.all();
            if let Some(only) = shards.first() {
                let mut st = only.lock();
                debug_assert_eq!(shards.len(), 1, "the logs go on with the second shard");
                totals.enable(Some(st.acct.stats()));
                st.acct.start_logging();
                // Every shard logs until a merge can give allowances (`accounting/totals/quiet.rs`).
                self.shared.stats_logging.store(true, Ordering::SeqCst);
            }
        }
        let log = totals.enabled;
        self.shards
            .get_or_insert(stream, || {
                let mut st = ShardState::new(stream, self.shared.clone());
                if log {
                    st.acct.start_logging_quiet();
                }
                st
            })
            .ok_or_else(|| {
                Error::InvalidState(format!(
                    "device {} already serves {MAX_STREAMS} streams",
                    self.index
                ))
            })
    }

    /// Publishes a shard's count of waiting frees.
    #[inline]
    fn set_pending(&self, shard: &Shard, n: usize) {
        publish_pending(&self.shared, shard, n);
    }

    /// Runs `f` on `shard`'s locked state, then publishes its count of waiting frees.
    fn with_shard<T>(&self, shard: &Shard, f: impl FnOnce(&mut ShardState) -> T) -> T {
        let mut st = shard.lock();
        let out = f(&mut st);
        self.set_pending(shard, st.pending_count());
        out
    }

    /// Runs `f` on every shard but `stream`'s, one lock at a time (never two), until
    /// one fails.
    fn for_other_shards<E>(
        &self,
        stream: StreamHandle,
        mut f: impl FnMut(&mut ShardState) -> Result<(), E>,
    ) -> Result<(), E> {
        for other in self.shards.all() {
            if other.stream != stream {
                self.with_shard(other, &mut f)?;
            }
        }
        Ok(())
    }

    /// Polls the pending frees of other shards that have any, without waiting for a
    /// lock; first merges the statistics logs if one is full.
    #[inline(never)]
    fn poll_others(&self, own: u32) {
        if self.shared.merge_asked() {
            self.merge_logs(); // host bookkeeping only: also while a graph is captured
        }
        if self.shared.capture_underway() {
            return; // no event queries while a graph is captured
        }
        for (si, s) in self.shards.iter() {
            if si != own && s.pending.load(Ordering::Relaxed) > 0 {
                if let Some(mut st) = s.try_lock() {
                    st.process_events();
                    self.set_pending(s, st.pending_count());
                }
            }
        }
    }

    /// Allocates at least `size` bytes for use on `stream`.
    ///
    /// Inlined: a request the stream's shard serves is a lookup, a lock and the shard's
    /// malloc; the rest (polling other shards, the last-resort retry, errors) is out of
    /// line.
    #[inline]
    pub fn malloc(&self, size: usize, stream: StreamHandle) -> Result<DevicePtr, Error> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let (si, shard) = self.shard(stream)?;
        // Every malloc polls every stream's pending frees (others' only when they have
        // some), and merges the statistics logs when one is full (`Shared::ask_merge`).
        if self.shared.pending_total.load(Ordering::Relaxed)
            > shard.pending.load(Ordering::Relaxed) as isize
        {
            self.poll_others(si);
        }
        let mut st = shard.lock();
        let peers = OtherShards {
            table: &self.shards,
            own: stream,
            shared: &self.shared,
        };
        let found = st.malloc(size, Released::Nothing, &peers);
        self.set_pending(shard, st.pending_count());
        // Nothing is left to drop on any arm: the slow arms take `found` apart by value,
        // and a served outcome owns nothing, so it is forgotten (a drop of it stays an
        // out-of-line call on the fast path). The slow path runs with the lock released.
        match found {
            Ok(Outcome::Served(ptr)) => {
                std::mem::forget(found);
                drop(st);
                THREAD.with(|t| t.last_shard.set((self.id, si)));
                if self.shared.history.on() {
                    self.trace_alloc(ptr, size, stream);
                }
                Ok(ptr)
            }
            Ok(outcome) => {
                drop(st);
                let ptr = self.malloc_slow(Ok(outcome), size, si, shard)?;
                if self.shared.history.on() {
                    self.trace_alloc(ptr, size, stream);
                }
                Ok(ptr)
            }
            Err(e) => {
                drop(st);
                self.malloc_slow(Err(e), size, si, shard)
            }
        }
    }

    /// `malloc` after the shard's climb did not allocate (`found`): an error, or the
    /// rungs across streams (`last_resort.rs`).
    #[cold]
    #[inline(never)]
    fn malloc_slow(
        &self,
        found: Result<Outcome, Error>,
        size: usize,
        si: u32,
        shard: &Shard,
    ) -> Result<DevicePtr, Error> {
        let outcome = match found {
            Ok(outcome) => outcome,
            Err(e) => return Err(self.malloc_failed(e, size)),
        };
        let ptr = self.last_resort(outcome, size, shard)?;
        THREAD.with(|t| t.last_shard.set((self.id, si)));
        Ok(ptr)
    }

    /// Reserved bytes per graph-private pool: torch 2.14's
    /// `DeviceStats::reserved_bytes_by_private_pools`, with PyTorch's meaning. A pool's
    /// entry appears when it first reserves device memory (a segment allocated, or pages
    /// mapped, on any stream allocating to it), and follows every allocation and release
    /// of its segments (pages) on every stream; `current` drops to 0 once the pool's
    /// memory went back (after [`release_pool`](Self::release_pool) and a cache release).
    /// Entries are never removed: `peak` and `allocated`/`freed` stay until
    /// [`reset_peak_stats`](Self::reset_peak_stats) /
    /// [`reset_accumulated_stats`](Self::reset_accumulated_stats). In the order pools
    /// first reserved memory; exact (counted under a device-wide lock on the slow paths).
    pub fn private_pool_stats(&self) -> Vec<PrivatePoolStats> {
        self.shared.private_reserved.lock().entries()
    }

    /// Device bytes held by graph-private pools.
    pub fn private_pool_bytes(&self) -> usize {
        self.shards
            .all()
            .iter()
            .map(|s| s.lock().private_pool_bytes())
            .sum()
    }

    /// Sets (or with `None` removes) the memory-history tracer, told of every
    /// allocation, free, segment change and out-of-memory failure (`history.rs`).
    pub fn set_tracer(&self, tracer: Option<Tracer>) {
        self.shared.history.set(tracer);
    }

    /// Tells the tracer of allocation `ptr` (`size` bytes asked for on `stream`).
    #[cold]
    #[inline(never)]
    fn trace_alloc(&self, ptr: DevicePtr, size: usize, stream: StreamHandle) {
        let pool = self
            .with_owner(ptr, Some(stream), |_, st, id| {
                st.pool_id(st.blocks[id].pool)
            })
            .flatten();
        self.emit_alloc(ptr, size, stream, pool);
    }

    /// Tells the tracer of allocation `ptr` (`size` bytes on `stream`, from `pool`).
    fn emit_alloc(
        &self,
        ptr: DevicePtr,
        size: usize,
        stream: StreamHandle,
        pool: Option<MempoolId>,
    ) {
        self.shared.history.emit(|| TraceEvent {
            action: TraceAction::Alloc,
            device: self.index,
            address: ptr as u64,
            size,
            stream,
            pool,
        });
    }

    /// Adds a callback run (outside every allocator lock) whenever an allocation fails
    /// with out of memory, after the cache was released and the request retried.
    pub fn attach_oom_observer(&self, observer: impl Fn(OomInfo) + Send + Sync + 'static) {
        self.observers.write().push(Arc::new(observer));
    }

    /// A malloc's error, after running the OOM observers if it is out of memory; called
    /// with no lock held.
    #[cold]
    fn malloc_failed(&self, e: Error, requested: usize) -> Error {
        if let Error::OutOfMemory { .. } = e {
            self.notify_oom(requested);
        }
        e
    }

    fn notify_oom(&self, requested: usize) {
        let observers = self.observers.read().clone();
        if observers.is_empty() && !self.shared.history.on() {
            return;
        }
        let info = self.device.mem_info(self.index).ok();
        self.shared.history.emit(|| TraceEvent {
            action: TraceAction::Oom,
            device: self.index,
            address: info.map_or(0, |i| i.free as u64),
            size: requested,
            stream: StreamHandle::DEFAULT,
            pool: None,
        });
        let info = OomInfo {
            device: self.index,
            requested,
            capacity: self
                .shared
                .allowed_max()
                .unwrap_or_else(|| info.map_or(0, |i| i.total)),
            free: info.map_or(0, |i| i.free),
        };
        for o in observers {
            o(info);
        }
    }

    /// Frees `ptr`. If it was used on other streams, it is reused only after work
    /// queued on them at this moment has completed.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), Error> {
        self.free_on(ptr, None)
    }

    /// Frees `ptr`, allocated on `stream` (a hint that saves a search, as torch passes
    /// it; a wrong or absent hint still finds the block). Inlined: a free the hinted
    /// shard holds is a lookup, a lock and the shard's free.
    #[inline]
    pub fn free_on(&self, ptr: DevicePtr, stream: Option<StreamHandle>) -> Result<(), Error> {
        let try_free = |shard: &Shard| -> bool {
            let mut st = shard.lock();
            let Some(id) = st.ptrs.remove(&ptr) else {
                return false;
            };
            if self.shared.history.on() {
                st.free_traced(id);
            } else {
                st.free(id);
            }
            self.set_pending(shard, st.pending_count());
            true
        };
        let hinted = stream.and_then(|s| self.shards.get(s));
        if let Some((_, shard)) = hinted {
            if try_free(shard) {
                return Ok(()); // the common case: torch names the allocation's stream
            }
        }
        self.free_searching(ptr, hinted.map(|(si, _)| si), try_free)
    }

    /// `free_on` after the hinted shard (if any) missed: this thread's last shard, then
    /// every other shard (also the whole of a free without a hint).
    #[inline(never)]
    fn free_searching(
        &self,
        ptr: DevicePtr,
        hinted: Option<u32>,
        try_free: impl Fn(&Shard) -> bool,
    ) -> Result<(), Error> {
        let (owner, last) = THREAD.with(|t| t.last_shard.get());
        let last = (owner == self.id)
            .then_some(last)
            .filter(|&l| Some(l) != hinted);
        if let Some(si) = last {
            if try_free(self.shards.by_index(si)) {
                return Ok(());
            }
        }
        for (si, shard) in self.shards.iter() {
            if Some(si) != hinted && Some(si) != last && try_free(shard) {
                return Ok(());
            }
        }
        Err(Error::UnknownPointer { ptr })
    }

    /// Runs `f` with the locked shard holding the live allocation `ptr` and its block:
    /// the hinted stream's shard first, then this thread's last one, then the rest.
    fn with_owner<T>(
        &self,
        ptr: DevicePtr,
        stream: Option<StreamHandle>,
        f: impl FnOnce(&Shard, &mut ShardState, BlockId) -> T,
    ) -> Option<T> {
        let mut f = Some(f);
        let mut tried = [u32::MAX; 2];
        let mut attempt = |shard: &Shard| -> Option<T> {
            let mut st = shard.lock();
            let id = *st.ptrs.get(&ptr)?;
            Some((f.take().expect("runs once"))(shard, &mut st, id))
        };
        if let Some((si, shard)) = stream.and_then(|s| self.shards.get(s)) {
            tried[0] = si;
            if let Some(v) = attempt(shard) {
                return Some(v);
            }
        }
        let (owner, si) = THREAD.with(|t| t.last_shard.get());
        if owner == self.id && si != tried[0] {
            tried[1] = si;
            if let Some(v) = attempt(self.shards.by_index(si)) {
                return Some(v);
            }
        }
        for (si, shard) in self.shards.iter() {
            if !tried.contains(&si) {
                if let Some(v) = attempt(shard) {
                    return Some(v);
                }
            }
        }
        None
    }

    /// Marks `ptr` as used on `stream` (a no-op for the block's own stream).
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamHandle) -> Result<(), Error> {
        let unknown = Error::UnknownPointer { ptr };
        self.with_owner(ptr, None, |_, st, id| st.record_stream(id, ptr, stream))
            .unwrap_or(Err(unknown))
    }

    /// Forgets a use of `ptr` on `stream` recorded earlier (torch_npu's `erase_stream`).
    pub fn erase_stream(&self, ptr: DevicePtr, stream: StreamHandle) -> Result<(), Error> {
        self.with_owner(ptr, None, |_, st, id| st.erase_stream(id, ptr, stream))
            .unwrap_or(Err(Error::UnknownPointer { ptr }))
    }

    /// Whether `ptr` is a live allocation of this allocator.
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        self.with_owner(ptr, None, |_, _, _| ()).is_some()
    }

    /// Start and size of the segment holding `ptr` (which must be a live allocation);
    /// with expandable segments, the run of mapped pages holding it, which may grow or
    /// shrink later (PyTorch refuses `getBaseAllocation` there).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize), Error> {
        self.with_owner(ptr, None, |_, st, id| st.segment_of(id))
            .ok_or(Error::UnknownPointer { ptr })
    }

    /// Waits for every pending event, then returns every unused cached segment (and
    /// idle event) to the device. Ends the memory-short regime ([`Regime`]) when every
    /// shard emptied its cache.
    /// Nothing goes back while a graph capture is underway (the runtime refuses
    /// synchronisations and frees then), and segments of live graph pools stay.
    pub fn empty_cache(&self) -> Result<(), Error> {
        if self.shared.capture_underway() {
            return Ok(());
        }
        let mut result = Ok(());
        for s in self.shards.all() {
            let emptied = self.with_shard(s, |st| st.empty_cache());
            result = result.and(emptied);
        }
        if result.is_ok() {
            self.shared.set_memory_short(false);
        }
        result
    }

    /// The regime the allocator runs in: [`Regime::MemoryShort`] from the first failed
    /// growth that the device could have held when empty until the next successful
    /// [`empty_cache`](Self::empty_cache), else [`Regime::Plentiful`] (Note [the
    /// memory-short regime] in [`policy`](crate::policy)).
    pub fn regime(&self) -> Regime {
        self.shared.regime()
    }

    /// The rules in force, resolved from the settings at creation.
    pub fn policy(&self) -> Policy {
        self.shared.policy
    }

    /// Caps reserved memory at `fraction` of the device's total memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} is not within [0, 1]"
            )));
        }
        let total = self.device.mem_info(self.index)?.total;
        self.shared
            .set_allowed_max((fraction * total as f64) as usize);
        Ok(())
    }

    /// The settings in force.
    pub fn config(&self) -> Config {
        self.shared.config.clone()
    }

    /// Every segment with its blocks, ordered by address.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut out: Vec<SegmentInfo> = self
            .shards
            .all()
            .iter()
            .flat_map(|s| s.lock().segments())
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }

    /// Current allocated and reserved bytes (cheaper than [`CachingAllocator::stats`]).
    pub fn usage(&self) -> Usage {
        let allocated = self
            .shards
            .all()
            .iter()
            .map(|s| s.lock().acct.stats().allocated_bytes[0].current.max(0) as usize)
            .sum();
        Usage {
            allocated,
            reserved: self.shared.reserved(),
        }
    }

    /// Merges recently freed blocks (the hot caches) into the free lists now; this also
    /// happens by itself before any device allocation or cache release.
    pub fn coalesce_now(&self) {
        for s in self.shards.all() {
            s.lock().flush_hot();
        }
    }

    /// Events this allocator has created, and how many of them sit idle in its pools.
    pub fn event_counts(&self) -> (u64, usize) {
        self.shards.all().iter().fold((0, 0), |(c, i), s| {
            let st = s.lock();
            let (created, idle) = st.waits.event_counts();
            (c + created, i + idle)
        })
    }

    /// Checks every internal invariant; the error names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved = 0;
        let mut seen = rustc_hash::FxHashSet::default();
        for s in self.shards.all() {
            let mut st = s.lock();
            st.finish_merge();
            invariants::check(&st)?;
            if let Some(p) = st.ptrs.keys().find(|&&p| !seen.insert(p)) {
                return Err(format!("pointer {p:#x} is live in two shards"));
            }
            reserved += st.acct.reserved();
            if s.pending.load(Ordering::Relaxed) != st.pending_count() {
                return Err(format!("shard {:?}: pending counter is stale", s.stream));
            }
        }
        if self.shared.reserved() != reserved {
            return Err(format!(
                "device-wide reserved {} but shards hold {reserved}",
                self.shared.reserved()
            ));
        }
        let pools = self.private_pool_stats();
        invariants::check_private_pools(&self.shards.all(), &pools)?;
        invariants::check_graph_pools(&self.shards.all(), &self.shared.pools)
    }
}

/// Publishes `shard`'s count of waiting frees `n` (and the device-wide total).
#[inline]
fn publish_pending(shared: &Shared, shard: &Shard, n: usize) {
    if shard.pending.load(Ordering::Relaxed) == n {
        return; // the common case: nothing waiting before or after
    }
    let old = shard.pending.swap(n, Ordering::Relaxed);
    if old != n {
        shared
            .pending_total
            .fetch_add(n as isize - old as isize, Ordering::Relaxed);
    }
}

/// The other shards of an allocator, visited without waiting for their locks; each
/// visit publishes the shard's count of waiting frees (a pending free may be lent).
struct OtherShards<'a> {
    table: &'a ShardTable,
    own: StreamHandle,
    shared: &'a Shared,
}

impl Peers for OtherShards<'_> {
    fn visit(&self, f: &mut dyn FnMut(&mut ShardState) -> bool) {
        for s in self.table.all() {
            if s.stream == self.own {
                continue;
            }
            if let Some(mut st) = s.try_lock() {
                st.finish_merge();
                let go_on = f(&mut st);
                publish_pending(self.shared, s, st.pending_count());
                if !go_on {
                    break;
                }
            }
        }
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // Best effort: live allocations stay with their owners; everything cached goes back.
        let _ = self.empty_cache();
    }
}

impl crate::snapshot::SegmentSource for CachingAllocator {
    fn device_index(&self) -> DeviceIndex {
        self.index
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        CachingAllocator::segments(self)
    }

    fn regime(&self) -> Regime {
        CachingAllocator::regime(self)
    }
}
