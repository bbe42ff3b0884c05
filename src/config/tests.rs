//! Unit tests of the settings parser.

use super::*;

#[test]
fn accepts_every_torch_npu_key() {
    let t = Config::parse_torch_npu(
        "expandable_segments:True,base_addr_aligned_kb:16,segment_size_mb:40,\
         per_process_memory_fraction:0.5,pinned_use_background_threads:True,\
         pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64,\
         pin_memory_expandable_segments:False,pinned_mem_register:False,\
         pinned_reserve_segment_size_mb:8,multi_stream_lazy_reclaim:True,\
         release_lock_on_npumalloc:True,throw_on_npumalloc_oom:False,page_size:1g",
    )
    .unwrap();
    assert!(t.config.expandable_segments);
    assert_eq!(t.config.large_page, 1 << 30); // page_size after segment_size_mb
    assert_eq!(t.memory_fraction, Some(0.5));
    assert_eq!(t.ignored.len(), 10);
    assert_eq!(t.ignored[0], "base_addr_aligned_kb");
    let t = Config::parse_torch_npu("segment_size_mb:40").unwrap();
    assert_eq!(t.config.large_page, 40 * MIB);
    assert_eq!(t.config, Config::parse("large_segment_size_mb:40").unwrap());
}

#[test]
fn refuses_what_torch_npu_refuses() {
    for bad in [
        "base_addr_aligned_kb:17",
        "base_addr_aligned_kb:x",
        "per_process_memory_fraction:1.5",
        "multi_stream_lazy_reclaim:yes",
        "segment_size_mb:10",
        "no_such_key:1",
        "expandable_segments:True,max_split_size_mb:128",
    ] {
        let e = Config::parse_torch_npu(bad).unwrap_err().to_string();
        let key = bad.split(':').next().unwrap();
        assert!(
            e.contains(key) || e.contains("max_split_size_mb"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn defaults_from_empty_string() {
    assert_eq!(Config::parse("").unwrap(), Config::default());
    assert_eq!(Config::default().max_split_size, usize::MAX);
}

#[test]
fn parses_pytorch_syntax() {
    let c = Config::parse(
        "max_split_size_mb:128, roundup_power2_divisions:4,garbage_collection_threshold:0.8",
    )
    .unwrap();
    assert_eq!(c.max_split_size, 128 * MIB);
    assert_eq!(c.divisions_for(3 * MIB), 4);
    assert!((c.garbage_collection_threshold - 0.8).abs() < 1e-12);
    assert!(c.reclaim_before_growth);
    assert!(
        !Config::parse("reclaim_before_growth:False")
            .unwrap()
            .reclaim_before_growth
    );
}

#[test]
fn pytorch_policy_turns_off_every_addition() {
    let c = Config::parse(PYTORCH_POLICY).unwrap();
    assert!(!c.reclaim_before_growth && !c.adaptive_segments);
    assert!(!c.hot_cache && !c.lend_segments && !c.lend_blocks);
    assert!(!c.pressure_wait && !c.release_clean && !c.small_spill);
    assert!(!c.sync_per_stream && !c.look_again && c.reserve_budget.is_none());
    let d = Config::default();
    assert!(d.reclaim_before_growth && d.adaptive_segments && d.hot_cache && d.lend_segments);
    assert!(d.lend_blocks);
    // PyTorch's best fit with expandable segments, which npualloc's default lacks,
    // and its ties by address.
    assert!(c.expandable_best_fit && !d.expandable_best_fit);
    assert!(c.address_ties && !d.address_ties);
    // Everything else PyTorch itself has keeps its default.
    assert_eq!(
        Config {
            reclaim_before_growth: true,
            adaptive_segments: true,
            hot_cache: true,
            lend_segments: true,
            lend_blocks: true,
            pressure_wait: true,
            release_clean: true,
            sync_per_stream: true,
            look_again: true,
            small_spill: true,
            expandable_best_fit: false,
            address_ties: false,
            ..c
        },
        d
    );
}

#[test]
fn torch_npu_policy_is_pytorch_policy_padded_and_head_aligned() {
    let t = Config::parse(TORCH_NPU_POLICY).unwrap();
    assert_eq!(t.request_padding, TORCH_NPU_PADDING);
    assert_eq!(t.base_addr_align, 16 << 10);
    assert_eq!(
        Config {
            request_padding: 0,
            base_addr_align: 0,
            ..t
        },
        Config::parse(PYTORCH_POLICY).unwrap()
    );
    assert_eq!(Config::default().request_padding, 0);
    assert!(Config::parse("request_padding:4097").is_err());
    assert!(Config::parse("request_padding:-1").is_err());
    // torch_npu's range, in KiB; off by default.
    assert_eq!(Config::default().base_addr_align, 0);
    assert_eq!(
        Config::parse("base_addr_aligned_kb:4")
            .unwrap()
            .base_addr_align,
        4096
    );
    assert!(Config::parse("base_addr_aligned_kb:17").is_err());
    assert!(Config::parse("base_addr_aligned_kb:-1").is_err());
    assert!(Config::parse("base_addr_aligned_kb:+8").is_err());
    assert!(Config::parse("base_addr_aligned_kb:016").is_err());
    assert_eq!(
        Config::parse("base_addr_aligned_kb:0")
            .unwrap()
            .base_addr_align,
        0
    );
}

#[test]
fn parses_page_sizes() {
    let c = Config::parse("expandable_segments:True").unwrap();
    assert!(c.expandable_segments);
    assert_eq!(c.page_size(crate::pool::PoolKind::Large), 20 * MIB);
    assert_eq!(c.page_size(crate::pool::PoolKind::Small), 2 * MIB);
    let c = Config::parse("large_segment_size_mb:64,small_segment_size_mb:4").unwrap();
    assert_eq!((c.large_page, c.small_page), (64 * MIB, 4 * MIB));
    assert_eq!(Config::parse("page_size:1g").unwrap().large_page, 1 << 30);
}

#[test]
fn parses_division_list() {
    let c = Config::parse("roundup_power2_divisions:[256:1,512:2,>:8]").unwrap();
    assert_eq!(c.divisions_for(100 * MIB), 1);
    assert_eq!(c.divisions_for(600 * MIB), 2);
    assert_eq!(c.divisions_for(4096 * MIB), 8);
}

#[test]
fn the_most_divisions_accepted_round_without_overflow() {
    let c = Config::parse(&format!("roundup_power2_divisions:{MAX_ROUNDUP_DIVISIONS}")).unwrap();
    for size in [512, 513, 3 * MIB + 1, (5 << 30) + 7, (64 << 30) + 1] {
        let r = c.block_size(size).unwrap();
        assert!(r >= size && r % 512 == 0, "{size} -> {r}");
    }
}

#[test]
fn every_listed_key_is_read_and_typos_get_a_suggestion() {
    for key in KEYS {
        let e = Config::parse(&format!("{key}:?")).unwrap_err().to_string();
        assert!(!e.contains("unrecognized key"), "{key}: {e}");
    }
    let e = Config::parse("max_split_size_md:128")
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("; did you mean 'max_split_size_mb'?"), "{e}");
    let e = Config::parse("max_split_size_mb=128")
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean 'max_split_size_mb:128'?"), "{e}");
}

#[test]
fn rejects_bad_input_naming_the_key() {
    for (s, needle) in [
        ("foo:1", "foo"),
        ("max_split_size_mb:abc", "max_split_size_mb"),
        ("max_split_size_mb:10", "at least 20"),
        ("roundup_power2_divisions:3", "power of two"),
        ("garbage_collection_threshold:1.5", "between 0 and 1"),
        ("expandable_segments:maybe", "True or False"),
        ("reclaim_before_growth:yes", "True or False"),
        ("adaptive_segments:1", "True or False"),
        ("max_split_size_mb", "key:value"),
        ("roundup_power2_divisions:[256:1", "closing"),
        (
            "roundup_power2_divisions:36028797018963968",
            "at most 134217728",
        ),
        ("roundup_power2_divisions:268435456", "at most 134217728"),
        ("roundup_power2_divisions:[256:1,>:268435456]", "at most"),
        ("large_segment_size_mb:3", "multiple of 2 MiB"),
        ("large_segment_size_mb:2048", "at most 1024"),
        ("small_segment_size_mb:0", "at least 2"),
        ("page_size:4k", "1g"),
        (
            "expandable_segments:True,max_split_size_mb:40",
            "max_split_size_mb",
        ),
        (
            "garbage_collection_threshold:0.5,expandable_segments:True",
            "garbage_collection_threshold",
        ),
    ] {
        let e = Config::parse(s).unwrap_err().to_string();
        assert!(e.contains(needle), "{s}: {e}");
    }
}
