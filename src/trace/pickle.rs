//! Conversion of PyTorch / torch_npu memory snapshots (`torch.cuda.memory._dump_snapshot()`,
//! `torch.npu.memory._dump_snapshot()` pickles) into traces.
//!
//! Uses `device_traces[device]`: `alloc` → `a`, `free_requested` → `f` (a
//! `free_completed` without a request also frees); `segment_*`, `snapshot`, `oom` and other
//! actions are ignored. Addresses are reused over time, so each `alloc` gets a fresh id.
//! Stream handles map to small integers: 0 stays 0, others are numbered in order of
//! first appearance. Each allocation's stack (`frames`) is kept in [`SnapshotTrace`];
//! events that share one frame list in the pickle share it here too.
//!
//! The pickle is read by [`super::unpickle`] (shared references, no recursion, a depth
//! limit).

use std::collections::HashMap;
use std::sync::Arc;

use super::unpickle::{self, Node, NodeId, Pickle};
use super::{Op, Trace, TraceError};

fn err(file: &str, message: impl Into<String>) -> TraceError {
    TraceError {
        file: file.to_owned(),
        line: 0,
        message: message.into(),
    }
}

/// One stack frame of a snapshot event (`{'filename', 'line', 'name'}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number (0 when absent).
    pub line: u64,
    /// Function name.
    pub name: String,
}

/// A snapshot converted to a trace, with the stack of each allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotTrace {
    /// The trace (allocation ids are 0, 1, 2, ... in order).
    pub trace: Trace,
    /// `frames[id]`: the stack recorded for allocation `id`, innermost first as the
    /// snapshot gives it (empty when the snapshot recorded none).
    pub frames: Vec<Arc<[Frame]>>,
}

/// Converts snapshot pickle bytes into a trace of `device` (the first device with
/// events when `None`).
pub fn from_snapshot(bytes: &[u8], file: &str, device: Option<usize>) -> Result<Trace, TraceError> {
    convert(bytes, file, device, false).map(|s| s.trace)
}

/// Like [`from_snapshot`], and also keeps each allocation's frames.
pub fn read_snapshot(
    bytes: &[u8],
    file: &str,
    device: Option<usize>,
) -> Result<SnapshotTrace, TraceError> {
    convert(bytes, file, device, true)
}

/// Frames of one event, shared between events that share the list in the pickle.
fn frames_of(event: Node<'_>, cache: &mut HashMap<NodeId, Arc<[Frame]>>) -> Arc<[Frame]> {
    let Some(list) = event.get("frames") else {
        return Arc::from([]);
    };
    if let Some(f) = cache.get(&list.id()) {
        return f.clone();
    }
    let frames: Arc<[Frame]> = list
        .items()
        .into_iter()
        .flatten()
        .map(|f| Frame {
            filename: f
                .get("filename")
                .and_then(|n| n.as_str())
                .unwrap_or("")
                .to_owned(),
            line: f.get("line").and_then(|n| n.as_u64()).unwrap_or(0),
            name: f
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or("")
                .to_owned(),
        })
        .collect();
    cache.insert(list.id(), frames.clone());
    frames
}

fn convert(
    bytes: &[u8],
    file: &str,
    device: Option<usize>,
    with_frames: bool,
) -> Result<SnapshotTrace, TraceError> {
    let pickle: Pickle =
        unpickle::read(bytes).map_err(|e| err(file, format!("not a readable pickle: {e}")))?;
    let top = pickle.root();
    if !matches!(top.value(), unpickle::Value::Dict(_)) {
        return Err(err(
            file,
            "expected a dict at the top (a PyTorch memory snapshot)",
        ));
    }
    let Some(devices) = top.get("device_traces").and_then(|d| d.items()) else {
        return Err(err(
            file,
            "no 'device_traces' list: record memory history before dumping the snapshot",
        ));
    };
    let devices: Vec<Node<'_>> = devices.collect();
    let index = match device {
        Some(d) if d < devices.len() => d,
        Some(d) => {
            return Err(err(
                file,
                format!(
                    "device {d} not in snapshot ({} device traces)",
                    devices.len()
                ),
            ))
        }
        None => devices
            .iter()
            .position(|t| t.items().is_some_and(|l| l.len() > 0))
            .ok_or_else(|| err(file, "every device trace is empty"))?,
    };
    let Some(entries) = devices[index].items() else {
        return Err(err(file, format!("device_traces[{index}] is not a list")));
    };

    let mut ops = Vec::with_capacity(entries.len());
    let mut frames = Vec::new();
    let mut frame_cache = HashMap::new();
    let mut live: HashMap<u64, u64> = HashMap::new(); // addr -> id
    let mut streams: HashMap<u64, u32> = HashMap::from([(0, 0)]);
    let mut next_id = 0u64;
    for (i, d) in entries.enumerate() {
        if !matches!(d.value(), unpickle::Value::Dict(_)) {
            return Err(err(
                file,
                format!("device_traces[{index}][{i}] is not a dict"),
            ));
        }
        let Some(action) = d.get("action").and_then(|a| a.as_str()) else {
            return Err(err(
                file,
                format!("device_traces[{index}][{i}] has no 'action' string"),
            ));
        };
        let field = |name: &str| {
            d.get(name).and_then(|n| n.as_u64()).ok_or_else(|| {
                err(file, format!("device_traces[{index}][{i}] ({action}) has no non-negative integer '{name}'"))
            })
        };
        match action {
            "alloc" => {
                let (addr, size, stream) = (field("addr")?, field("size")?, field("stream")?);
                let n = streams.len() as u32;
                let label = *streams.entry(stream).or_insert(n);
                live.insert(addr, next_id);
                ops.push(Op::Alloc {
                    id: next_id,
                    size,
                    stream: label,
                });
                if with_frames {
                    frames.push(frames_of(d, &mut frame_cache));
                }
                next_id += 1;
            }
            "free_requested" | "free_completed" => {
                if let Some(id) = live.remove(&field("addr")?) {
                    ops.push(Op::Free { id });
                }
            }
            _ => {}
        }
    }
    Ok(SnapshotTrace {
        trace: Trace {
            name: file.to_owned(),
            ops,
        },
        frames,
    })
}
