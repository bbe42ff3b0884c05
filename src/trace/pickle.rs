//! Conversion of PyTorch / torch_npu memory snapshots (`torch.cuda.memory._dump_snapshot()`,
//! `torch.npu.memory._dump_snapshot()` pickles) into traces.
//!
//! Uses `device_traces[device]`: `alloc` → `a`, `free_requested` → `f` (a
//! `free_completed` without a request also frees); `segment_*`, `snapshot`, `oom` and other
//! actions are ignored. Addresses are reused over time, so each `alloc` gets a fresh id.
//! Stream handles map to small integers: 0 stays 0, others are numbered in order of
//! first appearance.

use std::collections::{BTreeMap, HashMap};

use serde_pickle::{DeOptions, HashableValue, Value};

use super::{Op, Trace, TraceError};

fn err(file: &str, message: impl Into<String>) -> TraceError {
    TraceError {
        file: file.to_owned(),
        line: 0,
        message: message.into(),
    }
}

fn get<'a>(d: &'a BTreeMap<HashableValue, Value>, key: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(key.to_owned()))
}

fn as_u64(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::I64(n) if *n >= 0 => Some(*n as u64),
        Value::Int(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// Converts snapshot pickle bytes into a trace of `device` (the first device with
/// events when `None`).
pub fn from_snapshot(bytes: &[u8], file: &str, device: Option<usize>) -> Result<Trace, TraceError> {
    let value = serde_pickle::value_from_slice(bytes, DeOptions::new())
        .map_err(|e| err(file, format!("not a readable pickle: {e}")))?;
    let Value::Dict(top) = value else {
        return Err(err(
            file,
            "expected a dict at the top (a PyTorch memory snapshot)",
        ));
    };
    let Some(Value::List(devices)) = get(&top, "device_traces") else {
        return Err(err(
            file,
            "no 'device_traces' list: record memory history before dumping the snapshot",
        ));
    };
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
            .position(|t| matches!(t, Value::List(l) if !l.is_empty()))
            .ok_or_else(|| err(file, "every device trace is empty"))?,
    };
    let Value::List(entries) = &devices[index] else {
        return Err(err(file, format!("device_traces[{index}] is not a list")));
    };

    let mut ops = Vec::with_capacity(entries.len());
    let mut live: HashMap<u64, u64> = HashMap::new(); // addr -> id
    let mut streams: HashMap<u64, u32> = HashMap::from([(0, 0)]);
    let mut next_id = 0u64;
    for (i, e) in entries.iter().enumerate() {
        let Value::Dict(d) = e else {
            return Err(err(
                file,
                format!("device_traces[{index}][{i}] is not a dict"),
            ));
        };
        let action = match get(d, "action") {
            Some(Value::String(s)) => s.as_str(),
            _ => {
                return Err(err(
                    file,
                    format!("device_traces[{index}][{i}] has no 'action' string"),
                ))
            }
        };
        let field = |name: &str| {
            as_u64(get(d, name)).ok_or_else(|| {
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
    Ok(Trace {
        name: file.to_owned(),
        ops,
    })
}
