//! Test controls of the simulated backend (`NPUALLOC_BACKEND=sim`). Test-only: they fail
//! with NPUALLOC_ERR_INVALID_STATE on any other backend.

use std::ffi::c_int;
use std::sync::Arc;

use npualloc_core::device::sim::SimDevice;
use npualloc_core::StreamHandle;

use crate::error::{Failure, NPUALLOC_ERR_INVALID_ARGUMENT, NPUALLOC_ERR_INVALID_STATE};
use crate::panic::code;
use crate::runtime::runtime;
use crate::types::npualloc_stream;

/// Counters of one simulated device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct npualloc_sim_counters {
    /// Successful device allocations.
    pub mallocs: u64,
    /// Successful device frees.
    pub frees: u64,
    /// Bytes currently allocated on the device.
    pub live_bytes: u64,
    /// Highest live_bytes seen.
    pub peak_bytes: u64,
    /// Events created.
    pub events_created: u64,
    /// Events destroyed.
    pub events_destroyed: u64,
    /// Event records queued.
    pub event_records: u64,
    /// Misuses seen (unknown pointer freed, destroyed event used, ...).
    pub violations: u64,
}

fn sim() -> Result<(&'static Arc<SimDevice>, usize), Failure> {
    let rt = runtime()?;
    let sim = rt.sim.as_ref().ok_or_else(|| {
        Failure::new(
            NPUALLOC_ERR_INVALID_STATE,
            "npualloc_sim_* needs NPUALLOC_BACKEND=sim",
        )
    })?;
    Ok((sim, rt.device_count()))
}

fn dev(device: c_int) -> Result<&'static Arc<SimDevice>, Failure> {
    let (sim, _) = sim()?;
    runtime()?.check_device(device)?;
    Ok(sim)
}

fn out_ptr<T>(p: *mut T) -> Result<*mut T, Failure> {
    if p.is_null() {
        Err(Failure::new(
            NPUALLOC_ERR_INVALID_ARGUMENT,
            "output pointer is NULL",
        ))
    } else {
        Ok(p)
    }
}

/// Test-only: creates a simulated stream on `device` and stores it in `*out`.
#[no_mangle]
pub extern "C" fn npualloc_sim_create_stream(device: c_int, out: *mut npualloc_stream) -> c_int {
    code("npualloc_sim_create_stream", || {
        let out = out_ptr(out)?;
        let s = dev(device)?.create_stream(device as usize)?;
        // SAFETY: `out` is non-NULL and points to a caller-owned stream slot.
        unsafe { out.write(s.0 as npualloc_stream) };
        Ok(())
    })
}

/// Test-only: queues `count` units of (empty) work on `stream`, keeping it busy until
/// completed (manual mode) or run (threaded mode).
#[no_mangle]
pub extern "C" fn npualloc_sim_launch(device: c_int, stream: npualloc_stream, count: u32) -> c_int {
    code("npualloc_sim_launch", || {
        let sim = dev(device)?;
        for _ in 0..count {
            sim.launch(device as usize, StreamHandle(stream as usize), |_| {})?;
        }
        Ok(())
    })
}

/// Test-only: runs (manual mode) or waits for (threaded mode) all work queued on `stream`.
#[no_mangle]
pub extern "C" fn npualloc_sim_complete_stream(device: c_int, stream: npualloc_stream) -> c_int {
    code("npualloc_sim_complete_stream", || {
        dev(device)?.complete_stream(device as usize, StreamHandle(stream as usize))?;
        Ok(())
    })
}

/// Test-only: writes the counters of simulated `device` into `*out`.
#[no_mangle]
pub extern "C" fn npualloc_sim_get_counters(
    device: c_int,
    out: *mut npualloc_sim_counters,
) -> c_int {
    code("npualloc_sim_get_counters", || {
        let out = out_ptr(out)?;
        let c = dev(device)?.counters(device as usize);
        let v = npualloc_sim_counters {
            mallocs: c.mallocs,
            frees: c.frees,
            live_bytes: c.live_bytes as u64,
            peak_bytes: c.peak_bytes as u64,
            events_created: c.events_created,
            events_destroyed: c.events_destroyed,
            event_records: c.event_records,
            violations: c.violations,
        };
        // SAFETY: `out` is non-NULL and points to caller-owned counters.
        unsafe { out.write(v) };
        Ok(())
    })
}
