//! Error codes and the thread-local last error.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};

use npualloc_core::{DeviceError, Error};

/// Success.
pub const NPUALLOC_OK: c_int = 0;
/// A null, empty or too long string, or a bad value.
pub const NPUALLOC_ERR_INVALID_ARGUMENT: c_int = 1;
/// A pointer that is not a live allocation (including a double free).
pub const NPUALLOC_ERR_UNKNOWN_POINTER: c_int = 2;
/// A device index below 0 or at/above the device count.
pub const NPUALLOC_ERR_INVALID_DEVICE: c_int = 3;
/// Out of memory after releasing the cache and retrying.
pub const NPUALLOC_ERR_OUT_OF_MEMORY: c_int = 4;
/// The device runtime failed; the message carries its code and text.
pub const NPUALLOC_ERR_RUNTIME: c_int = 5;
/// The runtime library or one of its symbols is missing.
pub const NPUALLOC_ERR_BACKEND_UNAVAILABLE: c_int = 6;
/// Not allowed now (configure after first allocation, tag already bound, ...).
pub const NPUALLOC_ERR_INVALID_STATE: c_int = 7;
/// A tag never bound or created.
pub const NPUALLOC_ERR_UNKNOWN_TAG: c_int = 8;
/// A file could not be written or read.
pub const NPUALLOC_ERR_IO: c_int = 9;
/// A graph pool that is not live (never created, or every use released) where one
/// is required.
pub const NPUALLOC_ERR_UNKNOWN_POOL: c_int = 10;
/// A request npualloc cannot honour (the message says which and why).
pub const NPUALLOC_ERR_UNSUPPORTED: c_int = 11;
/// An internal panic was caught at the boundary.
pub const NPUALLOC_ERR_PANIC: c_int = 99;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// A failure: its code and message.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub code: c_int,
    pub message: String,
}

impl Failure {
    pub fn new(code: c_int, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::ZeroSize
            | Error::SizeTooLarge { .. }
            | Error::UnknownStream { .. }
            | Error::InvalidConfig(_)
            | Error::InvalidArgument(_) => NPUALLOC_ERR_INVALID_ARGUMENT,
            Error::OutOfMemory { .. } => NPUALLOC_ERR_OUT_OF_MEMORY,
            Error::UnknownPointer { .. } => NPUALLOC_ERR_UNKNOWN_POINTER,
            Error::InvalidDevice { .. } => NPUALLOC_ERR_INVALID_DEVICE,
            Error::UnknownTag(_) => NPUALLOC_ERR_UNKNOWN_TAG,
            Error::InvalidState(_) => NPUALLOC_ERR_INVALID_STATE,
            Error::UnknownPool { .. } => NPUALLOC_ERR_UNKNOWN_POOL,
            Error::Unsupported(_) => NPUALLOC_ERR_UNSUPPORTED,
            Error::Device(DeviceError::Unavailable(_)) => NPUALLOC_ERR_BACKEND_UNAVAILABLE,
            Error::Device(DeviceError::OutOfMemory { .. }) => NPUALLOC_ERR_OUT_OF_MEMORY,
            Error::Device(_) => NPUALLOC_ERR_RUNTIME,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<DeviceError> for Failure {
    fn from(e: DeviceError) -> Self {
        Failure::from(Error::from(e))
    }
}

/// Stores `message` as this thread's last error.
pub(crate) fn set_last_error(function: &str, message: &str) {
    let text = format!("{function}: {message}").replace('\0', "\\0");
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(c));
}

/// This thread's last error message, or NULL if no call on this thread ever failed.
///
/// The string is owned by npualloc and stays valid until the next failing call on this
/// thread; copy it to keep it. A successful call does not clear it.
#[no_mangle]
pub extern "C" fn npualloc_last_error() -> *const c_char {
    LAST_ERROR.with(|slot| {
        slot.borrow()
            .as_ref()
            .map_or(std::ptr::null(), |c| c.as_ptr())
    })
}
