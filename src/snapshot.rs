//! Memory snapshots in the shape of PyTorch's `torch.cuda.memory._snapshot()`, so
//! existing tooling (memory_viz) can read them after a conversion to pickle. Blocks
//! carry two keys of npualloc's own for cross-stream lending: `lent_to_stream` (a
//! block allocated for a caller on another stream) and `dirty_on_streams` (a free block
//! those streams may still use).

use serde_json::{json, Value};

use crate::handle::{DeviceIndex, DevicePtr, MempoolId, StreamHandle};
use crate::policy::Regime;
use crate::pool::PoolKind;

/// What a block is doing, as snapshots report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for events on other streams.
    ActivePendingFree,
    /// Cached and reusable.
    Inactive,
}

/// One block in a snapshot.
#[derive(Clone, Debug)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub size: usize,
    /// Bytes the caller asked for (0 when inactive).
    pub requested_size: usize,
    /// ShardState.
    pub state: BlockState,
    /// Allocated for a caller on this other stream (cross-stream lending).
    pub lent_to: Option<StreamHandle>,
    /// Free, but these streams it was lent to may still use it (their fences have not
    /// been seen complete): whoever takes it first waits for them on the device.
    pub dirty_on: Vec<StreamHandle>,
}

/// One segment (device allocation) in a snapshot.
#[derive(Clone, Debug)]
pub struct SegmentInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub total_size: usize,
    /// Stream the segment serves.
    pub stream: StreamHandle,
    /// Pool.
    pub kind: PoolKind,
    /// Blocks in address order.
    pub blocks: Vec<BlockInfo>,
    /// The graph-private pool holding the segment (`None`: the stream's own pool).
    pub pool_id: Option<MempoolId>,
    /// A run of mapped pages of an expandable segment.
    pub is_expandable: bool,
}

/// Something whose segments a snapshot lists: one device's allocator.
pub trait SegmentSource {
    /// The device index the segments belong to.
    fn device_index(&self) -> DeviceIndex;
    /// Every segment, in address order.
    fn segments(&self) -> Vec<SegmentInfo>;
    /// The regime the allocator runs in (Note [the memory-short regime]).
    fn regime(&self) -> Regime;
}

fn state_name(s: BlockState) -> &'static str {
    match s {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

/// PyTorch-shaped JSON of one device's segments.
pub fn segments_json(device: usize, segs: &[SegmentInfo]) -> Vec<Value> {
    segs.iter()
        .map(|seg| {
            let sum = |keep: &dyn Fn(&BlockInfo) -> bool, size: bool| -> usize {
                seg.blocks
                    .iter()
                    .filter(|b| keep(b))
                    .map(|b| if size { b.size } else { b.requested_size })
                    .sum()
            };
            let allocated = sum(&|b| b.state == BlockState::ActiveAllocated, true);
            let active = sum(&|b| b.state != BlockState::Inactive, true);
            let requested = sum(&|b| b.state != BlockState::Inactive, false);
            let blocks: Vec<Value> = seg
                .blocks
                .iter()
                .map(|b| {
                    let mut v = json!({
                        "address": b.address,
                        "size": b.size,
                        "requested_size": b.requested_size,
                        "state": state_name(b.state),
                        "frames": [],
                    });
                    if let Some(s) = b.lent_to {
                        v["lent_to_stream"] = json!(s.0);
                    }
                    if !b.dirty_on.is_empty() {
                        v["dirty_on_streams"] =
                            json!(b.dirty_on.iter().map(|s| s.0).collect::<Vec<_>>());
                    }
                    v
                })
                .collect();
            json!({
                "device": device,
                "address": seg.address,
                "total_size": seg.total_size,
                "allocated_size": allocated,
                "active_size": active,
                "requested_size": requested,
                "stream": seg.stream.0,
                "segment_type": if seg.kind == PoolKind::Small { "small" } else { "large" },
                "segment_pool_id": seg.pool_id.map_or([0, 0], |MempoolId(a, b)| [a, b]),
                "is_expandable": seg.is_expandable,
                "frames": [],
                "blocks": blocks,
            })
        })
        .collect()
}

/// The snapshot of several devices' allocators as a JSON value:
/// `{"segments": [...], "device_traces": [[...] per device], "regimes": [...]}`, the
/// last npualloc's: each device's regime, `"plentiful"` or `"memory_short"`.
pub fn snapshot<S: SegmentSource>(allocators: &[&S]) -> Value {
    let mut segments = Vec::new();
    let mut traces = Vec::new();
    let mut regimes = Vec::new();
    for a in allocators {
        segments.extend(segments_json(a.device_index(), &a.segments()));
        traces.push(Value::Array(Vec::new()));
        regimes.push(regime_name(a.regime()));
    }
    json!({ "segments": segments, "device_traces": traces, "regimes": regimes })
}

/// The snapshot's name of a regime.
pub fn regime_name(r: Regime) -> &'static str {
    match r {
        Regime::Plentiful => "plentiful",
        Regime::MemoryShort => "memory_short",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::device::sim::{SimConfig, SimDevice};
    use crate::{Config, StreamHandle};

    #[test]
    fn snapshot_lists_segments_and_block_states() {
        let sim = SimDevice::new(SimConfig::default());
        let a = CachingAllocator::new(sim, 0, Config::default()).unwrap();
        let p = a.malloc(1000, StreamHandle::DEFAULT).unwrap();
        let v = snapshot(&[&a]);
        let seg = &v["segments"][0];
        assert_eq!(seg["total_size"], 2 << 20);
        assert_eq!(seg["segment_type"], "small");
        assert_eq!(seg["allocated_size"], 1024);
        assert_eq!(seg["requested_size"], 1000);
        assert_eq!(seg["blocks"][0]["state"], "active_allocated");
        assert_eq!(seg["blocks"][1]["state"], "inactive");
        assert_eq!(v["device_traces"].as_array().unwrap().len(), 1);
        assert_eq!(v["regimes"], json!(["plentiful"]));
        a.free(p).unwrap();
    }
}
