//! Allocator settings, parsed from PyTorch's `key:value,key:value` syntax
//! (`NPUALLOC_CONF`, `PYTORCH_NPU_ALLOC_CONF`), resolved once into the allocator's
//! [`Policy`](crate::policy::Policy) (which says which combinations are supported).
//!
//! Supported keys: `max_split_size_mb`, `max_non_split_rounding_mb`,
//! `roundup_power2_divisions` (one power of two, or a list
//! `[256:1,512:2,>:4]` keyed by MiB intervals), `garbage_collection_threshold`,
//! `expandable_segments`, `large_segment_size_mb`, `small_segment_size_mb`,
//! `page_size` (`1g`); npualloc's own rules, each `True` by default and one behaviour
//! (see [`Policy`](crate::policy::Policy)): `reclaim_before_growth`,
//! `adaptive_segments`, `keep_whole`, `hot_cache`, `lazy_merge`, `lend_segments`,
//! `lend_blocks`, `pressure_wait`, `release_clean`, `sync_per_stream`, `look_again`,
//! `small_spill` (`wait_before_growth` sets the last five at once: npualloc's path at
//! the end of a miss); `reserve_budget_mb` (a soft ceiling on reserved memory, off by
//! default) and `request_padding` (bytes added to every request before rounding;
//! [`TORCH_NPU_POLICY`] sets torch_npu's 32) and `base_addr_aligned_kb` (torch_npu's
//! head split with expandable segments, off by default; the preset sets torch_npu's
//! 16), and `expandable_best_fit` (PyTorch's best fit with expandable segments, which
//! npualloc's default leaves out: on in both presets), `adaptive_pages` (expandable
//! large-pool pages scaled to the workload, off by default and in both presets),
//! `address_ties` (best fit's ties by address, as PyTorch's: on in both presets; off
//! by default, ties by segment age and offset, the same on every device), and
//! `exact_stats` (exact device-wide peaks with several streams, on by default).
//! `Config::parse_torch_npu` reads `PYTORCH_NPU_ALLOC_CONF` as torch_npu 2.14
//! does: every key torch_npu accepts is accepted (equivalents honoured, the rest listed
//! as ignored).

use crate::error::Error;

pub mod suggest;

/// Every key [`Config::parse`] reads, for "did you mean" in its errors.
pub const KEYS: [&str; 28] = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "large_segment_size_mb",
    "small_segment_size_mb",
    "page_size",
    "reclaim_before_growth",
    "adaptive_segments",
    "hot_cache",
    "exact_stats",
    "lend_segments",
    "lend_blocks",
    "request_padding",
    "wait_before_growth",
    "keep_whole",
    "lazy_merge",
    "pressure_wait",
    "release_clean",
    "sync_per_stream",
    "look_again",
    "small_spill",
    "expandable_best_fit",
    "adaptive_pages",
    "address_ties",
    "base_addr_aligned_kb",
    "reserve_budget_mb",
];

const MIB: usize = 1 << 20;
/// Number of power-of-two size intervals `roundup_power2_divisions` covers (1 MiB to 64 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;
/// Most divisions `roundup_power2_divisions` accepts: at 64 GiB, 2^27 divisions are
/// already a 512-byte step (the block granularity), so more would mean nothing (and
/// larger values overflowed the rounding).
pub const MAX_ROUNDUP_DIVISIONS: usize = 1 << 27;

/// Settings that turn off npualloc's additions and turn on the one rule of PyTorch's
/// that npualloc's default leaves out (`expandable_best_fit`, expandable segments
/// only), giving PyTorch's caching-allocator policy exactly (replays of the shipped
/// traces match PyTorch's figures).
pub const PYTORCH_POLICY: &str =
    "reclaim_before_growth:False,adaptive_segments:False,hot_cache:False,lend_segments:False,\
     lend_blocks:False,wait_before_growth:False,expandable_best_fit:True,adaptive_pages:False,\
     address_ties:True";

/// Bytes torch_npu 2.14 adds to every request before rounding on the SoCs and CANN
/// versions users run today (`AddPadSize()`: 0 only from Ascend950 with CANN 9.1).
pub const TORCH_NPU_PADDING: usize = 32;

/// The allocator torch_npu 2.14 users have: [`PYTORCH_POLICY`] plus torch_npu's
/// 32-byte request padding, so replays on the simulated device reproduce torch_npu's
/// rounding (on the ACL backend the device pads already; the two do not add up), and
/// with `expandable_segments:True` torch_npu's head split (`base_addr_aligned_kb:16`,
/// its default: a block of 2 MiB or more starts 16 KiB-aligned).
/// Best fit breaking ties between equal-size blocks by address, torch_npu's third
/// detail, is PyTorch's too (`address_ties:True`).
pub const TORCH_NPU_POLICY: &str =
    "reclaim_before_growth:False,adaptive_segments:False,hot_cache:False,lend_segments:False,\
     lend_blocks:False,wait_before_growth:False,expandable_best_fit:True,adaptive_pages:False,\
     address_ties:True,request_padding:32,base_addr_aligned_kb:16";

/// Smallest rounded request that torch_npu's head split aligns (its `kRoundLarge`).
pub const HEAD_ALIGN_MIN: usize = 2 * MIB;

/// Most bytes `request_padding` accepts (a pad, not a second allocation).
pub const MAX_REQUEST_PADDING: usize = 4096;

/// Parsed allocator settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Blocks of at least this size are never split (default: unlimited).
    pub max_split_size: usize,
    /// An oversize block serves a request only if it is smaller than request + this.
    pub max_non_split_rounding: usize,
    /// Divisions per power-of-two interval (index `log2(size) - 20`, clamped); 0 = off.
    pub roundup_power2_divisions: [usize; ROUNDUP_INTERVALS],
    /// Reclaim cached blocks when usage passes this fraction of the allowed maximum.
    pub garbage_collection_threshold: f64,
    /// Virtual-memory segments: one reserved address range per stream, pool and size
    /// class, with physical pages mapped as it grows and unmapped when free.
    pub expandable_segments: bool,
    /// Page size (mapping unit) of expandable large-pool segments.
    pub large_page: usize,
    /// Page size of expandable small-pool segments.
    pub small_page: usize,
    /// Before reserved memory would grow past its high-water mark, return wholly empty
    /// cached segments first (npualloc's addition; `False` gives PyTorch's policy).
    pub reclaim_before_growth: bool,
    /// Large-pool segments grow with the reserved high-water mark (npualloc's addition;
    /// `False` gives PyTorch's segment sizes).
    pub adaptive_segments: bool,
    /// Keep recently freed small-pool blocks unmerged for same-size reuse (npualloc's
    /// addition; `False` gives PyTorch's placement).
    pub hot_cache: bool,
    /// Before allocating a new segment, borrow a wholly free one cached by another
    /// stream, ordered on the device by an event (npualloc's addition; `False` keeps
    /// each stream's segments to itself, as PyTorch does).
    pub lend_segments: bool,
    /// When no segment can be borrowed, serve the request from a free block cached by
    /// another stream: the block stays that stream's, this stream waits on the device
    /// for an event recorded there, and the block goes back only after this stream's
    /// work on it (npualloc's addition; `False` keeps each stream's blocks to itself).
    pub lend_blocks: bool,
    /// Bytes added to every request before rounding, as torch_npu does on Ascend
    /// (`request_padding:32`); the device's own padding (`Device::request_padding`) is
    /// not added to it: the larger of the two applies.
    pub request_padding: usize,
    /// npualloc's keep-whole rule (`Policy::keep_whole`; needs `adaptive_segments`).
    pub keep_whole: bool,
    /// npualloc's lazy merge (`Policy::lazy_merge`; a speed rule only).
    pub lazy_merge: bool,
    /// npualloc's device-side wait for a pending free (`Policy::pressure_wait`).
    pub pressure_wait: bool,
    /// npualloc's release of clean segments first (`Policy::release_clean`).
    pub release_clean: bool,
    /// npualloc's one host sync per stream (`Policy::sync_per_stream`).
    pub sync_per_stream: bool,
    /// npualloc's second look after the last release (`Policy::look_again`).
    pub look_again: bool,
    /// npualloc's small spill into the large pool (`Policy::small_spill`).
    pub small_spill: bool,
    /// With expandable segments, best fit counts a free block at the end of a run of
    /// mapped pages as the bytes it can grow to (its own plus the unmapped pages after
    /// it), so a request takes a larger block elsewhere first: PyTorch's and
    /// torch_npu's rule, on in [`PYTORCH_POLICY`] and [`TORCH_NPU_POLICY`]
    /// (`expandable_best_fit:True`). Off by default: the smallest block that fits,
    /// growable or not (decision 022).
    pub expandable_best_fit: bool,
    /// With expandable segments, the large pool's page (mapping granule) scales with
    /// the workload: 2 MiB doubling up to `large_segment_size_mb`, at most 1/256 of the
    /// reserved high-water mark or 1/32 of the request, whichever is larger
    /// (`adaptive_pages:True`, npualloc's own; `shard/expandable.rs`). Off by default
    /// and in [`PYTORCH_POLICY`] and [`TORCH_NPU_POLICY`]: every page is
    /// `large_segment_size_mb`, as PyTorch's (on an H200 the scaled pages made a
    /// training step 13-20 % slower, README.md).
    pub adaptive_pages: bool,
    /// With expandable segments, a request of [`HEAD_ALIGN_MIN`] or more (rounded) is
    /// served at the first multiple of this many bytes in the block found, the bytes
    /// before it split off as a free block, when the rest still holds the request
    /// (torch_npu's `base_addr_aligned_kb`, 16 KiB in torch_npu, at most 16); 0 (the
    /// default): blocks start where the free block does, as PyTorch's.
    pub base_addr_align: usize,
    /// Best fit breaks ties between free blocks of equal size by address, the lowest
    /// first: PyTorch's and torch_npu's rule, on in [`PYTORCH_POLICY`] and
    /// [`TORCH_NPU_POLICY`] (`address_ties:True`), so placement follows the device's
    /// address order. Off by default: the block of the oldest segment first, then the
    /// lowest offset in it, the same on every device (Note [Places], `pool/block.rs`).
    pub address_ties: bool,
    /// A soft ceiling on reserved bytes (`reserve_budget_mb`): growth past it first tries
    /// a device-side wait for a pending free (with `pressure_wait`), then grows
    /// anyway. `None` (the default): no budget.
    pub reserve_budget: Option<usize>,
    /// Device-wide statistics exact with several streams (the default, as PyTorch's):
    /// from the second stream on, shards log their changes to statistics with a peak
    /// (`allocator/accounting/totals.rs`). `False` (`exact_stats:False`): no logs; with several
    /// streams the aggregate peaks other than reserved bytes are then the larger of
    /// each stream's peak and the sum of current values (a lower bound), for the
    /// throughput of several threads on their own streams.
    pub exact_stats: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_split_size: usize::MAX,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            large_page: 20 * MIB,
            small_page: 2 * MIB,
            reclaim_before_growth: true,
            adaptive_segments: true,
            hot_cache: true,
            lend_segments: true,
            lend_blocks: true,
            request_padding: 0,
            base_addr_align: 0,
            address_ties: false,
            expandable_best_fit: false,
            adaptive_pages: false,
            keep_whole: true,
            lazy_merge: true,
            pressure_wait: true,
            release_clean: true,
            sync_per_stream: true,
            look_again: true,
            small_spill: true,
            reserve_budget: None,
            exact_stats: true,
        }
    }
}

fn bad(key: &str, value: &str, why: &str) -> Error {
    Error::InvalidConfig(format!("bad value '{value}' for '{key}': {why}"))
}

fn parse_mb(key: &str, value: &str, min: usize) -> Result<usize, Error> {
    let mb: usize = value
        .parse()
        .map_err(|_| bad(key, value, "expected a whole number of MiB"))?;
    if mb < min {
        return Err(bad(key, value, &format!("must be at least {min}")));
    }
    mb.checked_mul(MIB)
        .ok_or_else(|| bad(key, value, "too large"))
}

/// `base_addr_aligned_kb` as torch_npu checks it (a whole number of KiB within [0, 16]),
/// in bytes.
fn parse_align_kb(key: &str, value: &str) -> Result<usize, Error> {
    // Digits only, no leading zero: torch_npu compares the text with the number's.
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_digit())
        && (value == "0" || !value.starts_with('0'));
    let kb: usize = value
        .parse()
        .ok()
        .filter(|_| plain)
        .ok_or_else(|| bad(key, value, "must be within [0, 16]"))?;
    if kb > 16 {
        return Err(bad(key, value, "must be within [0, 16]"));
    }
    Ok(kb << 10)
}

/// A page size in MiB: a multiple of 2 MiB, at least `min` MiB, at most 1 GiB.
fn parse_page(key: &str, value: &str, min: usize) -> Result<usize, Error> {
    let bytes = parse_mb(key, value, min)?;
    if bytes % (2 * MIB) != 0 || bytes > 1 << 30 {
        return Err(bad(key, value, "must be a multiple of 2 MiB, at most 1024"));
    }
    Ok(bytes)
}

fn parse_bool(key: &str, value: &str) -> Result<bool, Error> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(bad(key, value, "expected True or False")),
    }
}

fn parse_pow2(key: &str, value: &str, allow_zero: bool) -> Result<usize, Error> {
    let n: usize = value
        .parse()
        .map_err(|_| bad(key, value, "expected a power of two"))?;
    if (n == 0 && allow_zero) || n.is_power_of_two() {
        Ok(n)
    } else {
        Err(bad(key, value, "expected a power of two"))
    }
}

/// A `roundup_power2_divisions` value: a power of two up to [`MAX_ROUNDUP_DIVISIONS`]
/// (or 0 in a list, meaning no rounding for that interval).
fn parse_division_count(key: &str, value: &str, allow_zero: bool) -> Result<usize, Error> {
    let d = parse_pow2(key, value, allow_zero)?;
    if d > MAX_ROUNDUP_DIVISIONS {
        return Err(bad(
            key,
            value,
            &format!("expected at most {MAX_ROUNDUP_DIVISIONS} divisions"),
        ));
    }
    Ok(d)
}

impl Config {
    /// Parses a settings string; an empty string gives the defaults.
    pub fn parse(s: &str) -> Result<Config, Error> {
        let mut cfg = Config::default();
        // npualloc's rules named True, checked against the combinations that apply.
        let mut named: Vec<&str> = Vec::new();
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        for item in split_top_level(&s) {
            if item.is_empty() {
                continue;
            }
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| Error::InvalidConfig(suggest::not_key_value(item, &KEYS)))?;
            if let Some(rule) = cfg.rule_mut(key) {
                *rule = parse_bool(key, value)?;
                named.retain(|&k| k != key);
                if *rule {
                    named.push(key);
                }
                continue;
            }
            match key {
                "max_split_size_mb" => {
                    cfg.max_split_size = parse_mb(key, value, 20)?;
                }
                "max_non_split_rounding_mb" => {
                    cfg.max_non_split_rounding = parse_mb(key, value, 20)?;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad(key, value, "expected a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(key, value, "must be strictly between 0 and 1"));
                    }
                    cfg.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => {
                    cfg.roundup_power2_divisions = parse_divisions(key, value)?;
                }
                "reclaim_before_growth" => {
                    cfg.reclaim_before_growth = parse_bool(key, value)?;
                }
                "adaptive_segments" => {
                    cfg.adaptive_segments = parse_bool(key, value)?;
                }
                "hot_cache" => {
                    cfg.hot_cache = parse_bool(key, value)?;
                }
                "exact_stats" => {
                    cfg.exact_stats = parse_bool(key, value)?;
                }
                "lend_blocks" => {
                    cfg.lend_blocks = parse_bool(key, value)?;
                }
                "request_padding" => {
                    let n: usize = value
                        .parse()
                        .map_err(|_| bad(key, value, "expected a whole number of bytes"))?;
                    if n > MAX_REQUEST_PADDING {
                        return Err(bad(
                            key,
                            value,
                            &format!("must be at most {MAX_REQUEST_PADDING}"),
                        ));
                    }
                    cfg.request_padding = n;
                }
                "wait_before_growth" => {
                    let on = parse_bool(key, value)?;
                    (cfg.pressure_wait, cfg.release_clean, cfg.sync_per_stream) = (on, on, on);
                    (cfg.look_again, cfg.small_spill) = (on, on);
                }
                "expandable_best_fit" => {
                    cfg.expandable_best_fit = parse_bool(key, value)?;
                }
                "adaptive_pages" => {
                    cfg.adaptive_pages = parse_bool(key, value)?;
                }
                "address_ties" => {
                    cfg.address_ties = parse_bool(key, value)?;
                }
                "base_addr_aligned_kb" => {
                    cfg.base_addr_align = parse_align_kb(key, value)?;
                }
                "reserve_budget_mb" => {
                    cfg.reserve_budget = Some(parse_mb(key, value, 1)?);
                }
                "expandable_segments" => {
                    cfg.expandable_segments = parse_bool(key, value)?;
                }
                "large_segment_size_mb" => {
                    cfg.large_page = parse_page(key, value, 2)?;
                }
                "small_segment_size_mb" => {
                    cfg.small_page = parse_page(key, value, 2)?;
                }
                "page_size" => match value {
                    "1g" | "1G" => cfg.large_page = 1 << 30,
                    _ => return Err(bad(key, value, "the only page size accepted is 1g")),
                },
                _ => {
                    return Err(Error::InvalidConfig(format!(
                        "unrecognized key '{key}' in allocator config{}",
                        suggest::did_you_mean(key, KEYS)
                    )))
                }
            }
        }
        cfg.check_rules(&named)?;
        if cfg.expandable_segments {
            if cfg.max_split_size != usize::MAX {
                return Err(Error::InvalidConfig(
                    "expandable_segments:True cannot be combined with max_split_size_mb \
                     (as in torch_npu): expandable segments never strand whole blocks"
                        .into(),
                ));
            }
            if cfg.garbage_collection_threshold > 0.0 {
                return Err(Error::InvalidConfig(
                    "expandable_segments:True cannot be combined with \
                     garbage_collection_threshold (as in torch_npu): free pages are \
                     unmapped before reserved memory grows instead"
                        .into(),
                ));
            }
        }
        Ok(cfg)
    }

    /// The switch of one of npualloc's rules, by key.
    fn rule_mut(&mut self, key: &str) -> Option<&mut bool> {
        Some(match key {
            "keep_whole" => &mut self.keep_whole,
            "lazy_merge" => &mut self.lazy_merge,
            "lend_segments" => &mut self.lend_segments,
            "pressure_wait" => &mut self.pressure_wait,
            "release_clean" => &mut self.release_clean,
            "sync_per_stream" => &mut self.sync_per_stream,
            "look_again" => &mut self.look_again,
            "small_spill" => &mut self.small_spill,
            _ => return None,
        })
    }

    /// Refuses a rule named `True` (`named`) where it does not apply
    /// ([`Policy`](crate::policy::Policy)'s dependencies).
    fn check_rules(&self, named: &[&str]) -> Result<(), Error> {
        let ordinary = [
            "lend_segments",
            "keep_whole",
            "pressure_wait",
            "release_clean",
        ];
        let why = match named
            .iter()
            .find(|k| ordinary.contains(k) || **k == "small_spill")
        {
            Some(k) if self.expandable_segments => format!("{k}:True needs ordinary segments"),
            _ if named.contains(&"keep_whole") && !self.adaptive_segments => {
                "keep_whole:True needs adaptive_segments:True (its growth takes the \
                 request's own size, which only adaptive sizing gives)"
                    .into()
            }
            _ => return Ok(()),
        };
        Err(Error::InvalidConfig(why))
    }

    /// Page size of expandable segments of `kind`.
    pub fn page_size(&self, kind: crate::pool::PoolKind) -> usize {
        match kind {
            crate::pool::PoolKind::Small => self.small_page,
            crate::pool::PoolKind::Large => self.large_page,
        }
    }

    /// Divisions that apply to a request of `size` bytes.
    pub fn divisions_for(&self, size: usize) -> usize {
        let log = usize::BITS - 1 - size.max(1).leading_zeros();
        let idx = (log as usize).saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[idx]
    }

    /// The block size a request of `size` bytes gets under these settings (PyTorch's
    /// rounding with `roundup_power2_divisions`); `None` if it cannot be represented.
    pub fn block_size(&self, size: usize) -> Option<usize> {
        crate::pool::rounding::round_size(size, |s| self.divisions_for(s))
    }
}

/// Splits on commas that are not inside `[...]`.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_divisions(key: &str, value: &str) -> Result<[usize; ROUNDUP_INTERVALS], Error> {
    let mut table = [0; ROUNDUP_INTERVALS];
    let Some(list) = value.strip_prefix('[') else {
        let d = parse_division_count(key, value, false)?;
        return Ok([d; ROUNDUP_INTERVALS]);
    };
    let list = list
        .strip_suffix(']')
        .ok_or_else(|| bad(key, value, "list is missing its closing ']'"))?;
    let mut last_index = 0usize;
    let mut first = true;
    for entry in list.split(',') {
        let (k, v) = entry.split_once(':').ok_or_else(|| {
            bad(
                key,
                value,
                &format!("list entry '{entry}' is not size:divisions"),
            )
        })?;
        let d = parse_division_count(key, v, true)?;
        if k == ">" {
            for slot in table
                .iter_mut()
                .skip(if first { 0 } else { last_index + 1 })
            {
                *slot = d;
            }
            continue;
        }
        let mb = parse_pow2(key, k, false)?;
        let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if !first && index <= last_index {
            return Err(bad(key, value, "interval sizes must increase"));
        }
        let from = if first { 0 } else { last_index + 1 };
        for slot in &mut table[from..=index] {
            *slot = d;
        }
        last_index = index;
        first = false;
    }
    Ok(table)
}

/// How torch_npu checks the value of a key npualloc ignores.
#[derive(Clone, Copy)]
enum Ignored {
    Bool,
    Whole,
    AlignKb,
}

/// Keys torch_npu 2.14 accepts in `PYTORCH_NPU_ALLOC_CONF` that mean nothing for
/// npualloc's device memory: pinned host memory, and switches of torch_npu's own
/// allocator (address alignment, lazy reclaim, its lock, throwing on OOM).
const TORCH_NPU_IGNORED: &[(&str, Ignored)] = &[
    ("pinned_use_background_threads", Ignored::Bool),
    ("pinned_max_round_threshold_mb", Ignored::Whole),
    ("pinned_max_cached_size_mb", Ignored::Whole),
    ("pin_memory_expandable_segments", Ignored::Bool),
    ("pinned_mem_register", Ignored::Bool),
    ("pinned_reserve_segment_size_mb", Ignored::Whole),
    ("base_addr_aligned_kb", Ignored::AlignKb),
    ("multi_stream_lazy_reclaim", Ignored::Bool),
    ("release_lock_on_npumalloc", Ignored::Bool),
    ("throw_on_npumalloc_oom", Ignored::Bool),
];

/// Settings read from torch_npu's `PYTORCH_NPU_ALLOC_CONF` (`Config::parse_torch_npu`).
#[derive(Clone, Debug, PartialEq)]
pub struct TorchNpuConf {
    /// The settings npualloc shares with torch_npu.
    pub config: Config,
    /// `per_process_memory_fraction`, to apply to every device.
    pub memory_fraction: Option<f64>,
    /// Keys accepted but without meaning for npualloc (warn about them once).
    pub ignored: Vec<String>,
}

impl Config {
    /// Parses `PYTORCH_NPU_ALLOC_CONF` as torch_npu 2.14 accepts it: npualloc's keys,
    /// `segment_size_mb` (torch_npu's deprecated name of `large_segment_size_mb`),
    /// `per_process_memory_fraction`, and the keys of `TORCH_NPU_IGNORED`, whose values
    /// are checked as torch_npu checks them and which are then listed in `ignored`. Any
    /// other key or a bad value is an error.
    pub fn parse_torch_npu(s: &str) -> Result<TorchNpuConf, Error> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let (mut kept, mut ignored, mut memory_fraction) = (Vec::new(), Vec::new(), None);
        for item in split_top_level(&s) {
            let Some((key, value)) = item.split_once(':') else {
                kept.push(item.to_string());
                continue;
            };
            if key == "segment_size_mb" {
                parse_mb(key, value, 20)?;
                kept.push(format!("large_segment_size_mb:{value}"));
            } else if key == "per_process_memory_fraction" {
                let f: f64 = value
                    .parse()
                    .map_err(|_| bad(key, value, "expected a number"))?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(bad(key, value, "must be within [0, 1]"));
                }
                memory_fraction = Some(f);
            } else if let Some(&(_, kind)) = TORCH_NPU_IGNORED.iter().find(|(k, _)| *k == key) {
                match kind {
                    Ignored::Bool => {
                        parse_bool(key, value)?;
                    }
                    Ignored::Whole => {
                        parse_mb(key, value, 0)?;
                    }
                    Ignored::AlignKb => {
                        parse_align_kb(key, value)?;
                    }
                }
                ignored.push(key.to_string());
            } else {
                kept.push(item.to_string());
            }
        }
        Ok(TorchNpuConf {
            config: Config::parse(&kept.join(","))?,
            memory_fraction,
            ignored,
        })
    }
}

#[cfg(test)]
mod tests;
