//! Stack frames of allocations, and how a text trace carries them.
//!
//! Frames ride in comment lines starting with `#@`, so a reader that knows nothing of
//! them (any earlier npualloc) reads the same events and ignores the rest:
//!
//! ```text
//! # npualloc-trace v1 source=run.pickle events=3
//! #@frame<TAB>0<TAB>12<TAB>forward<TAB>model.py      frame 0: line, function name, file
//! #@frame<TAB>1<TAB>40<TAB>step<TAB>train.py
//! #@stack<TAB>0<TAB>0 1                              stack 0: frames 0 then 1, innermost first
//! a 0 512 0 #@0                                      allocation 0 was made at stack 0
//! a 1 1024 1 #@0                                     so was allocation 1 (stacks are shared)
//! f 0
//! ```
//!
//! A `#@` line is a keyword and fields separated by single tabs. In a frame's name and
//! file, `\` is written `\\`, a tab `\t`, a newline `\n` and a carriage return `\r`
//! (nothing else is escaped; names hold spaces, colons and `#` freely). A stack's field
//! lists frame ids separated by spaces (empty: a stack with no frames). Frames and stacks
//! are declared before the first line that uses them; an `a` line names its stack with a
//! trailing `#@<stack id>`. Other `#@` keywords are reserved and ignored.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use super::{parse, Op, Trace, TraceError, HEADER};

/// One stack frame (`{'filename', 'line', 'name'}` in a PyTorch snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number (0 when absent).
    pub line: u64,
    /// Function name.
    pub name: String,
}

/// A stack, innermost frame first; allocations made at the same place share one.
pub type Stack = Arc<[Frame]>;

/// The stack of each allocation id that has one.
pub type Stacks = HashMap<u64, Stack>;

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match it.next() {
            Some('\\') => '\\',
            Some('t') => '\t',
            Some('n') => '\n',
            Some('r') => '\r',
            Some(o) => {
                return Err(format!(
                    "unknown escape '\\{o}' (expected \\\\, \\t, \\n or \\r)"
                ))
            }
            None => return Err("a lone '\\' at the end of a field".into()),
        });
    }
    Ok(out)
}

/// Writes `trace` in the text format with the stacks of its allocations as `#@` lines.
pub fn write_with_stacks(
    trace: &Trace,
    stacks: &Stacks,
    out: &mut impl Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{HEADER} source={} events={}",
        trace.name,
        trace.ops.len()
    )?;
    // Number frames and stacks in order of first use; a stack shared by pointer or
    // equal by value is written once.
    let mut frame_ids: HashMap<&Frame, usize> = HashMap::new();
    let mut stack_ids: HashMap<&[Frame], usize> = HashMap::new();
    let mut of_alloc: HashMap<u64, usize> = HashMap::new();
    let mut decl = String::new();
    for op in &trace.ops {
        let Op::Alloc { id, .. } = *op else { continue };
        let Some(stack) = stacks.get(&id) else {
            continue;
        };
        let n = stack_ids.len();
        let sid = *stack_ids.entry(&stack[..]).or_insert_with(|| {
            let mut ids = Vec::with_capacity(stack.len());
            for f in stack.iter() {
                let n = frame_ids.len();
                let fid = *frame_ids.entry(f).or_insert_with(|| {
                    decl.push_str(&format!(
                        "#@frame\t{n}\t{}\t{}\t{}\n",
                        f.line,
                        escape(&f.name),
                        escape(&f.filename)
                    ));
                    n
                });
                ids.push(fid.to_string());
            }
            decl.push_str(&format!("#@stack\t{n}\t{}\n", ids.join(" ")));
            n
        });
        of_alloc.insert(id, sid);
    }
    out.write_all(decl.as_bytes())?;
    for op in &trace.ops {
        match op {
            Op::Alloc { id, .. } if of_alloc.contains_key(id) => {
                writeln!(out, "{op} #@{}", of_alloc[id])?
            }
            _ => writeln!(out, "{op}")?,
        }
    }
    Ok(())
}

/// Parses a text trace and the stacks its `#@` lines attach to allocations (none for a
/// trace written without them).
pub fn parse_with_stacks(text: &str, name: &str) -> Result<(Trace, Stacks), TraceError> {
    let trace = parse(text, name)?;
    let stacks = read_stacks(text).map_err(|(line, message)| TraceError {
        file: name.to_owned(),
        line,
        message,
    })?;
    Ok((trace, stacks))
}

fn field<'a>(it: &mut impl Iterator<Item = &'a str>, what: &str) -> Result<&'a str, String> {
    it.next().ok_or_else(|| format!("missing {what}"))
}

fn number(s: &str, what: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("{what} '{}' is not a non-negative integer", super::clip(s)))
}

/// The `#@` declarations and attachments of a trace that [`parse`] accepted; errors
/// carry the 1-based line.
fn read_stacks(text: &str) -> Result<Stacks, (usize, String)> {
    let mut frames: HashMap<u64, Frame> = HashMap::new();
    let mut stacks: HashMap<u64, Stack> = HashMap::new();
    let mut of_alloc = Stacks::new();
    if !text.contains("#@") {
        return Ok(of_alloc); // no stacks declared or named: skip the second pass
    }
    for (i, line) in super::lines(text).enumerate() {
        let at = |m: String| (i + 1, m);
        if let Some(rest) = line.strip_prefix("#@") {
            let mut it = rest.split('\t');
            match it.next() {
                Some("frame") => {
                    let id =
                        number(field(&mut it, "frame id").map_err(at)?, "frame id").map_err(at)?;
                    let l = number(field(&mut it, "line").map_err(at)?, "line").map_err(at)?;
                    let name =
                        unescape(field(&mut it, "function name").map_err(at)?).map_err(at)?;
                    let filename =
                        unescape(field(&mut it, "file name").map_err(at)?).map_err(at)?;
                    if it.next().is_some() {
                        return Err(at(
                            "a frame has 4 tab-separated fields: id, line, name, file".into(),
                        ));
                    }
                    if frames
                        .insert(
                            id,
                            Frame {
                                filename,
                                line: l,
                                name,
                            },
                        )
                        .is_some()
                    {
                        return Err(at(format!("frame {id} declared twice")));
                    }
                }
                Some("stack") => {
                    let id =
                        number(field(&mut it, "stack id").map_err(at)?, "stack id").map_err(at)?;
                    let list = it.next().unwrap_or("");
                    let mut stack = Vec::new();
                    for f in list.split(' ').filter(|f| !f.is_empty()) {
                        let fid = number(f, "frame id").map_err(at)?;
                        let frame = frames.get(&fid).ok_or_else(|| {
                            at(format!(
                                "stack {id} uses frame {fid}, not declared before it"
                            ))
                        })?;
                        stack.push(frame.clone());
                    }
                    if stacks.insert(id, stack.into()).is_some() {
                        return Err(at(format!("stack {id} declared twice")));
                    }
                }
                _ => {} // reserved for later use
            }
            continue;
        }
        // An allocation naming its stack: `a <id> <bytes> <stream> #@<stack>`.
        let Some((event, comment)) = line.split_once('#') else {
            continue;
        };
        let Some(sid) = comment.strip_prefix('@') else {
            continue;
        };
        let mut toks = event.split_ascii_whitespace();
        if toks.next() != Some("a") {
            continue;
        }
        let sid = number(sid.trim(), "stack id").map_err(at)?;
        let stack = stacks
            .get(&sid)
            .ok_or_else(|| at(format!("stack {sid} is not declared before its first use")))?;
        // `parse` accepted the line, so the id is there and a number.
        let id = number(toks.next().unwrap_or(""), "allocation id").map_err(at)?;
        of_alloc.insert(id, stack.clone());
    }
    Ok(of_alloc)
}

/// `name (file:line)`: how a frame is shown.
pub fn show(f: &Frame) -> String {
    format!("{} ({}:{})", f.name, f.filename, f.line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, file: &str, line: u64) -> Frame {
        Frame {
            filename: file.into(),
            line,
            name: name.into(),
        }
    }

    #[test]
    fn stacks_round_trip_shared_and_escaped() {
        let t = parse("a 0 10 0\na 1 20 1\na 2 30 0\nf 0\na 3 5 0\n", "x").unwrap();
        let odd = frame("at::empty(c10::IntArrayRef, \\ #x)", "a\tb\nc.cpp", 7);
        let s1: Stack = vec![frame("forward", "model.py", 12), odd.clone()].into();
        let s2: Stack = vec![odd, frame("", "", 0)].into();
        let stacks = Stacks::from([(0, s1.clone()), (1, s1.clone()), (2, s2), (3, [].into())]);
        let mut out = Vec::new();
        write_with_stacks(&t, &stacks, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        // The shared stack and the shared frame are declared once.
        assert_eq!(text.matches("#@stack").count(), 3, "{text}");
        assert_eq!(text.matches("#@frame").count(), 3, "{text}");
        assert!(text.contains("a 1 20 1 #@0\n"), "{text}");
        // Old readers see the same events; the new one the same stacks.
        assert_eq!(parse(&text, "x").unwrap().ops, t.ops);
        let (again, back) = parse_with_stacks(&text, "x").unwrap();
        assert_eq!(again.ops, t.ops);
        assert_eq!(back, stacks);
        // A trace without `#@` lines has no stacks.
        assert!(parse_with_stacks("a 0 1 0\n", "x").unwrap().1.is_empty());
    }

    #[test]
    fn bad_frame_lines_name_the_line() {
        for (text, line, needle) in [
            ("#@frame\tx\t1\tf\tg\n", 1, "frame id 'x'"),
            ("#@frame\t0\t1\tf\n", 1, "missing file name"),
            ("#@frame\t0\t1\tf\\q\tg\n", 1, "unknown escape"),
            ("#@stack\t0\t3\n", 1, "frame 3, not declared"),
            ("a 0 1 0\na 1 1 0 #@4\n", 2, "stack 4 is not declared"),
            ("#@stack\t0\t\n#@stack\t0\t\n", 2, "declared twice"),
        ] {
            let e = parse_with_stacks(text, "f.trace").unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
        // Unknown `#@` keywords are reserved, not errors.
        assert!(parse_with_stacks("#@later\tx\na 0 1 0\n", "x").is_ok());
    }
}
