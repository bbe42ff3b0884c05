//! Conversion of PyTorch / torch_npu memory snapshots (`torch.cuda.memory._dump_snapshot()`,
//! `torch.npu.memory._dump_snapshot()` pickles) into traces.
//!
//! Uses `device_traces[device]`: `alloc` → `a`, `free_requested` → `f` (a
//! `free_completed` without a request also frees). Addresses are reused over time, so
//! each `alloc` gets a fresh id. Stream handles map to small integers: 0 stays 0, others
//! are numbered in order of first appearance. Each allocation's stack (`frames`) is kept
//! in [`SnapshotTrace`]; events that share one frame list in the pickle share it here too.
//!
//! Memory live when recording began is allocated at the start of the trace, in the order
//! found: a block freed in the trace but never allocated in it (its free event gives its
//! size, stream and stack), then each `active_allocated` block of the snapshot's
//! `segments` (the state when it was dumped) for this device that the trace did not
//! allocate. What is still not converted is counted in [`ConvertNotes`]: `segment_*`
//! actions (the replay's allocator makes its own), `oom`, `snapshot` and unknown
//! actions, other devices' events, and blocks pending free at the dump whose allocation
//! and free both came before recording.
//!
//! The pickle is read by [`super::unpickle`] (shared references, no recursion, a depth
//! limit).

use std::collections::{BTreeMap, HashMap, HashSet};
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

pub use super::frames::Frame;
use super::frames::Stacks;

/// A snapshot converted to a trace, with the stack of each allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotTrace {
    /// The trace (allocation ids are 0, 1, 2, ... in order).
    pub trace: Trace,
    /// `frames[id]`: the stack recorded for allocation `id`, innermost first as the
    /// snapshot gives it (empty when the snapshot recorded none).
    pub frames: Vec<Arc<[Frame]>>,
    /// What was added and what was left out.
    pub notes: ConvertNotes,
}

impl SnapshotTrace {
    /// The frames as [`Stacks`] by allocation id (allocations without frames left out),
    /// for [`super::frames::write_with_stacks`].
    pub fn stacks(&self) -> Stacks {
        (0u64..)
            .zip(&self.frames)
            .filter(|(_, f)| !f.is_empty())
            .map(|(id, f)| (id, f.clone()))
            .collect()
    }
}

/// What a conversion added to the trace and what it could not convert.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertNotes {
    /// Blocks freed in the trace that it never allocated: allocated at the start.
    pub live_from_frees: usize,
    /// `active_allocated` blocks of `segments` the trace never allocated: allocated at
    /// the start.
    pub live_from_segments: usize,
    /// Bytes allocated at the start (both kinds).
    pub live_bytes_at_start: u64,
    /// Actions not converted, by name, with counts.
    pub ignored_actions: BTreeMap<String, usize>,
    /// Blocks pending free at the dump that the trace neither allocated nor freed.
    pub pending_at_dump: usize,
    /// Events of the other device traces (device index, events), not converted.
    pub other_devices: Vec<(usize, usize)>,
}

impl ConvertNotes {
    /// One line per thing added or left out (empty when the conversion was complete).
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        let live = self.live_from_frees + self.live_from_segments;
        if live > 0 {
            out.push(format!(
                "{live} block(s) live when recording began ({} bytes: {} freed in the trace, \
                 {} still allocated in the snapshot's segments) are allocated at the start",
                self.live_bytes_at_start, self.live_from_frees, self.live_from_segments
            ));
        }
        if !self.ignored_actions.is_empty() {
            let total: usize = self.ignored_actions.values().sum();
            let each: Vec<String> = self
                .ignored_actions
                .iter()
                .map(|(a, n)| format!("{a} {n}"))
                .collect();
            out.push(format!(
                "{total} event(s) not converted ({}): segment actions are the recording \
                 allocator's own (the replay makes its own), the others are not allocations",
                each.join(", ")
            ));
        }
        if self.pending_at_dump > 0 {
            out.push(format!(
                "{} block(s) pending free in the snapshot's segments were allocated and freed \
                 before recording began: left out",
                self.pending_at_dump
            ));
        }
        for (d, n) in &self.other_devices {
            out.push(format!(
                "device {d}: {n} event(s) not converted (choose it with --device {d})"
            ));
        }
        out
    }
}

/// Converts snapshot pickle bytes into a trace of `device` (the first device with
/// events when `None`).
pub fn from_snapshot(bytes: &[u8], file: &str, device: Option<usize>) -> Result<Trace, TraceError> {
    convert(&unpickle(bytes, file)?, file, device, false).map(|s| s.trace)
}

/// Like [`from_snapshot`], and also keeps each allocation's frames.
pub fn read_snapshot(
    bytes: &[u8],
    file: &str,
    device: Option<usize>,
) -> Result<SnapshotTrace, TraceError> {
    convert(&unpickle(bytes, file)?, file, device, true)
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

/// Converts a snapshot in JSON (`torch.cuda.memory._snapshot()`'s value as JSON, which
/// `npualloc replay --snapshot x.json` and `npualloc.dump_snapshot()` write) into a trace
/// of `device`, with each allocation's frames: the same fields, read the same way, as a
/// snapshot pickle.
pub fn read_json_snapshot(
    bytes: &[u8],
    file: &str,
    device: Option<usize>,
) -> Result<SnapshotTrace, TraceError> {
    let json: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| err(file, format!("not readable as JSON: {e}")))?;
    convert(&Pickle::from_json(&json), file, device, true)
}

/// Reads a snapshot pickle.
fn unpickle(bytes: &[u8], file: &str) -> Result<Pickle, TraceError> {
    unpickle::read(bytes).map_err(|e| err(file, format!("not a readable pickle: {e}")))
}

fn convert(
    pickle: &Pickle,
    file: &str,
    device: Option<usize>,
    with_frames: bool,
) -> Result<SnapshotTrace, TraceError> {
    let top = pickle.root();
    if !matches!(top.value(), unpickle::Value::Dict(_)) {
        return Err(err(
            file,
            "expected a dict at the top (a memory snapshot in the shape of PyTorch's \
             torch.cuda.memory._snapshot())",
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
            .ok_or_else(|| {
                let segments = top
                    .get("segments")
                    .and_then(|s| s.items())
                    .map_or(0, |s| s.len());
                err(
                    file,
                    format!(
                        "every device trace is empty: the snapshot holds the state at one moment \
                         ({segments} segment(s)) but no allocation history, which a replay needs. \
                         Record one: torch.npu.memory._record_memory_history() (or torch.cuda's) \
                         before the run, then _dump_snapshot(); or run with \
                         NPUALLOC_TRACE=run.trace through npualloc"
                    ),
                )
            })?,
    };
    let Some(entries) = devices[index].items() else {
        return Err(err(file, format!("device_traces[{index}] is not a list")));
    };
    let mut notes = ConvertNotes {
        other_devices: devices
            .iter()
            .enumerate()
            .filter(|(d, _)| *d != index)
            .filter_map(|(d, t)| Some((d, t.items()?.len())))
            .filter(|(_, n)| *n > 0)
            .collect(),
        ..ConvertNotes::default()
    };

    // Trace allocations get ids 0, 1, ... here; blocks live at the start are collected
    // apart and numbered before them at the end.
    let mut ops = Vec::with_capacity(entries.len());
    let mut frames = Vec::new();
    let mut at_start: Vec<(u64, u32, Arc<[Frame]>)> = Vec::new(); // size, stream, frames
    let mut frame_cache = HashMap::new();
    let mut live: HashMap<u64, u64> = HashMap::new(); // addr -> id
    let mut requested: HashSet<u64> = HashSet::new(); // freed, completion not seen yet
    let mut streams: HashMap<u64, u32> = HashMap::from([(0, 0)]);
    let mut label = |stream: u64| {
        let n = streams.len() as u32;
        *streams.entry(stream).or_insert(n)
    };
    let mut frames_for = |n: Node<'_>| {
        if with_frames {
            frames_of(n, &mut frame_cache)
        } else {
            Arc::from([])
        }
    };
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
                live.insert(addr, next_id);
                requested.remove(&addr);
                ops.push(Op::Alloc {
                    id: next_id,
                    size,
                    stream: label(stream),
                });
                frames.push(frames_for(d));
                next_id += 1;
            }
            "free_requested" | "free_completed" => {
                let addr = field("addr")?;
                if let Some(id) = live.remove(&addr) {
                    ops.push(Op::Free { id });
                    if action == "free_requested" {
                        requested.insert(addr);
                    }
                } else if action == "free_completed" && requested.remove(&addr) {
                    // The completion of a free already converted.
                } else {
                    // Allocated before recording began: live from the start until here.
                    let (size, stream) = (field("size")?, field("stream")?);
                    let id = u64::MAX - at_start.len() as u64; // renumbered below
                    at_start.push((size, label(stream), frames_for(d)));
                    notes.live_from_frees += 1;
                    ops.push(Op::Free { id });
                    if action == "free_requested" {
                        requested.insert(addr);
                    }
                }
            }
            other => *notes.ignored_actions.entry(super::clip(other)).or_default() += 1,
        }
    }
    // Blocks still allocated when the snapshot was dumped that the trace never allocated.
    let segments = top.get("segments").and_then(|s| s.items());
    for seg in segments.into_iter().flatten() {
        if seg
            .get("device")
            .and_then(|d| d.as_u64())
            .is_some_and(|d| d != index as u64)
        {
            continue;
        }
        let stream = seg.get("stream").and_then(|s| s.as_u64()).unwrap_or(0);
        for b in seg
            .get("blocks")
            .and_then(|b| b.items())
            .into_iter()
            .flatten()
        {
            let addr = b.get("address").and_then(|a| a.as_u64());
            let known = addr.is_some_and(|a| live.contains_key(&a) || requested.contains(&a));
            match b.get("state").and_then(|s| s.as_str()) {
                Some("active_allocated") if !known => {
                    let size = ["requested_size", "size"]
                        .iter()
                        .filter_map(|k| b.get(k).and_then(|n| n.as_u64()))
                        .find(|&n| n > 0)
                        .unwrap_or(0);
                    at_start.push((size, label(stream), frames_for(b)));
                    notes.live_from_segments += 1;
                }
                Some("active_pending_free") if !known => notes.pending_at_dump += 1,
                _ => {}
            }
        }
    }
    // Number what was live at the start first: ids 0..k, then the trace's shifted by k.
    let k = at_start.len() as u64;
    let renumber = |id: u64| {
        if id > u64::MAX - k {
            u64::MAX - id
        } else {
            id + k
        }
    };
    let mut all = Vec::with_capacity(ops.len() + at_start.len());
    let mut all_frames = Vec::with_capacity(frames.len() + at_start.len());
    for (id, (size, stream, f)) in (0u64..).zip(at_start) {
        notes.live_bytes_at_start = notes.live_bytes_at_start.saturating_add(size);
        all.push(Op::Alloc { id, size, stream });
        all_frames.push(f);
    }
    all.extend(ops.into_iter().map(|op| match op {
        Op::Alloc { id, size, stream } => Op::Alloc {
            id: renumber(id),
            size,
            stream,
        },
        Op::Free { id } => Op::Free { id: renumber(id) },
        other => other,
    }));
    all_frames.extend(frames);
    Ok(SnapshotTrace {
        trace: Trace {
            name: file.to_owned(),
            ops: all,
        },
        frames: if with_frames { all_frames } else { Vec::new() },
        notes,
    })
}
