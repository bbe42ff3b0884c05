//! mstx profiler markers through the C ABI, for runtimes that want one loader for both.

use std::ffi::{c_char, c_int};

use npualloc_core::profiling::{Mstx, RangeId};
use npualloc_core::StreamHandle;

use crate::api::c_str;
use crate::error::{Failure, NPUALLOC_ERR_INVALID_ARGUMENT};
use crate::panic::code;
use crate::types::npualloc_stream;

/// Opens an mstx range named `message` on `stream` and stores its id in `*out_id`
/// (0 when libms_tools_ext.so is absent or no profiler is attached: nothing to end).
/// The message must be non-empty, without NUL, at most 255 bytes; it is cut to 156
/// bytes on a UTF-8 boundary before being sent. The message is checked whether or not
/// the library is loaded.
#[no_mangle]
pub extern "C" fn npualloc_mstx_range_start(
    message: *const c_char,
    stream: npualloc_stream,
    out_id: *mut u64,
) -> c_int {
    code("npualloc_mstx_range_start", || {
        if out_id.is_null() {
            return Err(Failure::new(
                NPUALLOC_ERR_INVALID_ARGUMENT,
                "out_id is NULL",
            ));
        }
        let msg = c_str("message", message)?;
        let id = Mstx::global().range_start(msg, StreamHandle(stream as usize))?;
        // SAFETY: `out_id` is non-NULL and points to a caller-owned u64.
        unsafe { out_id.write(id.map_or(0, |r| r.0.get())) };
        Ok(())
    })
}

/// Ends a range opened by `npualloc_mstx_range_start`; id 0 is ignored.
#[no_mangle]
pub extern "C" fn npualloc_mstx_range_end(id: u64) -> c_int {
    code("npualloc_mstx_range_end", || {
        if let Some(id) = std::num::NonZeroU64::new(id) {
            Mstx::global().range_end(RangeId(id));
        }
        Ok(())
    })
}

/// Places an instantaneous mstx marker named `message` on `stream`. The message must
/// be non-empty, without NUL, at most 255 bytes, whether or not the library is loaded.
#[no_mangle]
pub extern "C" fn npualloc_mstx_mark(message: *const c_char, stream: npualloc_stream) -> c_int {
    code("npualloc_mstx_mark", || {
        let msg = c_str("message", message)?;
        Ok(Mstx::global().mark(msg, StreamHandle(stream as usize))?)
    })
}
