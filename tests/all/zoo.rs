//! The trace zoo (traces/zoo/): every trace replays cleanly under the default settings,
//! PyTorch's policy and expandable segments, to the peak traces/README.md documents,
//! and the minimum-capacity search finds a device for each.

use npualloc::config::PYTORCH_POLICY;
use npualloc::replay::{min_capacity, replay, ReplayOptions};
use npualloc::trace;

use crate::replay::traces_dir;

/// Each zoo trace: name, events and peak live (requested) bytes, as in traces/README.md.
const ZOO: [(&str, usize, u64); 16] = [
    ("llama_decode", 82_218, 8_368_948),
    ("gpt2_decode_batch8", 56_368, 85_034_101),
    ("vit_infer", 1_212, 33_878_016),
    ("mobilenet_infer", 3_568, 138_086_656),
    ("mlp_infer", 252, 9_998_336),
    ("bert_infer_varlen", 3_708, 69_238_784),
    ("resnet50_infer_varbatch", 3_768, 378_929_152),
    ("t5_generate_varlen", 100_776, 35_364_892),
    ("unet_sample", 13_698, 105_190_416),
    ("llama_pretrain", 11_646, 1_769_646_388),
    ("gpt2_pretrain_bf16", 11_558, 1_999_755_208),
    ("mixtral_moe_train", 7_014, 1_350_459_684),
    ("llama_lora_finetune", 12_488, 916_128_264),
    ("unet_train", 46_130, 1_717_806_124),
    ("vit_train", 15_826, 1_660_044_616),
    ("mlp_train", 1_296, 15_433_816),
];

fn load_zoo(name: &str) -> trace::Trace {
    let path = traces_dir().join("zoo").join(format!("{name}.trace"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    trace::parse(&text, name).unwrap()
}

/// "1234567" -> "1,234,567", as the README table writes numbers.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn the_zoo_is_the_documented_set() {
    let mut on_disk: Vec<String> = std::fs::read_dir(traces_dir().join("zoo"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".trace"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = ZOO.iter().map(|(n, _, _)| format!("{n}.trace")).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "a trace in traces/zoo/ is missing from ZOO, or back"
    );
    let readme = std::fs::read_to_string(traces_dir().join("README.md")).unwrap();
    for (name, events, peak) in ZOO {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("traces/README.md has no row for {name}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[3], grouped(events as u64), "{name}: events");
        assert_eq!(cells[6], grouped(peak), "{name}: peak live bytes");
        let size = std::fs::metadata(traces_dir().join("zoo").join(format!("{name}.trace")))
            .unwrap()
            .len();
        assert!(size < 5 << 20, "{name}: {size} bytes, over 5 MB");
    }
}

#[test]
fn every_zoo_trace_replays_to_its_documented_peak() {
    let expandable_pytorch = format!("{PYTORCH_POLICY},expandable_segments:True");
    for (name, events, peak) in ZOO {
        let t = load_zoo(name);
        assert_eq!(t.ops.len(), events, "{name}");
        assert_eq!(t.peak_requested(), peak, "{name}");
        for conf in [
            "",
            PYTORCH_POLICY,
            "expandable_segments:True",
            &expandable_pytorch,
        ] {
            let opts = ReplayOptions {
                conf: conf.into(),
                ..ReplayOptions::default()
            };
            let r = replay(&t, &opts, |_| {}).unwrap();
            let what = format!("{name} [{conf}]");
            assert_eq!(r.peak_requested, peak, "{what}");
            assert_eq!(r.ooms, 0, "{what}");
            assert_eq!(r.invariants, Ok(()), "{what}");
            assert!(
                r.peak_reserved >= r.peak_allocated && r.peak_allocated >= r.peak_requested,
                "{what}"
            );
            assert_eq!(
                r.reserved_after_drain, 0,
                "{what}: reserve left after draining"
            );
            assert_eq!(r.stalled_waits, 0, "{what}: one stream never waits");
        }
    }
}

#[test]
fn every_zoo_trace_has_a_minimum_capacity_under_its_uncapped_reserve() {
    for (name, _, peak) in ZOO {
        let t = load_zoo(name);
        let opts = ReplayOptions::default();
        let uncapped = replay(&t, &opts, |_| {}).unwrap();
        let m = min_capacity(&t, &opts).unwrap();
        let cap = m
            .capacity()
            .unwrap_or_else(|| panic!("{name} fits in 64 GiB"));
        assert!(cap >= peak, "{name}: {cap} under the peak requested {peak}");
        assert!(
            cap <= uncapped.peak_reserved.div_ceil(1 << 20) << 20,
            "{name}: {cap} over the uncapped peak reserved {}",
            uncapped.peak_reserved
        );
        assert_eq!(m.at_min().unwrap().ooms, 0, "{name}");
    }
}
