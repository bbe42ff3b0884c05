//! A C ABI call sequence read from bytes, on the simulated device in manual mode: the
//! interpreter behind the C ABI property test (`tests/abi_sequence.rs`) and the
//! `c_abi` fuzz target (`fuzz/`). Every 4 bytes are one call; after each call the
//! allocator's invariants must hold, and at the end everything is freed and released.

use std::ffi::c_void;
use std::sync::{Mutex, Once};

use npualloc::*;

static SETUP: Once = Once::new();
/// The runtime is process-wide: one sequence at a time.
static ONE_AT_A_TIME: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn streams() -> Vec<usize> {
    SETUP.call_once(|| {
        // Set before the runtime reads the environment (at its first use).
        std::env::set_var("NPUALLOC_BACKEND", "sim");
        std::env::set_var("NPUALLOC_SIM_MODE", "manual");
        std::env::set_var("NPUALLOC_SIM_CAPACITY", "256M");
        std::env::set_var("NPUALLOC_SIM_DEVICES", "1");
        let mut v = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        v.push(0);
        for _ in 0..2 {
            let mut s: npualloc_stream = std::ptr::null_mut();
            assert_eq!(npualloc_sim_create_stream(0, &mut s), 0);
            v.push(s as usize);
        }
    });
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

fn invariants() {
    assert_eq!(npualloc_check_invariants(0), 0, "{:?}", last_error());
}

fn last_error() -> Option<String> {
    let e = npualloc_last_error();
    // SAFETY: NULL or a NUL-terminated string valid until this thread's next call.
    (!e.is_null()).then(|| {
        unsafe { std::ffi::CStr::from_ptr(e) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Runs the calls `data` encodes; panics if an invariant breaks or memory is left.
pub fn run(data: &[u8]) {
    let streams = streams();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stream = |b: u8| streams[b as usize % streams.len()] as npualloc_stream;
    let mut live: Vec<*mut c_void> = Vec::new();
    for c in data.chunks_exact(4) {
        let (op, a, b) = (c[0] % 10, u16::from_le_bytes([c[1], c[2]]) as usize, c[3]);
        let pick = |live: &Vec<*mut c_void>| (!live.is_empty()).then(|| a % live.len());
        match op {
            0..=2 => {
                let size = a << (b % 20); // up to 32 GiB: out-of-memory paths too
                let p = npualloc_malloc(size, 0, stream(b >> 5));
                if !p.is_null() {
                    live.push(p);
                }
            }
            3 => {
                if let Some(i) = pick(&live) {
                    npualloc_free(live.swap_remove(i), 0, 0, stream(b));
                }
            }
            4 => {
                if let Some(i) = pick(&live) {
                    npualloc_record_stream(live[i], stream(b));
                }
            }
            5 => assert_eq!(npualloc_sim_launch(0, stream(b), u32::from(b % 4)), 0),
            6 => assert_eq!(npualloc_sim_complete_stream(0, stream(b)), 0),
            7 => assert_eq!(npualloc_empty_cache_device(0), 0, "{:?}", last_error()),
            8 => npualloc_set_memory_fraction(a as f64 / 50_000.0, 0),
            _ => {
                // Misuse: an unknown pointer, a pointer inside a block, a bad device.
                let p = live.first().map_or(0x1000, |&p| p as usize + 1 + a);
                npualloc_free(p as *mut c_void, 0, 0, stream(b));
                npualloc_record_stream(p as *mut c_void, stream(b));
                assert!(npualloc_malloc(16, i32::from(b) + 1, std::ptr::null_mut()).is_null());
            }
        }
        invariants();
    }
    for p in live {
        npualloc_free(p, 0, 0, std::ptr::null_mut());
    }
    for &s in &streams {
        assert_eq!(npualloc_sim_complete_stream(0, s as npualloc_stream), 0);
    }
    npualloc_set_memory_fraction(1.0, 0);
    assert_eq!(npualloc_empty_cache_device(0), 0, "{:?}", last_error());
    invariants();
    // SAFETY: zeroed plain data, filled by the call.
    let mut st: npualloc_device_stats = unsafe { std::mem::zeroed() };
    assert_eq!(npualloc_get_device_stats(0, &mut st), 0);
    assert_eq!(st.allocated_bytes[0].current, 0);
    assert_eq!(st.reserved_bytes[0].current, 0);
}
