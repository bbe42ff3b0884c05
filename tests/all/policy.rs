//! Allocator policy against PyTorch's and torch_npu's (issue #15): the torch_npu preset
//! reproduces torch_npu 2.14's own allocator on the shipped traces, and on random churn
//! the default settings never reserve more than PyTorch's policy.

use npualloc::config::{PYTORCH_POLICY, TORCH_NPU_POLICY};
use npualloc::replay::{replay, ReplayOptions};
use npualloc::trace::{self, Trace};

use crate::replay::load;

const MIB: u64 = 1 << 20;

fn run(t: &Trace, conf: &str) -> npualloc::replay::ReplayReport {
    let opts = ReplayOptions {
        conf: conf.into(),
        ..ReplayOptions::default()
    };
    let r = replay(t, &opts, |_| {}).unwrap();
    assert_eq!(r.ooms, 0, "{} [{conf}]", t.name);
    assert_eq!(r.invariants, Ok(()), "{} [{conf}]", t.name);
    r
}

/// torch_npu 2.14's own allocator on the stand-in CANN libraries (docs/results.md,
/// "torch_npu's own allocator"): peak reserved and device mallocs, and peak reserved with
/// expandable segments. The preset gives the same
/// figures exactly on these two; PyTorch's policy does not on gpt2 (1.445, not 1.485).
#[test]
fn the_torch_npu_preset_reproduces_torch_npus_own_allocator() {
    for (name, reserved, mallocs) in [
        ("gpt2_infer.trace", 296 * MIB, 8),
        ("bert_train.trace", 2014 * MIB, 75),
    ] {
        let r = run(&load(name), TORCH_NPU_POLICY);
        assert_eq!(
            (r.peak_reserved, r.device_mallocs),
            (reserved, mallocs),
            "{name}"
        );
    }
    let p = run(&load("gpt2_infer.trace"), PYTORCH_POLICY);
    assert_ne!(p.peak_reserved, 296 * MIB, "the padding is what moves gpt2");
    // With expandable segments (torch_npu's allocator with
    // PYTORCH_NPU_ALLOC_CONF=expandable_segments:True, `--anchor --conf`): bert needs the
    // 16 KiB head split, resnet50 PyTorch's growable best fit, to give these.
    let conf = format!("{TORCH_NPU_POLICY},expandable_segments:True");
    for (name, reserved) in [
        ("gpt2_infer.trace", 222 * MIB),
        ("bert_train.trace", 1784 * MIB),
        ("resnet50_train.trace", 860 * MIB),
    ] {
        assert_eq!(run(&load(name), &conf).peak_reserved, reserved, "{name}");
    }
}

/// splitmix64: a small seeded generator, so the churn is the same on every machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The random churn of issue #15: `steps` steps, each allocating (sizes log-uniform
/// from 512 B to 33 MiB, plus up to 4 KiB) or freeing a random live allocation, at most
/// `max_live` live; everything is freed at the end.
pub(crate) fn churn(seed: u64, steps: usize, max_live: usize) -> Trace {
    let mut rng = Rng(seed);
    let mut text = String::new();
    let mut live: Vec<u64> = Vec::new();
    let (lo, hi) = (9.0f64, (33.0 * MIB as f64).log2());
    for id in 0..steps as u64 {
        let alloc = live.is_empty() || (live.len() < max_live && rng.below(2) == 0);
        if alloc {
            let x = rng.below(1 << 30) as f64 / (1u64 << 30) as f64;
            let size = (lo + x * (hi - lo)).exp2() as u64 + rng.below(4097);
            text.push_str(&format!("a {id} {size} 0\n"));
            live.push(id);
        } else {
            let i = rng.below(live.len() as u64) as usize;
            text.push_str(&format!("f {}\n", live.swap_remove(i)));
        }
    }
    for id in live {
        text.push_str(&format!("f {id}\n"));
    }
    trace::parse(&text, &format!("churn seed {seed}")).unwrap()
}

/// Issue #29's random churn: 600 steps on one stream, each freeing a random live block
/// with probability 0.45 (when one is live), else allocating one of 512 B, 4 KiB,
/// 60,000 B, 1 MiB, 3 MiB + 100 B, 7 MiB, 20 MiB or 33 MiB, plus 0 to 4 KiB; past 40
/// live blocks the oldest is freed; everything left is freed at the end. Drawn from
/// splitmix64 seeded with `seed`, as `scripts/zoo/churn.py` draws them (the same traces).
pub(crate) fn churn_of_sizes(seed: u64) -> Trace {
    const SIZES: [u64; 8] = [
        512,
        4096,
        60_000,
        MIB,
        3 * MIB + 100,
        7 * MIB,
        20 * MIB,
        33 * MIB,
    ];
    let mut rng = Rng(seed);
    let mut text = String::new();
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0u64;
    for _ in 0..600 {
        if !live.is_empty() && rng.below(100) < 45 {
            let i = rng.below(live.len() as u64) as usize;
            text.push_str(&format!("f {}\n", live.remove(i)));
            continue;
        }
        let size = SIZES[rng.below(SIZES.len() as u64) as usize] + rng.below(4097);
        text.push_str(&format!("a {next} {size} 0\n"));
        live.push(next);
        next += 1;
        if live.len() > 40 {
            text.push_str(&format!("f {}\n", live.remove(0)));
        }
    }
    for id in live {
        text.push_str(&format!("f {id}\n"));
    }
    trace::parse(&text, &format!("churn29 seed {seed}")).unwrap()
}

#[test]
fn the_churn_of_sizes_is_the_scripts() {
    // scripts/zoo/churn.py --check prints the same figures for the same seeds.
    let got: Vec<(usize, u64)> = (1..=3)
        .map(|s| {
            let t = churn_of_sizes(s);
            (t.ops.len(), t.peak_requested())
        })
        .collect();
    assert_eq!(got, CHURN_CHECK);
}

/// (events, peak requested bytes) of `churn_of_sizes` seeds 1 to 3, as
/// `scripts/zoo/churn.py --check` prints them.
const CHURN_CHECK: [(usize, u64); 3] = [(650, 416_685_420), (648, 302_489_236), (666, 428_170_487)];

/// Seeds of the churn tests.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=32;

#[test]
fn random_churn_replays_cleanly_under_every_preset() {
    for seed in SEEDS {
        let t = churn(seed, 600, 40);
        assert!(t.peak_requested() > 0);
        for conf in ["", PYTORCH_POLICY, TORCH_NPU_POLICY] {
            let r = run(&t, conf);
            assert_eq!(r.reserved_after_drain, 0, "seed {seed} [{conf}]");
            assert!(r.peak_reserved >= r.peak_allocated, "seed {seed} [{conf}]");
        }
    }
}

/// Issue #15's churn target. Fails today: the defaults reserve more than PyTorch's
/// policy on 16 of the 32 seeds (seed 1: 194 MiB against 174; seed 8: 156 against
/// 136); turning off `reclaim_before_growth` alone leaves 17 worse, `adaptive_segments`
/// alone 9 (docs/decisions/001-adaptive-segments.md). Run with `cargo test --test all -- --ignored churn`.
#[test]
#[ignore = "issue #15 target, not met yet: 16 of 32 seeds reserve more than PyTorch's policy"]
fn on_random_churn_the_defaults_never_reserve_more_than_pytorch() {
    let mut worse = Vec::new();
    for seed in SEEDS {
        let t = churn(seed, 600, 40);
        let (ours, pytorch) = (run(&t, ""), run(&t, PYTORCH_POLICY));
        if ours.peak_reserved > pytorch.peak_reserved {
            worse.push((seed, ours.peak_reserved / MIB, pytorch.peak_reserved / MIB));
        }
    }
    assert!(
        worse.is_empty(),
        "(seed, ours MiB, PyTorch's MiB): {worse:?}"
    );
}

/// The memory-short regime (`npualloc::policy`): entered by a failed growth the device
/// could hold when empty, visible, and ended by `empty_cache`; in it a new segment is
/// the request's own size, else an adaptive one.
#[test]
fn a_failed_growth_enters_the_memory_short_regime_and_empty_cache_ends_it() {
    use npualloc::device::sim::{SimConfig, SimDevice};
    use npualloc::{CachingAllocator, Config, Regime, StreamHandle};
    let mib = 1usize << 20;
    let sim = SimDevice::new(SimConfig {
        capacity: 100 * mib,
        ..SimConfig::default()
    });
    let a = CachingAllocator::new(sim.clone(), 0, Config::default()).unwrap();
    let s = StreamHandle::DEFAULT;
    let reserved_by = |size: usize| {
        let before = a.usage().reserved;
        let p = a.malloc(size, s).unwrap();
        (p, a.usage().reserved - before)
    };
    let (big, _) = reserved_by(60 * mib);
    assert_eq!(a.regime(), Regime::Plentiful);
    // 1 GiB is larger than the device: the caller's error, not a shortage.
    assert!(a.malloc(1 << 30, s).is_err());
    assert_eq!(a.regime(), Regime::Plentiful);
    // Plentiful: 12 MiB takes an adaptive 20 MiB segment.
    let (p, grown) = reserved_by(12 * mib);
    assert_eq!(grown, 20 * mib);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    // 50 MiB more fits on an empty device but not beside the 60 MiB: memory is short.
    assert!(a.malloc(50 * mib, s).is_err());
    assert_eq!(a.regime(), Regime::MemoryShort);
    let (p, grown) = reserved_by(12 * mib);
    assert_eq!(
        grown,
        12 * mib,
        "the request's own size while memory is short"
    );
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.regime(), Regime::Plentiful);
    let (p, grown) = reserved_by(12 * mib);
    assert_eq!(grown, 20 * mib, "adaptive again after empty_cache");
    for p in [p, big] {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
}
