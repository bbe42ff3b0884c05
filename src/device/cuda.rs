//! The CUDA runtime backend: `libcudart.so`, loaded at run time, so the allocator can
//! be validated on NVIDIA hardware with a real framework (PyTorch's
//! `CUDAPluggableAllocator` takes the same two C functions as torch_npu's).
//!
//! Library: `NPUALLOC_CUDA_LIB`, else `libcudart.so`, then versioned names (a process
//! that already loaded PyTorch's bundled runtime finds it by its soname).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsString};

use libloading::Library;

use super::loader::{self, Candidate};
use super::{Device, DeviceError, DeviceIndex, DevicePtr, EventHandle, MemInfo, StreamHandle};

type CudaError = c_int;
type Ptr = *mut c_void;
const CUDA_SUCCESS: CudaError = 0;
const CUDA_ERROR_MEMORY_ALLOCATION: CudaError = 2;
const CUDA_ERROR_NOT_READY: CudaError = 600;
const CUDA_EVENT_DISABLE_TIMING: c_uint = 0x02;

struct Fns {
    malloc: unsafe extern "C" fn(*mut Ptr, usize) -> CudaError,
    free: unsafe extern "C" fn(Ptr) -> CudaError,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CudaError,
    event_create_with_flags: unsafe extern "C" fn(*mut Ptr, c_uint) -> CudaError,
    event_record: unsafe extern "C" fn(Ptr, Ptr) -> CudaError,
    event_query: unsafe extern "C" fn(Ptr) -> CudaError,
    event_synchronize: unsafe extern "C" fn(Ptr) -> CudaError,
    event_destroy: unsafe extern "C" fn(Ptr) -> CudaError,
    stream_wait_event: unsafe extern "C" fn(Ptr, Ptr, c_uint) -> CudaError,
    get_device: unsafe extern "C" fn(*mut c_int) -> CudaError,
    set_device: unsafe extern "C" fn(c_int) -> CudaError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> CudaError,
    device_synchronize: unsafe extern "C" fn() -> CudaError,
    get_last_error: unsafe extern "C" fn() -> CudaError,
    get_error_string: Option<unsafe extern "C" fn(CudaError) -> *const c_char>,
}

/// The CUDA backend.
pub struct CudaDevice {
    f: Fns,
    count: usize,
    path: String,
    _lib: Library,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("path", &self.path)
            .field("devices", &self.count)
            .finish()
    }
}

impl CudaDevice {
    /// Loads the CUDA runtime (see the module docs for the search order).
    pub fn load() -> Result<CudaDevice, DeviceError> {
        let (candidates, explicit) =
            match std::env::var_os("NPUALLOC_CUDA_LIB").filter(|p| !p.is_empty()) {
                Some(p) => (
                    vec![Candidate {
                        path: p,
                        source: "NPUALLOC_CUDA_LIB".into(),
                    }],
                    true,
                ),
                None => (
                    [
                        "libcudart.so",
                        "libcudart.so.13",
                        "libcudart.so.12",
                        "libcudart.so.11.0",
                    ]
                    .iter()
                    .map(|n| Candidate {
                        path: OsString::from(n),
                        source: "the loader's search path".into(),
                    })
                    .collect(),
                    false,
                ),
            };
        let (lib, path) = loader::open(&candidates, explicit)?;
        // SAFETY: each type is the CUDA runtime function's C signature (cuda_runtime_api.h;
        // cudaError_t is an int-sized enum, handles are pointers).
        let f = unsafe {
            let p = path.as_str();
            Fns {
                malloc: loader::required(&lib, p, "cudaMalloc")?,
                free: loader::required(&lib, p, "cudaFree")?,
                mem_get_info: loader::required(&lib, p, "cudaMemGetInfo")?,
                event_create_with_flags: loader::required(&lib, p, "cudaEventCreateWithFlags")?,
                event_record: loader::required(&lib, p, "cudaEventRecord")?,
                event_query: loader::required(&lib, p, "cudaEventQuery")?,
                event_synchronize: loader::required(&lib, p, "cudaEventSynchronize")?,
                event_destroy: loader::required(&lib, p, "cudaEventDestroy")?,
                stream_wait_event: loader::required(&lib, p, "cudaStreamWaitEvent")?,
                get_device: loader::required(&lib, p, "cudaGetDevice")?,
                set_device: loader::required(&lib, p, "cudaSetDevice")?,
                get_device_count: loader::required(&lib, p, "cudaGetDeviceCount")?,
                device_synchronize: loader::required(&lib, p, "cudaDeviceSynchronize")?,
                get_last_error: loader::required(&lib, p, "cudaGetLastError")?,
                get_error_string: loader::optional(&lib, "cudaGetErrorString"),
            }
        };
        let mut dev = CudaDevice {
            f,
            count: 0,
            path,
            _lib: lib,
        };
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        dev.check("cudaGetDeviceCount", unsafe {
            (dev.f.get_device_count)(&mut n)
        })?;
        dev.count = n.max(0) as usize;
        Ok(dev)
    }

    fn check(&self, call: &'static str, code: CudaError) -> Result<(), DeviceError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        let message = self
            .f
            .get_error_string
            // SAFETY: cudaGetErrorString returns a static NUL-terminated string.
            .map(|f| {
                unsafe { CStr::from_ptr(f(code)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        Err(DeviceError::Runtime {
            call,
            code: code.into(),
            message,
        })
    }

    fn on_device<T>(
        &self,
        device: DeviceIndex,
        f: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        if device >= self.count {
            return Err(DeviceError::InvalidDevice {
                device: device as i64,
                count: self.count,
            });
        }
        let mut current: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check("cudaGetDevice", unsafe {
            (self.f.get_device)(&mut current)
        })?;
        let switch = current != device as c_int;
        if switch {
            // SAFETY: checked device index.
            self.check("cudaSetDevice", unsafe {
                (self.f.set_device)(device as c_int)
            })?;
        }
        let result = f();
        if switch {
            // SAFETY: restoring the caller's device.
            unsafe { (self.f.set_device)(current) };
        }
        result
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn device_count(&self) -> usize {
        self.count
    }
    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        self.on_device(device, || {
            let mut p: Ptr = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let rc = unsafe { (self.f.malloc)(&mut p, size) };
            if rc == CUDA_ERROR_MEMORY_ALLOCATION {
                // SAFETY: clears the sticky-free "last error" so later calls are clean.
                unsafe { (self.f.get_last_error)() };
                return Err(DeviceError::OutOfMemory {
                    device,
                    requested: size,
                });
            }
            self.check("cudaMalloc", rc)?;
            Ok(p as DevicePtr)
        })
    }
    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: ptr came from cudaMalloc on this device.
        self.on_device(device, || {
            self.check("cudaFree", unsafe { (self.f.free)(ptr as Ptr) })
        })
    }
    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError> {
        self.on_device(device, || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: valid out-pointers.
            self.check("cudaMemGetInfo", unsafe {
                (self.f.mem_get_info)(&mut free, &mut total)
            })?;
            Ok(MemInfo { free, total })
        })
    }
    fn current_device(&self) -> Result<DeviceIndex, DeviceError> {
        let mut d: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check("cudaGetDevice", unsafe { (self.f.get_device)(&mut d) })?;
        Ok(d.max(0) as DeviceIndex)
    }
    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError> {
        self.on_device(device, || {
            let mut ev: Ptr = std::ptr::null_mut();
            // SAFETY: valid out-pointer, documented flag.
            self.check("cudaEventCreateWithFlags", unsafe {
                (self.f.event_create_with_flags)(&mut ev, CUDA_EVENT_DISABLE_TIMING)
            })?;
            Ok(EventHandle(ev as usize))
        })
    }
    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError> {
        // SAFETY: live event, destroyed once.
        self.on_device(device, || {
            self.check("cudaEventDestroy", unsafe {
                (self.f.event_destroy)(event.0 as Ptr)
            })
        })
    }
    fn event_record(
        &self,
        device: DeviceIndex,
        event: EventHandle,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        self.on_device(device, || {
            // SAFETY: live event and the caller's stream.
            self.check("cudaEventRecord", unsafe {
                (self.f.event_record)(event.0 as Ptr, stream.0 as Ptr)
            })
        })
    }
    fn event_query(&self, _device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError> {
        // SAFETY: live event; cudaEventQuery needs no current-device switch.
        match unsafe { (self.f.event_query)(event.0 as Ptr) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            rc => self.check("cudaEventQuery", rc).map(|_| false),
        }
    }
    fn event_synchronize(
        &self,
        _device: DeviceIndex,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        // SAFETY: live event.
        self.check("cudaEventSynchronize", unsafe {
            (self.f.event_synchronize)(event.0 as Ptr)
        })
    }
    fn stream_wait_event(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        self.on_device(device, || {
            // SAFETY: the caller's stream and a live event; flags 0.
            self.check("cudaStreamWaitEvent", unsafe {
                (self.f.stream_wait_event)(stream.0 as Ptr, event.0 as Ptr, 0)
            })
        })
    }
    fn synchronize_device(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        // SAFETY: plain call on the current device.
        self.on_device(device, || {
            self.check("cudaDeviceSynchronize", unsafe {
                (self.f.device_synchronize)()
            })
        })
    }
}
