//! Placement independent of the device's addresses (issue #29): npualloc's own policy
//! places every block the same whatever order the device hands out addresses in, so a
//! replay on the simulated device predicts any device; PyTorch's policy (address ties)
//! does not, and the simulated device's decreasing order reproduces what an H200 showed.

use npualloc::config::PYTORCH_POLICY;
use npualloc::device::sim::{AddressOrder, SimConfig, SimDevice};
use npualloc::replay::{min_capacity, replay, ReplayOptions, ReplayReport};
use npualloc::trace::{self, derive::derive, Trace};
use npualloc::{CachingAllocator, Config, StreamHandle};

use crate::replay::traces_dir;

const MIB: usize = 1 << 20;

/// Every shipped trace and every zoo trace.
fn every_trace() -> Vec<Trace> {
    let mut paths: Vec<_> = ["", "zoo"]
        .iter()
        .flat_map(|d| std::fs::read_dir(traces_dir().join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            trace::parse(&text, &p.file_name().unwrap().to_string_lossy()).unwrap()
        })
        .collect()
}

fn run(t: &Trace, conf: &str, capacity: usize, order: AddressOrder) -> ReplayReport {
    let opts = ReplayOptions {
        conf: conf.into(),
        capacity,
        address_order: order,
        ..ReplayOptions::default()
    };
    let r = replay(t, &opts, |_| {}).unwrap();
    assert_eq!(r.invariants, Ok(()), "{} [{conf}] {order}", t.name);
    r
}

/// Everything a replay reports but its wall time. The segments at the first out of
/// memory are listed by address (as a snapshot lists them): sorted by their figures.
fn figures(r: &ReplayReport) -> String {
    let mut r = ReplayReport {
        seconds: 0.0,
        ..r.clone()
    };
    if let Some(oom) = &mut r.first_oom {
        oom.segments.sort_by_key(|s| {
            (
                s.size,
                s.stream,
                s.small,
                s.allocated,
                s.pending,
                s.free,
                s.largest_free,
                s.blocks,
            )
        });
    }
    format!("{r:?}")
}

/// Replays `t` with the defaults uncapped, at the smallest device of the increasing
/// order and one MiB under it (out of memory), under every order: the same reports.
fn same_under_every_order(t: &Trace) {
    let inc = AddressOrder::Increasing;
    let min = min_capacity(t, &ReplayOptions::default()).unwrap();
    let cap = min.capacity().expect("fits in 64 GiB") as usize;
    let base: Vec<_> = [64 << 30, cap, cap - MIB]
        .iter()
        .map(|&c| figures(&run(t, "", c, inc)))
        .collect();
    assert!(
        base[2].contains("first_oom: Some"),
        "{}: fails under its minimum",
        t.name
    );
    for order in AddressOrder::all(0x5eed).into_iter().skip(1) {
        for (c, want) in [64 << 30, cap, cap - MIB].into_iter().zip(&base) {
            assert_eq!(
                &figures(&run(t, "", c, order)),
                want,
                "{} at {c} B, {order}",
                t.name
            );
        }
    }
}

#[test]
fn the_zoo_replays_identically_under_every_address_order() {
    let traces = every_trace();
    assert!(traces.len() >= 20, "{} traces", traces.len());
    for t in &traces {
        same_under_every_order(t);
    }
}

/// Lending (whole segments and blocks between streams) ties by place too.
#[test]
fn derived_multi_stream_cases_replay_identically_under_every_address_order() {
    for name in ["gpt2_infer.trace", "zoo/mobilenet_infer.trace"] {
        let text = std::fs::read_to_string(traces_dir().join(name)).unwrap();
        let t = trace::parse(&text, name).unwrap();
        for case in ["comm16", "branch", "rr4"] {
            same_under_every_order(&derive(&t, case).unwrap());
        }
    }
}

/// Two free 24 MiB segments made in turn on a device handing out decreasing addresses,
/// then a 24 MiB request: which segment (0: the first made) serves it.
fn tie_winner(conf: &str) -> usize {
    let sim = SimDevice::new(SimConfig {
        address_order: AddressOrder::Decreasing,
        ..SimConfig::default()
    });
    let a = CachingAllocator::new(sim.clone(), 0, Config::parse(conf).unwrap()).unwrap();
    let s = StreamHandle::DEFAULT;
    let segs = [
        a.malloc(24 * MIB, s).unwrap(),
        a.malloc(24 * MIB, s).unwrap(),
    ];
    assert!(segs[0] > segs[1], "decreasing addresses");
    for p in segs {
        a.free(p).unwrap();
    }
    let p = a.malloc(24 * MIB, s).unwrap();
    assert_eq!(sim.counters(0).mallocs, 2, "[{conf}] served from the cache");
    segs.iter().position(|&q| q == p).expect("one of the two")
}

#[test]
fn equal_blocks_tie_by_segment_age_and_under_pytorchs_policy_by_address() {
    assert_eq!(
        tie_winner(""),
        0,
        "the older segment, at the higher address"
    );
    assert_eq!(tie_winner(PYTORCH_POLICY), 1, "the lower address");
    assert_eq!(tie_winner("address_ties:True"), 1);
}

/// Peak reserved MiB of PyTorch's policy and of npualloc's defaults with address ties
/// (npualloc's placement before issue #29) on an H200 (torch 2.11), from issue #29:
/// every one is what the simulated device's decreasing order gives, and two differ
/// under the increasing order.
#[test]
fn the_decreasing_order_reproduces_the_h200s_figures_with_address_ties() {
    let h200 = [
        ("bert_train.trace", 2034, 1808),
        ("gpt2_infer.trace", 276, 220),
        ("resnet50_train.trace", 964, 944),
        ("t5_train.trace", 4354, 4192),
    ];
    let mut moved = 0;
    for (name, pytorch, ours) in h200 {
        let text = std::fs::read_to_string(traces_dir().join(name)).unwrap();
        let t = trace::parse(&text, name).unwrap();
        for (conf, want) in [(PYTORCH_POLICY, pytorch), ("address_ties:True", ours)] {
            let mib = |o| run(&t, conf, 64 << 30, o).peak_reserved as usize / MIB;
            assert_eq!(mib(AddressOrder::Decreasing), want, "{name} [{conf}]");
            moved += usize::from(mib(AddressOrder::Increasing) != want);
        }
    }
    assert!(moved >= 2, "{moved} figures depend on the order");
}

fn npualloc(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_npualloc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// `--json` gives settings with address ties their figures under each order and the
/// spread; npualloc's defaults, the same under every order, get none.
#[test]
fn replay_json_reports_the_spread_over_address_orders_for_address_ties() {
    let out = npualloc(&[
        "replay",
        "-q",
        "--json",
        "--min-capacity",
        "traces/resnet50_train.trace",
        "--conf",
        "",
        "--conf",
        "pytorch",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v[0].get("address_orders").is_none());
    let o = &v[1]["address_orders"];
    assert_eq!(o["runs"].as_array().unwrap().len(), 4);
    assert_eq!(o["runs"][1]["order"], "decreasing");
    assert_eq!(o["runs"][1]["peak_reserved"], 964 * MIB as u64);
    let (lo, hi) = (
        o["peak_reserved"][0].as_u64().unwrap(),
        o["peak_reserved"][1].as_u64().unwrap(),
    );
    assert!(lo < hi, "{o}");
    assert!(
        o["min_capacity"][0].as_u64().unwrap() <= v[1]["min_capacity"]["bytes"].as_u64().unwrap()
    );
    let bad = npualloc(&[
        "replay",
        "traces/gpt2_infer.trace",
        "--address-order",
        "sideways",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("shuffled:SEED"));
}
