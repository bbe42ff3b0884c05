//! torchair's tagged streams and events through the C ABI.

use std::ffi::{c_char, c_int, c_void};

use npualloc_core::StreamHandle;

use crate::api::{c_str, record};
use crate::panic::code;
use crate::runtime::runtime;
use crate::types::npualloc_stream;

/// Binds `tag` to `stream`. Binding a tag again to another stream, or "default" to a
/// non-NULL stream, fails with NPUALLOC_ERR_INVALID_STATE; to the same stream is a no-op.
/// The stream is not checked here, on either backend: a binding is only a name, and ACL
/// cannot validate stream handles. An unknown stream is refused where the tag is first
/// used with the device (`npualloc_record_tagged_stream` on the simulated device; on ACL
/// the event record at free fails and the error is reported there).
#[no_mangle]
pub extern "C" fn npualloc_tag_stream(tag: *const c_char, stream: npualloc_stream) -> c_int {
    code("npualloc_tag_stream", || {
        let tag = c_str("tag", tag)?;
        Ok(runtime()?
            .tags
            .tag_stream(tag, StreamHandle(stream as usize))?)
    })
}

/// `npualloc_record_stream(ptr, stream of tag)`; an unbound tag fails with
/// NPUALLOC_ERR_UNKNOWN_TAG.
#[no_mangle]
pub extern "C" fn npualloc_record_tagged_stream(ptr: *mut c_void, tag: *const c_char) -> c_int {
    code("npualloc_record_tagged_stream", || {
        let tag = c_str("tag", tag)?;
        let s = runtime()?.tags.stream_of(tag)?;
        record(ptr, s)
    })
}

/// Creates the event named `tag`; creating it twice fails with NPUALLOC_ERR_INVALID_STATE.
#[no_mangle]
pub extern "C" fn npualloc_tagged_event_create(tag: *const c_char) -> c_int {
    code("npualloc_tagged_event_create", || {
        let tag = c_str("tag", tag)?;
        Ok(runtime()?.tags.event_create(tag)?)
    })
}

/// Records the event named `tag` on `stream`.
#[no_mangle]
pub extern "C" fn npualloc_tagged_event_record(
    tag: *const c_char,
    stream: npualloc_stream,
) -> c_int {
    code("npualloc_tagged_event_record", || {
        let tag = c_str("tag", tag)?;
        let rt = runtime()?;
        Ok(rt
            .tags
            .event_record(&*rt.backend, tag, StreamHandle(stream as usize))?)
    })
}

/// Makes `stream` wait on the device for the event named `tag` (never blocks the host);
/// a no-op if the event was never recorded.
#[no_mangle]
pub extern "C" fn npualloc_tagged_event_wait(tag: *const c_char, stream: npualloc_stream) -> c_int {
    code("npualloc_tagged_event_wait", || {
        let tag = c_str("tag", tag)?;
        let rt = runtime()?;
        Ok(rt
            .tags
            .event_wait(&*rt.backend, tag, StreamHandle(stream as usize))?)
    })
}
