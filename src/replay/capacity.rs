//! The smallest simulated device a trace runs on: binary search, in 1 MiB steps, for the
//! least capacity at which a replay completes with no out-of-memory failure.
//!
//! A capacity below the trace's peak requested bytes can never hold it, so the search
//! starts between the whole MiB just under that peak (known to fail) and the limit the
//! caller gives (the replay's `--capacity`), after checking that the trace fits at the
//! limit at all. It first tries the uncapped replay's peak reserved (rounded up to a MiB),
//! which usually fits and narrows the search to a dozen replays.
//!
//! Fitting is not strictly monotone in capacity for a caching allocator (a smaller device
//! changes when the cache is released, and so where later blocks land), so the result is
//! a boundary: the replay fits at the capacity found and fails one MiB below it. A still
//! smaller capacity may fit again in rare cases; the search does not look for one.

use super::{replay, ReplayOptions, ReplayReport};
use crate::trace::Trace;
use crate::Error;

/// The search step and granularity of the reported capacity.
pub const STEP: u64 = 1 << 20;

/// Where the search ended.
#[derive(Clone, Debug)]
pub enum MinCapacity {
    /// The smallest capacity found (a multiple of [`STEP`]) and the replay at it.
    Fits {
        /// Capacity in bytes.
        capacity: u64,
        /// The trace's peak requested bytes.
        peak_requested: u64,
        /// The replay at `capacity` (device mallocs, host syncs, stalled waits, retries).
        at_min: Box<ReplayReport>,
        /// Replays the search ran.
        replays: usize,
    },
    /// The trace runs out of memory even at the limit.
    NoFit {
        /// The capacity tried (the caller's limit, rounded down to a whole MiB).
        limit: u64,
        /// Allocations that failed there.
        ooms: u64,
    },
}

impl MinCapacity {
    /// The capacity found, if the trace fits at all.
    pub fn capacity(&self) -> Option<u64> {
        match self {
            MinCapacity::Fits { capacity, .. } => Some(*capacity),
            MinCapacity::NoFit { .. } => None,
        }
    }

    /// Capacity / peak requested (None if the trace does not fit or requests nothing).
    pub fn ratio(&self) -> Option<f64> {
        match self {
            MinCapacity::Fits {
                capacity,
                peak_requested,
                ..
            } if *peak_requested > 0 => Some(*capacity as f64 / *peak_requested as f64),
            _ => None,
        }
    }

    /// The replay at the capacity found.
    pub fn at_min(&self) -> Option<&ReplayReport> {
        match self {
            MinCapacity::Fits { at_min, .. } => Some(at_min),
            MinCapacity::NoFit { .. } => None,
        }
    }
}

/// Replays `trace` with `opts` (its `capacity` is the limit of the search) at capacities
/// down to the smallest whole MiB at which no allocation fails.
///
/// The limit is rounded down to a whole MiB; under 1 MiB it is an invalid argument.
/// Errors are those of [`replay`] (bad settings, a broken trace); a trace that does not
/// fit even at the limit is [`MinCapacity::NoFit`], not an error.
pub fn min_capacity(trace: &Trace, opts: &ReplayOptions) -> Result<MinCapacity, Error> {
    search(trace, opts, |_, _| false)
}

/// Whether [`min_capacity`] would find a capacity of at most `bound` bytes: the same
/// search, stopped as soon as its answer is known (the capacity known to fit is at
/// most `bound`, or the one known to fail is at least `bound`), so a comparison costs
/// a few replays instead of a dozen. `false` if the trace does not fit at the limit.
pub fn min_capacity_at_most(
    trace: &Trace,
    opts: &ReplayOptions,
    bound: u64,
) -> Result<bool, Error> {
    let bound = bound / STEP;
    let found = search(trace, opts, |lo, hi| hi <= bound || lo >= bound)?;
    Ok(found.capacity().is_some_and(|c| c / STEP <= bound))
}

/// The search of [`min_capacity`], in MiB, ended early once `done(lo, hi)` (`lo`
/// fails, `hi` fits); the capacity it reports is `hi` then.
fn search(
    trace: &Trace,
    opts: &ReplayOptions,
    done: impl Fn(u64, u64) -> bool,
) -> Result<MinCapacity, Error> {
    let mut replays = 0usize;
    let mut run = |capacity: u64| -> Result<ReplayReport, Error> {
        replays += 1;
        let o = ReplayOptions {
            conf: opts.conf.clone(),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
            detail: false,
            address_order: opts.address_order,
        };
        replay(trace, &o, |_| {})
    };
    // Capacities in MiB: `lo` fails (below the peak requested, or nothing), `hi` fits.
    let mut hi = opts.capacity as u64 / STEP;
    if hi == 0 {
        return Err(Error::InvalidArgument(format!(
            "the capacity limit of a minimum-capacity search ({} bytes) is under 1 MiB",
            opts.capacity
        )));
    }
    let limit = hi * STEP;
    let mut hi_report = run(limit)?;
    if hi_report.ooms > 0 {
        return Ok(MinCapacity::NoFit {
            limit,
            ooms: hi_report.ooms,
        });
    }
    let peak = trace.peak_requested();
    let mut lo = peak.div_ceil(STEP).saturating_sub(1);
    let guess = hi_report.peak_reserved.div_ceil(STEP).max(lo + 1);
    if guess < hi {
        let r = run(guess * STEP)?;
        if r.ooms == 0 {
            (hi, hi_report) = (guess, r);
        } else {
            lo = guess;
        }
    }
    while hi - lo > 1 && !done(lo, hi) {
        let mid = lo + (hi - lo) / 2;
        let r = run(mid * STEP)?;
        if r.ooms == 0 {
            (hi, hi_report) = (mid, r);
        } else {
            lo = mid;
        }
    }
    Ok(MinCapacity::Fits {
        capacity: hi * STEP,
        peak_requested: peak,
        at_min: Box::new(hi_report),
        replays,
    })
}
