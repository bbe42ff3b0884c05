//! The allocator's policy: which rules a device's allocator applies, as one value
//! resolved once from the settings ([`Config`]) when the allocator is created. Each
//! field is one behaviour; the settings keep PyTorch's `key:value` syntax, one key per
//! field (the key is the field's name).
//!
//! Three policies are supported as a whole, each the default of one preset:
//! [`Policy::npualloc`] (the empty settings string), [`Policy::pytorch`]
//! ([`PYTORCH_POLICY`](crate::config::PYTORCH_POLICY): PyTorch's caching allocator
//! exactly) and [`Policy::torch_npu`] ([`TORCH_NPU_POLICY`](crate::config::TORCH_NPU_POLICY):
//! PyTorch's, with torch_npu's request padding and head split). On any of them,
//! expandable segments may be turned on, and any of npualloc's rules may be left out,
//! alone or with others: each is a rung of the miss path (`allocator/shard/ladder.rs`)
//! or a switch that no other rule relies on, but for two dependencies, resolved here,
//! stated, never silent (`scripts/rule_costs.py` prices each rule left out alone):
//!
//! - **with expandable segments** the rules that need ordinary segments do not apply:
//!   segment lending and its growth-first rule (a run of mapped pages is never a
//!   whole segment), adaptive segment sizes (pages scale instead: `adaptive_pages`),
//!   keep whole, the pressure wait (a freed page may be unmapped at once, so a
//!   device-side wait must not be the only order), the clean release and the small
//!   spill;
//! - **without adaptive segments** keep whole does not apply (a request kept out of a
//!   whole segment grows its own size, which only adaptive sizing gives).
//!
//! Naming one of those rules `True` where it does not apply is an error
//! (`Config::parse`); left at its default it is simply off.
//!
//! Note [the memory-short regime]: a device malloc for a new segment that the device
//! could hold when empty failing says memory is short. From then on the allocator runs
//! in [`Regime::MemoryShort`]: new large-pool segments are the request's own size
//! rounded to 2 MiB instead of an adaptive size (an adaptive segment's excess over the
//! request is what a later large request then misses), and best fit keeps whole
//! segments for their size (`keep_whole`) without first asking whether the device could
//! give them back. `empty_cache` ends it (every cached segment went back: the next
//! shortage is seen afresh); nothing else does, since a workload that ran short once
//! runs short again at its next peak. A request larger than the whole device or the
//! memory fraction is the caller's error and does not enter it.

use crate::config::Config;

/// Which rules an allocator applies (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Before reserved memory would grow past its high-water mark, wholly empty idle
    /// segments go back first (npualloc's).
    pub reclaim_before_growth: bool,
    /// Large-pool segments grow with the reserve mark: at least 1/8 of it, 20 to
    /// 64 MiB (npualloc's; off: PyTorch's sizes).
    pub adaptive_segments: bool,
    /// Under memory pressure best fit does not split a whole segment twice the
    /// request's size or more: the request grows its own size instead, and takes the
    /// segment only if that fails (npualloc's).
    pub keep_whole: bool,
    /// Recently freed small-pool blocks stay unmerged for same-size reuse (npualloc's).
    pub hot_cache: bool,
    /// A caller's free of a large-pool block may leave its merge to the next
    /// operation, invisibly (npualloc's; a speed rule only).
    pub lazy_merge: bool,
    /// A miss borrows a wholly free segment of another stream before growing
    /// (npualloc's).
    pub lend_segments: bool,
    /// A miss borrows a free block of another stream, ordered on the device
    /// (npualloc's).
    pub lend_blocks: bool,
    /// When growth fails or would pass the reserve budget, the stream waits on the
    /// device for a pending free that fits (npualloc's).
    pub pressure_wait: bool,
    /// Before the other streams' caches are synchronised and released, every stream's
    /// cached segments that need no host wait go back, and the request is tried again
    /// (npualloc's).
    pub release_clean: bool,
    /// A cache release host-synchronises each stream holding pending frees once, at
    /// its last event, instead of each event (npualloc's).
    pub sync_per_stream: bool,
    /// After the release rungs synchronised and released, the free blocks are looked
    /// at again before out of memory: this stream's before growing, other streams'
    /// (with `lend_blocks`) after (npualloc's).
    pub look_again: bool,
    /// At the very end, a small request takes a free block of this stream's large pool
    /// rather than run out of memory (npualloc's).
    pub small_spill: bool,
    /// Growth maps pages of expandable segments instead of allocating segments
    /// (PyTorch's `expandable_segments`).
    pub expandable_segments: bool,
    /// With expandable segments, large-pool pages scale with the workload (npualloc's).
    pub adaptive_pages: bool,
    /// With expandable segments, best fit counts a growable block as what it can grow
    /// to (PyTorch's and torch_npu's rule).
    pub expandable_best_fit: bool,
    /// Best fit breaks ties between free blocks of equal size by address, the lowest
    /// first (PyTorch's and torch_npu's rule); off, by segment age, then offset: the
    /// same on every device (Note [Places], `pool/block.rs`).
    pub address_ties: bool,
    /// Bytes added to every request before rounding (torch_npu's 32).
    pub request_padding: usize,
    /// With expandable segments, a large request starts at a multiple of this many
    /// bytes (torch_npu's head split, 16 KiB; 0: off).
    pub base_addr_align: usize,
}

impl Policy {
    /// npualloc's policy: every rule of its own on.
    pub const fn npualloc() -> Policy {
        Policy {
            reclaim_before_growth: true,
            adaptive_segments: true,
            keep_whole: true,
            hot_cache: true,
            lazy_merge: true,
            lend_segments: true,
            lend_blocks: true,
            pressure_wait: true,
            release_clean: true,
            sync_per_stream: true,
            look_again: true,
            small_spill: true,
            expandable_segments: false,
            adaptive_pages: false,
            expandable_best_fit: false,
            address_ties: false,
            request_padding: 0,
            base_addr_align: 0,
        }
    }

    /// PyTorch's caching-allocator policy exactly: none of npualloc's rules but the
    /// invisible lazy merge, and PyTorch's best fit with expandable segments.
    pub const fn pytorch() -> Policy {
        Policy {
            reclaim_before_growth: false,
            adaptive_segments: false,
            keep_whole: false,
            hot_cache: false,
            lazy_merge: true,
            lend_segments: false,
            lend_blocks: false,
            pressure_wait: false,
            release_clean: false,
            sync_per_stream: false,
            look_again: false,
            small_spill: false,
            expandable_segments: false,
            adaptive_pages: false,
            expandable_best_fit: true,
            address_ties: true,
            request_padding: 0,
            base_addr_align: 0,
        }
    }

    /// torch_npu 2.14's allocator: PyTorch's policy with torch_npu's 32-byte request
    /// padding and its 16 KiB head split (the latter with expandable segments only).
    pub const fn torch_npu() -> Policy {
        Policy {
            request_padding: crate::config::TORCH_NPU_PADDING,
            base_addr_align: 16 << 10,
            ..Policy::pytorch()
        }
    }

    /// The policy `config` asks for, its dependencies resolved (module doc).
    pub fn from_config(config: &Config) -> Policy {
        let c = config;
        let ordinary = !c.expandable_segments;
        Policy {
            reclaim_before_growth: c.reclaim_before_growth,
            adaptive_segments: c.adaptive_segments && ordinary,
            keep_whole: c.keep_whole && c.adaptive_segments && ordinary,
            hot_cache: c.hot_cache,
            lazy_merge: c.lazy_merge,
            lend_segments: c.lend_segments && ordinary,
            lend_blocks: c.lend_blocks,
            pressure_wait: c.pressure_wait && ordinary,
            release_clean: c.release_clean && ordinary,
            sync_per_stream: c.sync_per_stream,
            look_again: c.look_again,
            small_spill: c.small_spill && ordinary,
            expandable_segments: c.expandable_segments,
            adaptive_pages: c.adaptive_pages,
            expandable_best_fit: c.expandable_best_fit,
            address_ties: c.address_ties,
            request_padding: c.request_padding,
            base_addr_align: c.base_addr_align,
        }
    }

    /// Whether a miss grows first where lending would otherwise serve it (lending's
    /// repeat and steadiness rules, `shard/lending.rs`): with lending, on ordinary
    /// segments.
    pub fn grows_before_borrowing(&self) -> bool {
        (self.lend_segments || self.lend_blocks) && !self.expandable_segments
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::npualloc()
    }
}

/// Whether memory was seen short (module doc, Note [the memory-short regime]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// No device malloc for a segment the device could hold has failed (since the
    /// allocator's creation or the last `empty_cache`).
    Plentiful,
    /// One has: new large-pool segments are the request's own size, and best fit keeps
    /// whole segments for their size.
    MemoryShort,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PYTORCH_POLICY, TORCH_NPU_POLICY};

    fn of(conf: &str) -> Policy {
        Policy::from_config(&Config::parse(conf).unwrap())
    }

    #[test]
    fn each_preset_is_its_policy() {
        assert_eq!(of(""), Policy::npualloc());
        assert_eq!(of(PYTORCH_POLICY), Policy::pytorch());
        assert_eq!(of(TORCH_NPU_POLICY), Policy::torch_npu());
    }

    #[test]
    fn each_key_turns_one_rule_off() {
        for (key, off) in [
            (
                "reclaim_before_growth",
                Policy {
                    reclaim_before_growth: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "hot_cache",
                Policy {
                    hot_cache: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "lazy_merge",
                Policy {
                    lazy_merge: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "keep_whole",
                Policy {
                    keep_whole: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "lend_segments",
                Policy {
                    lend_segments: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "lend_blocks",
                Policy {
                    lend_blocks: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "pressure_wait",
                Policy {
                    pressure_wait: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "release_clean",
                Policy {
                    release_clean: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "sync_per_stream",
                Policy {
                    sync_per_stream: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "look_again",
                Policy {
                    look_again: false,
                    ..Policy::npualloc()
                },
            ),
            (
                "small_spill",
                Policy {
                    small_spill: false,
                    ..Policy::npualloc()
                },
            ),
        ] {
            assert_eq!(of(&format!("{key}:False")), off, "{key}");
        }
        // Adaptive segments take keep whole with them (it needs their sizing).
        assert_eq!(
            of("adaptive_segments:False"),
            Policy {
                adaptive_segments: false,
                keep_whole: false,
                ..Policy::npualloc()
            }
        );
    }

    #[test]
    fn wait_before_growth_names_the_five_rules_of_npuallocs_path() {
        assert_eq!(
            of("wait_before_growth:False"),
            Policy {
                pressure_wait: false,
                release_clean: false,
                sync_per_stream: false,
                look_again: false,
                small_spill: false,
                ..Policy::npualloc()
            }
        );
    }

    #[test]
    fn expandable_segments_leave_out_the_rules_that_need_ordinary_segments() {
        let p = of("expandable_segments:True");
        assert!(p.expandable_segments && p.lend_blocks && p.look_again && p.sync_per_stream);
        assert!(!p.lend_segments && !p.adaptive_segments && !p.keep_whole);
        assert!(!p.pressure_wait && !p.release_clean && !p.small_spill);
        assert!(!p.grows_before_borrowing());
        for key in [
            "lend_segments",
            "keep_whole",
            "pressure_wait",
            "release_clean",
            "small_spill",
        ] {
            let e = Config::parse(&format!("expandable_segments:True,{key}:True")).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
        let e = Config::parse("adaptive_segments:False,keep_whole:True").unwrap_err();
        assert!(e.to_string().contains("keep_whole"), "{e}");
    }
}
