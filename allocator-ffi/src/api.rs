//! The allocator entry points (docs/design.md, "The C ABI contract").

use std::ffi::{c_char, c_int, c_void, CStr};

use npualloc_core::{CachingAllocator, Config, Error, MempoolId, StreamHandle};

use crate::error::*;
use crate::hooks::{self, npualloc_runtime_hooks};
use crate::panic::{code, or_default};
use crate::record::recorder;
use crate::runtime::{configure, runtime, set_hooks, set_oom_observer, Runtime};
use crate::types::{npualloc_device_stats, npualloc_private_pool_stats, npualloc_stream};

fn to_stream(s: npualloc_stream) -> StreamHandle {
    StreamHandle(s as usize)
}

/// Reads a C string argument: non-NULL, UTF-8.
pub(crate) fn c_str<'a>(name: &str, s: *const c_char) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::new(
            NPUALLOC_ERR_INVALID_ARGUMENT,
            format!("{name} is NULL"),
        ));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives the call (the
    // documented contract of every string argument); NULL was excluded above.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map_err(|_| {
        Failure::new(
            NPUALLOC_ERR_INVALID_ARGUMENT,
            format!("{name} is not valid UTF-8"),
        )
    })
}

/// Allocates `size` bytes on `device` for use on `stream` (NULL: the default stream).
///
/// Returns a pointer at least 512-byte aligned, owned by the caller until passed to
/// `npualloc_free`. Returns NULL on failure (the out-of-memory or other message is in
/// `npualloc_last_error()`); `size` 0 returns NULL and is not a failure.
#[no_mangle]
pub extern "C" fn npualloc_malloc(
    size: usize,
    device: c_int,
    stream: npualloc_stream,
) -> *mut c_void {
    or_default("npualloc_malloc", std::ptr::null_mut(), || {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let rt = runtime()?;
        let ptr = rt.allocator(device)?.malloc(size, to_stream(stream))?;
        if let Some(r) = rt.recorder {
            r.alloc(ptr, size, stream as usize);
        }
        Ok(ptr as *mut c_void)
    })
}

/// Frees `ptr`, returned by `npualloc_malloc`. `size`, `device` and `stream` are advisory
/// (the allocator knows them). If `ptr` was recorded on other streams, its memory is
/// reused only after work queued on them at this moment has run. NULL is ignored; an
/// unknown or already freed pointer records an error and changes nothing.
#[no_mangle]
pub extern "C" fn npualloc_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: npualloc_stream,
) {
    let _ = size;
    or_default("npualloc_free", (), || {
        if ptr.is_null() {
            return Ok(());
        }
        let rt = runtime()?;
        let p = ptr as usize;
        if let Some(r) = rt.recorder {
            r.free(p); // logged first: a concurrent reuse of `p` must log after it
        }
        // The allocation's device and stream (as torch passes them) first: the only
        // allocator tried on the fast path.
        let hinted = rt.existing_allocator(device);
        if let Some(a) = hinted {
            match a.free_on(p, Some(to_stream(stream))) {
                Err(Error::UnknownPointer { .. }) => {}
                result => return Ok(result?),
            }
        }
        free_elsewhere(rt, hinted, p, to_stream(stream))
    })
}

/// Frees `p` on an allocator other than `tried` (a wrong or unknown device hint).
#[cold]
#[inline(never)]
fn free_elsewhere(
    rt: &Runtime,
    tried: Option<&CachingAllocator>,
    p: usize,
    stream: StreamHandle,
) -> Result<(), Failure> {
    let others = rt
        .existing()
        .filter(|a| !tried.is_some_and(|t| std::ptr::eq(*a, t)));
    for a in others {
        match a.free_on(p, Some(stream)) {
            Err(Error::UnknownPointer { .. }) => continue,
            result => return Ok(result?),
        }
    }
    Err(Error::UnknownPointer { ptr: p }.into())
}

/// Prepares npualloc for `device_count` devices (torch_npu's and torch.cuda's
/// pluggable allocators pass the number of devices they see): reads the settings and
/// opens the backend. Idempotent; a count above the backend's records an error.
#[no_mangle]
pub extern "C" fn npualloc_init(device_count: c_int) {
    or_default("npualloc_init", (), || {
        let rt = runtime()?;
        if device_count < 0 || device_count as usize > rt.device_count() {
            return Err(Failure::new(
                NPUALLOC_ERR_INVALID_ARGUMENT,
                format!(
                    "torch sees {device_count} device(s), the backend {}",
                    rt.device_count()
                ),
            ));
        }
        Ok(())
    })
}

fn empty_all() -> Result<(), Failure> {
    let rt = runtime()?;
    if let Some(r) = recorder() {
        r.flush();
    }
    let mut first = Ok(());
    for a in rt.existing() {
        if let Err(e) = a.empty_cache() {
            first = first.and(Err(e.into()));
        }
    }
    first
}

/// Releases every cached, unused segment on all devices, after waiting for pending
/// frees (torch_npu's `reset_fn`). `check_error` is accepted for signature
/// compatibility; failures are always recorded in the last error.
#[no_mangle]
pub extern "C" fn npualloc_empty_cache(check_error: bool) {
    let _ = check_error;
    or_default("npualloc_empty_cache", (), empty_all)
}

/// Same as `npualloc_empty_cache`, in the shape of torch.cuda's `reset_fn`.
#[no_mangle]
pub extern "C" fn npualloc_empty_cache_all() {
    or_default("npualloc_empty_cache_all", (), empty_all)
}

/// Caps the memory `device` may reserve at `fraction` (0 to 1) of its total memory.
/// A bad fraction or device records an error.
#[no_mangle]
pub extern "C" fn npualloc_set_memory_fraction(fraction: f64, device: c_int) {
    or_default("npualloc_set_memory_fraction", (), || {
        Ok(runtime()?
            .allocator(device)?
            .set_memory_fraction(fraction)?)
    })
}

/// Returns the start of the device allocation (segment) holding the live allocation
/// `ptr`, and stores its size in `*size` (if `size` is not NULL). Returns NULL and
/// records an error for an unknown pointer.
#[no_mangle]
pub extern "C" fn npualloc_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    or_default("npualloc_base_alloc", std::ptr::null_mut(), || {
        let rt = runtime()?;
        let p = ptr as usize;
        let owner = rt
            .owner_of(p, None)
            .ok_or(Error::UnknownPointer { ptr: p })?;
        let (base, len) = owner.base_allocation(p)?;
        if !size.is_null() {
            // SAFETY: the caller passes a writable size_t (or NULL, excluded above).
            unsafe { *size = len };
        }
        Ok(base as *mut c_void)
    })
}

/// Marks the live allocation `ptr` as used on `stream`; a no-op for its own stream.
/// An unknown pointer or stream records an error.
#[no_mangle]
pub extern "C" fn npualloc_record_stream(ptr: *mut c_void, stream: npualloc_stream) {
    or_default("npualloc_record_stream", (), || {
        record(ptr, to_stream(stream))
    })
}

pub(crate) fn record(ptr: *mut c_void, s: StreamHandle) -> Result<(), Failure> {
    let rt = runtime()?;
    let p = ptr as usize;
    let owner = rt
        .owner_of(p, None)
        .ok_or(Error::UnknownPointer { ptr: p })?;
    owner.record_stream(p, s)?;
    if let Some(r) = recorder() {
        r.record(p, s.0);
    }
    Ok(())
}

/// Forgets a use of `ptr` on `stream` recorded earlier (torch_npu's `erase_stream`).
/// A stream never recorded for `ptr`, known to the device or not (e.g. 0xdead), is
/// accepted and changes nothing: there is nothing to forget, and no device call is
/// made (ACL cannot tell a bogus stream handle from a real one anyway).
#[no_mangle]
pub extern "C" fn npualloc_erase_stream(ptr: *mut c_void, stream: npualloc_stream) {
    or_default("npualloc_erase_stream", (), || {
        let rt = runtime()?;
        let p = ptr as usize;
        let owner = rt
            .owner_of(p, None)
            .ok_or(Error::UnknownPointer { ptr: p })?;
        Ok(owner.erase_stream(p, to_stream(stream))?)
    })
}

/// Sets every peak statistic of `device` to its current value.
#[no_mangle]
pub extern "C" fn npualloc_reset_peak_stats(device: c_int) {
    or_default("npualloc_reset_peak_stats", (), || {
        runtime()?.allocator(device)?.reset_peak_stats();
        Ok(())
    })
}

/// Writes the statistics of `device` into `*out` (caller-owned). Returns 0, or an
/// error code with `*out` unchanged.
#[no_mangle]
pub extern "C" fn npualloc_get_device_stats(
    device: c_int,
    out: *mut npualloc_device_stats,
) -> c_int {
    code("npualloc_get_device_stats", || {
        if out.is_null() {
            return Err(Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, "out is NULL"));
        }
        let stats = npualloc_device_stats::from(runtime()?.allocator(device)?.stats());
        // SAFETY: `out` is a non-NULL pointer to caller-owned, writable stats.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Reads `device`'s reserved bytes per graph-private pool (torch 2.14's
/// `reserved_bytes_by_private_pools`): stores the number of pools in `*count` and
/// writes the first `capacity` of them (at most `*count`) to `out` (caller-owned; may be
/// NULL when `capacity` is 0, to ask for the count). A pool appears once it reserved
/// memory and stays, with `current` 0 after its memory went back, as in PyTorch; in the
/// order pools first reserved memory. Returns 0; NPUALLOC_ERR_INVALID_ARGUMENT for a
/// NULL `count`, or a NULL `out` with a non-zero `capacity`.
#[no_mangle]
pub extern "C" fn npualloc_get_private_pool_stats(
    device: c_int,
    out: *mut npualloc_private_pool_stats,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    code("npualloc_get_private_pool_stats", || {
        if count.is_null() {
            return Err(Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, "count is NULL"));
        }
        if out.is_null() && capacity > 0 {
            return Err(Failure::new(
                NPUALLOC_ERR_INVALID_ARGUMENT,
                "out is NULL with a non-zero capacity",
            ));
        }
        let pools = runtime()?.allocator(device)?.private_pool_stats();
        for (i, p) in pools.iter().take(capacity).enumerate() {
            // SAFETY: `out` points to `capacity` caller-owned, writable entries (non-NULL
            // when `capacity` > 0, checked above) and `i` < `capacity`.
            unsafe { out.add(i).write((*p).into()) };
        }
        // SAFETY: `count` is a non-NULL pointer to a caller-owned, writable size_t.
        unsafe { count.write(pools.len()) };
        Ok(())
    })
}

/// Applies settings (`NPUALLOC_CONF` syntax, e.g. "max_split_size_mb:128"); only before
/// the first allocation. A malformed string gives NPUALLOC_ERR_INVALID_ARGUMENT naming
/// the key; a call after the first allocation NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_configure(conf: *const c_char) -> c_int {
    code("npualloc_configure", || {
        let s = c_str("conf", conf)?;
        configure(Config::parse(s)?)
    })
}

/// Releases every cached, unused segment of `device` after waiting for pending frees.
#[no_mangle]
pub extern "C" fn npualloc_empty_cache_device(device: c_int) -> c_int {
    code("npualloc_empty_cache_device", || {
        if let Some(r) = recorder() {
            r.flush();
        }
        Ok(runtime()?.allocator(device)?.empty_cache()?)
    })
}

/// Writes a memory snapshot of every device (JSON in the shape of PyTorch's
/// `torch.cuda.memory._snapshot()`) to the file `path`. A NULL or empty path gives
/// NPUALLOC_ERR_INVALID_ARGUMENT, a file that cannot be written NPUALLOC_ERR_IO.
#[no_mangle]
pub extern "C" fn npualloc_dump_snapshot(path: *const c_char) -> c_int {
    code("npualloc_dump_snapshot", || {
        let path = c_str("path", path)?;
        if path.is_empty() {
            return Err(Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, "path is empty"));
        }
        let rt = runtime()?;
        let allocators: Vec<_> = rt.existing().collect();
        let json = npualloc_core::snapshot::snapshot(&allocators);
        std::fs::write(path, json.to_string())
            .map_err(|e| Failure::new(NPUALLOC_ERR_IO, format!("cannot write '{path}': {e}")))
    })
}

/// Installs runtime hooks (copied; `hooks` may be freed after the call); NULL removes
/// them. Only before the first allocation or init, else NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_set_runtime_hooks(hooks: *const npualloc_runtime_hooks) -> c_int {
    code("npualloc_set_runtime_hooks", || {
        // SAFETY: the caller passes NULL or a valid hooks struct for the call's duration.
        let h = unsafe { hooks.as_ref() }.copied();
        if let Some(h) = &h {
            hooks::validate(h)?;
        }
        set_hooks(h)
    })
}

/// Checks the internal invariants of `device`'s allocator (a test aid; cheap enough to
/// call after every operation). Returns 0, or NPUALLOC_ERR_INVALID_STATE with the broken
/// invariant in the last error.
#[no_mangle]
pub extern "C" fn npualloc_check_invariants(device: c_int) -> c_int {
    code("npualloc_check_invariants", || {
        runtime()?
            .allocator(device)?
            .check_invariants()
            .map_err(|e| Failure::new(NPUALLOC_ERR_INVALID_STATE, e))
    })
}

/// Number of devices of the backend, or -1 with an error (backend unavailable).
#[no_mangle]
pub extern "C" fn npualloc_device_count() -> c_int {
    or_default("npualloc_device_count", -1, || {
        Ok(runtime()?.device_count() as c_int)
    })
}

/// A callback told about every out-of-memory failure: device, bytes requested, capacity
/// (the memory-fraction cap if set, else the device's total memory) and free bytes.
pub type npualloc_oom_observer =
    Option<extern "C" fn(device: c_int, requested: usize, capacity: usize, free: usize)>;

/// Sets the function called (outside every allocator lock, on the allocating thread)
/// after an allocation fails with out of memory; NULL removes it. Any time.
#[no_mangle]
pub extern "C" fn npualloc_set_oom_observer(observer: npualloc_oom_observer) -> c_int {
    code("npualloc_set_oom_observer", || {
        set_oom_observer(observer);
        Ok(())
    })
}

/// Routes allocations on `capture_stream` of `device` to the graph-private pool
/// (`id_hi`, `id_lo`) (torch's `MempoolId_t`; (0, 0) is reserved) until
/// `npualloc_end_allocate_to_pool`, and marks a graph capture underway until then: call
/// it before starting a graph capture. Adds one use of the pool (creating it), which
/// `npualloc_release_pool` drops; the pool's memory stays while it has a use. It is
/// `npualloc_pool_begin` + `npualloc_route_stream_to_pool` + `npualloc_capture_begin`
/// in one call. A stream already routing to a pool gives NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_begin_allocate_to_pool(
    device: c_int,
    id_hi: u64,
    id_lo: u64,
    capture_stream: npualloc_stream,
) -> c_int {
    code("npualloc_begin_allocate_to_pool", || {
        Ok(runtime()?
            .allocator(device)?
            .begin_allocate_to_pool(MempoolId(id_hi, id_lo), to_stream(capture_stream))?)
    })
}

/// Ends one stream route to the pool (one per `npualloc_begin_allocate_to_pool` or
/// `npualloc_route_stream_to_pool`; after the capture ended) and the capture mark the
/// begin made; once no capture is underway, frees made during the capture record their
/// events. Adds or drops no use. NPUALLOC_ERR_INVALID_STATE if no stream routes to the
/// pool.
#[no_mangle]
pub extern "C" fn npualloc_end_allocate_to_pool(device: c_int, id_hi: u64, id_lo: u64) -> c_int {
    code("npualloc_end_allocate_to_pool", || {
        Ok(runtime()?
            .allocator(device)?
            .end_allocate_to_pool(MempoolId(id_hi, id_lo))?)
    })
}

/// Drops one use of the pool (torch's `releasePool`, when a graph or MemPool using it
/// goes); at no use left, its cached memory goes back to the device at the next cache
/// release once nothing in it is allocated, and the pool id may be used again. A pool
/// with no use left gives NPUALLOC_ERR_UNKNOWN_POOL.
#[no_mangle]
pub extern "C" fn npualloc_release_pool(device: c_int, id_hi: u64, id_lo: u64) -> c_int {
    code("npualloc_release_pool", || {
        Ok(runtime()?
            .allocator(device)?
            .release_pool(MempoolId(id_hi, id_lo))?)
    })
}
