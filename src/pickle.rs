//! Writes a JSON value as a Python pickle, so a snapshot opens where PyTorch's tools
//! expect `torch.cuda.memory._dump_snapshot()` output (memory_viz, `pickle.load`).
//!
//! Protocol 2, the plain data opcodes only: `None`, booleans, integers (`BININT` when
//! they fit in 32 bits, else `LONG1`), floats (`BINFLOAT`), strings (`BINUNICODE`),
//! lists (`EMPTY_LIST MARK … APPENDS`) and dicts (`EMPTY_DICT MARK … SETITEMS`). No
//! memo, no globals: nothing in the output runs code when loaded.
//!
//! The encoder walks the value with an explicit stack, so the depth of the input
//! costs heap, not call stack.

use serde_json::Value;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';

/// One step of the walk: a value to write, or the opcode that closes a container.
enum Step<'a> {
    Value(&'a Value),
    Key(&'a str),
    Close(u8),
}

/// `value` as pickle bytes (protocol 2).
pub fn to_pickle(value: &Value) -> Vec<u8> {
    let mut out = vec![PROTO, 2];
    let mut todo = vec![Step::Value(value)];
    while let Some(step) = todo.pop() {
        match step {
            Step::Close(op) => out.push(op),
            Step::Key(k) => string(&mut out, k),
            Step::Value(v) => match v {
                Value::Null => out.push(NONE),
                Value::Bool(b) => out.push(if *b { NEWTRUE } else { NEWFALSE }),
                Value::Number(n) => number(&mut out, n),
                Value::String(s) => string(&mut out, s),
                Value::Array(items) => {
                    out.extend([EMPTY_LIST, MARK]);
                    todo.push(Step::Close(APPENDS));
                    todo.extend(items.iter().rev().map(Step::Value));
                }
                Value::Object(map) => {
                    out.extend([EMPTY_DICT, MARK]);
                    todo.push(Step::Close(SETITEMS));
                    for (k, v) in map.iter().rev() {
                        todo.push(Step::Value(v));
                        todo.push(Step::Key(k));
                    }
                }
            },
        }
    }
    out.push(STOP);
    out
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.push(BINUNICODE);
    // serde_json strings live in memory, so they are far below 4 GiB.
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
}

fn number(out: &mut Vec<u8>, n: &serde_json::Number) {
    if let Some(i) = n.as_i64() {
        integer(out, i128::from(i));
    } else if let Some(u) = n.as_u64() {
        integer(out, i128::from(u));
    } else {
        out.push(BINFLOAT);
        out.extend(n.as_f64().unwrap_or(f64::NAN).to_be_bytes());
    }
}

fn integer(out: &mut Vec<u8>, i: i128) {
    if let Ok(small) = i32::try_from(i) {
        out.push(BININT);
        out.extend(small.to_le_bytes());
        return;
    }
    // LONG1: little-endian two's complement, as few bytes as keep the sign.
    let bytes = i.to_le_bytes();
    let mut len = bytes.len();
    while len > 1 {
        let (last, prev) = (bytes[len - 1], bytes[len - 2]);
        let redundant = (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0);
        if !redundant {
            break;
        }
        len -= 1;
    }
    out.extend([LONG1, len as u8]);
    out.extend(&bytes[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_use_the_expected_opcodes() {
        assert_eq!(to_pickle(&json!(null)), [PROTO, 2, NONE, STOP]);
        assert_eq!(to_pickle(&json!(true)), [PROTO, 2, NEWTRUE, STOP]);
        assert_eq!(
            to_pickle(&json!(-2)),
            [PROTO, 2, BININT, 0xfe, 0xff, 0xff, 0xff, STOP]
        );
        // 2^32: five bytes, the top one 0x01.
        assert_eq!(
            to_pickle(&json!(1u64 << 32)),
            [PROTO, 2, LONG1, 5, 0, 0, 0, 0, 1, STOP]
        );
        // u64::MAX needs a ninth byte to stay positive.
        let max = to_pickle(&json!(u64::MAX));
        assert_eq!(&max[2..4], [LONG1, 9]);
        assert_eq!(max[12], 0);
        assert_eq!(
            to_pickle(&json!("é")),
            [PROTO, 2, BINUNICODE, 2, 0, 0, 0, 0xc3, 0xa9, STOP]
        );
    }

    #[test]
    fn containers_close_in_order() {
        let p = to_pickle(&json!({"a": [1, {}], "b": []}));
        let expect: Vec<u8> = [
            &[PROTO, 2, EMPTY_DICT, MARK, BINUNICODE, 1, 0, 0, 0, b'a'][..],
            &[
                EMPTY_LIST, MARK, BININT, 1, 0, 0, 0, EMPTY_DICT, MARK, SETITEMS, APPENDS,
            ],
            &[
                BINUNICODE, 1, 0, 0, 0, b'b', EMPTY_LIST, MARK, APPENDS, SETITEMS, STOP,
            ],
        ]
        .concat();
        assert_eq!(p, expect);
    }

    #[test]
    fn deep_values_do_not_recurse() {
        let mut v = json!(0);
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        let p = to_pickle(&v);
        assert_eq!(p.len(), 2 + 100_000 * 3 + 5 + 1);
        // serde_json's own drop of the value recurses: unwrap it by hand.
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }
}
