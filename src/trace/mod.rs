//! Allocation traces: the text format (`.trace`), its parser and writer, and
//! conversion from PyTorch / torch_npu memory snapshots.
//!
//! ```text
//! # npualloc-trace v1 ...        first line; '#' starts a comment anywhere
//! a <id> <bytes> <stream>         allocate; id unique per allocation; stream 0 = default
//! f <id>                          free (on the stream it was allocated on)
//! r <id> <stream>                 that allocation was used on another stream
//! s <stream>                      all work queued so far on that stream has completed
//! ```
//!
//! Allocation stacks travel in `#@` comment lines that older readers skip
//! ([`frames`]: `#@frame`, `#@stack` declarations and a trailing `#@<stack>` on `a` lines).

pub mod derive;
pub mod frames;
#[cfg(feature = "cli")]
pub mod pickle;
#[cfg(feature = "cli")]
pub mod unpickle;

use std::fmt;

// Fx hashing: the maps here are keyed by trace ids and stream labels, hashed once per
// event; SipHash cost more than the rest of a parse or a floor pass.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::io::Write;

/// One trace event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a id bytes stream`
    Alloc {
        /// Allocation id.
        id: u64,
        /// Requested bytes.
        size: u64,
        /// Stream label.
        stream: u32,
    },
    /// `f id`
    Free {
        /// Allocation id.
        id: u64,
    },
    /// `r id stream`
    Record {
        /// Allocation id.
        id: u64,
        /// Stream label.
        stream: u32,
    },
    /// `s stream`
    Sync {
        /// Stream label.
        stream: u32,
    },
}

/// A parsed, validated trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Where it came from (file name).
    pub name: String,
    /// Events in order.
    pub ops: Vec<Op>,
}

/// A malformed trace: file, line and what was expected. Displays as `file:line: message`,
/// or `file: message` when the error is about the whole file (a snapshot pickle has no
/// lines).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line_part(*.line))]
pub struct TraceError {
    /// File name.
    pub file: String,
    /// 1-based line number (0 when the error is about the whole file).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Most characters of an input token an error or note repeats.
pub const ECHO: usize = 40;

/// `s` as an error repeats it: whole when short, else its first [`ECHO`] characters and
/// its length, so a malformed input (a whole JSON file on one line) is not printed back.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(ECHO) {
        None => s.to_string(),
        Some((end, _)) => format!("{}... ({} bytes)", &s[..end], s.len()),
    }
}

fn line_part(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}

/// Header line written at the top of every trace.
pub const HEADER: &str = "# npualloc-trace v1";

/// Tracks live ids and their bytes while parsing, to reject inconsistent traces.
#[derive(Default)]
struct Liveness {
    state: HashMap<u64, (bool, u64)>, // id -> (live?, bytes)
    live_bytes: u64,
}

impl Liveness {
    fn alloc(&mut self, id: u64, size: u64) -> Result<(), String> {
        if self.state.contains_key(&id) {
            return Err(format!(
                "duplicate allocation id {id} (ids are unique per allocation)"
            ));
        }
        self.live_bytes = self.live_bytes.checked_add(size).ok_or_else(|| {
            format!(
                "allocation {id} of {size} bytes takes the live total past {} bytes",
                u64::MAX
            )
        })?;
        self.state.insert(id, (true, size));
        Ok(())
    }

    fn use_live(&mut self, id: u64, what: &str, free: bool) -> Result<(), String> {
        match self.state.get_mut(&id) {
            None => Err(format!("{what} of unknown id {id} (never allocated)")),
            Some((false, _)) => Err(format!("{what} of id {id}, which was already freed")),
            Some((live, size)) => {
                if free {
                    *live = false;
                    self.live_bytes -= *size;
                }
                Ok(())
            }
        }
    }
}

/// The lines of `text` exactly as [`str::lines`] cuts them (at `\n`, dropping a `\r`
/// before it; no empty line after a final `\n`), found by a byte loop: a trace's lines
/// are short, where the library's `\n` search pays its set-up on every line.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (line, next) = match rest.bytes().position(|b| b == b'\n') {
            Some(n) => (
                rest[..n].strip_suffix('\r').unwrap_or(&rest[..n]),
                &rest[n + 1..],
            ),
            None => (rest, ""),
        };
        rest = next;
        Some(line)
    })
}

/// `line` up to its first `#` (a comment), by a byte loop (see [`lines`]).
fn before_comment(line: &str) -> &str {
    match line.bytes().position(|b| b == b'#') {
        Some(n) => &line[..n],
        None => line,
    }
}

/// The value of a token of 1 to 19 ASCII digits (which always fits a `u64`); `None`
/// for anything else, which [`num`]'s checks then word.
fn digits(t: &str) -> Option<u64> {
    if t.is_empty() || t.len() > 19 {
        return None;
    }
    t.bytes().try_fold(0u64, |v, b| {
        let d = b.wrapping_sub(b'0');
        (d <= 9).then_some(v * 10 + u64::from(d))
    })
}

fn num<T: TryFrom<u64>>(tok: Option<&str>, what: &str) -> Result<T, String> {
    if let Some(v) = tok.and_then(digits).and_then(|v| T::try_from(v).ok()) {
        return Ok(v);
    }
    let tok = tok.ok_or_else(|| format!("missing {what}"))?;
    let t = clip(tok);
    if t.starts_with('-') {
        return Err(format!(
            "{what} '{t}' is negative; expected a non-negative integer"
        ));
    }
    if tok.is_empty() || !tok.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} '{t}' is not a non-negative integer"));
    }
    // All digits: the only failure left is a value that does not fit.
    let too_large = || {
        let max = [u64::MAX, u32::MAX.into(), u16::MAX.into(), u8::MAX.into()]
            .into_iter()
            .find(|m| T::try_from(*m).is_ok())
            .unwrap_or(0);
        format!("{what} '{t}' is too large (at most {max})")
    };
    let v: u64 = tok.parse().map_err(|_| too_large())?;
    T::try_from(v).map_err(|_| too_large())
}

fn parse_line(line: &str, live: &mut Liveness) -> Result<Option<Op>, String> {
    let line = before_comment(line).trim();
    if line.is_empty() {
        return Ok(None);
    }
    let mut it = line.split_ascii_whitespace();
    let op = it.next().unwrap_or("");
    let parsed = match op {
        "a" => {
            let id = num(it.next(), "allocation id")?;
            let size: u64 = num(it.next(), "size in bytes")?;
            let stream = num(it.next(), "stream")?;
            live.alloc(id, size)?;
            Op::Alloc { id, size, stream }
        }
        "f" => {
            let id = num(it.next(), "allocation id")?;
            live.use_live(id, "free", true)?;
            Op::Free { id }
        }
        "r" => {
            let id = num(it.next(), "allocation id")?;
            let stream = num(it.next(), "stream")?;
            live.use_live(id, "record", false)?;
            Op::Record { id, stream }
        }
        "s" => Op::Sync {
            stream: num(it.next(), "stream")?,
        },
        other => {
            let other = clip(other);
            return Err(format!(
                "unknown operation '{other}'; expected 'a <id> <bytes> <stream>', 'f <id>', 'r <id> <stream>' or 's <stream>'"
            ));
        }
    };
    if let Some(extra) = it.next() {
        let extra = clip(extra);
        return Err(format!(
            "unexpected '{extra}' after a complete '{op}' event"
        ));
    }
    Ok(Some(parsed))
}

/// Parses and validates a text trace; `name` is used in error messages.
pub fn parse(text: &str, name: &str) -> Result<Trace, TraceError> {
    let mut live = Liveness::default();
    let mut ops = Vec::with_capacity(text.len() / 12);
    for (i, line) in lines(text).enumerate() {
        match parse_line(line, &mut live) {
            Ok(Some(op)) => ops.push(op),
            Ok(None) => {}
            Err(message) => {
                return Err(TraceError {
                    file: name.to_owned(),
                    line: i + 1,
                    message,
                })
            }
        }
    }
    Ok(Trace {
        name: name.to_owned(),
        ops,
    })
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Alloc { id, size, stream } => write!(f, "a {id} {size} {stream}"),
            Op::Free { id } => write!(f, "f {id}"),
            Op::Record { id, stream } => write!(f, "r {id} {stream}"),
            Op::Sync { stream } => write!(f, "s {stream}"),
        }
    }
}

impl Trace {
    /// Every allocation event in order: (id, bytes, stream).
    pub fn allocations(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::Alloc { id, size, stream } => Some((id, size, stream)),
            _ => None,
        })
    }

    /// Writes the trace in the text format.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "{HEADER} source={} events={}",
            self.name,
            self.ops.len()
        )?;
        for op in &self.ops {
            writeln!(out, "{op}")?;
        }
        Ok(())
    }

    /// Largest sum of requested bytes of live allocations over the trace (saturating at
    /// `u64::MAX`; [`parse`] refuses a trace whose live bytes would pass it).
    pub fn peak_requested(&self) -> u64 {
        let mut sizes = HashMap::default();
        let (mut cur, mut peak) = (0u64, 0u64);
        for op in &self.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    sizes.insert(id, size);
                    cur = cur.saturating_add(size);
                    peak = peak.max(cur);
                }
                Op::Free { id } => cur = cur.saturating_sub(sizes.remove(&id).unwrap_or(0)),
                _ => {}
            }
        }
        peak
    }

    /// The trace `n` times in a row, as a training loop runs it: what a repetition left
    /// live is freed before the next starts (in order of the original ids); ids are
    /// renumbered densely (repetition `k`'s `j`-th allocation is `k * allocations + j`),
    /// so each stays unique whatever the original ids. `n <= 1` gives the trace unchanged.
    pub fn repeated(&self, n: usize) -> Trace {
        if n <= 1 {
            return self.clone();
        }
        let dense: HashMap<u64, u64> = self.allocations().map(|(id, _, _)| id).zip(0..).collect();
        let span = dense.len().max(1) as u64;
        let mut ops = Vec::with_capacity(self.ops.len().checked_mul(n).unwrap_or(0));
        for k in 0..n as u64 {
            let base = k * span; // k * span < n * ops.len(), which fits memory
            let shift = |id: u64| base + dense.get(&id).copied().unwrap_or(0);
            let mut live = std::collections::BTreeMap::new();
            for op in &self.ops {
                ops.push(match *op {
                    Op::Alloc { id, size, stream } => {
                        live.insert(id, shift(id));
                        Op::Alloc {
                            id: shift(id),
                            size,
                            stream,
                        }
                    }
                    Op::Free { id } => {
                        live.remove(&id);
                        Op::Free { id: shift(id) }
                    }
                    Op::Record { id, stream } => Op::Record {
                        id: shift(id),
                        stream,
                    },
                    Op::Sync { stream } => Op::Sync { stream },
                });
            }
            ops.extend(live.into_values().map(|id| Op::Free { id }));
        }
        Trace {
            name: if n == 1 {
                self.name.clone()
            } else {
                format!("{} x{n}", self.name)
            },
            ops,
        }
    }

    /// The least any allocator must hold without making streams wait for each other:
    /// the largest sum of live requested bytes plus bytes freed but still in use on a
    /// stream they were recorded on (that stream had work queued after the `r` and has
    /// not reached its next `s`). Saturates at `u64::MAX`.
    pub fn pending_floor(&self) -> u64 {
        let mut live: HashMap<u64, (u64, Vec<u32>)> = HashMap::default();
        // Freed blocks waiting for streams: id -> (size, streams still to complete).
        let mut pending: HashMap<u64, (u64, Vec<u32>)> = HashMap::default();
        let mut busy: HashSet<u32> = HashSet::default();
        let (mut cur, mut held, mut floor) = (0u64, 0u64, 0u64);
        for op in &self.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    live.insert(id, (size, Vec::new()));
                    cur = cur.saturating_add(size);
                }
                Op::Record { id, stream } => {
                    if let Some((_, uses)) = live.get_mut(&id) {
                        uses.push(stream);
                    }
                    busy.insert(stream);
                }
                Op::Free { id } => {
                    if let Some((size, mut uses)) = live.remove(&id) {
                        cur = cur.saturating_sub(size);
                        uses.retain(|s| busy.contains(s));
                        if !uses.is_empty() {
                            held = held.saturating_add(size);
                            pending.insert(id, (size, uses));
                        }
                    }
                }
                Op::Sync { stream } => {
                    busy.remove(&stream);
                    pending.retain(|_, (size, uses)| {
                        uses.retain(|s| *s != stream);
                        if uses.is_empty() {
                            held = held.saturating_sub(*size);
                        }
                        !uses.is_empty()
                    });
                }
            }
            floor = floor.max(cur.saturating_add(held));
        }
        floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_frees_leftovers_and_renumbers() {
        let t = parse("a 0 100 0\na 1 50 0\nf 0\n", "x").unwrap();
        let r = t.repeated(3);
        assert_eq!(r.ops.len(), 3 * 4);
        // Each repetition ends with its leftover freed, so live bytes never accumulate.
        assert_eq!(r.peak_requested(), t.peak_requested());
        assert_eq!(r.ops[3], Op::Free { id: 1 });
        assert_eq!(
            r.ops[4],
            Op::Alloc {
                id: 2,
                size: 100,
                stream: 0
            }
        );
        assert_eq!(r.ops[11], Op::Free { id: 5 });
        assert_eq!(t.repeated(1).ops, t.ops);
    }

    #[test]
    fn huge_sizes_and_ids_neither_panic_nor_wrap() {
        // 16 live allocations of 2^60 bytes reach 2^64: refused on the line that does it.
        let text: String = (0..17)
            .map(|i| format!("a {i} {} 0\n", 1u64 << 60))
            .collect();
        let e = parse(&text, "big.trace").unwrap_err();
        assert_eq!(e.line, 16, "{e}");
        assert!(e.message.contains("live total"), "{e}");
        // Freed in between, they are fine.
        let text: String = (0..17)
            .map(|i| format!("a {i} {} 0\nf {i}\n", 1u64 << 60))
            .collect();
        assert_eq!(parse(&text, "x").unwrap().peak_requested(), 1 << 60);
        // Live plus pending bytes past 2^64 saturate instead of wrapping.
        let t = parse(
            "a 0 9223372036854775808 0\nr 0 1\nf 0\na 1 9223372036854775808 0\n",
            "x",
        );
        assert_eq!(t.unwrap().pending_floor(), u64::MAX);
        // A trace built by hand (not parsed) saturates too.
        let t = Trace {
            name: "hand".into(),
            ops: (0..17)
                .map(|id| Op::Alloc {
                    id,
                    size: 1 << 60,
                    stream: 0,
                })
                .collect(),
        };
        assert_eq!(t.peak_requested(), u64::MAX);
        assert_eq!(t.pending_floor(), u64::MAX);
        // The largest id repeats into distinct ids.
        let t = parse(&format!("a {} 5 0\na 3 7 0\nf 3\n", u64::MAX), "x").unwrap();
        let r = t.repeated(3);
        let ids: std::collections::HashSet<u64> = r.allocations().map(|(id, _, _)| id).collect();
        assert_eq!(ids.len(), 6);
        let mut out = Vec::new();
        r.write_to(&mut out).unwrap();
        parse(std::str::from_utf8(&out).unwrap(), "again").unwrap();
    }

    #[test]
    fn pending_floor_counts_frees_awaiting_their_streams() {
        // id 0 is freed while stream 1 still has work after its record: it is held
        // until `s 1`, while id 1 is live.
        let t = parse("a 0 100 0\nr 0 1\nf 0\na 1 50 0\ns 1\na 2 60 0\n", "x").unwrap();
        assert_eq!(t.peak_requested(), 110);
        assert_eq!(t.pending_floor(), 150);
        // A record on a stream that already completed holds nothing.
        let t = parse("a 0 100 0\nr 0 1\ns 1\nf 0\na 1 50 0\n", "x").unwrap();
        assert_eq!(t.pending_floor(), 100);
    }

    #[test]
    fn parses_and_round_trips() {
        let text = "# npualloc-trace v1\na 0 100 0\nr 0 1 # comment\na 1 7 1\nf 0\ns 1\nf 1\n";
        let t = parse(text, "x.trace").unwrap();
        assert_eq!(t.ops.len(), 6);
        assert_eq!(t.ops[1], Op::Record { id: 0, stream: 1 });
        assert_eq!(t.peak_requested(), 107);
        let mut out = Vec::new();
        t.write_to(&mut out).unwrap();
        let again = parse(std::str::from_utf8(&out).unwrap(), "x.trace").unwrap();
        assert_eq!(again.ops, t.ops);
    }

    #[test]
    fn malformed_lines_name_file_line_and_expectation() {
        for (text, line, needle) in [
            ("a 0 100", 1, "missing stream"),
            ("a 0 -5 0", 1, "negative"),
            ("x 1", 1, "unknown operation 'x'"),
            ("a 0 1 0\na 0 2 0", 2, "duplicate allocation id 0"),
            ("f 3", 1, "unknown id 3"),
            ("a 0 1 0\nf 0\nr 0 1", 3, "already freed"),
            ("a 0 1 0\nf 0\nf 0", 3, "already freed"),
            ("a 0 1 0 9", 1, "unexpected '9'"),
            ("a zero 1 0", 1, "not a non-negative integer"),
            ("a 0 1 1.5", 1, "not a non-negative integer"),
            // Integers that do not fit say so, with the limit.
            (
                "a 0 1 4294967296",
                1,
                "stream '4294967296' is too large (at most 4294967295)",
            ),
            ("s 99999999999", 1, "too large (at most 4294967295)"),
            (
                "a 0 18446744073709551616 0",
                1,
                "size in bytes '18446744073709551616' is too large (at most 18446744073709551615)",
            ),
        ] {
            let e = parse(text, "bad.trace").unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(
                e.to_string().starts_with(&format!("bad.trace:{line}: ")),
                "{e}"
            );
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn errors_repeat_at_most_a_few_dozen_characters_of_a_line() {
        assert_eq!(clip("short"), "short");
        let exact = "é".repeat(ECHO);
        assert_eq!(clip(&exact), exact);
        let long = format!("{}{}", "x".repeat(ECHO), "é".repeat(1000));
        assert_eq!(clip(&long), format!("{}... (2040 bytes)", "x".repeat(ECHO)));
        for text in [
            format!("{{\"device_traces\":{}}}", "[".repeat(100_000)),
            format!("a 0 {} 0", "1".repeat(100_000)),
            format!("a 0 1 0 {}", "z".repeat(100_000)),
            format!("a {} 1 0", "-".repeat(100_000)),
        ] {
            let e = parse(&text, "bad.trace").unwrap_err().to_string();
            assert!(
                e.len() < 250,
                "{} bytes: {}",
                e.len(),
                &e[..300.min(e.len())]
            );
            assert!(e.contains("(100"), "{e}");
        }
    }

    /// The byte-loop line cutter agrees with `str::lines` on every kind of line end
    /// (a `\r` kept where no `\n` follows it, no line after a final `\n`).
    #[test]
    fn lines_cut_as_str_lines() {
        for text in [
            "",
            "\n",
            "\n\n",
            "a",
            "a\n",
            "a\r\n",
            "a\r",
            "a\rb\n",
            "\r\n\r\n",
            "a\n\nb",
            "a 1 2 0\r\nf 1",
            "é\n\u{a0}x\r\n",
        ] {
            let ours: Vec<&str> = lines(text).collect();
            let std: Vec<&str> = text.lines().collect();
            assert_eq!(ours, std, "{text:?}");
        }
    }

    /// The digit fast path returns what the checked parse does, and leaves every
    /// error (too many digits, too large for the type, signs, empty) to its wording.
    #[test]
    fn numbers_fast_path_agrees_with_the_checked_parse() {
        assert_eq!(num::<u64>(Some("007"), "x"), Ok(7));
        assert_eq!(
            num::<u64>(Some("9999999999999999999"), "x"),
            Ok(9_999_999_999_999_999_999)
        );
        assert_eq!(num::<u64>(Some("18446744073709551615"), "x"), Ok(u64::MAX));
        assert!(num::<u64>(Some("18446744073709551616"), "x")
            .unwrap_err()
            .contains("too large"));
        assert!(num::<u32>(Some("4294967296"), "s")
            .unwrap_err()
            .contains("at most 4294967295"));
        assert!(num::<u64>(Some("+5"), "x")
            .unwrap_err()
            .contains("not a non-negative"));
        assert!(num::<u64>(Some("-5"), "x")
            .unwrap_err()
            .contains("negative"));
        assert!(num::<u64>(Some(""), "x").is_err());
        assert!(num::<u64>(None, "x").unwrap_err().contains("missing"));
        assert!(digits("12a").is_none() && digits("").is_none());
    }
}
