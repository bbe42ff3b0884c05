//! C types of the ABI.

use std::ffi::c_void;

use npualloc_core::stats::{DeviceStats, PrivatePoolStats, Stat};

/// A stream: an `aclrtStream` or `cudaStream_t`; NULL is the device's default stream.
pub type npualloc_stream = *mut c_void;
/// An event: an `aclrtEvent` or `cudaEvent_t`.
pub type npualloc_event = *mut c_void;

/// One statistic (PyTorch's `Stat`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct npualloc_stat {
    /// Current value.
    pub current: i64,
    /// Highest value since the last peak reset.
    pub peak: i64,
    /// Sum of increases.
    pub allocated: i64,
    /// Sum of decreases.
    pub freed: i64,
}

/// A statistic per pool: index 0 all, 1 small pool, 2 large pool.
pub type npualloc_stat_array = [npualloc_stat; 3];

/// Device statistics: PyTorch's `c10::CachingDeviceAllocator::DeviceStats` (torch 2.14)
/// in its order, less two fields: `reserved_bytes_by_private_pools`, a map that does not
/// fit a fixed struct (read it with `npualloc_get_private_pool_stats`; the pools' bytes
/// are also counted in `reserved_bytes`, as in PyTorch), and `num_oom_rejections`, which
/// is always 0 (npualloc has no OOM preemption policy). The layout is frozen: callers
/// built against an older header pass this struct, so a new statistic comes with a new
/// function, never a new field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct npualloc_device_stats {
    /// Live allocations.
    pub allocation: npualloc_stat_array,
    /// Device allocations (segments) held.
    pub segment: npualloc_stat_array,
    /// Blocks allocated or waiting for stream events.
    pub active: npualloc_stat_array,
    /// Free blocks inside split segments.
    pub inactive_split: npualloc_stat_array,
    /// Bytes of live allocations.
    pub allocated_bytes: npualloc_stat_array,
    /// Device memory held.
    pub reserved_bytes: npualloc_stat_array,
    /// Bytes of active blocks.
    pub active_bytes: npualloc_stat_array,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: npualloc_stat_array,
    /// Bytes callers asked for, over active blocks.
    pub requested_bytes: npualloc_stat_array,
    /// Allocations that needed the cache released and a retry.
    pub num_alloc_retries: i64,
    /// Allocations that failed with out of memory.
    pub num_ooms: i64,
    /// Allocations of at least max_split_size.
    pub oversize_allocations: npualloc_stat,
    /// Segments of at least max_split_size.
    pub oversize_segments: npualloc_stat,
    /// Full synchronisations of pending frees.
    pub num_sync_all_streams: i64,
    /// Device allocations made.
    pub num_device_alloc: i64,
    /// Device frees made.
    pub num_device_free: i64,
    /// The max_split_size setting in bytes (INT64_MAX when unlimited).
    pub max_split_size: i64,
}

/// One entry of torch 2.14's `DeviceStats::reserved_bytes_by_private_pools`: a
/// graph-private pool (its `MempoolId_t`) and the device memory its segments hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct npualloc_private_pool_stats {
    /// The pool id's first integer (`MempoolId_t::first`).
    pub id_hi: u64,
    /// The pool id's second integer (`MempoolId_t::second`).
    pub id_lo: u64,
    /// Bytes reserved by the pool, per pool kind (index 0 all, 1 small, 2 large).
    pub reserved_bytes: npualloc_stat_array,
}

impl From<PrivatePoolStats> for npualloc_private_pool_stats {
    fn from(p: PrivatePoolStats) -> Self {
        npualloc_private_pool_stats {
            id_hi: p.id.0,
            id_lo: p.id.1,
            reserved_bytes: arr(p.reserved_bytes),
        }
    }
}

fn stat(s: Stat) -> npualloc_stat {
    npualloc_stat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn arr(a: [Stat; 3]) -> npualloc_stat_array {
    a.map(stat)
}

impl From<DeviceStats> for npualloc_device_stats {
    fn from(s: DeviceStats) -> Self {
        npualloc_device_stats {
            allocation: arr(s.allocation),
            segment: arr(s.segment),
            active: arr(s.active),
            inactive_split: arr(s.inactive_split),
            allocated_bytes: arr(s.allocated_bytes),
            reserved_bytes: arr(s.reserved_bytes),
            active_bytes: arr(s.active_bytes),
            inactive_split_bytes: arr(s.inactive_split_bytes),
            requested_bytes: arr(s.requested_bytes),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            oversize_allocations: stat(s.oversize_allocations),
            oversize_segments: stat(s.oversize_segments),
            num_sync_all_streams: s.num_sync_all_streams,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            max_split_size: s.max_split_size,
        }
    }
}
