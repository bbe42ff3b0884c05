//! A simulated device with real asynchronous streams and events.
//!
//! - **Threaded mode**: each stream has a worker thread that runs queued operations
//!   (kernels, event records, waits) as they arrive, so races behave like a device. A
//!   device free waits for all queued work first, as cudaFree and aclrtFree do.
//! - **Manual mode**: nothing runs until a test calls [`SimDevice::step`] or
//!   [`SimDevice::complete_stream`], so tests decide exactly when work finishes (a
//!   device free leaves queued work queued: replays model streams lagging the host).
//!
//! Memory is *backed* (kernels read and write real host buffers) or *unbacked*
//! (addresses only, so a 60 GiB trace costs megabytes). Capacity, device count and
//! fault injection are configurable, and counters report what the allocator did.
//! Virtual memory (for expandable segments): address ranges are reserved in a window of
//! their own, pages of `SimConfig::vm_granularity` bytes are mapped against the
//! capacity, and misuse (mapping outside a reservation or twice, unmapping what is not
//! mapped, releasing a range with pages mapped) counts as a violation.
//! Addresses come in the order `SimConfig::address_order` sets (`addresses.rs`).

mod addresses;
mod faults;
mod memory;
mod stream;

pub use addresses::AddressOrder;
pub use faults::InjectedFailure;
pub use memory::SimMemory;
pub use stream::Kernel;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use super::{
    Device, DeviceError, DeviceIndex, DevicePtr, EventHandle, MemInfo, PhysHandle, StreamHandle,
};
use faults::{injected_failure, Faults};
use stream::{ChangeLog, EventState, Op, Progress, StreamState};

/// How queued work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimMode {
    /// A worker thread per stream runs work as it arrives.
    Threaded,
    /// Work runs only when a test steps a stream.
    Manual,
}

/// Settings of a [`SimDevice`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Number of devices.
    pub devices: usize,
    /// Capacity of each device in bytes.
    pub capacity: usize,
    /// Back device memory with host memory (kernels can read and write it).
    pub backed: bool,
    /// Threaded or manual execution.
    pub mode: SimMode,
    /// Virtual-memory mapping granularity in bytes; 0 = no virtual-memory support.
    pub vm_granularity: usize,
    /// The order in which allocations and reservations get their addresses.
    pub address_order: AddressOrder,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 1,
            capacity: 64 << 30,
            backed: false,
            mode: SimMode::Manual,
            vm_granularity: 2 << 20,
            address_order: AddressOrder::Increasing,
        }
    }
}

/// Counters of one simulated device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Successful device allocations.
    pub mallocs: u64,
    /// Successful device frees.
    pub frees: u64,
    /// Bytes currently allocated.
    pub live_bytes: usize,
    /// Highest `live_bytes` seen.
    pub peak_bytes: usize,
    /// Live device allocations.
    pub live_allocations: usize,
    /// Events created.
    pub events_created: u64,
    /// Events destroyed.
    pub events_destroyed: u64,
    /// Event records queued.
    pub event_records: u64,
    /// Device-side waits queued (`stream_wait_event` calls that found a recorded event).
    pub stream_waits: u64,
    /// Successful virtual-memory page mappings.
    pub maps: u64,
    /// Successful unmappings.
    pub unmaps: u64,
    /// Live address-space reservations.
    pub reservations: usize,
    /// Host-blocking synchronisations (event, stream or device).
    pub synchronizations: u64,
    /// Device-side waits that held their stream back: the record they wait for had not
    /// run when the stream reached them (a stream stalled on another).
    pub stalled_waits: u64,
    /// Misuses seen: freeing an unknown pointer, using a destroyed event, a kernel
    /// touching memory that is not allocated.
    pub violations: u64,
    /// Failures injected so far (`fail_nth_*`) that fired.
    pub injected_faults: u64,
    /// Calls refused because a graph capture was open (`set_graph_capture`).
    pub capture_violations: u64,
}

struct DevState {
    index: DeviceIndex,
    memory: Arc<SimMemory>,
    streams: RwLock<HashMap<StreamHandle, Arc<StreamState>>>,
    events: Mutex<HashMap<usize, Arc<EventState>>>,
    progress: Arc<Progress>,
    changes: Arc<ChangeLog>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    faults: Faults,
    mallocs: AtomicU64,
    frees: AtomicU64,
    maps: AtomicU64,
    unmaps: AtomicU64,
    events_created: AtomicU64,
    events_destroyed: AtomicU64,
    event_records: AtomicU64,
    stream_waits: AtomicU64,
    syncs: AtomicU64,
}

/// Threaded mode: blocks until every stream of `d` has run all its queued work.
fn wait_all_idle(d: &DevState) {
    let streams: Vec<_> = d.streams.read().values().cloned().collect();
    d.progress
        .wait_until(|| streams.iter().all(|s| s.is_idle()), || false);
}

/// The end of a host wait: fine if `done`, else the error of `call` that can never
/// finish (a stream waits on an event never recorded to completion).
fn never_completes(done: bool, call: &'static str, message: &str) -> Result<(), DeviceError> {
    if done {
        return Ok(());
    }
    Err(DeviceError::Runtime {
        call,
        code: 507000,
        message: message.into(),
    })
}

/// The simulated device (all of its devices).
pub struct SimDevice {
    config: SimConfig,
    devices: Vec<DevState>,
    next_handle: AtomicUsize,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("config", &self.config)
            .finish()
    }
}

impl SimDevice {
    /// Creates a simulated device with the default stream of each device ready.
    pub fn new(config: SimConfig) -> Arc<SimDevice> {
        let devices = (0..config.devices)
            .map(|index| DevState {
                index,
                memory: Arc::new(SimMemory::new(
                    index,
                    config.capacity,
                    config.backed,
                    config.address_order,
                )),
                streams: RwLock::new(HashMap::new()),
                events: Mutex::new(HashMap::new()),
                progress: Arc::new(Progress::default()),
                changes: Arc::new(ChangeLog::default()),
                workers: Mutex::new(Vec::new()),
                faults: Faults::default(),
                mallocs: AtomicU64::new(0),
                frees: AtomicU64::new(0),
                maps: AtomicU64::new(0),
                unmaps: AtomicU64::new(0),
                events_created: AtomicU64::new(0),
                events_destroyed: AtomicU64::new(0),
                event_records: AtomicU64::new(0),
                stream_waits: AtomicU64::new(0),
                syncs: AtomicU64::new(0),
            })
            .collect();
        let sim = SimDevice {
            config,
            devices,
            next_handle: AtomicUsize::new(0x1000),
        };
        for d in &sim.devices {
            sim.add_stream(d, StreamHandle::DEFAULT);
        }
        Arc::new(sim)
    }

    /// The settings this device was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn dev(&self, device: DeviceIndex) -> Result<&DevState, DeviceError> {
        self.devices.get(device).ok_or(DeviceError::InvalidDevice {
            device: device as i64,
            count: self.devices.len(),
        })
    }

    fn add_stream(&self, d: &DevState, handle: StreamHandle) {
        let s = Arc::new(StreamState::new(handle.0, d.changes.clone()));
        if self.config.mode == SimMode::Threaded {
            let (s2, mem, prog) = (s.clone(), d.memory.clone(), d.progress.clone());
            let h = std::thread::Builder::new()
                .name(format!("sim-dev{}-{:#x}", d.index, handle.0))
                .spawn(move || s2.run_worker(mem, prog))
                .expect("spawn simulated stream worker");
            d.workers.lock().push(h);
        }
        d.streams.write().insert(handle, s);
    }

    /// Creates a new stream on `device`.
    pub fn create_stream(&self, device: DeviceIndex) -> Result<StreamHandle, DeviceError> {
        let d = self.dev(device)?;
        let handle = StreamHandle(self.next_handle.fetch_add(0x10, Ordering::Relaxed));
        self.add_stream(d, handle);
        Ok(handle)
    }

    fn stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<Arc<StreamState>, DeviceError> {
        let d = self.dev(device)?;
        d.streams
            .read()
            .get(&stream)
            .cloned()
            .ok_or(DeviceError::UnknownStream { device, stream })
    }

    fn event(
        &self,
        device: DeviceIndex,
        event: EventHandle,
    ) -> Result<Arc<EventState>, DeviceError> {
        let d = self.dev(device)?;
        let found = d.events.lock().get(&event.0).cloned();
        found.ok_or_else(|| {
            d.memory.note_violation();
            DeviceError::UnknownEvent {
                device,
                event: event.0,
            }
        })
    }

    /// Queues a kernel on `stream`.
    pub fn launch(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        kernel: impl FnOnce(&SimMemory) + Send + 'static,
    ) -> Result<(), DeviceError> {
        self.stream(device, stream)?
            .push(Op::Kernel(Box::new(kernel)));
        Ok(())
    }

    /// The memory of `device`, for host-side reads after synchronising.
    pub fn memory(&self, device: DeviceIndex) -> Result<Arc<SimMemory>, DeviceError> {
        Ok(self.dev(device)?.memory.clone())
    }

    /// Manual mode: counts each stream blocked at a device-side wait as stalled there
    /// (once per wait); call it when the streams have made what progress they can.
    pub fn note_stalls(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        for s in self.dev(device)?.streams.read().values() {
            s.note_blocked();
        }
        Ok(())
    }

    /// Manual mode: [`SimDevice::note_stalls`] for the given streams only (unknown
    /// handles are skipped).
    pub fn note_stalls_on(
        &self,
        device: DeviceIndex,
        streams: impl IntoIterator<Item = StreamHandle>,
    ) -> Result<(), DeviceError> {
        let map = self.dev(device)?.streams.read();
        for s in streams {
            if let Some(s) = map.get(&s) {
                s.note_blocked();
            }
        }
        Ok(())
    }

    /// Starts (on the first call) and drains the log of `device`'s streams whose queue
    /// changed (operations queued or run) since the previous call, each once. Nothing
    /// is logged before the first call.
    pub fn changed_streams(&self, device: DeviceIndex) -> Result<Vec<StreamHandle>, DeviceError> {
        let d = self.dev(device)?;
        d.changes.listen();
        let mut v = d.changes.take();
        if v.is_empty() {
            return Ok(Vec::new());
        }
        v.sort_unstable();
        v.dedup();
        Ok(v.into_iter().map(StreamHandle).collect())
    }

    /// (operations queued on `stream` so far, operations it has run), numbered from 1.
    pub fn position(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(u64, u64), DeviceError> {
        Ok(self.stream(device, stream)?.position())
    }

    /// Whether `stream`'s next operations run after operation `n` of `other` (queued
    /// earlier on `other`, or ordered there through events waited on).
    pub fn ordered_after(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        other: StreamHandle,
        n: u64,
    ) -> Result<bool, DeviceError> {
        let s = self.stream(device, stream)?;
        Ok(stream == other || s.ordered_after(other.0) >= n)
    }

    /// Manual mode: runs up to `max` queued operations of `stream`; returns how many ran.
    pub fn step(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        max: usize,
    ) -> Result<usize, DeviceError> {
        let d = self.dev(device)?;
        let s = self.stream(device, stream)?;
        Ok(s.step(max, &d.memory, &d.progress))
    }

    /// Runs (manual mode) or waits for (threaded mode) everything queued on `stream`.
    /// In manual mode, work blocked on an unsatisfied wait stays queued; returns the
    /// number of operations still pending.
    pub fn complete_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<u64, DeviceError> {
        let d = self.dev(device)?;
        let s = self.stream(device, stream)?;
        match self.config.mode {
            SimMode::Manual => {
                s.step(usize::MAX, &d.memory, &d.progress);
            }
            SimMode::Threaded => d.progress.wait_until(|| s.is_idle(), || false),
        }
        Ok(s.pending())
    }

    /// Operations queued on `stream` that have not run.
    pub fn pending(&self, device: DeviceIndex, stream: StreamHandle) -> Result<u64, DeviceError> {
        Ok(self.stream(device, stream)?.pending())
    }

    /// Manual mode: steps every stream until none can make progress. Returns whether
    /// all streams are idle afterwards.
    fn run_until_idle(&self, d: &DevState) -> bool {
        loop {
            let streams: Vec<_> = d.streams.read().values().cloned().collect();
            let ran: usize = streams
                .iter()
                .map(|s| s.step(usize::MAX, &d.memory, &d.progress))
                .sum();
            if streams.iter().all(|s| s.is_idle()) {
                return true;
            }
            if ran == 0 {
                return false;
            }
        }
    }

    /// Current counters of `device`.
    pub fn counters(&self, device: DeviceIndex) -> SimCounters {
        let Ok(d) = self.dev(device) else {
            return SimCounters::default();
        };
        SimCounters {
            mallocs: d.mallocs.load(Ordering::Relaxed),
            frees: d.frees.load(Ordering::Relaxed),
            maps: d.maps.load(Ordering::Relaxed),
            unmaps: d.unmaps.load(Ordering::Relaxed),
            reservations: d.memory.reservations(),
            live_bytes: d.memory.live_bytes(),
            peak_bytes: d.memory.peak_bytes(),
            live_allocations: d.memory.live_allocations(),
            events_created: d.events_created.load(Ordering::Relaxed),
            events_destroyed: d.events_destroyed.load(Ordering::Relaxed),
            event_records: d.event_records.load(Ordering::Relaxed),
            stream_waits: d.stream_waits.load(Ordering::Relaxed),
            synchronizations: d.syncs.load(Ordering::Relaxed),
            stalled_waits: d.streams.read().values().map(|s| s.stalls()).sum(),
            violations: d.memory.violations(),
            injected_faults: d.faults.fired.load(Ordering::Relaxed),
            capture_violations: d.faults.capture_violations.load(Ordering::Relaxed),
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        for d in &self.devices {
            for s in d.streams.read().values() {
                s.stop();
            }
            d.progress.notify();
            for h in d.workers.lock().drain(..) {
                let _ = h.join();
            }
        }
    }
}

impl Device for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        let d = self.dev(device)?;
        if let Some(e) = d.faults.injected("sim_malloc", d.index, size) {
            return Err(e);
        }
        let ptr = d.memory.allocate(size)?;
        d.mallocs.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError> {
        let d = self.dev(device)?;
        d.faults.refuse_if_capturing("sim_free")?;
        if self.config.mode == SimMode::Threaded {
            // cudaFree and aclrtFree wait for the device's queued work first. (Manual mode
            // leaves it queued: replays model streams that lag behind the host.)
            wait_all_idle(d);
        }
        d.memory.release(ptr)?;
        d.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError> {
        let d = self.dev(device)?;
        let total = d.memory.capacity();
        Ok(MemInfo {
            free: total - d.memory.live_bytes(),
            total,
        })
    }

    fn check_stream(&self, device: DeviceIndex, stream: StreamHandle) -> Result<(), DeviceError> {
        self.stream(device, stream).map(|_| ())
    }

    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError> {
        let d = self.dev(device)?;
        if d.faults.fire(&d.faults.event_countdown) {
            return Err(injected_failure("sim_event_create"));
        }
        let handle = self.next_handle.fetch_add(0x10, Ordering::Relaxed);
        d.events
            .lock()
            .insert(handle, Arc::new(EventState::default()));
        d.events_created.fetch_add(1, Ordering::Relaxed);
        Ok(EventHandle(handle))
    }

    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError> {
        let d = self.dev(device)?;
        if d.events.lock().remove(&event.0).is_none() {
            d.memory.note_violation();
            return Err(DeviceError::UnknownEvent {
                device,
                event: event.0,
            });
        }
        d.events_destroyed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn event_record(
        &self,
        device: DeviceIndex,
        event: EventHandle,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let ev = self.event(device, event)?;
        let s = self.stream(device, stream)?;
        let d = self.dev(device)?;
        if d.faults.fire(&d.faults.record_countdown) {
            return Err(injected_failure("sim_event_record"));
        }
        s.push_record(stream.0, ev.record());
        self.dev(device)?
            .event_records
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn event_query(&self, device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError> {
        let ev = self.event(device, event)?;
        let d = self.dev(device)?;
        d.faults.refuse_if_capturing("sim_event_query")?;
        if d.faults.fire(&d.faults.query_countdown) {
            return Err(injected_failure("sim_event_query"));
        }
        Ok(ev.is_complete())
    }

    fn event_synchronize(
        &self,
        device: DeviceIndex,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        let ev = self.event(device, event)?;
        let d = self.dev(device)?;
        d.faults.refuse_if_capturing("sim_event_synchronize")?;
        d.syncs.fetch_add(1, Ordering::Relaxed);
        match self.config.mode {
            SimMode::Threaded => d.progress.wait_until(|| ev.is_complete(), || false),
            SimMode::Manual => {
                // The host waits: the device runs until the event completes.
                self.run_until_idle(d);
            }
        }
        never_completes(
            ev.is_complete(),
            "sim_event_synchronize",
            "event can never complete: its stream waits on an event never recorded to completion",
        )
    }

    fn stream_wait_event(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        let ev = self.event(device, event)?;
        let s = self.stream(device, stream)?;
        if let Some(mark) = ev.latest() {
            s.push_wait(mark);
            self.dev(device)?
                .stream_waits
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn synchronize_device(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        let d = self.dev(device)?;
        d.faults.refuse_if_capturing("sim_synchronize_device")?;
        d.syncs.fetch_add(1, Ordering::Relaxed);
        let idle = match self.config.mode {
            SimMode::Threaded => {
                wait_all_idle(d);
                true
            }
            SimMode::Manual => self.run_until_idle(d),
        };
        never_completes(
            idle,
            "sim_synchronize_device",
            "device cannot drain: a stream waits on an event that never completes",
        )
    }

    fn stream_query(&self, device: DeviceIndex, stream: StreamHandle) -> Result<bool, DeviceError> {
        self.dev(device)?
            .faults
            .refuse_if_capturing("sim_stream_query")?;
        Ok(self.stream(device, stream)?.is_idle())
    }

    fn synchronize_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let d = self.dev(device)?;
        let s = self.stream(device, stream)?;
        d.faults.refuse_if_capturing("sim_synchronize_stream")?;
        d.syncs.fetch_add(1, Ordering::Relaxed);
        match self.config.mode {
            SimMode::Threaded => d.progress.wait_until(|| s.is_idle(), || false),
            SimMode::Manual => {
                s.step(usize::MAX, &d.memory, &d.progress);
                if !s.is_idle() {
                    // Blocked on another stream's event: run the others too.
                    self.run_until_idle(d);
                }
            }
        }
        never_completes(
            s.is_idle(),
            "sim_synchronize_stream",
            "stream cannot drain: it waits on an event that never completes",
        )
    }

    fn vm_granularity(&self, device: DeviceIndex) -> Result<usize, DeviceError> {
        self.dev(device)?;
        match self.config.vm_granularity {
            0 => Err(DeviceError::Unavailable(
                "the simulated device was made without virtual-memory support \
                 (SimConfig::vm_granularity = 0)"
                    .into(),
            )),
            g => Ok(g),
        }
    }

    fn vm_reserve(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        let g = self.vm_granularity(device)?;
        self.dev(device)?.memory.reserve(size, g)
    }

    fn vm_release(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        _size: usize,
    ) -> Result<(), DeviceError> {
        self.vm_granularity(device)?;
        self.dev(device)?.memory.release_reservation(va)
    }

    fn vm_map(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<PhysHandle, DeviceError> {
        let g = self.vm_granularity(device)?;
        let d = self.dev(device)?;
        if let Some(e) = d.faults.injected("sim_vm_map", d.index, size) {
            return Err(e);
        }
        d.memory.map(va, size, g)?;
        d.maps.fetch_add(1, Ordering::Relaxed);
        Ok(PhysHandle(va))
    }

    fn vm_unmap(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        _size: usize,
        handle: PhysHandle,
    ) -> Result<(), DeviceError> {
        self.vm_granularity(device)?;
        let d = self.dev(device)?;
        d.faults.refuse_if_capturing("sim_vm_unmap")?;
        if handle.0 != va {
            d.memory.note_violation();
            return Err(DeviceError::Runtime {
                call: "sim_vm_unmap",
                code: 107000,
                message: format!("handle {:#x} was not mapped at {va:#x}", handle.0),
            });
        }
        d.memory.unmap(va)?;
        d.unmaps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
