//! Allocator statistics with exactly PyTorch's `DeviceStats` meaning.
//!
//! Every [`Stat`] keeps `current`, `peak`, `allocated` (sum of increases) and `freed`
//! (sum of decreases); arrays are indexed by [`StatType`]. [`DeviceStats`] holds every
//! field of torch 2.14's `DeviceStats` but two: `reserved_bytes_by_private_pools`, a map
//! kept apart ([`PrivatePoolStats`], one entry per pool, read with
//! `CachingAllocator::private_pool_stats`), and `num_oom_rejections`, always 0 here
//! (npualloc has no out-of-memory preemption policy).

use crate::handle::MempoolId;

/// Formats bytes as PyTorch does: "N bytes" up to 1 KiB, else "x.xx KiB/MiB/GiB";
/// takes any integer, so a [`Stat`] field (`i64`) formats as well as a `usize`.
pub fn format_size(bytes: impl TryInto<i128>) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let bytes: i128 = bytes.try_into().unwrap_or(i128::MAX);
    if bytes.abs() <= 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Which pool a statistic counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum StatType {
    /// Both pools together.
    Aggregate = 0,
    /// The small pool (requests of at most 1 MiB).
    SmallPool = 1,
    /// The large pool.
    LargePool = 2,
}

/// One counter: current value, peak, total increases and total decreases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest value since the last peak reset.
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount`.
    #[inline(always)]
    pub fn increase(&mut self, amount: usize) {
        let a = amount as i64;
        self.current += a;
        // A branch, not `max`: at steady state the peak is not passed and not stored.
        if self.current > self.peak {
            self.peak = self.current;
        }
        self.allocated += a;
    }

    /// Subtracts `amount`.
    pub fn decrease(&mut self, amount: usize) {
        let a = amount as i64;
        self.current -= a;
        self.freed += a;
    }

    /// Sets the peak to the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Zeroes the sums of increases and decreases.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A statistic per [`StatType`]; index it with a [`StatType`]
/// (`stats.allocated_bytes[StatType::Aggregate]`) or its `usize` value.
pub type StatArray = [Stat; 3];

impl std::ops::Index<StatType> for StatArray {
    type Output = Stat;
    fn index(&self, pool: StatType) -> &Stat {
        &self[pool as usize]
    }
}

impl std::ops::IndexMut<StatType> for StatArray {
    fn index_mut(&mut self, pool: StatType) -> &mut Stat {
        &mut self[pool as usize]
    }
}

/// Adds `amount` to the aggregate and to `pool`'s entry.
#[inline(always)]
pub fn increase(arr: &mut StatArray, pool: StatType, amount: usize) {
    arr[StatType::Aggregate as usize].increase(amount);
    arr[pool as usize].increase(amount);
}

/// Subtracts `amount` from the aggregate and from `pool`'s entry.
pub fn decrease(arr: &mut StatArray, pool: StatType, amount: usize) {
    arr[StatType::Aggregate as usize].decrease(amount);
    arr[pool as usize].decrease(amount);
}

/// Statistics of one device's allocator: PyTorch's `DeviceStats` in its field order,
/// less `reserved_bytes_by_private_pools` ([`PrivatePoolStats`]) and
/// `num_oom_rejections` (always 0), as the module documentation says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DeviceStats {
    /// Live allocations (drops when the caller frees).
    pub allocation: StatArray,
    /// Device allocations (segments) held.
    pub segment: StatArray,
    /// Blocks allocated or waiting for their stream events.
    pub active: StatArray,
    /// Free blocks that are part of a split segment.
    pub inactive_split: StatArray,
    /// Bytes of live allocations (rounded block sizes).
    pub allocated_bytes: StatArray,
    /// Device memory held.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes callers asked for (before rounding), over active blocks.
    pub requested_bytes: StatArray,
    /// Allocations that needed the whole cache released and a retry.
    pub num_alloc_retries: i64,
    /// Allocations that failed with out of memory.
    pub num_ooms: i64,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Times every pending event was synchronised.
    pub num_sync_all_streams: i64,
    /// Device allocations made.
    pub num_device_alloc: i64,
    /// Device frees made.
    pub num_device_free: i64,
    /// The `max_split_size` setting (bytes; `i64::MAX` when unlimited).
    pub max_split_size: i64,
}

impl DeviceStats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// Calls `f` on each of the nine arrays.
    pub(crate) fn for_each_array(&mut self, f: impl FnMut(&mut StatArray)) {
        self.arrays_mut().into_iter().for_each(f);
    }

    /// Calls `f` on every statistic (the nine arrays, then the oversize counters).
    pub(crate) fn for_each_stat(&mut self, mut f: impl FnMut(&mut Stat)) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(&mut f);
        }
        f(&mut self.oversize_allocations);
        f(&mut self.oversize_segments);
    }

    /// Sets every peak to its current value.
    pub fn reset_peak(&mut self) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Zeroes `allocated`/`freed` of every stat and the event counters.
    pub fn reset_accumulated(&mut self) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(Stat::reset_accumulated);
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.reset_accumulated();
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

/// The device memory one graph-private pool holds: an entry of torch 2.14's
/// `DeviceStats::reserved_bytes_by_private_pools`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrivatePoolStats {
    /// The pool (PyTorch's `MempoolId_t`).
    pub id: MempoolId,
    /// Bytes of device memory held by the pool's segments (or mapped pages), per
    /// [`StatType`], counted as `reserved_bytes` counts them.
    pub reserved_bytes: StatArray,
}

/// `reserved_bytes_by_private_pools` of one device, as PyTorch keeps it: an entry is made
/// when a pool first reserves memory, follows every reservation and release of the
/// pool's memory, and is never removed (its `current` is 0 once the pool gave
/// everything back; `peak`, `allocated` and `freed` stay until the resets).
#[derive(Clone, Debug, Default)]
pub(crate) struct PrivatePoolReserved(Vec<PrivatePoolStats>);

impl PrivatePoolReserved {
    fn entry(&mut self, id: MempoolId) -> &mut StatArray {
        let i = match self.0.iter().position(|e| e.id == id) {
            Some(i) => i,
            None => {
                self.0.push(PrivatePoolStats {
                    id,
                    reserved_bytes: StatArray::default(),
                });
                self.0.len() - 1
            }
        };
        &mut self.0[i].reserved_bytes
    }

    /// Pool `id` reserved `bytes` more in `pool`'s size class.
    pub fn increase(&mut self, id: MempoolId, pool: StatType, bytes: usize) {
        increase(self.entry(id), pool, bytes);
    }

    /// Pool `id` gave `bytes` back in `pool`'s size class.
    pub fn decrease(&mut self, id: MempoolId, pool: StatType, bytes: usize) {
        decrease(self.entry(id), pool, bytes);
    }

    /// Every entry, in the order the pools first reserved memory.
    pub fn entries(&self) -> Vec<PrivatePoolStats> {
        self.0.clone()
    }

    /// Sets every peak to its current value (entries stay).
    pub fn reset_peak(&mut self) {
        for e in &mut self.0 {
            e.reserved_bytes.iter_mut().for_each(Stat::reset_peak);
        }
    }

    /// Zeroes every `allocated` and `freed` (entries stay).
    pub fn reset_accumulated(&mut self) {
        for e in &mut self.0 {
            e.reserved_bytes
                .iter_mut()
                .for_each(Stat::reset_accumulated);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(2048), "2.00 KiB");
        assert_eq!(format_size(20usize << 20), "20.00 MiB");
        assert_eq!(format_size(3usize << 30), "3.00 GiB");
        // Stat fields are i64: the same text, and a negative delta keeps its sign.
        assert_eq!(format_size(3i64 << 30), "3.00 GiB");
        assert_eq!(format_size(-(2i64 << 20)), "-2.00 MiB");
        assert_eq!(format_size(u128::MAX), format_size(i128::MAX));
    }

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!((s.current, s.peak, s.allocated, s.freed), (3, 15, 15, 12));
        s.reset_peak();
        assert_eq!(s.peak, 3);
    }

    #[test]
    fn arrays_update_aggregate_and_pool() {
        let mut a = StatArray::default();
        increase(&mut a, StatType::SmallPool, 4);
        increase(&mut a, StatType::LargePool, 6);
        decrease(&mut a, StatType::SmallPool, 4);
        assert_eq!(a[0].current, 6);
        assert_eq!(a[StatType::Aggregate], a[0]);
        assert_eq!(a[StatType::SmallPool], a[1]);
        assert_eq!(a[StatType::LargePool].current, 6);
        assert_eq!(a[1].current, 0);
        assert_eq!(a[2].current, 6);
        assert_eq!(a[0].peak, 10);
    }

    #[test]
    fn private_pool_entries_follow_their_pool_and_outlive_it_until_reset() {
        let (a, b) = (MempoolId(1, 0), MempoolId(2, 0));
        let mut r = PrivatePoolReserved::default();
        assert!(r.entries().is_empty(), "no entry before a pool reserves");
        r.increase(a, StatType::LargePool, 20 << 20);
        r.increase(b, StatType::SmallPool, 2 << 20);
        r.increase(a, StatType::SmallPool, 2 << 20);
        r.decrease(a, StatType::LargePool, 20 << 20);
        let e = r.entries();
        assert_eq!(
            (e[0].id, e[1].id),
            (a, b),
            "in the order pools first reserved"
        );
        let ra = e[0].reserved_bytes;
        assert_eq!(
            ra[StatType::Aggregate],
            stat(2 << 20, 22 << 20, 22 << 20, 20 << 20)
        );
        assert_eq!(
            ra[StatType::LargePool],
            stat(0, 20 << 20, 20 << 20, 20 << 20)
        );
        assert_eq!(ra[StatType::SmallPool], stat(2 << 20, 2 << 20, 2 << 20, 0));
        assert_eq!(e[1].reserved_bytes[StatType::SmallPool].current, 2 << 20);
        // The pool gives everything back: the entry stays, current 0.
        r.decrease(a, StatType::SmallPool, 2 << 20);
        r.reset_peak();
        let ra = r.entries()[0].reserved_bytes;
        assert_eq!(ra[StatType::Aggregate], stat(0, 0, 22 << 20, 22 << 20));
        r.reset_accumulated();
        let e = r.entries();
        assert_eq!(e.len(), 2, "reset removes no entry");
        assert_eq!(e[0].reserved_bytes, StatArray::default());
        assert_eq!(
            e[1].reserved_bytes[StatType::SmallPool],
            stat(2 << 20, 2 << 20, 0, 0)
        );
    }

    fn stat(current: i64, peak: i64, allocated: i64, freed: i64) -> Stat {
        Stat {
            current,
            peak,
            allocated,
            freed,
        }
    }
}
