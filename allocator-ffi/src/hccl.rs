//! HCCL's multi-stream memory reuse (torch_npu's `recordHcclWorkForBlock` and
//! `eraseStreamWithBlockPtr`, `ERASE_RECORD_STREAM_WITH_OPTIMIZE`): an allocation
//! recorded on the HCCL stream remembers the collective (the work) that last used it;
//! once the allocation's own stream waits for that work, the use on the HCCL stream is
//! erased, also after the allocation was freed (its free then completes without
//! waiting for the HCCL stream). The block handle of torch_npu's `getBlockPtr` is the
//! allocation's address.

use std::ffi::{c_int, c_void};

use npualloc_core::StreamHandle;

use crate::error::{Failure, NPUALLOC_ERR_INVALID_ARGUMENT};
use crate::panic::code;
use crate::runtime::runtime;
use crate::types::npualloc_stream;

/// Remembers `work` (an opaque, non-NULL id of the collective) as the last work that
/// used the live allocation `ptr` (torch_npu's `recordHcclWorkForBlock`). Forgotten
/// when the allocation's free completes. An unknown pointer gives
/// NPUALLOC_ERR_UNKNOWN_POINTER.
#[no_mangle]
pub extern "C" fn npualloc_record_hccl_work(ptr: *mut c_void, work: *mut c_void) -> c_int {
    code("npualloc_record_hccl_work", || {
        if work.is_null() {
            return Err(Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, "work is NULL"));
        }
        let rt = runtime()?;
        let p = ptr as usize;
        for a in rt.existing() {
            match a.record_hccl_work(p, work as usize) {
                Err(npualloc_core::Error::UnknownPointer { .. }) => continue,
                r => return Ok(r?),
            }
        }
        Err(npualloc_core::Error::UnknownPointer { ptr: p }.into())
    })
}

/// torch_npu's `eraseStream(ptr, stream)`: forgets the use of `stream` by the live
/// allocation `ptr` only if the allocation was made on `current_stream` (the caller's
/// current stream, which now waits for `stream`'s work); otherwise nothing changes. An
/// unknown pointer gives NPUALLOC_ERR_UNKNOWN_POINTER.
#[no_mangle]
pub extern "C" fn npualloc_erase_stream_on_current(
    ptr: *mut c_void,
    stream: npualloc_stream,
    current_stream: npualloc_stream,
) -> c_int {
    code("npualloc_erase_stream_on_current", || {
        let rt = runtime()?;
        let p = ptr as usize;
        let owner = rt
            .owner_of(p, None)
            .ok_or(npualloc_core::Error::UnknownPointer { ptr: p })?;
        Ok(owner.erase_stream_if_current(
            p,
            StreamHandle(stream as usize),
            StreamHandle(current_stream as usize),
        )?)
    })
}

/// torch_npu's `eraseStreamWithBlockPtr(block, stream, work)`: if the allocation at
/// `ptr` (live, or freed and waiting for other streams) belongs to `current_stream`
/// (the caller's current stream, which now waits for the work) and `work` is the last
/// work recorded for it, its use on `stream` is erased: a pending free stops waiting
/// for `stream` (and completes if nothing else is left). Otherwise nothing changes, as
/// in torch_npu: the memory was reused, or another work used it since. `work` NULL gives
/// NPUALLOC_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn npualloc_erase_stream_for_work(
    ptr: *mut c_void,
    stream: npualloc_stream,
    work: *mut c_void,
    current_stream: npualloc_stream,
) -> c_int {
    code("npualloc_erase_stream_for_work", || {
        if work.is_null() {
            return Err(Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, "work is NULL"));
        }
        let rt = runtime()?;
        for a in rt.existing() {
            let done = a.erase_stream_for_work(
                ptr as usize,
                StreamHandle(stream as usize),
                work as usize,
                StreamHandle(current_stream as usize),
            )?;
            if done {
                break;
            }
        }
        Ok(())
    })
}
