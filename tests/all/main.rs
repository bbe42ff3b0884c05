//! Integration tests of the core crate, as one test binary (one module per area).

mod bad_input;
mod basic;
mod common;
mod cross_stream;
mod faults;
mod props;
mod stress;
