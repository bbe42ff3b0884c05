//! A small pickle reader for memory snapshots: an iterative pickle machine over the
//! opcodes CPython's `pickle` writes for plain data (protocols 2 to 5, and the simple
//! protocol-0 numbers), with shared references kept as shared nodes.
//!
//! Why not a crate: serde-pickle 1.2's value decoder counts memo references per opcode,
//! not per use, so a list or dict that two events share (torch's snapshots share frame
//! lists and frame dicts) fails as "recursive structure found"; and it decodes
//! recursively, so 2,000 nested lists overflow the stack.
//!
//! Here every object is a node in one arena and containers hold node ids, so a memo
//! reference is just the same id again and nothing is copied. Nothing is run: a class
//! (`GLOBAL`) and its construction (`REDUCE`, `NEWOBJ`) become inert nodes. Reading
//! never recurses and allocates at most a few nodes per input byte. After `STOP` the
//! value reachable from the root is checked to be acyclic and at most [`MAX_DEPTH`]
//! deep, so any code that walks it recursively is safe.

use std::collections::HashMap;
use std::fmt;

/// Deepest nesting of containers accepted (a memory snapshot is about 7 deep).
pub const MAX_DEPTH: usize = 256;

/// Index of a node in [`Pickle`]'s arena.
pub type NodeId = usize;

/// One unpickled object; containers refer to their items by [`NodeId`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits 128 bits.
    Int(i128),
    /// An integer too large for 128 bits (its value is not kept).
    BigInt,
    /// A float.
    Float(f64),
    /// A text string (invalid UTF-8 replaced).
    Str(String),
    /// `bytes` or `bytearray`.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<NodeId>),
    /// A tuple.
    Tuple(Vec<NodeId>),
    /// A dict's entries in insertion order (key, value).
    Dict(Vec<(NodeId, NodeId)>),
    /// A set or frozenset.
    Set(Vec<NodeId>),
    /// A class or function reference (`module.name`); never imported or called.
    Global {
        /// Module name.
        module: String,
        /// Attribute name.
        name: String,
    },
    /// An object the pickle constructs (`REDUCE`, `NEWOBJ`), kept inert.
    Object {
        /// What would be called.
        class: NodeId,
        /// Its arguments.
        args: NodeId,
        /// State set by `BUILD`, if any.
        state: Option<NodeId>,
    },
}

/// Why a pickle could not be read, and the byte offset where it went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpickleError {
    /// Byte offset of the opcode (or of the end of input).
    pub pos: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for UnpickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.pos)
    }
}

impl std::error::Error for UnpickleError {}

/// An unpickled value: an arena of nodes and the root.
#[derive(Clone, Debug)]
pub struct Pickle {
    nodes: Vec<Value>,
    root: NodeId,
}

/// A node of a [`Pickle`], with accessors for walking it.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    pickle: &'a Pickle,
    id: NodeId,
}

impl Pickle {
    /// The top-level object.
    pub fn root(&self) -> Node<'_> {
        self.node(self.root)
    }

    /// The node with this id (ids come from this pickle's containers).
    pub fn node(&self, id: NodeId) -> Node<'_> {
        Node { pickle: self, id }
    }

    /// How many nodes the arena holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the arena is empty (never, for a pickle that was read).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The same tree built from JSON (what `pickle.load` would give for `json.load`'s
    /// value): null, booleans, integers, floats, strings, lists and dicts with string
    /// keys. Nothing is shared. `serde_json` refuses input nested deeper than 128, so
    /// the depth stays within [`MAX_DEPTH`].
    pub fn from_json(json: &serde_json::Value) -> Pickle {
        use serde_json::Value as J;
        // Each JSON value is given its node id on the way down, filled on the way up.
        let mut nodes = vec![Value::None];
        let mut todo: Vec<(NodeId, &serde_json::Value)> = vec![(0, json)];
        while let Some((id, v)) = todo.pop() {
            let mut child = |nodes: &mut Vec<Value>, v| {
                nodes.push(Value::None);
                todo.push((nodes.len() - 1, v));
                nodes.len() - 1
            };
            let value = match v {
                J::Null => Value::None,
                J::Bool(b) => Value::Bool(*b),
                J::Number(n) => match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => Value::Int(u.into()),
                    (None, Some(i)) => Value::Int(i.into()),
                    _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
                },
                J::String(s) => Value::Str(s.clone()),
                J::Array(items) => {
                    Value::List(items.iter().map(|v| child(&mut nodes, v)).collect())
                }
                J::Object(map) => Value::Dict(
                    map.iter()
                        .map(|(k, v)| {
                            nodes.push(Value::Str(k.clone()));
                            let key = nodes.len() - 1;
                            (key, child(&mut nodes, v))
                        })
                        .collect(),
                ),
            };
            nodes[id] = value;
        }
        Pickle { nodes, root: 0 }
    }
}

impl<'a> Node<'a> {
    /// This node's id: equal ids are the same (possibly shared) object.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The object.
    pub fn value(&self) -> &'a Value {
        &self.pickle.nodes[self.id]
    }

    /// A dict's value for a string key (the last one set wins, as in Python).
    pub fn get(&self, key: &str) -> Option<Node<'a>> {
        let Value::Dict(entries) = self.value() else {
            return None;
        };
        entries
            .iter()
            .rev()
            .find(|(k, _)| matches!(&self.pickle.nodes[*k], Value::Str(s) if s == key))
            .map(|&(_, v)| self.pickle.node(v))
    }

    /// A list's or tuple's items.
    pub fn items(&self) -> Option<impl ExactSizeIterator<Item = Node<'a>> + 'a> {
        let pickle = self.pickle;
        match self.value() {
            Value::List(v) | Value::Tuple(v) => Some(v.iter().map(move |&id| pickle.node(id))),
            _ => None,
        }
    }

    /// A string's text.
    pub fn as_str(&self) -> Option<&'a str> {
        match self.value() {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer that fits 64 bits.
    pub fn as_u64(&self) -> Option<u64> {
        match *self.value() {
            Value::Int(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }
}

fn child(nodes: &[Value], id: NodeId, i: usize) -> Option<NodeId> {
    match &nodes[id] {
        Value::List(v) | Value::Tuple(v) | Value::Set(v) => v.get(i).copied(),
        Value::Dict(e) => e.get(i / 2).map(|&(k, v)| if i % 2 == 0 { k } else { v }),
        Value::Object { class, args, state } => match i {
            0 => Some(*class),
            1 => Some(*args),
            2 => *state,
            _ => None,
        },
        _ => None,
    }
}

/// Checks that the value under `root` has no cycle and is at most [`MAX_DEPTH`] deep,
/// without recursion (shared nodes are visited once).
fn check_shape(nodes: &[Value], root: NodeId) -> Result<(), String> {
    const NEW: u8 = 0;
    const OPEN: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![NEW; nodes.len()];
    let mut height = vec![0usize; nodes.len()];
    // (node, next child, tallest child so far)
    let mut path: Vec<(NodeId, usize, usize)> = vec![(root, 0, 0)];
    state[root] = OPEN;
    while let Some(top) = path.last_mut() {
        let (id, i) = (top.0, top.1);
        if let Some(c) = child(nodes, id, i) {
            top.1 += 1;
            match state[c] {
                OPEN => return Err("a container contains itself (recursive structure)".into()),
                DONE => top.2 = top.2.max(height[c]),
                _ => {
                    if path.len() >= MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                    state[c] = OPEN;
                    path.push((c, 0, 0));
                }
            }
        } else {
            let h = top.2 + 1;
            height[id] = h;
            state[id] = DONE;
            path.pop();
            if let Some(parent) = path.last_mut() {
                parent.2 = parent.2.max(h);
            }
            if h + path.len() > MAX_DEPTH {
                return Err(format!("nested deeper than {MAX_DEPTH} levels"));
            }
        }
    }
    Ok(())
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    nodes: Vec<Value>,
    stack: Vec<NodeId>,
    marks: Vec<usize>,
    memo: HashMap<u64, NodeId>,
}

type Step<T> = Result<T, String>;

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        if n > self.data.len() - self.pos {
            return Err(format!(
                "truncated: needs {n} more bytes, {} left",
                self.data.len() - self.pos
            ));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn line(&mut self) -> Step<&'a str> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("truncated: a text argument has no end of line")?;
        self.pos += end + 1;
        std::str::from_utf8(&rest[..end]).map_err(|_| "a text argument is not UTF-8".into())
    }

    fn len_u32(&mut self) -> Step<usize> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }

    fn len_u64(&mut self) -> Step<usize> {
        usize::try_from(u64::from_le_bytes(self.array()?)).map_err(|_| "length too large".into())
    }

    fn push(&mut self, v: Value) {
        self.nodes.push(v);
        self.stack.push(self.nodes.len() - 1);
    }

    fn pop(&mut self) -> Step<NodeId> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err("stack underflow (pop past a MARK)".into());
        }
        self.stack.pop().ok_or_else(|| "stack underflow".into())
    }

    fn top(&self) -> Step<NodeId> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "stack underflow".into())
    }

    fn pop_mark(&mut self) -> Step<Vec<NodeId>> {
        let m = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(m))
    }

    fn text(&mut self, n: usize) -> Step<()> {
        let s = String::from_utf8_lossy(self.take(n)?).into_owned();
        self.push(Value::Str(s));
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> Step<()> {
        let b = self.take(n)?.to_vec();
        self.push(Value::Bytes(b));
        Ok(())
    }

    fn long(&mut self, n: usize) -> Step<()> {
        let b = self.take(n)?;
        let v = if b.len() > 16 {
            Value::BigInt
        } else {
            let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) {
                0xff
            } else {
                0
            };
            let mut le = [fill; 16];
            le[..b.len()].copy_from_slice(b);
            Value::Int(i128::from_le_bytes(le))
        };
        self.push(v);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Step<()> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo {key} was never stored"))?;
        self.stack.push(id);
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Step<()> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    fn extend_list(&mut self, items: Vec<NodeId>) -> Step<()> {
        let target = self.top()?;
        match &mut self.nodes[target] {
            Value::List(v) => v.extend(items),
            _ => return Err("APPEND(S) to something that is not a list".into()),
        }
        Ok(())
    }

    fn set_items(&mut self, items: Vec<NodeId>) -> Step<()> {
        if items.len() % 2 != 0 {
            return Err("SETITEMS with an odd number of items".into());
        }
        let target = self.top()?;
        match &mut self.nodes[target] {
            Value::Dict(e) => e.extend(items.chunks_exact(2).map(|p| (p[0], p[1]))),
            _ => return Err("SETITEM(S) on something that is not a dict".into()),
        }
        Ok(())
    }

    fn tuple(&mut self, n: usize) -> Step<()> {
        if self.stack.len() < n || self.marks.last().is_some_and(|&m| m > self.stack.len() - n) {
            return Err("stack underflow".into());
        }
        let items = self.stack.split_off(self.stack.len() - n);
        self.push(Value::Tuple(items));
        Ok(())
    }

    /// Runs one opcode; `Ok(true)` at `STOP`.
    fn step(&mut self, op: u8) -> Step<bool> {
        match op {
            b'.' => return Ok(true),
            0x80 => {
                let p = self.array::<1>()?[0];
                if p > 5 {
                    return Err(format!("pickle protocol {p} is newer than 5"));
                }
            }
            0x95 => {
                self.take(8)?; // FRAME: a length hint only
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let t = self.top()?;
                self.stack.push(t);
            }
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(self.array()?);
                self.push(Value::Int(v.into()));
            }
            b'K' => {
                let v = self.array::<1>()?[0];
                self.push(Value::Int(v.into()));
            }
            b'M' => {
                let v = u16::from_le_bytes(self.array()?);
                self.push(Value::Int(v.into()));
            }
            0x8a => {
                let n = self.array::<1>()?[0] as usize;
                self.long(n)?;
            }
            0x8b => {
                let n = i32::from_le_bytes(self.array()?);
                self.long(usize::try_from(n).map_err(|_| "LONG4 with a negative length")?)?;
            }
            b'I' => {
                let l = self.line()?;
                let v = match l {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    _ => Value::Int(
                        l.parse()
                            .map_err(|_| format!("INT '{l}' is not a number"))?,
                    ),
                };
                self.push(v);
            }
            b'L' => {
                let l = self.line()?;
                let n = l.strip_suffix('L').unwrap_or(l);
                self.push(n.parse().map_or(Value::BigInt, Value::Int));
            }
            b'F' => {
                let l = self.line()?;
                self.push(Value::Float(
                    l.parse()
                        .map_err(|_| format!("FLOAT '{l}' is not a number"))?,
                ));
            }
            b'G' => {
                let v = f64::from_be_bytes(self.array()?);
                self.push(Value::Float(v));
            }
            0x8c | b'U' => {
                let n = self.array::<1>()?[0] as usize;
                self.text(n)?;
            }
            b'X' | b'T' => {
                let n = self.len_u32()?;
                self.text(n)?;
            }
            0x8d => {
                let n = self.len_u64()?;
                self.text(n)?;
            }
            b'C' => {
                let n = self.array::<1>()?[0] as usize;
                self.bytes(n)?;
            }
            b'B' => {
                let n = self.len_u32()?;
                self.bytes(n)?;
            }
            0x8e | 0x96 => {
                let n = self.len_u64()?;
                self.bytes(n)?;
            }
            b']' => self.push(Value::List(Vec::new())),
            b'}' => self.push(Value::Dict(Vec::new())),
            b')' => self.push(Value::Tuple(Vec::new())),
            0x8f => self.push(Value::Set(Vec::new())),
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Value::List(items));
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Value::Tuple(items));
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Value::Set(items));
            }
            0x85 => self.tuple(1)?,
            0x86 => self.tuple(2)?,
            0x87 => self.tuple(3)?,
            b'd' => {
                let items = self.pop_mark()?;
                self.push(Value::Dict(Vec::new()));
                self.set_items(items)?;
            }
            b'a' => {
                let item = self.pop()?;
                self.extend_list(vec![item])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend_list(items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            0x90 => {
                let items = self.pop_mark()?;
                let target = self.top()?;
                match &mut self.nodes[target] {
                    Value::Set(v) => v.extend(items),
                    _ => return Err("ADDITEMS to something that is not a set".into()),
                }
            }
            b'p' => {
                let l = self.line()?;
                let key = l
                    .parse()
                    .map_err(|_| format!("PUT '{l}' is not an index"))?;
                self.memo_put(key)?;
            }
            b'q' => {
                let key = self.array::<1>()?[0].into();
                self.memo_put(key)?;
            }
            b'r' => {
                let key = u32::from_le_bytes(self.array()?).into();
                self.memo_put(key)?;
            }
            0x94 => {
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            b'g' => {
                let l = self.line()?;
                let key = l
                    .parse()
                    .map_err(|_| format!("GET '{l}' is not an index"))?;
                self.memo_get(key)?;
            }
            b'h' => {
                let key = self.array::<1>()?[0].into();
                self.memo_get(key)?;
            }
            b'j' => {
                let key = u32::from_le_bytes(self.array()?).into();
                self.memo_get(key)?;
            }
            b'c' => {
                let module = self.line()?.to_owned();
                let name = self.line()?.to_owned();
                self.push(Value::Global { module, name });
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (&self.nodes[module], &self.nodes[name]) {
                    (Value::Str(m), Value::Str(n)) => {
                        let (module, name) = (m.clone(), n.clone());
                        self.push(Value::Global { module, name });
                    }
                    _ => return Err("STACK_GLOBAL needs two strings".into()),
                }
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let class = self.pop()?;
                self.push(Value::Object {
                    class,
                    args,
                    state: None,
                });
            }
            0x92 => {
                self.pop()?; // keyword arguments
                let args = self.pop()?;
                let class = self.pop()?;
                self.push(Value::Object {
                    class,
                    args,
                    state: None,
                });
            }
            b'b' => {
                let s = self.pop()?;
                let target = self.top()?;
                if let Value::Object { state, .. } = &mut self.nodes[target] {
                    *state = Some(s);
                }
            }
            _ => {
                return Err(format!(
                    "unsupported pickle opcode 0x{op:02x} (a memory snapshot holds plain data)"
                ))
            }
        }
        Ok(false)
    }
}

/// Reads a pickle (bytes after its `STOP` are ignored, as CPython does).
pub fn read(data: &[u8]) -> Result<Pickle, UnpickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        let at = m.pos;
        let Some(&op) = data.get(at) else {
            return Err(UnpickleError {
                pos: at,
                message: "truncated: ended before the STOP opcode".into(),
            });
        };
        m.pos += 1;
        match m.step(op) {
            Ok(false) => {}
            Ok(true) => {
                let root = m
                    .pop()
                    .map_err(|message| UnpickleError { pos: at, message })?;
                check_shape(&m.nodes, root)
                    .map_err(|message| UnpickleError { pos: at, message })?;
                return Ok(Pickle {
                    nodes: m.nodes,
                    root,
                });
            }
            Err(message) => return Err(UnpickleError { pos: at, message }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_reads_as_the_pickle_of_the_same_value() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"a": [1, -2, 18446744073709551615, 1.5, null, true, "é"], "b": {"c": []}, "a": [7]}"#,
        )
        .unwrap();
        let p = Pickle::from_json(&json);
        let root = p.root();
        // serde_json keeps the last of a repeated key, as Python's json does.
        let a: Vec<_> = root
            .get("a")
            .unwrap()
            .items()
            .unwrap()
            .map(|n| n.value())
            .collect();
        assert_eq!(a, [&Value::Int(7)]);
        let json: serde_json::Value = serde_json::from_str(
            r#"[1, -2, 18446744073709551615, 1.5, null, true, "é", {"k": [3]}]"#,
        )
        .unwrap();
        let p = Pickle::from_json(&json);
        let items: Vec<_> = p.root().items().unwrap().collect();
        assert_eq!(items[0].as_u64(), Some(1));
        assert_eq!(items[1].value(), &Value::Int(-2));
        assert_eq!(items[1].as_u64(), None);
        assert_eq!(items[2].as_u64(), Some(u64::MAX));
        assert_eq!(items[3].value(), &Value::Float(1.5));
        assert_eq!(items[4].value(), &Value::None);
        assert_eq!(items[5].value(), &Value::Bool(true));
        assert_eq!(items[6].as_str(), Some("é"));
        let inner: Vec<_> = items[7].get("k").unwrap().items().unwrap().collect();
        assert_eq!(inner[0].as_u64(), Some(3));
        assert!(check_shape(&p.nodes, p.root).is_ok());
    }

    #[test]
    fn reads_scalars_and_containers() {
        // pickle.dumps({'a': [1, -2, 70000, 2**70, 1.5, None, True], 'b': (b'x', 'é')}, 4)
        let p = read(
            b"\x80\x04\x95>\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffJp\x11\x01\x00\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00@G?\xf8\x00\x00\x00\x00\x00\x00N\x88e\x8c\x01b\x94C\x01x\x94\x8c\x02\xc3\xa9\x94\x86\x94u.",
        )
        .unwrap();
        let a: Vec<_> = p
            .root()
            .get("a")
            .unwrap()
            .items()
            .unwrap()
            .map(|n| n.value().clone())
            .collect();
        assert_eq!(
            a,
            [
                Value::Int(1),
                Value::Int(-2),
                Value::Int(70000),
                Value::Int(1 << 70),
                Value::Float(1.5),
                Value::None,
                Value::Bool(true)
            ]
        );
        let b: Vec<_> = p.root().get("b").unwrap().items().unwrap().collect();
        assert_eq!(b[0].value(), &Value::Bytes(b"x".to_vec()));
        assert_eq!(b[1].as_str(), Some("é"));
        assert!(p.root().get("c").is_none());
    }

    #[test]
    fn shared_references_are_one_node() {
        // x = [1]; pickle.dumps([x, x], 2)
        let p = read(b"\x80\x02]q\x00(]q\x01K\x01ah\x01e.").unwrap();
        let items: Vec<_> = p.root().items().unwrap().collect();
        assert_eq!(items[0].id(), items[1].id());
        assert_eq!(items[0].items().unwrap().len(), 1);
    }

    #[test]
    fn cycles_depth_and_bad_input_are_errors() {
        // x = []; x.append(x); pickle.dumps(x, 2)
        let e = read(b"\x80\x02]q\x00h\x00a.").unwrap_err();
        assert!(e.message.contains("recursive"), "{e}");
        let mut deep = vec![0x80, 2];
        deep.extend(std::iter::repeat_n(b']', 2000));
        deep.extend(std::iter::repeat_n(b'a', 1999));
        deep.push(b'.');
        let e = read(&deep).unwrap_err();
        assert!(e.message.contains("deeper than"), "{e}");
        for (bad, needle) in [
            (&b""[..], "truncated"),
            (b"\x80\x02]q\x00", "truncated"),
            (b"\x80\x02X\xff\xff\xff\x7fab", "truncated"),
            (b"\x80\x02h\x05.", "memo 5"),
            (b"\x80\x02a.", "underflow"),
            (b"\x80\x02(.", "underflow"),
            (b"\x80\x02K\x01K\x01a.", "not a list"),
            (b"\x80\x02Q.", "unsupported"),
            (b"\x80\x09N.", "protocol 9"),
        ] {
            let e = read(bad).unwrap_err();
            assert!(e.message.contains(needle), "{bad:?}: {e}");
        }
    }
}
