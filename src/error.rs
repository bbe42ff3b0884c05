//! Errors of the caching allocator.

use crate::handle::{DeviceError, DevicePtr, MempoolId, StreamHandle};

/// Everything the allocator can report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A request of zero bytes (callers map it to a null pointer).
    #[error("allocation of 0 bytes")]
    ZeroSize,
    /// The request is too large to round or to ever fit.
    #[error("cannot allocate {requested} bytes: the size is too large to round to a block")]
    SizeTooLarge {
        /// The caller's size.
        requested: usize,
    },
    /// Out of memory after releasing the cache and retrying.
    #[error("{message}")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// PyTorch-style explanation (capacity, free, allocated, reserved).
        message: String,
    },
    /// `free` or `record_stream` on a pointer that is not a live allocation (including a
    /// double free).
    #[error("unknown pointer {ptr:#x}: not allocated by npualloc or already freed")]
    UnknownPointer {
        /// The pointer.
        ptr: DevicePtr,
    },
    /// The device index is out of range.
    #[error("invalid device {device}: {count} device(s) available")]
    InvalidDevice {
        /// The index asked for.
        device: i64,
        /// Devices available.
        count: usize,
    },
    /// The stream is not a stream of this device.
    #[error("unknown stream {stream} on device {device}")]
    UnknownStream {
        /// Device index.
        device: usize,
        /// The stream.
        stream: StreamHandle,
    },
    /// A malformed settings string or value.
    #[error("invalid allocator config: {0}")]
    InvalidConfig(String),
    /// A value out of range (memory fraction, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A tag that was never bound (streams) or created (events).
    #[error("unknown tag '{0}'")]
    UnknownTag(String),
    /// The call is not allowed now (tag already bound, event created twice, settings
    /// changed after the first allocation, ...).
    #[error("invalid state: {0}")]
    InvalidState(String),
    /// A graph-private pool that is not live (no capture or caller holds a use of it),
    /// named where one is required.
    #[error("pool {id:?} is not live (it has no use): {why}")]
    UnknownPool {
        /// The pool id.
        id: MempoolId,
        /// What could not be done.
        why: &'static str,
    },
    /// A request npualloc cannot honour (the message says which and why).
    #[error("not supported by npualloc: {0}")]
    Unsupported(String),
    /// The device runtime failed.
    #[error("device runtime error: {0}")]
    Device(DeviceError),
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::InvalidDevice { device, count } => Error::InvalidDevice { device, count },
            DeviceError::UnknownStream { device, stream } => {
                Error::UnknownStream { device, stream }
            }
            other => Error::Device(other),
        }
    }
}
