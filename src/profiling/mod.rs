//! Profiler markers: mstx ranges around the allocator's slow paths.

pub mod mstx;

pub use mstx::{Mstx, RangeGuard, RangeId};
