//! The out-of-memory message, worded like torch_npu's.

use crate::device::{DeviceIndex, MemInfo};
use crate::stats::{format_size, DeviceStats};

pub(super) fn message(
    device: DeviceIndex,
    requested: usize,
    segment: usize,
    info: Option<MemInfo>,
    allowed_max: Option<usize>,
    stats: &DeviceStats,
) -> String {
    let allocated = stats.allocated_bytes[0].current.max(0) as usize;
    let reserved = stats.reserved_bytes[0].current.max(0) as usize;
    let capacity = match info {
        Some(i) => format!(
            "NPU {device} has a total capacity of {} of which {} is free. ",
            format_size(i.total),
            format_size(i.free)
        ),
        None => format!("NPU {device} memory information is unavailable. "),
    };
    let allowed = allowed_max
        .map(|m| format!("{} allowed by the memory fraction; ", format_size(m)))
        .unwrap_or_default();
    format!(
        "NPU out of memory. Tried to allocate {} (a {} device segment). {capacity}{allowed}\
         Of the allocated memory {} is allocated by npualloc, and {} is reserved by npualloc \
         but unallocated. If reserved but unallocated memory is large, try setting \
         max_split_size_mb in NPUALLOC_CONF to avoid fragmentation.",
        format_size(requested),
        format_size(segment),
        format_size(allocated),
        format_size(reserved.saturating_sub(allocated)),
    )
}
