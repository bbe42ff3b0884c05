//! Integration tests of the core crate, as one test binary (one module per area).

mod acl;
mod bad_input;
mod basic;
mod common;
mod cross_stream;
mod expandable;
mod fake_acl;
mod faults;
mod graph_pools;
mod lending;
mod mstx;
mod pickle;
mod props;
mod replay;
mod stress;
mod tagged;
