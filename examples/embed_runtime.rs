//! Embedding npualloc in a Rust runtime: the code of docs/guides/rust-runtime.md.
//!
//! `ToyRuntime` implements [`Device`] for a made-up runtime whose "device memory" is
//! host memory and whose streams run work only when told to (`finish`), which is enough
//! to show what the allocator asks of a runtime and what `record_stream` buys. Then one
//! [`CachingAllocator`] serves it: malloc / free on two streams, statistics, the
//! torch_npu-style summary, and a snapshot PyTorch's memory viewer opens.
//!
//! Run: `cargo run --example embed_runtime` (CI runs it and compares its output with
//! the guide: scripts/check-docs.py).

use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use npualloc::device::MemInfo;
use npualloc::summary::{Fragmentation, MemorySummary};
use npualloc::{
    CachingAllocator, Config, Device, DeviceError, DeviceIndex, DevicePtr, EventHandle, StatType,
    StreamHandle,
};

/// Work counters of one stream: queued so far, and run so far.
#[derive(Default, Clone, Copy)]
struct Progress {
    queued: u64,
    done: u64,
}

#[derive(Default)]
struct State {
    blocks: HashMap<DevicePtr, Layout>,
    used: usize,
    streams: HashMap<StreamHandle, Progress>,
    /// Event -> (stream, the stream's queued count when it was recorded).
    events: HashMap<usize, (StreamHandle, u64)>,
    next_event: usize,
    device_mallocs: u64,
}

/// A one-device runtime: memory from the host heap, streams that run on `finish`.
struct ToyRuntime {
    capacity: usize,
    state: Mutex<State>,
}

impl ToyRuntime {
    fn new(capacity: usize) -> Self {
        ToyRuntime {
            capacity,
            state: Mutex::new(State::default()),
        }
    }
    /// Queues one kernel on `stream` (it runs at the next `finish`).
    fn launch(&self, stream: StreamHandle) {
        self.state.lock().streams.entry(stream).or_default().queued += 1;
    }
    /// Runs everything queued on `stream`.
    fn finish(&self, stream: StreamHandle) {
        let mut s = self.state.lock();
        let p = s.streams.entry(stream).or_default();
        p.done = p.queued;
    }
    fn check(device: DeviceIndex) -> Result<(), DeviceError> {
        match device {
            0 => Ok(()),
            d => Err(DeviceError::InvalidDevice {
                device: d as i64,
                count: 1,
            }),
        }
    }
}

impl Device for ToyRuntime {
    fn name(&self) -> &'static str {
        "toy"
    }
    fn device_count(&self) -> usize {
        1
    }
    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        Self::check(device)?;
        let mut s = self.state.lock();
        if s.used + size > self.capacity {
            return Err(DeviceError::OutOfMemory {
                device,
                requested: size,
            });
        }
        let layout =
            Layout::from_size_align(size.max(1), 512).map_err(|_| DeviceError::OutOfMemory {
                device,
                requested: size,
            })?;
        // SAFETY: the layout has a non-zero size; the block is freed in `free` with the
        // same layout.
        let p = unsafe { alloc(layout) } as DevicePtr;
        if p == 0 {
            return Err(DeviceError::OutOfMemory {
                device,
                requested: size,
            });
        }
        s.blocks.insert(p, layout);
        s.used += size;
        s.device_mallocs += 1;
        Ok(p)
    }
    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError> {
        Self::check(device)?;
        let mut s = self.state.lock();
        let layout = s
            .blocks
            .remove(&ptr)
            .ok_or(DeviceError::InvalidPointer { device, ptr })?;
        s.used -= layout.size();
        // SAFETY: `ptr` came from `alloc` with this layout and is freed once (removed
        // from `blocks` above).
        unsafe { dealloc(ptr as *mut u8, layout) };
        Ok(())
    }
    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError> {
        Self::check(device)?;
        let used = self.state.lock().used;
        Ok(MemInfo {
            free: self.capacity - used,
            total: self.capacity,
        })
    }
    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError> {
        Self::check(device)?;
        let mut s = self.state.lock();
        s.next_event += 1;
        let id = s.next_event;
        s.events.insert(id, (StreamHandle::DEFAULT, 0));
        Ok(EventHandle(id))
    }
    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        s.events
            .remove(&event.0)
            .map(|_| ())
            .ok_or(DeviceError::UnknownEvent {
                device,
                event: event.0,
            })
    }
    fn event_record(
        &self,
        device: DeviceIndex,
        event: EventHandle,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let queued = s.streams.entry(stream).or_default().queued;
        let e = s
            .events
            .get_mut(&event.0)
            .ok_or(DeviceError::UnknownEvent {
                device,
                event: event.0,
            })?;
        *e = (stream, queued);
        Ok(())
    }
    fn event_query(&self, device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError> {
        let s = self.state.lock();
        let (stream, at) = *s.events.get(&event.0).ok_or(DeviceError::UnknownEvent {
            device,
            event: event.0,
        })?;
        Ok(s.streams.get(&stream).copied().unwrap_or_default().done >= at)
    }
    fn event_synchronize(
        &self,
        device: DeviceIndex,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        let stream = self.state.lock().events.get(&event.0).map(|e| e.0);
        let stream = stream.ok_or(DeviceError::UnknownEvent {
            device,
            event: event.0,
        })?;
        self.finish(stream); // a real runtime blocks until the stream got there
        Ok(())
    }
    fn stream_wait_event(
        &self,
        _device: DeviceIndex,
        _stream: StreamHandle,
        _event: EventHandle,
    ) -> Result<(), DeviceError> {
        Ok(()) // a real runtime queues a device-side wait
    }
    fn synchronize_device(&self, _device: DeviceIndex) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        for p in s.streams.values_mut() {
            p.done = p.queued;
        }
        Ok(())
    }
}

fn main() -> Result<(), npualloc::Error> {
    const MIB: usize = 1 << 20;
    let main_stream = StreamHandle::DEFAULT;
    let comm = StreamHandle(7); // whatever handle the runtime gives its streams

    // 1. One allocator per device, over the runtime, with PyTorch-syntax settings.
    let runtime = Arc::new(ToyRuntime::new(256 * MIB));
    let alloc = CachingAllocator::new(runtime.clone(), 0, Config::parse("max_split_size_mb:64")?)?;

    // 2. A tensor produced on the main stream and consumed on the communication stream.
    let grad = alloc.malloc(12 * MIB, main_stream)?;
    runtime.launch(comm); // e.g. an all-reduce reading `grad`, still queued
    alloc.record_stream(grad, comm)?;
    alloc.free(grad)?; // the host is done with it; `comm` may not be

    // 3. The next allocation of that size cannot get grad's block while `comm` runs...
    let next = alloc.malloc(12 * MIB, main_stream)?;
    println!("grad's block reused while comm busy: {}", next == grad);
    alloc.free(next)?;
    // ... and gets it back from the cache once `comm` has run past the free.
    runtime.finish(comm);
    let again = alloc.malloc(12 * MIB, main_stream)?;
    println!(
        "cached block reused after comm ran: {}",
        again == grad || again == next
    );
    alloc.free(again)?;

    // 4. Statistics mean what PyTorch's memory_stats() mean.
    let stats = alloc.stats();
    println!(
        "allocations: {} (peak {} live), device mallocs: {}",
        stats.allocation[StatType::Aggregate].allocated,
        stats.allocation[StatType::Aggregate].peak,
        runtime.state.lock().device_mallocs
    );
    println!(
        "peak allocated {} MiB, reserved now {} MiB",
        stats.allocated_bytes[StatType::Aggregate].peak / MIB as i64,
        stats.reserved_bytes[StatType::Aggregate].current / MIB as i64
    );

    // 5. torch_npu's memory_summary() text, and where the reserve goes.
    let summary = MemorySummary::new(&stats, Some(0))
        .abbreviated(true)
        .with_fragmentation(Fragmentation::of(&alloc.segments()))
        .to_string();
    println!("{}", summary.lines().last().unwrap_or_default());

    // 6. A snapshot in the shape of torch.cuda.memory._snapshot(); as a pickle, PyTorch's
    //    memory viewer (pytorch.org/memory_viz) opens it.
    let snap = npualloc::snapshot::snapshot(&[&alloc]);
    println!(
        "snapshot: {} segments",
        snap["segments"].as_array().map_or(0, |s| s.len())
    );
    let path = std::env::temp_dir().join("embed_runtime.pickle");
    std::fs::write(&path, npualloc::pickle::to_pickle(&snap)).expect("write the snapshot");

    // 7. Give the cache back to the runtime (e.g. before another library allocates).
    alloc.empty_cache()?;
    println!(
        "after empty_cache: {} MiB reserved",
        alloc.stats().reserved_bytes[StatType::Aggregate].current / MIB as i64
    );
    alloc.check_invariants().expect("allocator invariants");
    Ok(())
}
