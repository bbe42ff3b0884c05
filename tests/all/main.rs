//! Integration tests of the core crate, as one test binary (one module per area).

mod acl;
mod bad_input;
mod basic;
mod blame;
mod capacity;
mod cli;
#[cfg(feature = "cli")]
mod cli_pipe;
#[cfg(feature = "cli")]
mod cli_snapshots;
mod common;
mod cross_stream;
mod exact_stats;
mod exact_stats_quiet;
mod expandable;
mod fake_acl;
mod faults;
mod fuzz_checks;
mod fuzz_props;
mod graph_pools;
mod lending;
mod mstx;
mod pickle;
#[cfg(feature = "cli")]
mod placement;
mod policy;
mod pool_lifetime;
mod pool_props;
#[cfg(feature = "cli")]
mod pressure;
#[cfg(feature = "cli")]
mod pressure_zoo;
mod props;
#[cfg(feature = "cli")]
mod pytorch_fit;
#[cfg(feature = "cli")]
mod replay;
mod soak;
mod stress;
mod tune;
mod zoo;
