//! One stream's shard state: its blocks, free lists, events, lending and statistics,
//! behind the shard's mutex. `ShardState` composes the state of each concern, a type
//! of its own with private fields (`waits.rs`, `lending_state.rs`, `reclaim.rs`,
//! `../accounting`; capture's in this file); each concern's rules live in a file of
//! their own, all `impl ShardState`:
//!
//! | file | concern |
//! |---|---|
//! | `request.rs` | the values the miss path passes between rungs (a leaf) |
//! | `rungs.rs` | the ladder's rungs and their order, built from the policy (a leaf) |
//! | `ladder.rs` | the miss path: the climb over the rungs, own cache → lending → grow → release |
//! | `grow.rs` | new segments (or pages) and their sizes |
//! | `free_lists.rs` | best fit, split, hot cache, merge; block statistics |
//! | `lazy_merge.rs` | a free's merge deferred to the next operation, invisibly |
//! | `events.rs` | frees, `record_stream`, cross-stream events, parked frees |
//! | `waits.rs` | the state of waiting frees: event queues, parked frees, idle events (pure data) |
//! | `ordering.rs` | device-side waits between streams, fences, dirty marks (shared by lending and release) |
//! | `lending.rs` | lending segments and blocks to other streams' shards |
//! | `lending_state.rs` | the state of lending: fences, dirty marks, borrow counts, steadiness (pure data) |
//! | `pressure.rs` | memory pressure: a device-side wait for a pending free instead of growth |
//! | `keep_whole.rs` | memory pressure: a whole free segment kept for a request of its size |
//! | `release.rs` | giving segments back: cache release, reclaim before growth, GC |
//! | `reclaim.rs` | the clocks and back-off of giving memory back (pure data) |
//! | `capture.rs` | graph-private pools: tags, routes, frees deferred by captures |
//! | `hccl.rs` | HCCL works that last used blocks; erasing their streams' uses |
//! | `checkpoint.rs` | a graph pool's checkpoint and restore |
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
mod checkpoint;
mod events;
mod expandable;
mod free_lists;
mod grow;
mod hccl;
mod inspect;
mod keep_whole;
mod ladder;
mod lazy_merge;
mod lending;
mod lending_state;
mod ordering;
mod pressure;
mod reclaim;
mod release;
mod request;
mod rungs;
mod small_spill;
mod waits;

use capture::Capture;
pub use checkpoint::{CheckpointBlock, CheckpointSegment};
use hccl::HcclWorks;
use lazy_merge::LazyMerge;
use lending_state::Lending;
use reclaim::Reclaim;
pub(crate) use request::{Outcome, Released};
use rungs::Ladder;
use waits::Waits;

use rustc_hash::FxHashSet;
use std::sync::Arc;

use slab::Slab;

use super::accounting::totals::StatLog;
use super::accounting::Accounting;
use super::shared::Shared;
use crate::device::{Device, DeviceIndex, StreamHandle};
use crate::error::Error;
use crate::pool::{Block, PtrTable, StreamMap, VmSegment};

/// Access to the other streams' shards from inside one shard's slow path.
pub(crate) trait Peers {
    /// Calls `f` on each other shard whose lock is free right now, until it returns false.
    fn visit(&self, f: &mut dyn FnMut(&mut ShardState) -> bool);
}

/// No other shards (tests of one shard, and a graph pool's last attempt).
pub(crate) struct NoPeers;

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
    /// Statistics and reserved bytes (`../accounting`).
    pub acct: Accounting,
    /// Frees waiting for events or a synchronisation (`waits.rs`, `events.rs`).
    pub waits: Waits,
    /// Graph-private pools and capture (`capture.rs`).
    pub(crate) capture: Capture,
    /// HCCL works that last used blocks (`hccl.rs`).
    pub(crate) hccl: HcclWorks,
    /// Both sides of lending (`lending_state.rs`, `lending.rs`, `ordering.rs`).
    pub lending: Lending,
    /// The clocks and back-off of giving memory back (`reclaim.rs`, `release.rs`).
    reclaim: Reclaim,
    /// The miss path's rungs, in order (`rungs.rs`), built from the policy.
    ladder: Ladder,
    /// The merge a free deferred to the next operation, if any (`lazy_merge.rs`).
    lazy: Option<LazyMerge>,
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
            acct: Accounting::new(log),
            waits: Waits::default(),
            capture: Capture::default(),
            hccl: HcclWorks::default(),
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

    use super::{NoPeers, Peers, Released, ShardState, Shared};
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

    /// A fresh malloc of `size` bytes with no other shards, which must be served.
    #[track_caller]
    pub fn malloc_ok(st: &mut ShardState, size: usize) -> DevicePtr {
        (st.malloc(size, Released::Nothing, &NoPeers).unwrap())
            .served()
            .expect("served")
    }

    /// A fresh malloc of `size` bytes from graph pool `pool`, which must be served.
    #[track_caller]
    pub fn malloc_in_ok(
        st: &mut ShardState,
        pool: crate::device::MempoolId,
        size: usize,
    ) -> DevicePtr {
        (st.malloc_in(pool, size, Released::Nothing, &NoPeers)
            .unwrap())
        .served()
        .expect("served")
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
