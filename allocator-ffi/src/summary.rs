//! `npualloc_memory_summary`: torch_npu's memory summary table plus the fragmentation
//! account, as text.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};

use npualloc_core::summary::{Fragmentation, MemorySummary};

use crate::panic::or_default;
use crate::runtime::runtime;

thread_local! {
    static SUMMARY: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// The memory summary of `device` (the table of `torch.npu.memory_summary()`, only the
/// "all" rows when `abbreviated`, then one line on where reserved memory goes), as a
/// NUL-terminated string owned by the library and valid until this thread's next call
/// of this function. NULL on error (invalid device, backend unavailable), with the
/// reason in `npualloc_last_error()`.
#[no_mangle]
pub extern "C" fn npualloc_memory_summary(device: c_int, abbreviated: bool) -> *const c_char {
    or_default("npualloc_memory_summary", std::ptr::null(), || {
        let alloc = runtime()?.allocator(device)?;
        let text = MemorySummary::new(&alloc.stats(), Some(i64::from(device)))
            .abbreviated(abbreviated)
            .with_fragmentation(Fragmentation::of(&alloc.segments()))
            .to_string();
        // The text is built from numbers and fixed words: it has no NUL byte.
        let c = CString::new(text).unwrap_or_default();
        Ok(SUMMARY.with(|slot| slot.borrow_mut().insert(c).as_ptr()))
    })
}
