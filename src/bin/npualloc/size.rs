//! Sizes as users write them: `64G`, `64GiB`, `1.5G`, `512MiB`, `1T`, `64 GB`,
//! `1073741824`.
//!
//! A size is a number, optionally with a decimal fraction, then optionally a unit: `K`,
//! `M`, `G` or `T`, alone or followed by `iB` or `B`, in any case. Every unit is a power
//! of 1024 (`G` = `GiB` = `GB` = 2^30 bytes), as in PyTorch's `max_split_size_mb` and
//! memory summaries. A fraction is rounded down to whole bytes; without a unit the
//! number must be whole.

/// The units and their multipliers.
const UNITS: [(char, u128); 4] = [
    ('k', 1 << 10),
    ('m', 1 << 20),
    ('g', 1 << 30),
    ('t', 1 << 40),
];

/// Most digits read after the decimal point.
const MAX_FRACTION_DIGITS: usize = 12;

/// Reads a size in bytes; the error says what is wrong with `text`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim_start());
    if number.is_empty() {
        return Err(if t.starts_with('-') {
            "a size cannot be negative".into()
        } else {
            "expected a number of bytes, or one with a unit such as 64G or 1.5GiB".into()
        });
    }
    let mult = unit_bytes(unit)?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(format!("'{number}' is not a number"));
    }
    if !fraction.is_empty() && mult == 1 {
        return Err("a number of bytes must be whole (or give a unit: 1.5G)".into());
    }
    let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
    let too_large = || "too large (at most 16 EiB)".to_string();
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let frac: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().expect("ASCII digits")
    };
    let bytes = whole
        .checked_mul(mult)
        .and_then(|w| w.checked_add(frac * mult / scale))
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// The multiplier of a unit (`""` is bytes).
fn unit_bytes(unit: &str) -> Result<u128, String> {
    let lower = unit.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Ok(1);
    }
    let mut chars = lower.chars();
    let first = chars.next().unwrap_or(' ');
    let rest = chars.as_str();
    match UNITS.iter().find(|(c, _)| *c == first) {
        Some(&(_, m)) if matches!(rest, "" | "b" | "ib") => Ok(m),
        _ => Err(format!(
            "unknown unit '{unit}': use K, M, G or T (or KiB, MiB, GiB, TiB; all powers of 1024)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sizes_users_write() {
        for (text, bytes) in [
            ("1073741824", 1u64 << 30),
            ("64G", 64 << 30),
            ("64g", 64 << 30),
            ("64GiB", 64 << 30),
            ("64GB", 64 << 30),
            ("64 GiB", 64 << 30),
            ("512MiB", 512 << 20),
            ("512M", 512 << 20),
            ("80m", 80 << 20),
            ("4KiB", 4096),
            ("1T", 1 << 40),
            ("2TiB", 2 << 40),
            ("1.5G", 3 << 29),
            ("0.5M", 1 << 19),
            (".5K", 512),
            ("0.1K", 102),
            ("100B", 100),
            (" 64G ", 64 << 30),
            ("0", 0),
            ("15.999999999999T", 17_592_186_044_414),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn says_what_is_wrong() {
        for (text, why) in [
            ("lots", "expected a number"),
            ("", "expected a number"),
            ("-1G", "cannot be negative"),
            ("64X", "unknown unit 'X'"),
            ("64Gi", "unknown unit 'Gi'"),
            ("64 GiBs", "unknown unit 'GiBs'"),
            ("1.5", "must be whole"),
            ("1.2.3G", "'1.2.3' is not a number"),
            (".G", "'.' is not a number"),
            ("16777216T", "too large"),
            ("99999999999999999999999999999999999999999", "too large"),
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
