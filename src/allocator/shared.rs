//! What a device's stream shards share: settings and device-wide memory counters.
//!
//! Only slow paths (device allocation and free, settings, statistics merges) write
//! here, so shards on different streams do not contend on the fast path. Lock order:
//! `totals` (statistics merges), then shards' mutexes, then the other mutexes of this
//! struct (leaves: never held while taking another lock).

use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use std::sync::Arc;

use crate::config::Config;
use crate::device::{Device, DeviceIndex, DevicePtr};
use crate::policy::{Policy, Regime};
use crate::profiling::Mstx;
use crate::stats::PrivatePoolReserved;

use super::accounting::totals::{LogLink, Totals};
use super::graph_pools::GraphPools;
use super::history::History;

/// Added to `pending_total` while a statistics merge is wanted (far above any count of
/// waiting frees).
pub(crate) const MERGE_NUDGE: isize = 1 << 48;

/// A value alone on its cache line (128 bytes: a line and the adjacent one some x86-64
/// cores prefetch with it, or one line on aarch64 cores with 128-byte lines), so that
/// no write to a field around it invalidates the line its readers hold.
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Device-wide state of one allocator.
pub(crate) struct Shared {
    /// The device every shard allocates on.
    pub device: Arc<dyn Device>,
    /// Its index.
    pub index: DeviceIndex,
    pub config: Config,
    /// The rules in force, resolved once from `config`.
    pub policy: Policy,
    /// Profiler markers around the slow paths.
    pub markers: Arc<Mstx>,
    /// Bytes added to each request before rounding: the device's
    /// (`Device::request_padding`) or the settings' `request_padding`, the larger (both
    /// are torch_npu's 32 bytes on Ascend; they never add up).
    pub padding: usize,
    /// Device bytes held by all shards.
    pub reserved: AtomicUsize,
    /// Highest `reserved` ever (not reset with the peak statistics).
    pub hwm: AtomicUsize,
    /// Highest `reserved` since the last peak reset (the aggregate reserved peak).
    pub reserved_peak: AtomicUsize,
    /// Device allocations (and page mappings) so far: a steady workload makes none
    /// (lending's repeat rule, `shard/lending.rs`).
    pub growths: AtomicU64,
    /// Of which growths instead of a repeat borrow (`shard/lending.rs`).
    pub regrowths: AtomicU64,
    /// Memory-fraction cap in bytes; `usize::MAX` when unset.
    allowed_max: AtomicUsize,
    /// Frees waiting for events, over all shards.
    pub pending_total: AtomicIsize,
    /// Device-wide statistics rebuilt from the shards' logs (`accounting/totals.rs`). Lock order:
    /// this, then shards in creation order.
    pub totals: Mutex<Totals>,
    /// Set when a shard's statistics log is full: the next malloc merges
    /// ([`Shared::ask_merge`]).
    merge_wanted: AtomicBool,
    /// Whether the shards log their statistics changes (`accounting/totals/quiet.rs`): clear while
    /// one shard exists (nothing logged) or with `exact_stats:False`; set when the
    /// second shard turns the logs on; cleared by a merge that enters quiet mode (all
    /// shards locked), set by the first change that passes its shard's allowance. Read
    /// by every malloc and free: on a cache line of its own, which nothing else writes.
    pub stats_logging: OwnLine<AtomicBool>,
    /// Graph-private pools' use counts and the captures underway (`graph_pools.rs`).
    pub pools: GraphPools,
    /// The memory-history tracer, if set (`history.rs`).
    pub history: History,
    /// Reserved bytes per graph-private pool, over every shard (a pool spans the streams
    /// routed to it); written only where a pool's device memory grows or shrinks.
    pub private_reserved: Mutex<PrivatePoolReserved>,
    /// Whether the allocator runs in the memory-short regime (`Regime::MemoryShort`,
    /// Note [the memory-short regime] in `policy.rs`): set when a device malloc for a
    /// new segment the device could hold when empty fails, cleared by `empty_cache`.
    memory_short: AtomicBool,
    /// The device's total memory (`Device::mem_info`), asked once on first use; 0 until
    /// then, `usize::MAX` if the device could not say ([`Shared::device_total`]).
    device_total: AtomicUsize,
    /// Start of the next segment's place range (Note [Places], `pool/block.rs`).
    next_place: AtomicUsize,
}

impl Shared {
    pub fn new(
        device: Arc<dyn Device>,
        index: DeviceIndex,
        config: Config,
        padding: usize,
    ) -> Self {
        Shared {
            device,
            index,
            padding: padding.max(config.request_padding),
            policy: Policy::from_config(&config),
            config,
            markers: Mstx::global(),
            reserved: AtomicUsize::new(0),
            hwm: AtomicUsize::new(0),
            reserved_peak: AtomicUsize::new(0),
            growths: AtomicU64::new(0),
            regrowths: AtomicU64::new(0),
            allowed_max: AtomicUsize::new(usize::MAX),
            pending_total: AtomicIsize::new(0),
            totals: Mutex::new(Totals::default()),
            merge_wanted: AtomicBool::new(false),
            stats_logging: OwnLine(AtomicBool::new(false)),
            pools: GraphPools::default(),
            history: History::default(),
            private_reserved: Mutex::new(PrivatePoolReserved::default()),
            memory_short: AtomicBool::new(false),
            device_total: AtomicUsize::new(0),
            next_place: AtomicUsize::new(0),
        }
    }

    /// The `shift` of the blocks of a new segment (or address reservation) of `size`
    /// bytes at `base` (Note [Places], `pool/block.rs`): 0 with `address_ties` (places
    /// are addresses), else one that gives it the next `size` places, after those of
    /// every segment made before it on this device.
    pub fn place_shift(&self, base: DevicePtr, size: usize) -> usize {
        if self.policy.address_ties {
            return 0;
        }
        let start = self.next_place.fetch_add(size, Ordering::Relaxed);
        start.wrapping_sub(base)
    }

    /// The device's total memory, asked of the device once (`usize::MAX` if it cannot
    /// say): a bound to test reservations against without a device call.
    pub fn device_total(&self) -> usize {
        let known = self.device_total.load(Ordering::Relaxed);
        if known != 0 {
            return known;
        }
        let total = self
            .device
            .mem_info(self.index)
            .map_or(usize::MAX, |info| info.total.max(1));
        self.device_total.store(total, Ordering::Relaxed);
        total
    }

    /// Whether `bytes` more beside `held` bytes stay within the device's total memory
    /// and the memory fraction: past either, a segment of `bytes` surely cannot be had;
    /// within, only the device can say (other users' memory). No device call after the
    /// first ([`Shared::device_total`]).
    pub fn fits_beside(&self, held: usize, bytes: usize) -> bool {
        let want = held.saturating_add(bytes);
        want <= self.device_total() && self.allowed_max().is_none_or(|m| want <= m)
    }

    /// The regime the allocator runs in.
    pub fn regime(&self) -> Regime {
        if self.memory_short.load(Ordering::Relaxed) {
            Regime::MemoryShort
        } else {
            Regime::Plentiful
        }
    }

    /// Whether memory was seen short ([`Shared::regime`]; one relaxed load).
    #[inline]
    pub fn memory_short(&self) -> bool {
        self.memory_short.load(Ordering::Relaxed)
    }

    /// Enters the memory-short regime (a growth the device could hold when empty failed)
    /// or, after `empty_cache`, leaves it.
    pub fn set_memory_short(&self, short: bool) {
        self.memory_short.store(short, Ordering::Relaxed);
    }

    /// Whether a graph capture is underway on the device (any stream): no event query,
    /// synchronisation or device free may be made then (PyTorch's
    /// `captures_underway.empty()` guards).
    #[inline]
    pub fn capture_underway(&self) -> bool {
        self.pools.capture_underway()
    }

    /// The memory-fraction cap, if set.
    pub fn allowed_max(&self) -> Option<usize> {
        match self.allowed_max.load(Ordering::Relaxed) {
            usize::MAX => None,
            n => Some(n),
        }
    }

    pub fn set_allowed_max(&self, bytes: usize) {
        self.allowed_max
            .store(bytes.min(usize::MAX - 1), Ordering::Relaxed);
    }

    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    pub fn hwm(&self) -> usize {
        self.hwm.load(Ordering::Relaxed)
    }

    /// Tries to account `bytes` more reserved memory under the fraction cap (undo with
    /// `unreserve` if the device allocation then fails; confirm with `note_reserved`).
    pub fn try_reserve(&self, bytes: usize) -> bool {
        let cap = self.allowed_max.load(Ordering::Relaxed);
        let ok = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                r.checked_add(bytes)
                    .filter(|&n| cap == usize::MAX || n <= cap)
            });
        ok.is_ok()
    }

    /// Records the high-water marks after a reservation was backed by device memory.
    pub fn note_reserved(&self) {
        let now = self.reserved();
        self.hwm.fetch_max(now, Ordering::Relaxed);
        self.reserved_peak.fetch_max(now, Ordering::Relaxed);
        self.growths.fetch_add(1, Ordering::Relaxed);
    }

    /// Growths so far that were not instead of a repeat borrow. Only compared for
    /// equality (a change means the device grew): a value torn by a concurrent growth
    /// only restarts lending's count, hence the wrapping subtraction.
    pub fn growths(&self) -> u64 {
        let all = self.growths.load(Ordering::Relaxed);
        all.wrapping_sub(self.regrowths.load(Ordering::Relaxed))
    }

    /// A statistics log is full: makes the next malloc merge the logs at no cost to
    /// the others. `pending_total` goes up by [`MERGE_NUDGE`], so every malloc's test
    /// of it ("other streams have frees waiting") takes its slow branch, which merges
    /// ([`take_merge`](Self::take_merge) takes the nudge back).
    pub fn ask_merge(&self) {
        if !self.merge_wanted.swap(true, Ordering::Relaxed) {
            self.pending_total.fetch_add(MERGE_NUDGE, Ordering::Relaxed);
        }
    }

    /// Whether a merge was asked for; clears the request.
    pub fn take_merge(&self) -> bool {
        let asked = self.merge_wanted.swap(false, Ordering::Relaxed);
        if asked {
            self.pending_total.fetch_sub(MERGE_NUDGE, Ordering::Relaxed);
        }
        asked
    }

    /// Whether a merge was asked for (read without taking it).
    pub fn merge_asked(&self) -> bool {
        self.merge_wanted.load(Ordering::Relaxed)
    }

    pub fn unreserve(&self, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl LogLink for Shared {
    fn stats_logging(&self) -> &AtomicBool {
        &self.stats_logging
    }

    fn ask_merge(&self) {
        Shared::ask_merge(self);
    }
}
