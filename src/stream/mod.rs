//! Cross-stream lifetime tracking: the event pool and the per-stream FIFOs of frees
//! waiting for their events.

pub mod events;
pub mod pending;
pub mod tagged;

pub use events::EventPool;
pub use pending::PendingFrees;
pub use tagged::TagRegistry;
