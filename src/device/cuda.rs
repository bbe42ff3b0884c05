//! The CUDA runtime backend: `libcudart.so`, loaded at run time, so the allocator can
//! be validated on NVIDIA hardware with a real framework (PyTorch's
//! `CUDAPluggableAllocator` takes the same two C functions as torch_npu's).
//!
//! Library: `NPUALLOC_CUDA_LIB`, else `libcudart.so`, then versioned names (a process
//! that already loaded PyTorch's bundled runtime finds it by its soname).
//!
//! Virtual memory (expandable segments) uses the driver API, as PyTorch does:
//! `cuMemAddressReserve`, `cuMemCreate` (pinned, on the device), `cuMemMap`,
//! `cuMemSetAccess` (read-write for the device); `cuMemUnmap` + `cuMemRelease` undo it.
//! The driver library (`NPUALLOC_CUDA_DRIVER_LIB`, else `libcuda.so.1`, `libcuda.so`) is
//! optional: without it `expandable_segments:True` is refused, naming what is missing.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use libloading::Library;

use super::{
    with_capture_mode_relaxed, Device, DeviceError, DeviceIndex, DevicePtr, EventHandle,
    ExchangeCaptureMode, MemInfo, PhysHandle, StreamHandle,
};
use crate::loader;

type CudaError = c_int;
type Ptr = *mut c_void;
const CUDA_SUCCESS: CudaError = 0;
const CUDA_ERROR_MEMORY_ALLOCATION: CudaError = 2;
const CUDA_ERROR_NOT_READY: CudaError = 600;
const CUDA_EVENT_DISABLE_TIMING: c_uint = 0x02;

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;

/// `CUmemLocation`.
#[repr(C)]
struct CuMemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (32 bytes on 64-bit Linux).
#[repr(C)]
struct CuMemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: CuMemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

// cuda.h's layout on 64-bit Linux: 32 bytes, the metadata pointer at 16.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<CuMemAllocationProp>() == 32);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::offset_of!(CuMemAllocationProp, win32_handle_meta_data) == 16);
const _: () = assert!(std::mem::size_of::<CuMemAccessDesc>() == 12);

impl CuMemAllocationProp {
    fn pinned(device: DeviceIndex) -> Self {
        CuMemAllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: CuMemLocation {
                kind: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device as c_int,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct CuMemAccessDesc {
    location: CuMemLocation,
    flags: c_int,
}

/// The driver's virtual-memory functions (`CUdeviceptr` and handles are u64).
struct DriverFns {
    reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> CudaError,
    address_free: unsafe extern "C" fn(u64, usize) -> CudaError,
    create: unsafe extern "C" fn(*mut u64, usize, *const CuMemAllocationProp, u64) -> CudaError,
    release: unsafe extern "C" fn(u64) -> CudaError,
    map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CudaError,
    unmap: unsafe extern "C" fn(u64, usize) -> CudaError,
    set_access: unsafe extern "C" fn(u64, usize, *const CuMemAccessDesc, usize) -> CudaError,
    granularity: unsafe extern "C" fn(*mut usize, *const CuMemAllocationProp, c_int) -> CudaError,
    _lib: Library,
}

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
    stream_synchronize: Option<unsafe extern "C" fn(Ptr) -> CudaError>,
    stream_query: Option<unsafe extern "C" fn(Ptr) -> CudaError>,
    thread_exchange_stream_capture_mode: Option<ExchangeCaptureMode>,
}

/// The CUDA backend.
pub struct CudaDevice {
    f: Fns,
    driver: Result<DriverFns, String>,
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
        let (candidates, explicit) = loader::from_env_or(
            "NPUALLOC_CUDA_LIB",
            loader::on_search_path(&[
                "libcudart.so",
                "libcudart.so.13",
                "libcudart.so.12",
                "libcudart.so.11.0",
            ]),
        );
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
                stream_synchronize: loader::optional(&lib, "cudaStreamSynchronize"),
                stream_query: loader::optional(&lib, "cudaStreamQuery"),
                thread_exchange_stream_capture_mode: loader::optional(
                    &lib,
                    "cudaThreadExchangeStreamCaptureMode",
                ),
            }
        };
        let driver = load_driver();
        if let Err(e) = &driver {
            log::debug!("npualloc cuda backend: virtual memory off: {e}");
        }
        let mut dev = CudaDevice {
            f,
            driver,
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

    /// The driver's virtual-memory functions, or why they are missing.
    fn driver(&self) -> Result<&DriverFns, DeviceError> {
        self.driver
            .as_ref()
            .map_err(|e| DeviceError::Unavailable(e.clone()))
    }

    /// Checks a driver call (`CUresult`).
    fn check_cu(&self, call: &'static str, code: CudaError) -> Result<(), DeviceError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(DeviceError::Runtime {
            call,
            code: code.into(),
            message: String::new(),
        })
    }

    /// Runs a driver call on `device` with its primary context current on this thread.
    fn on_context<T>(
        &self,
        device: DeviceIndex,
        f: impl FnOnce(&DriverFns) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let d = self.driver()?;
        self.on_device(device, || {
            self.relaxed_capture(|| {
                // SAFETY: cudaFree(NULL) only initialises the runtime and makes the
                // device's primary context current.
                self.check("cudaFree", unsafe { (self.f.free)(std::ptr::null_mut()) })?;
                f(d)
            })
        })
    }

    /// Runs `f` with this thread's capture mode relaxed
    /// (`cudaThreadExchangeStreamCaptureMode`; see [`with_capture_mode_relaxed`]).
    fn relaxed_capture<T>(&self, f: impl FnOnce() -> T) -> T {
        with_capture_mode_relaxed(self.f.thread_exchange_stream_capture_mode, f)
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
            let rc = self.relaxed_capture(|| unsafe { (self.f.malloc)(&mut p, size) });
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
            self.check(
                "cudaMemGetInfo",
                self.relaxed_capture(|| unsafe { (self.f.mem_get_info)(&mut free, &mut total) }),
            )?;
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
    fn stream_query(&self, device: DeviceIndex, stream: StreamHandle) -> Result<bool, DeviceError> {
        let Some(query) = self.f.stream_query else {
            return Ok(false);
        };
        self.on_device(device, || {
            // SAFETY: the caller's stream (NULL: the legacy default stream).
            match unsafe { query(stream.0 as Ptr) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                rc => self.check("cudaStreamQuery", rc).map(|_| false),
            }
        })
    }
    fn synchronize_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let Some(sync) = self.f.stream_synchronize else {
            return self.synchronize_device(device);
        };
        self.on_device(device, || {
            // SAFETY: the caller's stream (NULL: the legacy default stream).
            self.check("cudaStreamSynchronize", unsafe { sync(stream.0 as Ptr) })
        })
    }
    fn vm_granularity(&self, device: DeviceIndex) -> Result<usize, DeviceError> {
        self.on_context(device, |d| {
            let prop = CuMemAllocationProp::pinned(device);
            let mut g = 0usize;
            // SAFETY: valid out-pointer and property struct.
            self.check_cu("cuMemGetAllocationGranularity", unsafe {
                (d.granularity)(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            })?;
            Ok(g.max(1))
        })
    }
    fn vm_reserve(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        self.on_context(device, |d| {
            let mut va = 0u64;
            // SAFETY: valid out-pointer; no fixed address, default alignment, flags 0.
            self.check_cu("cuMemAddressReserve", unsafe {
                (d.reserve)(&mut va, size, 0, 0, 0)
            })?;
            Ok(va as DevicePtr)
        })
    }
    fn vm_release(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<(), DeviceError> {
        self.on_context(device, |d| {
            // SAFETY: the whole range from vm_reserve, nothing mapped in it.
            self.check_cu("cuMemAddressFree", unsafe {
                (d.address_free)(va as u64, size)
            })
        })
    }
    fn vm_map(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<PhysHandle, DeviceError> {
        self.on_context(device, |d| {
            let prop = CuMemAllocationProp::pinned(device);
            let mut h = 0u64;
            // SAFETY: valid out-pointer and property struct; flags 0.
            let rc = unsafe { (d.create)(&mut h, size, &prop, 0) };
            if rc == CUDA_ERROR_MEMORY_ALLOCATION {
                return Err(DeviceError::OutOfMemory {
                    device,
                    requested: size,
                });
            }
            self.check_cu("cuMemCreate", rc)?;
            let access = CuMemAccessDesc {
                location: CuMemLocation {
                    kind: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: device as c_int,
                },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `va` is an unmapped part of a reservation; `h` holds `size` bytes.
            let mapped = self
                .check_cu("cuMemMap", unsafe { (d.map)(va as u64, size, 0, h, 0) })
                .and_then(|_| {
                    // SAFETY: the range was just mapped; one access descriptor.
                    let rc = unsafe { (d.set_access)(va as u64, size, &access, 1) };
                    if rc != CUDA_SUCCESS {
                        // SAFETY: undoing the mapping made above.
                        unsafe { (d.unmap)(va as u64, size) };
                    }
                    self.check_cu("cuMemSetAccess", rc)
                });
            if let Err(e) = mapped {
                // SAFETY: `h` is ours and unmapped.
                unsafe { (d.release)(h) };
                return Err(e);
            }
            Ok(PhysHandle(h as usize))
        })
    }
    fn vm_unmap(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
        handle: PhysHandle,
    ) -> Result<(), DeviceError> {
        self.on_context(device, |d| {
            // SAFETY: `va`/`size` is exactly what vm_map mapped; the caller synchronised.
            self.check_cu("cuMemUnmap", unsafe { (d.unmap)(va as u64, size) })?;
            // SAFETY: the handle is unmapped and released once.
            self.check_cu("cuMemRelease", unsafe { (d.release)(handle.0 as u64) })
        })
    }
}

/// Loads the driver library's virtual-memory functions.
fn load_driver() -> Result<DriverFns, String> {
    let (candidates, explicit) = loader::from_env_or(
        "NPUALLOC_CUDA_DRIVER_LIB",
        loader::on_search_path(&["libcuda.so.1", "libcuda.so"]),
    );
    let (lib, path) = loader::open(&candidates, explicit).map_err(|e| e.to_string())?;
    // SAFETY: the types in `DriverFns` are the driver functions' C signatures.
    unsafe { resolve_driver(lib, &path) }.map_err(|e| e.to_string())
}

/// Resolves the virtual-memory functions of driver library `lib`.
///
/// # Safety
/// `lib` must be the CUDA driver library (the types are cuda.h's: CUresult is an
/// int-sized enum, CUdeviceptr and CUmemGenericAllocationHandle are 64-bit).
unsafe fn resolve_driver(lib: Library, p: &str) -> Result<DriverFns, DeviceError> {
    // SAFETY: forwarded to the caller.
    unsafe {
        Ok(DriverFns {
            reserve: loader::required(&lib, p, "cuMemAddressReserve")?,
            address_free: loader::required(&lib, p, "cuMemAddressFree")?,
            create: loader::required(&lib, p, "cuMemCreate")?,
            release: loader::required(&lib, p, "cuMemRelease")?,
            map: loader::required(&lib, p, "cuMemMap")?,
            unmap: loader::required(&lib, p, "cuMemUnmap")?,
            set_access: loader::required(&lib, p, "cuMemSetAccess")?,
            granularity: loader::required(&lib, p, "cuMemGetAllocationGranularity")?,
            _lib: lib,
        })
    }
}
