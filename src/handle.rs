//! The types every layer shares: device indices, addresses, and the runtime's stream,
//! event and physical-memory handles as plain integers (so that a runtime's opaque
//! pointers such as `aclrtStream` pass through unchanged), a device's memory figures and
//! the errors a device backend reports. A leaf: it uses nothing else in the crate, so
//! pools, streams, snapshots, errors and the library loader need not import the device
//! layer.

use std::fmt;

/// Index of a device as the runtime numbers them (0-based).
pub type DeviceIndex = usize;

/// A device address.
pub type DevicePtr = usize;

/// A stream handle: the runtime's stream pointer as an integer; `0` is the default stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamHandle(pub usize);

impl StreamHandle {
    /// The device's default stream.
    pub const DEFAULT: StreamHandle = StreamHandle(0);
}

impl fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:#x}", self.0)
    }
}

impl fmt::Display for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An event handle: the runtime's event pointer as an integer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EventHandle(pub usize);

/// Physical memory mapped into a reserved address range (the runtime's handle).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PhysHandle(pub usize);

/// A graph-private memory pool's id (PyTorch's `MempoolId_t`: two integers); `(0, 0)`
/// is reserved.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MempoolId(pub u64, pub u64);

impl fmt::Debug for MempoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

impl From<(u64, u64)> for MempoolId {
    fn from((hi, lo): (u64, u64)) -> Self {
        MempoolId(hi, lo)
    }
}

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the runtime could still allocate.
    pub free: usize,
    /// Total device memory.
    pub total: usize,
}

/// Errors reported by a device backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The runtime could not satisfy an allocation.
    #[error("device {device} out of memory: tried to allocate {requested} bytes")]
    OutOfMemory {
        /// Device index.
        device: DeviceIndex,
        /// Bytes asked of the runtime.
        requested: usize,
    },
    /// The device index is not below the runtime's device count.
    #[error("invalid device {device}: the runtime has {count} device(s)")]
    InvalidDevice {
        /// The index asked for.
        device: i64,
        /// Devices the runtime has.
        count: usize,
    },
    /// The stream is not known to the runtime.
    #[error("unknown stream {stream} on device {device}")]
    UnknownStream {
        /// Device index.
        device: DeviceIndex,
        /// The stream handle.
        stream: StreamHandle,
    },
    /// The event handle is not (or no longer) valid.
    #[error("unknown or destroyed event {event:#x} on device {device}")]
    UnknownEvent {
        /// Device index.
        device: DeviceIndex,
        /// The raw event handle.
        event: usize,
    },
    /// A pointer given to the runtime is not a live device allocation.
    #[error("pointer {ptr:#x} is not a live allocation of device {device}")]
    InvalidPointer {
        /// Device index.
        device: DeviceIndex,
        /// The pointer.
        ptr: DevicePtr,
    },
    /// The runtime reported another failure; `code` is its own error code.
    #[error("runtime call {call} failed with code {code}: {message}")]
    Runtime {
        /// The runtime function that failed.
        call: &'static str,
        /// The runtime's error code.
        code: i64,
        /// The runtime's message, if it gave one.
        message: String,
    },
    /// The runtime library or one of its functions is missing.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

impl DeviceError {
    /// True when this error means "no memory left", which the allocator may recover from.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. })
    }
}
