//! Profiler markers: mstx ranges around the allocator's slow paths.

pub mod mstx;

pub use mstx::{HeldRange, Mstx, RangeGuard, RangeId};
