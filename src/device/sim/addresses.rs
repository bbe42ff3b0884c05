//! Where a simulated device puts each allocation (and each address-space reservation):
//! the order in which it hands out addresses.
//!
//! A real device's runtime decides addresses by rules of its own (a driver's virtual
//! address allocator), which a program cannot choose and which differ between runtimes
//! and versions. An allocator whose placement depends on addresses (PyTorch's best fit
//! breaks ties between equal-size blocks by the lowest address) can then place blocks
//! differently on the device than in a replay. The simulated device offers several
//! orders, so a replay shows how much a figure depends on them:
//! - [`AddressOrder::Increasing`] (the default): each range above the last, freed ranges
//!   not handed out again until the window's end is reached (a bump pointer; then the
//!   lowest free range);
//! - [`AddressOrder::Decreasing`]: each range below the last, likewise down to the
//!   window's start;
//! - [`AddressOrder::Shuffled`]: anywhere in the window, drawn from a seeded generator;
//! - [`AddressOrder::LowestFree`]: the lowest free range that holds it, so a freed
//!   range comes back first (first fit over the window). This is not a characterisation
//!   of any runtime (no measurement of one was available): it is the other common way
//!   an address allocator works, beside a bump pointer.
//!
//! Invariants: ranges taken never overlap and lie inside the window; each starts at a
//! multiple of its alignment; `taken` holds exactly the ranges handed out and not given
//! back, by start.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The order in which a simulated device hands out addresses (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressOrder {
    /// Each range above the last; freed ranges come back only past the window's end.
    #[default]
    Increasing,
    /// Each range below the last; freed ranges come back only past the window's start.
    Decreasing,
    /// Anywhere in the window, drawn from a generator seeded with this value.
    Shuffled(u64),
    /// The lowest free range that holds it (freed ranges come back first).
    LowestFree,
}

impl AddressOrder {
    /// One of each kind (the shuffled one with `seed`): what a test sweeps.
    pub fn all(seed: u64) -> [AddressOrder; 4] {
        [
            AddressOrder::Increasing,
            AddressOrder::Decreasing,
            AddressOrder::Shuffled(seed),
            AddressOrder::LowestFree,
        ]
    }
}

impl fmt::Display for AddressOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressOrder::Increasing => write!(f, "increasing"),
            AddressOrder::Decreasing => write!(f, "decreasing"),
            AddressOrder::Shuffled(seed) => write!(f, "shuffled:{seed}"),
            AddressOrder::LowestFree => write!(f, "lowest-free"),
        }
    }
}

impl FromStr for AddressOrder {
    type Err = String;

    /// `increasing`, `decreasing`, `shuffled:SEED` or `lowest-free`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "increasing" => Ok(AddressOrder::Increasing),
            "decreasing" => Ok(AddressOrder::Decreasing),
            "lowest-free" => Ok(AddressOrder::LowestFree),
            other => other
                .strip_prefix("shuffled:")
                .and_then(|seed| seed.parse().ok())
                .map(AddressOrder::Shuffled)
                .ok_or_else(|| {
                    format!(
                        "address order '{other}' is not one of increasing, decreasing, \
                         shuffled:SEED (a whole number) or lowest-free"
                    )
                }),
        }
    }
}

/// Tries of a shuffled order before it takes the lowest free range instead.
const SHUFFLE_TRIES: usize = 64;

/// A window of addresses and the ranges taken in it.
#[derive(Debug)]
pub(super) struct Window {
    order: AddressOrder,
    start: usize,
    end: usize,
    /// Increasing: where the next range may start; decreasing: where the last began.
    cursor: usize,
    /// The shuffled order's generator state.
    rng: u64,
    /// Ranges handed out: start → length.
    taken: BTreeMap<usize, usize>,
}

impl Window {
    /// The window `[start, start + len)`, handing out ranges in `order`.
    pub(super) fn new(order: AddressOrder, start: usize, len: usize) -> Window {
        let end = start.saturating_add(len);
        Window {
            order,
            start,
            end,
            cursor: match order {
                AddressOrder::Decreasing => end,
                _ => start,
            },
            rng: match order {
                AddressOrder::Shuffled(seed) => seed,
                _ => 0,
            },
            taken: BTreeMap::new(),
        }
    }

    /// A free range of `len` bytes starting at a multiple of `align` (not 0),
    /// now taken; `None` when the window has none.
    pub(super) fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        let at = match self.order {
            AddressOrder::Increasing => {
                let next = self.cursor.checked_next_multiple_of(align);
                let at = next
                    .filter(|&at| self.fits(at, len))
                    .or_else(|| self.lowest(len, align))?;
                self.cursor = at + len;
                at
            }
            AddressOrder::Decreasing => {
                let next = self.cursor.checked_sub(len).map(|c| c - c % align);
                let at = next
                    .filter(|&at| self.fits(at, len))
                    .or_else(|| self.lowest(len, align))?;
                self.cursor = at;
                at
            }
            AddressOrder::Shuffled(_) => self
                .shuffled(len, align)
                .or_else(|| self.lowest(len, align))?,
            AddressOrder::LowestFree => self.lowest(len, align)?,
        };
        self.taken.insert(at, len);
        Some(at)
    }

    /// Gives back the range starting at `at`; whether there was one.
    pub(super) fn give_back(&mut self, at: usize) -> bool {
        self.taken.remove(&at).is_some()
    }

    /// Whether `[at, at + len)` lies in the window and overlaps no taken range.
    fn fits(&self, at: usize, len: usize) -> bool {
        let Some(end) = at.checked_add(len) else {
            return false;
        };
        at >= self.start
            && end <= self.end
            && self
                .taken
                .range(..end)
                .next_back()
                .is_none_or(|(&b, &l)| b + l <= at)
    }

    /// A random aligned start where the range fits, within [`SHUFFLE_TRIES`] draws.
    fn shuffled(&mut self, len: usize, align: usize) -> Option<usize> {
        let first = self.start.checked_next_multiple_of(align)?;
        let slots = self.end.checked_sub(first)?.checked_sub(len)? / align + 1;
        for _ in 0..SHUFFLE_TRIES {
            let at = first + (splitmix(&mut self.rng) % slots as u64) as usize * align;
            if self.fits(at, len) {
                return Some(at);
            }
        }
        None
    }

    /// The lowest aligned start where the range fits.
    fn lowest(&self, len: usize, align: usize) -> Option<usize> {
        let mut at = self.start.checked_next_multiple_of(align)?;
        for (&b, &l) in &self.taken {
            if at.checked_add(len)? <= b {
                break;
            }
            at = at.max((b + l).checked_next_multiple_of(align)?);
        }
        self.fits(at, len).then_some(at)
    }
}

/// splitmix64: the next value of the generator whose state is `x`.
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Takes ranges of these lengths (2 MiB-aligned), gives back the ones marked, then
    /// takes one more of 2 MiB: every start, in order.
    fn run(order: AddressOrder, lens: &[(usize, bool)]) -> Vec<usize> {
        let mut w = Window::new(order, 1 << 40, 1 << 40);
        let mut out: Vec<usize> = lens
            .iter()
            .map(|&(l, _)| w.take(l, 2 * MIB).unwrap())
            .collect();
        for (at, &(_, back)) in out.clone().iter().zip(lens) {
            if back {
                assert!(w.give_back(*at));
                assert!(!w.give_back(*at), "given back once");
            }
        }
        out.push(w.take(2 * MIB, 2 * MIB).unwrap());
        out
    }

    const LENS: [(usize, bool); 4] = [
        (20 * MIB, false),
        (2 * MIB, true),
        (4 * MIB, false),
        (2 * MIB, false),
    ];

    #[test]
    fn increasing_and_decreasing_hand_no_range_out_again_before_the_windows_end() {
        let up = run(AddressOrder::Increasing, &LENS);
        assert!(up.windows(2).all(|p| p[0] < p[1]), "{up:x?}");
        assert_eq!(up[0], 1 << 40);
        let down = run(AddressOrder::Decreasing, &LENS);
        assert!(down.windows(2).all(|p| p[0] > p[1]), "{down:x?}");
        assert_eq!(down[0] + 20 * MIB, 2 << 40);
    }

    #[test]
    fn lowest_free_hands_a_freed_range_out_first() {
        let v = run(AddressOrder::LowestFree, &LENS);
        assert_eq!(v[4], v[1], "the freed 2 MiB come back: {v:x?}");
        assert_eq!(v[1], v[0] + 20 * MIB);
    }

    #[test]
    fn shuffled_is_the_same_for_a_seed_and_differs_between_seeds() {
        let a = run(AddressOrder::Shuffled(7), &LENS);
        assert_eq!(a, run(AddressOrder::Shuffled(7), &LENS));
        assert_ne!(a, run(AddressOrder::Shuffled(8), &LENS));
        assert!(a.iter().all(|&at| at % (2 * MIB) == 0));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_ne!(a, sorted, "not in increasing order");
    }

    #[test]
    fn ranges_never_overlap_and_a_full_window_says_so() {
        for order in AddressOrder::all(3) {
            let mut w = Window::new(order, 4096, 10 * 4096);
            let mut got: Vec<usize> = (0..10).map(|_| w.take(4096, 4096).unwrap()).collect();
            assert_eq!(w.take(4096, 4096), None, "{order}: the window is full");
            got.sort_unstable();
            assert_eq!(
                got,
                (1..=10).map(|i| i * 4096).collect::<Vec<_>>(),
                "{order}"
            );
            // One page back: the only place left for the next, in every order (past
            // the window's end, a bump pointer takes the lowest free range).
            assert!(w.give_back(5 * 4096));
            assert_eq!(w.take(4096, 4096), Some(5 * 4096), "{order}");
            assert_eq!(w.take(4096, 4096), None, "{order}");
        }
    }

    #[test]
    fn orders_read_back_as_written() {
        for order in AddressOrder::all(42) {
            assert_eq!(order.to_string().parse::<AddressOrder>(), Ok(order));
        }
        assert!("shuffled:x".parse::<AddressOrder>().is_err());
        assert!("random".parse::<AddressOrder>().is_err());
    }
}
