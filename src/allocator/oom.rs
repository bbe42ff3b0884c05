//! The out-of-memory message, worded like torch_npu's (like PyTorch's on the CUDA
//! backend: "CUDA out of memory", "GPU 0 has ...").

use crate::device::{DeviceIndex, MemInfo};
use crate::stats::{format_size, DeviceStats};

/// The words for the device in the message: (what ran out, the device) by backend name.
fn words(backend: &str) -> (&'static str, &'static str) {
    match backend {
        "cuda" => ("CUDA", "GPU"),
        _ => ("NPU", "NPU"),
    }
}

pub(super) fn message(
    backend: &str,
    device: DeviceIndex,
    requested: usize,
    segment: usize,
    info: Option<MemInfo>,
    allowed_max: Option<usize>,
    stats: &DeviceStats,
) -> String {
    let allocated = stats.allocated_bytes[0].current.max(0) as usize;
    let reserved = stats.reserved_bytes[0].current.max(0) as usize;
    let (what, dev) = words(backend);
    let capacity = match info {
        Some(i) => format!(
            "{dev} {device} has a total capacity of {} of which {} is free. ",
            format_size(i.total),
            format_size(i.free)
        ),
        None => format!("{dev} {device} memory information is unavailable. "),
    };
    let allowed = allowed_max
        .map(|m| format!("{} allowed by the memory fraction; ", format_size(m)))
        .unwrap_or_default();
    format!(
        "{what} out of memory. Tried to allocate {} (a {} device segment). {capacity}{allowed}\
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
    use super::*;

    fn msg(backend: &str) -> String {
        let info = MemInfo {
            free: 1 << 30,
            total: 4 << 30,
        };
        message(
            backend,
            0,
            1 << 20,
            2 << 20,
            Some(info),
            None,
            &DeviceStats::default(),
        )
    }

    #[test]
    fn names_the_device_of_the_backend() {
        assert!(msg("acl").starts_with("NPU out of memory. Tried to allocate 1.00 MiB"));
        assert!(msg("acl").contains("NPU 0 has a total capacity of 4.00 GiB"));
        assert!(msg("cuda").starts_with("CUDA out of memory. Tried to allocate 1.00 MiB"));
        assert!(msg("cuda").contains("GPU 0 has a total capacity of 4.00 GiB"));
        assert!(msg("sim").starts_with("NPU out of memory"));
    }
}
