//! The device abstraction: what the allocator needs from an accelerator runtime.
//!
//! Backends: [`sim`] (a simulated device with real asynchronous streams, used by
//! every test), [`acl`] (Ascend, `libascendcl.so` loaded at run time) and [`cuda`]
//! (`libcudart.so` loaded at run time, for validation on NVIDIA cards).
//!
//! Handles are plain integers so that a runtime's opaque pointers (`aclrtStream`,
//! `cudaEvent_t`) pass through unchanged. Stream `0` is a device's default stream.

pub mod acl;
pub mod cuda;
pub mod sim;

pub use crate::handle::{
    DeviceError, DeviceIndex, DevicePtr, EventHandle, MemInfo, MempoolId, PhysHandle, StreamHandle,
};

/// What the caching allocator needs from a device runtime.
///
/// Every method takes the device index explicitly; implementations must not leave the
/// calling thread's current device changed. Implementations are shared between threads.
pub trait Device: Send + Sync {
    /// Human-readable backend name (`sim`, `acl`, `cuda`).
    fn name(&self) -> &'static str;
    /// Number of devices the runtime exposes.
    fn device_count(&self) -> usize;
    /// Allocates `size` bytes of device memory; the result is at least 512-byte aligned.
    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError>;
    /// Frees memory returned by [`Device::malloc`], after the device's queued work (as
    /// cudaFree and aclrtFree do; the simulated device's manual mode does not wait).
    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError>;
    /// Free and total memory.
    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError>;
    /// Checks that `stream` is a stream of `device` the runtime knows; the default
    /// stream is always valid. Backends that cannot tell return `Ok`.
    fn check_stream(&self, device: DeviceIndex, stream: StreamHandle) -> Result<(), DeviceError> {
        let _ = (device, stream);
        Ok(())
    }
    /// Bytes added to every request before rounding (torch_npu pads by 32 on Ascend).
    fn request_padding(&self) -> usize {
        0
    }
    /// The calling thread's current device (the runtime's notion; 0 if it has none).
    fn current_device(&self) -> Result<DeviceIndex, DeviceError> {
        Ok(0)
    }
    /// Creates an event usable for [`Device::event_record`].
    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError>;
    /// Destroys an event.
    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError>;
    /// Records `event` on `stream`: it completes when all work queued before it has run.
    fn event_record(
        &self,
        device: DeviceIndex,
        event: EventHandle,
        stream: StreamHandle,
    ) -> Result<(), DeviceError>;
    /// Returns whether the last record of `event` has completed (never blocks).
    fn event_query(&self, device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError>;
    /// Blocks the host until the last record of `event` has completed.
    fn event_synchronize(&self, device: DeviceIndex, event: EventHandle)
        -> Result<(), DeviceError>;
    /// Makes future work on `stream` wait, on the device, for `event`'s last record.
    fn stream_wait_event(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        event: EventHandle,
    ) -> Result<(), DeviceError>;
    /// Blocks the host until all work on every stream of `device` has run.
    fn synchronize_device(&self, device: DeviceIndex) -> Result<(), DeviceError>;
    /// Called before cached segments go back to the device: a host framework with its
    /// own launch queue (torch_npu's task queue) drains it here, so no queued kernel can
    /// touch memory being freed. The runtimes' own frees already synchronise the device,
    /// so the default does nothing.
    fn drain_before_free(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        let _ = device;
        Ok(())
    }
    /// Whether all work queued on `stream` has run, without blocking; `false` when the
    /// runtime cannot tell.
    fn stream_query(&self, device: DeviceIndex, stream: StreamHandle) -> Result<bool, DeviceError> {
        let _ = (device, stream);
        Ok(false)
    }
    /// Blocks the host until all work queued on `stream` has run.
    fn synchronize_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let _ = stream;
        self.synchronize_device(device)
    }

    // ---- virtual memory (expandable segments) -----------------------------------------

    /// The mapping granularity in bytes, or an error naming what the runtime lacks
    /// when it cannot reserve address ranges and map physical pages into them.
    fn vm_granularity(&self, device: DeviceIndex) -> Result<usize, DeviceError> {
        let _ = device;
        Err(no_vm(self.name()))
    }
    /// Reserves `size` bytes of address space (no memory behind it).
    fn vm_reserve(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        let _ = (device, size);
        Err(no_vm(self.name()))
    }
    /// Returns an address range of `size` bytes from [`Device::vm_reserve`]; nothing
    /// may be mapped in it.
    fn vm_release(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<(), DeviceError> {
        let _ = (device, va, size);
        Err(no_vm(self.name()))
    }
    /// Allocates `size` bytes of physical memory and maps them at `va` (inside a
    /// reservation, granularity-aligned); out of memory leaves nothing behind.
    fn vm_map(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<PhysHandle, DeviceError> {
        let _ = (device, va, size);
        Err(no_vm(self.name()))
    }
    /// Unmaps the `size` bytes [`Device::vm_map`] mapped at `va` and frees their
    /// physical memory. It does not synchronise: the caller makes sure no queued work
    /// touches the range.
    fn vm_unmap(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
        handle: PhysHandle,
    ) -> Result<(), DeviceError> {
        let _ = (device, va, size, handle);
        Err(no_vm(self.name()))
    }
}

/// The error of the virtual-memory methods of a backend without virtual memory.
fn no_vm(backend: &str) -> DeviceError {
    DeviceError::Unavailable(format!(
        "the {backend} backend has no virtual-memory support"
    ))
}

/// A runtime's "exchange this thread's stream-capture mode" function
/// (`cudaThreadExchangeStreamCaptureMode`, `aclmdlRICaptureThreadExchangeMode`): takes the
/// new mode, hands back the old one, returns 0 on success.
pub(crate) type ExchangeCaptureMode = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;

/// Runs `f` with this thread's graph-capture mode relaxed (mode 2 in CUDA and ACL alike),
/// then puts the old mode back; without the function, just runs `f`. PyTorch does this
/// around an allocation made during a capture (`cudaMallocMaybeCapturing`): in the default
/// (global) mode an allocation or mapping is an unsafe call that fails and breaks the
/// capture (seen with CUDA on an H200). Memory taken during a capture is only handed out
/// by the allocator, never freed while the graph lives, so relaxing is safe there.
pub(crate) fn with_capture_mode_relaxed<T>(
    exchange: Option<ExchangeCaptureMode>,
    f: impl FnOnce() -> T,
) -> T {
    const RELAXED: std::ffi::c_int = 2;
    let Some(exchange) = exchange else {
        return f();
    };
    let mut mode = RELAXED;
    // SAFETY: valid in/out pointer; swaps this thread's mode, restored below.
    let swapped = unsafe { exchange(&mut mode) } == 0;
    let out = f();
    if swapped {
        // SAFETY: puts back the mode the thread had.
        unsafe { exchange(&mut mode) };
    }
    out
}
