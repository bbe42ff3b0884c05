//! How much a replay's figures depend on the order in which the device hands out
//! addresses: the error bar of a figure for settings that break best fit's ties by
//! address (`address_ties:True`, PyTorch's and torch_npu's presets).
//!
//! npualloc's own placement ties by segment age and offset (Note [Places],
//! `pool/block.rs`) and gives the same figures under every order (a test replays the
//! zoo so). PyTorch's policy takes the lowest address among equal-size free blocks, so
//! where the runtime puts each segment changes which block serves a request, and with
//! it peak reserved and the smallest device. A replay of such settings is repeated
//! under each of [`ORDERS`]; the spread of a figure over them is how far a "PyTorch's
//! policy needs" figure may be off on a device whose order is unknown.

use super::{min_capacity, replay, ReplayOptions};
use crate::device::sim::AddressOrder;
use crate::trace::Trace;
use crate::{Config, Error};

/// The orders a replay is repeated under: the simulated device's default (increasing),
/// decreasing (what an H200 showed, `tests/all/placement.rs`), one shuffled and lowest
/// free first.
pub const ORDERS: [AddressOrder; 4] = [
    AddressOrder::Increasing,
    AddressOrder::Decreasing,
    AddressOrder::Shuffled(1),
    AddressOrder::LowestFree,
];

/// A replay's figures under one address order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderRun {
    /// The order.
    pub order: AddressOrder,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// The smallest device (bytes) with no out of memory, when asked for and found.
    pub min_capacity: Option<u64>,
}

/// Whether settings `conf` place blocks by address (so their figures depend on the
/// device's address order).
pub fn depends_on_addresses(conf: &str) -> Result<bool, Error> {
    Ok(Config::parse(conf)?.address_ties)
}

/// `trace` replayed with `opts` (its address order aside) under each of [`ORDERS`],
/// with the minimum-capacity search (up to `opts.capacity`) when `with_min`.
pub fn across_orders(
    trace: &Trace,
    opts: &ReplayOptions,
    with_min: bool,
) -> Result<Vec<OrderRun>, Error> {
    ORDERS
        .iter()
        .map(|&order| {
            let o = ReplayOptions {
                conf: opts.conf.clone(),
                address_order: order,
                detail: false,
                ..*opts
            };
            let peak_reserved = replay(trace, &o, |_| {})?.peak_reserved;
            let min_capacity = if with_min {
                min_capacity(trace, &o)?.capacity()
            } else {
                None
            };
            Ok(OrderRun {
                order,
                peak_reserved,
                min_capacity,
            })
        })
        .collect()
}

/// The least and the most of `figure` over `runs` (`None` when any run lacks it).
pub fn spread(runs: &[OrderRun], figure: impl Fn(&OrderRun) -> Option<u64>) -> Option<(u64, u64)> {
    let all: Option<Vec<u64>> = runs.iter().map(figure).collect();
    let all = all?;
    Some((*all.iter().min()?, *all.iter().max()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PYTORCH_POLICY;
    use crate::trace;

    const MIB: u64 = 1 << 20;

    /// A 48 MiB segment S, then a 24 MiB one W; S's front taken again, W freed: two free
    /// 24 MiB blocks (S's rest, W) for a 24 MiB request. If it takes S's rest, S never
    /// becomes whole again and the last 48 MiB request grows the device (peak 120 MiB);
    /// if it takes W, S merges whole for it (peak 72 MiB).
    fn tie() -> Trace {
        let text = "a 1 50331648 0\na 2 25165824 0\nf 1\na 3 25165824 0\nf 2\n\
                    a 4 25165824 0\nf 3\na 5 50331648 0\nf 4\nf 5\n";
        trace::parse(text, "tie").unwrap()
    }

    fn runs(conf: &str) -> Vec<OrderRun> {
        let opts = ReplayOptions {
            conf: conf.into(),
            ..ReplayOptions::default()
        };
        across_orders(&tie(), &opts, true).unwrap()
    }

    #[test]
    fn address_ties_move_a_figure_across_orders_and_npualloc_ties_do_not() {
        assert!(depends_on_addresses(PYTORCH_POLICY).unwrap());
        assert!(!depends_on_addresses("").unwrap());
        assert!(depends_on_addresses("bad_key:1").is_err());
        let pytorch = runs(PYTORCH_POLICY);
        assert_eq!(pytorch.iter().map(|r| r.order).collect::<Vec<_>>(), ORDERS);
        // Increasing: S is at the lower address; decreasing: W is.
        assert_eq!(pytorch[0].peak_reserved, 120 * MIB);
        assert_eq!(pytorch[1].peak_reserved, 72 * MIB);
        assert_eq!(
            spread(&pytorch, |r| Some(r.peak_reserved)),
            Some((72 * MIB, 120 * MIB))
        );
        let (lo, hi) = spread(&pytorch, |r| r.min_capacity).unwrap();
        assert!(lo == 72 * MIB && hi > lo, "{pytorch:?}");
        // npualloc's own ties: the older segment (S) wherever the device put it.
        let ours = runs("");
        assert!(
            ours.iter().all(|r| (r.peak_reserved, r.min_capacity)
                == (ours[0].peak_reserved, ours[0].min_capacity)),
            "{ours:?}"
        );
        let opts = ReplayOptions::default();
        let without = across_orders(&tie(), &opts, false).unwrap();
        assert!(without.iter().all(|r| r.min_capacity.is_none()));
        assert_eq!(spread(&without, |r| r.min_capacity), None);
        assert_eq!(spread(&without[..0], |r| Some(r.peak_reserved)), None);
    }
}
