//! Cross-stream lifetime tracking: the event pool, the per-stream FIFOs of frees
//! waiting for their events, and the fences of lent blocks.

pub mod events;
pub mod fences;
pub mod pending;

pub use events::EventPool;
pub use fences::{DirtyMarks, Fences, UNFENCED};
pub use pending::PendingFrees;
