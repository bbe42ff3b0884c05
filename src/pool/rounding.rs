//! Size rounding and segment sizing, with PyTorch's constants.

/// Smallest block and rounding unit.
pub const MIN_BLOCK: usize = 512;
/// Largest request served by the small pool.
pub const SMALL_SIZE: usize = 1 << 20;
/// Segment size of the small pool.
pub const SMALL_BUFFER: usize = 2 << 20;
/// Segment size for requests between 1 and 10 MiB.
pub const LARGE_BUFFER: usize = 20 << 20;
/// Requests from this size get a segment of their own rounded size.
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: usize = 2 << 20;
/// Requests above this (1 EiB) are refused outright.
pub const MAX_REQUEST: usize = 1 << 60;

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|x| x / to * to)
}

/// Rounds to the next division of the power-of-two interval holding `size`.
fn next_division(size: usize, divisions: usize) -> Option<usize> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        Some(size)
    } else {
        down.checked_add(step)
    }
}

/// The block size serving a request of `size` bytes; `None` if it cannot be represented.
/// `divisions_for(size)`: the `roundup_power2_divisions` setting for that size
/// (`Config::divisions_for`; 0 or 1 = none).
pub fn round_size(size: usize, divisions_for: impl Fn(usize) -> usize) -> Option<usize> {
    if size > MAX_REQUEST {
        return None;
    }
    if size < MIN_BLOCK {
        return Some(MIN_BLOCK);
    }
    let divisions = divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK * divisions {
        next_division(size, divisions).and_then(|s| round_up(s, MIN_BLOCK))
    } else {
        round_up(size, MIN_BLOCK)
    }
}

/// The device allocation (segment) size for a block of `rounded` bytes.
pub fn allocation_size(rounded: usize) -> Option<usize> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        round_up(rounded, ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_like_pytorch() {
        let c = |_| 0;
        assert_eq!(round_size(1, c), Some(512));
        assert_eq!(round_size(512, c), Some(512));
        assert_eq!(round_size(513, c), Some(1024));
        assert_eq!(round_size(3 << 20, c), Some(3 << 20));
    }

    #[test]
    fn power2_divisions_match_pytorch_example() {
        let c = |_| 4;
        // PyTorch's own example of the division step; below 512 * divisions plain
        // 512-byte rounding applies.
        assert_eq!(next_division(1200, 4), Some(1280));
        assert_eq!(round_size(1200, c), Some(1536));
        assert_eq!(round_size(5000, c), Some(5120));
        assert_eq!(round_size(4096, c), Some(4096));
        assert_eq!(round_size((1 << 20) + 1, c), Some((1 << 20) + (1 << 18)));
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        assert_eq!(round_size(usize::MAX, |_| 8), None);
        assert_eq!(round_size(usize::MAX - 100, |_| 0), None);
        assert_eq!(allocation_size(usize::MAX - 5), None);
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(allocation_size(512), Some(SMALL_BUFFER));
        assert_eq!(allocation_size(SMALL_SIZE + 512), Some(LARGE_BUFFER));
        assert_eq!(allocation_size(MIN_LARGE_ALLOC), Some(MIN_LARGE_ALLOC));
        assert_eq!(allocation_size(11 << 20 | 512), Some(12 << 20));
    }
}
