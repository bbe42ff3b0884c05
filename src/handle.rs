//! The handle types every layer shares: device indices, addresses, and the runtime's
//! stream, event and physical-memory handles as plain integers (so that a runtime's
//! opaque pointers such as `aclrtStream` pass through unchanged). A leaf: it uses nothing
//! else in the crate, so pools, streams and snapshots need not import the device layer.

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
