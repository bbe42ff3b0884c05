//! Searching the settings for the one that needs the smallest device: a coordinate
//! search over a small grid, each point scored by [`min_capacity`] on every trace.
//!
//! The grid ([`GRID`]): PyTorch's `max_split_size_mb`, `roundup_power2_divisions` and
//! `expandable_segments`, the page settings `adaptive_pages:True` (pages scaled to the
//! workload) and `large_segment_size_mb` (each turns expandable segments on with it),
//! and npualloc's own switches set to `False`. `garbage_collection_threshold` is left out: it acts only
//! when a memory fraction caps the device, which a replay does not set, so every value
//! would score like the defaults.
//!
//! The search starts from the defaults. For each key in turn it tries each of its values
//! (and unsetting it, once set) on top of the best setting so far, and keeps the one that
//! does best by a clear margin ([`gain`]): the total minimum capacity over the traces
//! falls by at least [`MIN_CAPACITY_GAIN_PERCENT`] of the best so far's, or, at no more
//! memory, device calls plus host syncs fall by at least [`MIN_CALLS_GAIN_PERCENT`]. A
//! smaller difference is noise of the 1 MiB search step or of one segment more or less
//! (2 MiB of 6.7 GiB on the shipped traces), not a reason to change a setting; such a
//! setting is marked [`Outcome::BelowMinimumGain`] and reported with its figures. No kept
//! setting may raise, on any trace, the device calls (segment mallocs plus page maps) or
//! host synchronisations of the replay at the minimum capacity above the defaults' (a
//! trace the defaults do not fit within the limit sets no such bound, and any setting
//! that fits every trace beats them). Rounds
//! repeat while one changes the setting, at most [`ROUNDS`]; a setting is never scored
//! twice. So the work is bounded: at most `ROUNDS × (grid values + keys)` settings,
//! each a dozen or so replays per trace.

use std::collections::{BTreeMap, HashSet};

use super::capacity::{min_capacity, MinCapacity};
use super::ReplayOptions;
use crate::trace::Trace;
use crate::{Config, Error};

/// Keys and the values tried for each.
pub const GRID: [(&str, &[&str]); 10] = [
    ("max_split_size_mb", &["64", "128", "256", "512"]),
    ("roundup_power2_divisions", &["1", "2", "4", "8"]),
    ("expandable_segments", &["True"]),
    ("adaptive_pages", &["True"]),
    ("large_segment_size_mb", &["2", "4", "8"]),
    ("reclaim_before_growth", &["False"]),
    ("adaptive_segments", &["False"]),
    ("hot_cache", &["False"]),
    ("lend_segments", &["False"]),
    ("lend_blocks", &["False"]),
];

/// The grid's keys that act on expandable segments' pages only: setting one turns
/// expandable segments on with it, unsetting those turns it off.
const PAGE_KEYS: [&str; 2] = ["adaptive_pages", "large_segment_size_mb"];

/// Most rounds over the keys.
pub const ROUNDS: usize = 3;

/// A setting that needs less memory is better only if it saves at least this share of
/// the best so far's total minimum capacity (percent).
pub const MIN_CAPACITY_GAIN_PERCENT: u64 = 1;

/// A setting that needs no more memory is better only if it cuts device calls plus host
/// syncs by at least this share (percent).
pub const MIN_CALLS_GAIN_PERCENT: u64 = 10;

/// How a setting's (total min capacity, device calls + host syncs) compares with the best
/// so far's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gain {
    /// Better by the minimum gain or more.
    Clear,
    /// Better, but by less than the minimum gain.
    BelowMinimum,
    /// Not better.
    None,
}

/// Compares `(total, cost)` with the best so far (`None`: nothing fits yet, and any
/// setting that fits is better).
pub fn gain(total: u64, cost: u64, best: Option<(u64, u64)>) -> Gain {
    let Some((best_total, best_cost)) = best else {
        return Gain::Clear;
    };
    let saved = best_total.saturating_sub(total);
    let fewer = best_cost.saturating_sub(cost);
    let less_memory = saved > 0
        && saved.saturating_mul(100) >= best_total.saturating_mul(MIN_CAPACITY_GAIN_PERCENT);
    let fewer_calls = total <= best_total
        && fewer > 0
        && fewer.saturating_mul(100) >= best_cost.saturating_mul(MIN_CALLS_GAIN_PERCENT);
    if less_memory || fewer_calls {
        Gain::Clear
    } else if (total, cost) < (best_total, best_cost) {
        Gain::BelowMinimum
    } else {
        Gain::None
    }
}

/// One trace's figures under one setting, at that setting's minimum capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Score {
    /// Minimum capacity in bytes (`None`: does not fit even at the limit).
    pub capacity: Option<u64>,
    /// The trace's peak requested bytes.
    pub peak_requested: u64,
    /// Segment mallocs plus page maps of the replay at the minimum capacity.
    pub device_calls: u64,
    /// Host synchronisations of that replay.
    pub host_syncs: u64,
}

/// What became of a setting the search tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The defaults, which everything is compared with.
    Baseline,
    /// It became the best setting so far.
    Kept,
    /// It fit with no more device calls or syncs than the defaults, but was no better than
    /// the best so far (more memory, or as much with as many calls).
    NotSmaller,
    /// It was better than the best so far, by less than the minimum gain ([`gain`]).
    BelowMinimumGain,
    /// It needed more device calls or host syncs than the defaults on some trace.
    MoreCalls,
    /// Some trace did not fit at the limit.
    NoFit,
    /// The allocator refused the settings (the reason).
    Refused(String),
}

/// One setting tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tried {
    /// The full settings string.
    pub conf: String,
    /// What it changed from the best so far (`key:value`, or `-key` for unsetting).
    pub change: String,
    /// Per trace (empty when refused).
    pub scores: Vec<Score>,
    /// The verdict.
    pub outcome: Outcome,
}

impl Tried {
    /// Device calls plus host syncs over the traces (the tie-break between settings that
    /// need the same memory).
    pub fn cost(&self) -> u64 {
        self.scores
            .iter()
            .map(|s| s.device_calls + s.host_syncs)
            .sum()
    }

    /// Sum of minimum capacities (`None` if some trace does not fit, or it was refused).
    pub fn total(&self) -> Option<u64> {
        if self.scores.is_empty() {
            return None;
        }
        self.scores.iter().map(|s| s.capacity).sum()
    }
}

/// The search's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Every setting tried, in order; the first is the defaults.
    pub tried: Vec<Tried>,
    /// The best settings string (empty: the defaults).
    pub best: String,
}

impl Tuning {
    /// The setting tried that came closest to the minimum gain without reaching it: the
    /// smallest total, then the fewest calls (`None` when none was better at all).
    pub fn closest_below_minimum(&self) -> Option<&Tried> {
        self.tried
            .iter()
            .filter(|t| t.outcome == Outcome::BelowMinimumGain)
            .min_by_key(|t| (t.total(), t.cost()))
    }

    /// The entry of the best setting.
    pub fn best_tried(&self) -> &Tried {
        self.tried
            .iter()
            .rev()
            .find(|t| t.conf == self.best && matches!(t.outcome, Outcome::Kept | Outcome::Baseline))
            .unwrap_or(&self.tried[0])
    }
}

fn conf_string(s: &BTreeMap<&str, &str>) -> String {
    // In the grid's order, so equal settings read the same.
    GRID.iter()
        .filter_map(|(k, _)| s.get(k).map(|v| format!("{k}:{v}")))
        .collect::<Vec<_>>()
        .join(",")
}

fn score(traces: &[Trace], conf: &str, limit: usize) -> Result<Vec<Score>, Error> {
    let opts = ReplayOptions {
        conf: conf.to_owned(),
        capacity: limit,
        ..ReplayOptions::default()
    };
    traces
        .iter()
        .map(|t| {
            Ok(match min_capacity(t, &opts)? {
                MinCapacity::Fits {
                    capacity,
                    peak_requested,
                    at_min,
                    ..
                } => Score {
                    capacity: Some(capacity),
                    peak_requested,
                    device_calls: at_min.device_mallocs + at_min.page_maps,
                    host_syncs: at_min.host_syncs,
                },
                MinCapacity::NoFit { .. } => Score {
                    capacity: None,
                    peak_requested: t.peak_requested(),
                    device_calls: 0,
                    host_syncs: 0,
                },
            })
        })
        .collect()
}

/// Searches the settings on `traces` (minimum capacities searched up to `limit` bytes);
/// `progress` sees each setting once scored.
pub fn tune(
    traces: &[Trace],
    limit: usize,
    mut progress: impl FnMut(&Tried),
) -> Result<Tuning, Error> {
    let base = Tried {
        conf: String::new(),
        change: "(defaults)".into(),
        scores: score(traces, "", limit)?,
        outcome: Outcome::Baseline,
    };
    progress(&base);
    let baseline = base.scores.clone();
    let mut best = base.total().map(|t| (t, base.cost()));
    let mut tried = vec![base];
    let mut seen: HashSet<String> = HashSet::from([String::new()]);
    let mut current: BTreeMap<&str, &str> = BTreeMap::new();
    for _ in 0..ROUNDS {
        let mut changed = false;
        for (key, values) in GRID {
            let mut options: Vec<Option<&str>> = values
                .iter()
                .filter(|v| current.get(key) != Some(*v))
                .map(|v| Some(*v))
                .collect();
            if current.contains_key(key) {
                options.push(None);
            }
            let mut winner: Option<BTreeMap<&str, &str>> = None;
            for v in options {
                let mut cand = current.clone();
                let change = match v {
                    // Only expandable segments have pages: a page setting turns them on.
                    Some(v)
                        if PAGE_KEYS.contains(&key)
                            && !cand.contains_key("expandable_segments") =>
                    {
                        cand.insert("expandable_segments", "True");
                        cand.insert(key, v);
                        format!("expandable_segments:True,{key}:{v}")
                    }
                    Some(v) => {
                        cand.insert(key, v);
                        format!("{key}:{v}")
                    }
                    None => {
                        cand.remove(key);
                        if key == "expandable_segments" {
                            for k in PAGE_KEYS {
                                cand.remove(k);
                            }
                        }
                        format!("-{key}")
                    }
                };
                let conf = conf_string(&cand);
                if !seen.insert(conf.clone()) {
                    continue;
                }
                let mut t = Tried {
                    conf: conf.clone(),
                    change,
                    scores: Vec::new(),
                    outcome: Outcome::NoFit,
                };
                if let Err(e) = Config::parse(&conf) {
                    t.outcome = Outcome::Refused(e.to_string());
                } else {
                    t.scores = score(traces, &conf, limit)?;
                    // A trace the defaults do not fit sets no bound.
                    let cheap = t.scores.iter().zip(&baseline).all(|(s, b)| {
                        b.capacity.is_none()
                            || (s.device_calls <= b.device_calls && s.host_syncs <= b.host_syncs)
                    });
                    let cost = t.cost();
                    t.outcome = match t.total() {
                        None => Outcome::NoFit,
                        Some(_) if !cheap => Outcome::MoreCalls,
                        Some(total) => match gain(total, cost, best) {
                            Gain::Clear => {
                                best = Some((total, cost));
                                winner = Some(cand);
                                Outcome::Kept
                            }
                            Gain::BelowMinimum => Outcome::BelowMinimumGain,
                            Gain::None => Outcome::NotSmaller,
                        },
                    };
                }
                progress(&t);
                tried.push(t);
            }
            if let Some(cand) = winner {
                current = cand;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Ok(Tuning {
        tried,
        best: conf_string(&current),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_better_only_past_the_minimum_gain() {
        const GIB: u64 = 1 << 30;
        const MIB: u64 = 1 << 20;
        // Nothing fits yet: anything that fits is better.
        assert_eq!(gain(10 * GIB, 1000, None), Gain::Clear);
        // 2 MiB of 6.7 GiB is noise; 1 % is not.
        let best = Some((6800 * MIB, 452));
        assert_eq!(gain(6798 * MIB, 452, best), Gain::BelowMinimum);
        assert_eq!(gain(6800 * MIB - 6800 * MIB / 100, 452, best), Gain::Clear);
        assert_eq!(
            gain(6800 * MIB - 6800 * MIB / 100 + 1, 452, best),
            Gain::BelowMinimum
        );
        // Less memory counts even with more calls (the defaults' calls bound them).
        assert_eq!(gain(6000 * MIB, 500, best), Gain::Clear);
        // At no more memory, 10 % fewer calls and syncs is better; fewer is noise.
        assert_eq!(gain(6800 * MIB, 406, best), Gain::Clear);
        assert_eq!(gain(6800 * MIB, 407, best), Gain::BelowMinimum);
        assert_eq!(gain(6799 * MIB, 407, best), Gain::BelowMinimum);
        // More memory, however few the calls, or the same figures: no gain.
        assert_eq!(gain(6801 * MIB, 10, best), Gain::None);
        assert_eq!(gain(6800 * MIB, 452, best), Gain::None);
        assert_eq!(gain(6800 * MIB, 453, best), Gain::None);
    }
}
