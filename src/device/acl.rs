//! The Ascend ACL runtime backend: `libascendcl.so`, loaded at run time.
//!
//! Never linked: the crate builds and tests without CANN. Every symbol is resolved at
//! load into a function table; a missing required one is a load error naming it, a
//! missing optional one turns its feature off (logged at debug level).
//!
//! Facts used (CANN `acl/acl_rt.h`, `acl_base_rt.h`): segments come from
//! `aclrtMallocAlign32(.., ACL_MEM_MALLOC_HUGE_FIRST)` (fallback `aclrtMalloc`), requests
//! are padded by 32 bytes before rounding as torch_npu does, out of memory is 207001
//! (also 207018 and 200000), events are created with `ACL_EVENT_CAPTURE_STREAM_PROGRESS`
//! (reusable `Ex` variant preferred) and queried with `aclrtQueryEventStatus` (fallback
//! `aclrtQueryEvent`, whose status values are the other way round). ACL's current device
//! is per thread: each call sets the target device and restores the caller's.
//!
//! Virtual memory (expandable segments) follows torch_npu: `aclrtReserveMemAddress(..,
//! flags 1)`, `aclrtMallocPhysical` with `{NONE, PINNED, ACL_HBM_MEM_HUGE (HUGE1G for
//! 1 GiB pages), {device, DEVICE}, 0}`, `aclrtMapMem(va, size, 0, handle, 0)`; undone
//! with `aclrtUnmapMem` + `aclrtFreePhysical`. The whole set is optional: without it
//! `expandable_segments:True` is refused with the missing names.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

use super::{
    with_capture_mode_relaxed, Device, DeviceError, DeviceIndex, DevicePtr, EventHandle,
    ExchangeCaptureMode, MemInfo, PhysHandle, StreamHandle,
};
use crate::loader::{self, Candidate};

type AclError = c_int;
type Ptr = *mut c_void;

const ACL_SUCCESS: AclError = 0;
const ACL_ERROR_UNINITIALIZE: AclError = 100001;
const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;
/// Error codes that mean "out of memory".
pub const OOM_CODES: [AclError; 3] = [207001, 207018, 200000];
const ACL_MEM_MALLOC_HUGE_FIRST: c_int = 0;
const ACL_HBM_MEM: c_int = 1;
const ACL_EVENT_CAPTURE_STREAM_PROGRESS: u32 = 0x2;
const RECORDED_STATUS_COMPLETE: c_int = 1;
const EVENT_STATUS_COMPLETE: c_int = 0;
/// `ACL_STREAM_STATUS_COMPLETE` (`aclrtStreamStatus`).
const STREAM_STATUS_COMPLETE: c_int = 0;
const ACL_HBM_MEM_HUGE: c_int = 4;
const ACL_HBM_MEM_HUGE1G: c_int = 10;
const ACL_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// Page-type flag torch_npu passes to `aclrtReserveMemAddress`.
const RESERVE_FLAGS: u64 = 1;
/// Mapping granularity when the runtime cannot be asked (`aclrtMemGetAllocationGranularity`
/// missing): Ascend's huge page.
const DEFAULT_GRANULARITY: usize = 2 << 20;

/// `aclrtMemLocation`.
#[repr(C)]
struct MemLocation {
    id: u32,
    kind: c_int,
}

/// `aclrtPhysicalMemProp` (32 bytes; `reserve` at offset 24).
#[repr(C)]
struct PhysicalMemProp {
    handle_type: c_int,
    allocation_type: c_int,
    mem_attr: c_int,
    location: MemLocation,
    reserve: u64,
}

// The layout acl_rt.h gives (gcc, x86_64 and aarch64 LP64): 32 bytes, `reserve` at 24.
const _: () = assert!(std::mem::size_of::<PhysicalMemProp>() == 32);
const _: () = assert!(std::mem::offset_of!(PhysicalMemProp, reserve) == 24);
const _: () = assert!(std::mem::offset_of!(PhysicalMemProp, location) == 12);

impl PhysicalMemProp {
    fn huge(device: DeviceIndex, size: usize) -> Self {
        PhysicalMemProp {
            handle_type: 0,     // ACL_MEM_HANDLE_TYPE_NONE
            allocation_type: 0, // ACL_MEM_ALLOCATION_TYPE_PINNED
            mem_attr: if size == 1 << 30 {
                ACL_HBM_MEM_HUGE1G
            } else {
                ACL_HBM_MEM_HUGE
            },
            location: MemLocation {
                id: device as u32,
                kind: ACL_MEM_LOCATION_TYPE_DEVICE,
            },
            reserve: 0,
        }
    }
}

/// The virtual-memory functions.
#[derive(Clone, Copy)]
struct VmFns {
    reserve: unsafe extern "C" fn(*mut Ptr, usize, usize, Ptr, u64) -> AclError,
    release: PtrFn,
    malloc_physical: unsafe extern "C" fn(*mut Ptr, usize, *const PhysicalMemProp, u64) -> AclError,
    free_physical: PtrFn,
    map: unsafe extern "C" fn(Ptr, usize, usize, Ptr, u64) -> AclError,
    unmap: PtrFn,
    granularity: Option<unsafe extern "C" fn(*mut PhysicalMemProp, c_int, *mut usize) -> AclError>,
}

/// Bytes torch_npu adds to each request before rounding on current SoCs.
pub const ACL_REQUEST_PADDING: usize = 32;

type MallocFn = unsafe extern "C" fn(*mut Ptr, usize, c_int) -> AclError;
type PtrFn = unsafe extern "C" fn(Ptr) -> AclError;
type OutPtrFn = unsafe extern "C" fn(*mut Ptr) -> AclError;
type CreateFlagFn = unsafe extern "C" fn(*mut Ptr, u32) -> AclError;
type TwoPtrFn = unsafe extern "C" fn(Ptr, Ptr) -> AclError;
type QueryFn = unsafe extern "C" fn(Ptr, *mut c_int) -> AclError;

struct Fns {
    init: Option<unsafe extern "C" fn(*const c_char) -> AclError>,
    recent_err_msg: Option<unsafe extern "C" fn() -> *const c_char>,
    set_device: unsafe extern "C" fn(i32) -> AclError,
    get_device: unsafe extern "C" fn(*mut i32) -> AclError,
    get_device_count: unsafe extern "C" fn(*mut u32) -> AclError,
    malloc: MallocFn,
    malloc_align32: Option<MallocFn>,
    free: PtrFn,
    get_mem_info: unsafe extern "C" fn(c_int, *mut usize, *mut usize) -> AclError,
    create_event: OutPtrFn,
    create_event_with_flag: Option<CreateFlagFn>,
    create_event_ex_with_flag: Option<CreateFlagFn>,
    record_event: TwoPtrFn,
    query_event_status: Option<QueryFn>,
    query_event: Option<QueryFn>,
    synchronize_event: PtrFn,
    destroy_event: PtrFn,
    stream_wait_event: TwoPtrFn,
    synchronize_device: unsafe extern "C" fn() -> AclError,
    synchronize_stream: Option<PtrFn>,
    stream_query: Option<QueryFn>,
    capture_exchange_mode: Option<ExchangeCaptureMode>,
    vm: Option<VmFns>,
}

/// Which optional ACL features the loaded library has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclFeatures {
    /// `aclrtMallocAlign32` (no 32-byte padding by the runtime).
    pub malloc_align32: bool,
    /// `aclrtQueryEventStatus` (else the deprecated `aclrtQueryEvent`).
    pub query_event_status: bool,
    /// `aclrtCreateEventExWithFlag` (reusable events).
    pub event_ex: bool,
    /// The virtual-memory set (`aclrtReserveMemAddress`, `aclrtMallocPhysical`, `aclrtMapMem`, ...).
    pub virtual_memory: bool,
}

/// The ACL backend.
pub struct AclDevice {
    f: Fns,
    features: AclFeatures,
    notes: Vec<String>,
    missing_vmm: Vec<&'static str>,
    path: String,
    count: usize,
    // Keeps the library loaded while `f` holds pointers into it; never unloaded.
    _lib: Library,
}

impl std::fmt::Debug for AclDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclDevice")
            .field("path", &self.path)
            .field("devices", &self.count)
            .field("features", &self.features)
            .finish()
    }
}

/// Resolves the virtual-memory set, each symbol once; the error names every function
/// missing (the set is used whole or not at all).
///
/// # Safety
/// `lib` must be the ACL runtime: the types in `VmFns` are its C signatures.
unsafe fn resolve_vm(lib: &Library) -> Result<VmFns, Vec<&'static str>> {
    let mut missing = Vec::new();
    // SAFETY: each type is inferred from its `VmFns` field (the caller's guarantee).
    let (reserve, release, malloc_physical, free_physical, map, unmap) = unsafe {
        (
            probe(lib, "aclrtReserveMemAddress", &mut missing),
            probe(lib, "aclrtReleaseMemAddress", &mut missing),
            probe(lib, "aclrtMallocPhysical", &mut missing),
            probe(lib, "aclrtFreePhysical", &mut missing),
            probe(lib, "aclrtMapMem", &mut missing),
            probe(lib, "aclrtUnmapMem", &mut missing),
        )
    };
    match (reserve, release, malloc_physical, free_physical, map, unmap) {
        (
            Some(reserve),
            Some(release),
            Some(malloc_physical),
            Some(free_physical),
            Some(map),
            Some(unmap),
        ) => {
            Ok(VmFns {
                reserve,
                release,
                malloc_physical,
                free_physical,
                map,
                unmap,
                // SAFETY: as above.
                granularity: unsafe { loader::optional(lib, "aclrtMemGetAllocationGranularity") },
            })
        }
        _ => Err(missing),
    }
}

/// Resolves `name`, noting it in `missing` when the library lacks it.
///
/// # Safety
/// `T` must be the symbol's function-pointer type.
unsafe fn probe<T: Copy>(
    lib: &Library,
    name: &'static str,
    missing: &mut Vec<&'static str>,
) -> Option<T> {
    // SAFETY: forwarded to the caller.
    let f = unsafe { loader::optional(lib, name) };
    if f.is_none() {
        missing.push(name);
    }
    f
}

fn candidates() -> (Vec<Candidate>, bool) {
    let mut search = loader::on_search_path(&["libascendcl.so"]);
    search.extend(loader::under_ascend_home("lib64/libascendcl.so"));
    loader::from_env_or("NPUALLOC_ACL_LIB", search)
}

impl AclDevice {
    /// Loads the ACL runtime from `NPUALLOC_ACL_LIB`, else `libascendcl.so`, else
    /// `$ASCEND_HOME_PATH/lib64/libascendcl.so`.
    pub fn load() -> Result<AclDevice, DeviceError> {
        let (c, explicit) = candidates();
        let (lib, path) = loader::open(&c, explicit)?;
        Self::from_library(lib, path)
    }

    /// Loads the ACL runtime from `path` (a test aid; production code uses [`AclDevice::load`]).
    pub fn load_from(path: &str) -> Result<AclDevice, DeviceError> {
        let (lib, path) = loader::open_path(path)?;
        Self::from_library(lib, path)
    }

    fn from_library(lib: Library, path: String) -> Result<AclDevice, DeviceError> {
        // SAFETY: the types in `VmFns` are the C signatures in acl_rt.h.
        let (vm, missing_vmm) = match unsafe { resolve_vm(&lib) } {
            Ok(vm) => (Some(vm), Vec::new()),
            Err(missing) => (None, missing),
        };
        // SAFETY: each type below is the ACL function's C signature from acl_rt.h /
        // acl_base_rt.h (aclError = int; handles are void*; enums are int-sized).
        let f = unsafe {
            let p = path.as_str();
            Fns {
                init: loader::optional(&lib, "aclInit"),
                recent_err_msg: loader::optional(&lib, "aclGetRecentErrMsg"),
                set_device: loader::required(&lib, p, "aclrtSetDevice")?,
                get_device: loader::required(&lib, p, "aclrtGetDevice")?,
                get_device_count: loader::required(&lib, p, "aclrtGetDeviceCount")?,
                malloc: loader::required(&lib, p, "aclrtMalloc")?,
                malloc_align32: loader::optional(&lib, "aclrtMallocAlign32"),
                free: loader::required(&lib, p, "aclrtFree")?,
                get_mem_info: loader::required(&lib, p, "aclrtGetMemInfo")?,
                create_event: loader::required(&lib, p, "aclrtCreateEvent")?,
                create_event_with_flag: loader::optional(&lib, "aclrtCreateEventWithFlag"),
                create_event_ex_with_flag: loader::optional(&lib, "aclrtCreateEventExWithFlag"),
                record_event: loader::required(&lib, p, "aclrtRecordEvent")?,
                query_event_status: loader::optional(&lib, "aclrtQueryEventStatus"),
                query_event: loader::optional(&lib, "aclrtQueryEvent"),
                synchronize_event: loader::required(&lib, p, "aclrtSynchronizeEvent")?,
                destroy_event: loader::required(&lib, p, "aclrtDestroyEvent")?,
                stream_wait_event: loader::required(&lib, p, "aclrtStreamWaitEvent")?,
                synchronize_device: loader::required(&lib, p, "aclrtSynchronizeDevice")?,
                synchronize_stream: loader::optional(&lib, "aclrtSynchronizeStream"),
                stream_query: loader::optional(&lib, "aclrtStreamQuery"),
                capture_exchange_mode: loader::optional(&lib, "aclmdlRICaptureThreadExchangeMode"),
                vm,
            }
        };
        if f.query_event_status.is_none() && f.query_event.is_none() {
            return Err(DeviceError::Unavailable(format!(
                "required symbol aclrtQueryEventStatus (or the older aclrtQueryEvent) is missing from '{path}'"
            )));
        }
        let features = AclFeatures {
            malloc_align32: f.malloc_align32.is_some(),
            query_event_status: f.query_event_status.is_some(),
            event_ex: f.create_event_ex_with_flag.is_some(),
            virtual_memory: f.vm.is_some(),
        };
        let mut notes = Vec::new();
        if !features.malloc_align32 {
            notes.push(
                "aclrtMallocAlign32 missing: segments use aclrtMalloc (runtime adds 32 bytes)"
                    .to_string(),
            );
        }
        if !features.query_event_status {
            notes.push(
                "aclrtQueryEventStatus missing: events are queried with aclrtQueryEvent"
                    .to_string(),
            );
        }
        if !features.event_ex {
            notes.push(
                "aclrtCreateEventExWithFlag missing: events come from aclrtCreateEventWithFlag"
                    .to_string(),
            );
        }
        if !features.virtual_memory {
            notes.push(format!(
                "virtual memory off: missing {}",
                missing_vmm.join(", ")
            ));
        }
        for n in &notes {
            log::debug!("npualloc acl backend ({path}): {n}");
        }
        let mut dev = AclDevice {
            missing_vmm,
            f,
            features,
            notes,
            path,
            count: 0,
            _lib: lib,
        };
        dev.count = dev.probe_device_count()?;
        Ok(dev)
    }

    /// Reads the device count, calling `aclInit` first only if the runtime asks for it.
    fn probe_device_count(&self) -> Result<usize, DeviceError> {
        let mut n: u32 = 0;
        // SAFETY: valid out-pointer; function from the loaded table.
        let mut rc = unsafe { (self.f.get_device_count)(&mut n) };
        if rc == ACL_ERROR_UNINITIALIZE {
            if let Some(init) = self.f.init {
                // SAFETY: aclInit(NULL) uses the default configuration.
                let irc = unsafe { init(std::ptr::null()) };
                if irc != ACL_SUCCESS && irc != ACL_ERROR_REPEAT_INITIALIZE {
                    return Err(self.error("aclInit", irc));
                }
                // SAFETY: as above.
                rc = unsafe { (self.f.get_device_count)(&mut n) };
            }
        }
        if rc != ACL_SUCCESS {
            return Err(self.error("aclrtGetDeviceCount", rc));
        }
        Ok(n as usize)
    }

    /// The optional features found.
    pub fn features(&self) -> AclFeatures {
        self.features
    }

    /// Human-readable notes on features turned off.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn error(&self, call: &'static str, code: AclError) -> DeviceError {
        let message = self
            .f
            .recent_err_msg
            // SAFETY: aclGetRecentErrMsg returns NULL or a NUL-terminated string owned by
            // the runtime, valid until the next ACL call on this thread; copied at once.
            .map(|f| unsafe { f() })
            .filter(|p| !p.is_null())
            // SAFETY: non-NULL, NUL-terminated (see above).
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        DeviceError::Runtime {
            call,
            code: code.into(),
            message,
        }
    }

    /// The virtual-memory functions, or an error naming the missing ones.
    fn vm(&self) -> Result<&VmFns, DeviceError> {
        self.f.vm.as_ref().ok_or_else(|| {
            DeviceError::Unavailable(format!(
                "'{}' lacks {} (virtual memory)",
                self.path,
                self.missing_vmm.join(", ")
            ))
        })
    }

    fn check(&self, call: &'static str, code: AclError) -> Result<(), DeviceError> {
        if code == ACL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// Runs `f` with this thread's capture mode relaxed
    /// (`aclmdlRICaptureThreadExchangeMode`; see [`with_capture_mode_relaxed`]).
    fn relaxed_capture<T>(&self, f: impl FnOnce() -> T) -> T {
        with_capture_mode_relaxed(self.f.capture_exchange_mode, f)
    }

    /// Runs `f` with `device` current on this thread, restoring the caller's device.
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
        let mut current: i32 = -1;
        // SAFETY: valid out-pointer.
        let had = unsafe { (self.f.get_device)(&mut current) } == ACL_SUCCESS;
        let switch = !had || current != device as i32;
        if switch {
            // SAFETY: plain call with a checked device index.
            self.check("aclrtSetDevice", unsafe {
                (self.f.set_device)(device as i32)
            })?;
        }
        let result = f();
        if switch && had {
            // SAFETY: restoring the device the caller had.
            unsafe { (self.f.set_device)(current) };
        }
        result
    }
}

impl Device for AclDevice {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn device_count(&self) -> usize {
        self.count
    }

    fn request_padding(&self) -> usize {
        ACL_REQUEST_PADDING
    }

    fn malloc(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        self.on_device(device, || {
            let mut p: Ptr = std::ptr::null_mut();
            let (call, f) = match self.f.malloc_align32 {
                Some(f) => ("aclrtMallocAlign32", f),
                None => ("aclrtMalloc", self.f.malloc),
            };
            // SAFETY: valid out-pointer; HUGE_FIRST is a valid policy.
            let rc = self.relaxed_capture(|| unsafe { f(&mut p, size, ACL_MEM_MALLOC_HUGE_FIRST) });
            if OOM_CODES.contains(&rc) {
                return Err(DeviceError::OutOfMemory {
                    device,
                    requested: size,
                });
            }
            self.check(call, rc)?;
            Ok(p as DevicePtr)
        })
    }

    fn free(&self, device: DeviceIndex, ptr: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: `ptr` came from this backend's malloc on `device`.
        self.on_device(device, || {
            self.check("aclrtFree", unsafe { (self.f.free)(ptr as Ptr) })
        })
    }

    fn mem_info(&self, device: DeviceIndex) -> Result<MemInfo, DeviceError> {
        self.on_device(device, || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: valid out-pointers; ACL_HBM_MEM is a valid attribute.
            self.check("aclrtGetMemInfo", unsafe {
                (self.f.get_mem_info)(ACL_HBM_MEM, &mut free, &mut total)
            })?;
            Ok(MemInfo { free, total })
        })
    }

    fn current_device(&self) -> Result<DeviceIndex, DeviceError> {
        let mut d: i32 = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.f.get_device)(&mut d) };
        // No current device yet: ACL's implicit default is device 0.
        Ok(if rc == ACL_SUCCESS {
            d.max(0) as DeviceIndex
        } else {
            0
        })
    }

    fn event_create(&self, device: DeviceIndex) -> Result<EventHandle, DeviceError> {
        self.on_device(device, || {
            let mut ev: Ptr = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the flag is a documented ACL event flag.
            let (call, rc) = unsafe {
                if let Some(f) = self.f.create_event_ex_with_flag {
                    (
                        "aclrtCreateEventExWithFlag",
                        f(&mut ev, ACL_EVENT_CAPTURE_STREAM_PROGRESS),
                    )
                } else if let Some(f) = self.f.create_event_with_flag {
                    (
                        "aclrtCreateEventWithFlag",
                        f(&mut ev, ACL_EVENT_CAPTURE_STREAM_PROGRESS),
                    )
                } else {
                    ("aclrtCreateEvent", (self.f.create_event)(&mut ev))
                }
            };
            self.check(call, rc)?;
            Ok(EventHandle(ev as usize))
        })
    }

    fn event_destroy(&self, device: DeviceIndex, event: EventHandle) -> Result<(), DeviceError> {
        // SAFETY: the event came from event_create and is destroyed once.
        self.on_device(device, || {
            self.check("aclrtDestroyEvent", unsafe {
                (self.f.destroy_event)(event.0 as Ptr)
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
            // SAFETY: a live event of this device and the caller's stream handle.
            self.check("aclrtRecordEvent", unsafe {
                (self.f.record_event)(event.0 as Ptr, stream.0 as Ptr)
            })
        })
    }

    fn event_query(&self, device: DeviceIndex, event: EventHandle) -> Result<bool, DeviceError> {
        self.on_device(device, || {
            let mut status: c_int = -1;
            if let Some(f) = self.f.query_event_status {
                // SAFETY: live event, valid out-pointer.
                self.check("aclrtQueryEventStatus", unsafe {
                    f(event.0 as Ptr, &mut status)
                })?;
                Ok(status == RECORDED_STATUS_COMPLETE)
            } else {
                let f = self.f.query_event.expect("checked at load");
                // SAFETY: live event, valid out-pointer.
                self.check("aclrtQueryEvent", unsafe { f(event.0 as Ptr, &mut status) })?;
                Ok(status == EVENT_STATUS_COMPLETE)
            }
        })
    }

    fn event_synchronize(
        &self,
        device: DeviceIndex,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        self.on_device(device, || {
            // SAFETY: a live event of this device.
            self.check("aclrtSynchronizeEvent", unsafe {
                (self.f.synchronize_event)(event.0 as Ptr)
            })
        })
    }

    fn stream_wait_event(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
        event: EventHandle,
    ) -> Result<(), DeviceError> {
        self.on_device(device, || {
            // SAFETY: the caller's stream and a live event.
            self.check("aclrtStreamWaitEvent", unsafe {
                (self.f.stream_wait_event)(stream.0 as Ptr, event.0 as Ptr)
            })
        })
    }

    fn synchronize_device(&self, device: DeviceIndex) -> Result<(), DeviceError> {
        // SAFETY: plain call on the current device.
        self.on_device(device, || {
            self.check("aclrtSynchronizeDevice", unsafe {
                (self.f.synchronize_device)()
            })
        })
    }

    fn stream_query(&self, device: DeviceIndex, stream: StreamHandle) -> Result<bool, DeviceError> {
        let Some(query) = self.f.stream_query else {
            return Ok(false);
        };
        self.on_device(device, || {
            let mut status: c_int = -1;
            // SAFETY: the caller's stream handle and a valid out-pointer.
            self.check("aclrtStreamQuery", unsafe {
                query(stream.0 as Ptr, &mut status)
            })?;
            Ok(status == STREAM_STATUS_COMPLETE)
        })
    }

    fn synchronize_stream(
        &self,
        device: DeviceIndex,
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let Some(sync) = self.f.synchronize_stream else {
            return self.synchronize_device(device);
        };
        self.on_device(device, || {
            // SAFETY: the caller's stream handle (NULL is the default stream).
            self.check("aclrtSynchronizeStream", unsafe { sync(stream.0 as Ptr) })
        })
    }

    fn vm_granularity(&self, device: DeviceIndex) -> Result<usize, DeviceError> {
        let vm = self.vm()?;
        let Some(query) = vm.granularity else {
            return Ok(DEFAULT_GRANULARITY);
        };
        self.on_device(device, || {
            let mut prop = PhysicalMemProp::huge(device, DEFAULT_GRANULARITY);
            let mut g = 0usize;
            // SAFETY: valid property struct and out-pointer; option 0 = MINIMUM.
            self.check("aclrtMemGetAllocationGranularity", unsafe {
                query(&mut prop, 0, &mut g)
            })?;
            Ok(if g == 0 { DEFAULT_GRANULARITY } else { g })
        })
    }

    fn vm_reserve(&self, device: DeviceIndex, size: usize) -> Result<DevicePtr, DeviceError> {
        let vm = self.vm()?;
        self.on_device(device, || {
            let mut va: Ptr = std::ptr::null_mut();
            // SAFETY: valid out-pointer; expectPtr must be NULL; flags as torch_npu.
            self.check("aclrtReserveMemAddress", unsafe {
                (vm.reserve)(&mut va, size, 0, std::ptr::null_mut(), RESERVE_FLAGS)
            })?;
            Ok(va as DevicePtr)
        })
    }

    fn vm_release(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        _size: usize,
    ) -> Result<(), DeviceError> {
        let vm = self.vm()?;
        self.on_device(device, || {
            // SAFETY: `va` came from vm_reserve and has nothing mapped.
            self.check("aclrtReleaseMemAddress", unsafe { (vm.release)(va as Ptr) })
        })
    }

    fn vm_map(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        size: usize,
    ) -> Result<PhysHandle, DeviceError> {
        let vm = self.vm()?;
        self.on_device(device, || {
            self.relaxed_capture(|| {
                let prop = PhysicalMemProp::huge(device, size);
                let mut h: Ptr = std::ptr::null_mut();
                // SAFETY: valid out-pointer and property struct; flags must be 0.
                let rc = unsafe { (vm.malloc_physical)(&mut h, size, &prop, 0) };
                if OOM_CODES.contains(&rc) {
                    return Err(DeviceError::OutOfMemory {
                        device,
                        requested: size,
                    });
                }
                self.check("aclrtMallocPhysical", rc)?;
                // SAFETY: `va` lies in a reservation and is unmapped; `h` holds `size` bytes.
                let rc = unsafe { (vm.map)(va as Ptr, size, 0, h, 0) };
                if rc != ACL_SUCCESS {
                    let err = self.error("aclrtMapMem", rc);
                    // SAFETY: `h` is unmapped and ours.
                    unsafe { (vm.free_physical)(h) };
                    return Err(err);
                }
                Ok(PhysHandle(h as usize))
            })
        })
    }

    fn vm_unmap(
        &self,
        device: DeviceIndex,
        va: DevicePtr,
        _size: usize,
        handle: PhysHandle,
    ) -> Result<(), DeviceError> {
        let vm = self.vm()?;
        self.on_device(device, || {
            // SAFETY: `va` was mapped by vm_map with `handle`; the caller synchronised.
            self.check("aclrtUnmapMem", unsafe { (vm.unmap)(va as Ptr) })?;
            // SAFETY: the handle is now unmapped and freed once.
            self.check("aclrtFreePhysical", unsafe {
                (vm.free_physical)(handle.0 as Ptr)
            })
        })
    }
}
