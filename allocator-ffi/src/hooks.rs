//! Runtime hooks: a host framework (torch_npu) replaces event and device-synchronise
//! operations with its own queue-aware ones (docs/design.md, "The host framework's task queue").

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use npualloc_core::device::{
    DeviceError, DeviceIndex, DevicePtr, EventHandle, MemInfo, PhysHandle, StreamHandle,
};
use npualloc_core::Device;

use crate::error::{Failure, NPUALLOC_ERR_INVALID_ARGUMENT};
use crate::types::npualloc_stream;

/// Operations a host framework supplies; each returns 0 on success. A NULL member keeps
/// the backend's own operation, but the five event members come as a set: all NULL or
/// all set. The functions may be called from any thread and must be thread-safe.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct npualloc_runtime_hooks {
    /// Passed back as the first argument of every hook.
    pub ctx: *mut c_void,
    /// Creates an event on `device` and stores it in `*ev`.
    pub event_create: Option<
        unsafe extern "C" fn(ctx: *mut c_void, device: c_int, ev: *mut *mut c_void) -> c_int,
    >,
    /// Destroys an event.
    pub event_destroy: Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *mut c_void) -> c_int>,
    /// Records `ev` on stream `s`.
    pub event_record: Option<
        unsafe extern "C" fn(ctx: *mut c_void, ev: *mut c_void, s: npualloc_stream) -> c_int,
    >,
    /// Stores 1 in `*done` if `ev` completed, else 0.
    pub event_query:
        Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *mut c_void, done: *mut c_int) -> c_int>,
    /// Blocks until `ev` completed.
    pub event_synchronize: Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *mut c_void) -> c_int>,
    /// Blocks until all work queued for `device` (including the host framework's own
    /// task queue) has run. Also called before cached segments are freed.
    pub device_synchronize: Option<unsafe extern "C" fn(ctx: *mut c_void, device: c_int) -> c_int>,
}

/// Checks that the event hooks are all set or all NULL.
pub(crate) fn validate(h: &npualloc_runtime_hooks) -> Result<(), Failure> {
    let set = [
        h.event_create.is_some(),
        h.event_destroy.is_some(),
        h.event_record.is_some(),
        h.event_query.is_some(),
        h.event_synchronize.is_some(),
    ];
    if set.iter().any(|&s| s) && !set.iter().all(|&s| s) {
        return Err(Failure::new(
            NPUALLOC_ERR_INVALID_ARGUMENT,
            "event hooks come as a set: event_create, event_destroy, event_record, event_query and event_synchronize must all be set or all be NULL",
        ));
    }
    Ok(())
}

/// A backend with some operations replaced by hooks.
pub(crate) struct HookedDevice {
    inner: Arc<dyn Device>,
    hooks: npualloc_runtime_hooks,
}

// SAFETY: the hooks' contract (documented on `npualloc_runtime_hooks`) requires them to
// be callable from any thread; `ctx` is only ever passed back to them.
unsafe impl Send for HookedDevice {}
// SAFETY: as above; the struct itself is immutable after construction.
unsafe impl Sync for HookedDevice {}

impl HookedDevice {
    pub fn new(inner: Arc<dyn Device>, hooks: npualloc_runtime_hooks) -> Self {
        HookedDevice { inner, hooks }
    }
}

fn check(call: &'static str, rc: c_int) -> Result<(), DeviceError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(DeviceError::Runtime {
            call,
            code: rc.into(),
            message: "runtime hook failed".into(),
        })
    }
}

impl Device for HookedDevice {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn device_count(&self) -> usize {
        self.inner.device_count()
    }
    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        self.inner.malloc(device, size)
    }
    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.inner.free(device, ptr)
    }
    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError> {
        self.inner.mem_info(device)
    }
    fn check_stream(&self, device: DeviceIndex, stream: StreamHandle) -> Result<(), DeviceError> {
        self.inner.check_stream(device, stream)
    }
    fn current_device(&self) -> Result<DeviceIndex, DeviceError> {
        self.inner.current_device()
    }
    fn request_padding(&self) -> usize {
        self.inner.request_padding()
    }
    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError> {
        match self.hooks.event_create {
            Some(f) => {
                let mut ev: *mut c_void = std::ptr::null_mut();
                // SAFETY: a host-supplied hook with the documented signature; `ev` is a
                // valid out-pointer for the duration of the call.
                check("hook event_create", unsafe {
                    f(self.hooks.ctx, device as c_int, &mut ev)
                })?;
                Ok(EventHandle(ev as usize))
            }
            None => self.inner.event_create(device),
        }
    }
    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError> {
        match self.hooks.event_destroy {
            // SAFETY: host-supplied hook; the event came from its event_create.
            Some(f) => check("hook event_destroy", unsafe {
                f(self.hooks.ctx, event.0 as *mut c_void)
            }),
            None => self.inner.event_destroy(device, event),
        }
    }
    fn event_record(
        &self,
        device: DeviceIndex,
        event: EventHandle,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        match self.hooks.event_record {
            // SAFETY: host-supplied hook; the event came from its event_create and the
            // stream from the caller of the allocator.
            Some(f) => check("hook event_record", unsafe {
                f(
                    self.hooks.ctx,
                    event.0 as *mut c_void,
                    stream.0 as npualloc_stream,
                )
            }),
            None => self.inner.event_record(device, event, stream),
        }
    }
    fn event_query(&self, device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError> {
        match self.hooks.event_query {
            Some(f) => {
                let mut done: c_int = 0;
                // SAFETY: host-supplied hook; `done` is a valid out-pointer during the call.
                check("hook event_query", unsafe {
                    f(self.hooks.ctx, event.0 as *mut c_void, &mut done)
                })?;
                Ok(done != 0)
            }
            None => self.inner.event_query(device, event),
        }
    }
    fn event_synchronize(
        &self,
        device: DeviceIndex,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        match self.hooks.event_synchronize {
            // SAFETY: host-supplied hook; the event came from its event_create.
            Some(f) => check("hook event_synchronize", unsafe {
                f(self.hooks.ctx, event.0 as *mut c_void)
            }),
            None => self.inner.event_synchronize(device, event),
        }
    }
    fn stream_wait_event(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        self.inner.stream_wait_event(device, stream, event)
    }
    fn drain_before_free(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        match self.hooks.device_synchronize {
            Some(_) => self.synchronize_device(device),
            None => self.inner.drain_before_free(device),
        }
    }
    fn synchronize_device(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        match self.hooks.device_synchronize {
            // SAFETY: host-supplied hook with the documented signature.
            Some(f) => check("hook device_synchronize", unsafe {
                f(self.hooks.ctx, device as c_int)
            }),
            None => self.inner.synchronize_device(device),
        }
    }
    fn stream_query(&self, device: DeviceIndex, stream: StreamHandle) -> Result<bool, DeviceError> {
        self.inner.stream_query(device, stream)
    }
    fn synchronize_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(device, stream)
    }
    fn vm_granularity(&self, device: DeviceIndex) -> Result<usize, DeviceError> {
        self.inner.vm_granularity(device)
    }
    fn vm_reserve(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        self.inner.vm_reserve(device, size)
    }
    fn vm_release(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<(), DeviceError> {
        self.inner.vm_release(device, va, size)
    }
    fn vm_map(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<PhysHandle, DeviceError> {
        self.inner.vm_map(device, va, size)
    }
    fn vm_unmap(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
        handle: PhysHandle,
    ) -> Result<(), DeviceError> {
        self.inner.vm_unmap(device, va, size, handle)
    }
}
