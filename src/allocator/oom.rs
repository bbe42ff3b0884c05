//! The out-of-memory message, worded like torch_npu's.

use crate::device::{DeviceIndex, MemInfo};
use crate::stats::DeviceStats;

/// Formats bytes as PyTorch does: "N bytes" up to 1 KiB, else "x.xx KiB/MiB/GiB".
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes <= 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

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

#[cfg(test)]
mod tests {
    use super::format_size;

    #[test]
    fn sizes_format_like_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(2048), "2.00 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }
}
