//! The pickle machine: runs a pickle's opcodes (protocols 0 to 5) and
//! builds the values into an arena.
//!
//! Every value is a [`Node`] in one vector, and containers hold the
//! indices of their items, so a value the pickle fetches from its memo
//! twice is one node reached twice, never a copy, and nothing walks the
//! values recursively: a pickle nested a million deep, or whose shared
//! values would expand to more than memory holds as a tree, costs no
//! more than its length (each opcode adds at most one node or one index).
//! What the caller reads it reads by following the indices it wants.
//!
//! Objects (`GLOBAL`, `REDUCE`, `NEWOBJ`, `BUILD`, extensions) are not
//! constructed: each is an [`Node::Opaque`] value, and items added to one
//! are dropped. Persistent ids and out-of-band buffers are errors.

use std::collections::HashMap;

/// A value's index in the arena.
pub(super) type Id = usize;

/// A value of the pickle.
#[derive(Debug, PartialEq)]
pub(super) enum Node {
    None,
    Bool(bool),
    /// An integer of up to 127 bits and a sign.
    Int(i128),
    /// An integer too large for [`Node::Int`].
    BigInt,
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    /// Keys and values in the order the pickle set them (a later key
    /// replaces an equal earlier one when read: see `Value::get`).
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    /// An object the machine does not construct.
    Opaque,
}

/// A pickle run to its `STOP`: the values and the one it stopped on.
pub(super) struct Unpickled {
    nodes: Vec<Node>,
    root: Id,
}

impl Unpickled {
    /// The value the pickle stopped on.
    pub(super) fn root(&self) -> Id {
        self.root
    }

    /// The value at `id`.
    pub(super) fn node(&self, id: Id) -> &Node {
        &self.nodes[id]
    }

    /// The value of `key` in the dict `dict`: the last one set, as Python
    /// keeps it. A key matches as a `str` or as `bytes`.
    pub(super) fn get(&self, dict: &[(Id, Id)], key: &str) -> Option<Id> {
        dict.iter().rev().find_map(|&(k, v)| {
            let hit = match self.node(k) {
                Node::Str(s) => s == key,
                Node::Bytes(b) => b == key.as_bytes(),
                _ => false,
            };
            hit.then_some(v)
        })
    }
}

/// Runs `input` to its `STOP`. The error says what was wrong and at which
/// byte.
pub(super) fn unpickle(input: &[u8]) -> Result<Unpickled, String> {
    let mut m = Machine {
        input,
        at: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        let start = m.at;
        let Some(&op) = input.get(start) else {
            return Err(format!("the pickle ends before its STOP (at byte {start})"));
        };
        m.at += 1;
        match m.step(op) {
            Ok(Some(root)) => {
                return Ok(Unpickled {
                    nodes: m.nodes,
                    root,
                });
            }
            Ok(None) => {}
            Err(e) => return Err(format!("{e} (opcode {op:#04x} at byte {start})")),
        }
    }
}

struct Machine<'a> {
    input: &'a [u8],
    at: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    /// The stack's length at each `MARK` still open.
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl<'a> Machine<'a> {
    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let rest = &self.input[self.at..];
        if n > rest.len() {
            return Err(if self.at == self.input.len() {
                "the pickle ends before its STOP".to_string()
            } else {
                format!("{n} bytes wanted, {} left", rest.len())
            });
        }
        self.at += n;
        Ok(&rest[..n])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<usize, String> {
        Ok(usize::from(self.take(1)?[0]))
    }

    fn u16(&mut self) -> Result<usize, String> {
        Ok(usize::from(u16::from_le_bytes(self.array()?)))
    }

    fn u32(&mut self) -> Result<usize, String> {
        usize::try_from(u32::from_le_bytes(self.array()?)).map_err(|e| e.to_string())
    }

    fn u64(&mut self) -> Result<usize, String> {
        usize::try_from(u64::from_le_bytes(self.array()?)).map_err(|e| e.to_string())
    }

    /// A signed 4-byte length (`BINSTRING`, `LONG4`).
    fn i32_len(&mut self) -> Result<usize, String> {
        let n = i32::from_le_bytes(self.array()?);
        usize::try_from(n).map_err(|_| format!("negative length {n}"))
    }

    /// A text argument: the bytes up to the next newline.
    fn line(&mut self) -> Result<&'a [u8], String> {
        let rest = &self.input[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("an argument without its newline")?;
        self.at += end + 1;
        Ok(&rest[..end])
    }

    fn push(&mut self, node: Node) {
        self.stack.push(self.nodes.len());
        self.nodes.push(node);
    }

    fn pop(&mut self) -> Result<Id, String> {
        let base = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= base {
            return Err("the stack is empty".into());
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> Result<Id, String> {
        let base = self.marks.last().copied().unwrap_or(0);
        match self.stack.last() {
            Some(&id) if self.stack.len() > base => Ok(id),
            _ => Err("the stack is empty".into()),
        }
    }

    /// The items above the last mark, which is closed.
    fn pop_mark(&mut self) -> Result<Vec<Id>, String> {
        let base = self.marks.pop().ok_or("no mark")?;
        Ok(self.stack.split_off(base))
    }

    /// The memo key that follows a `PUT` or `GET` opcode `op`, in its
    /// encoding.
    fn memo_key(&mut self, op: u8) -> Result<u64, String> {
        match op {
            b'p' | b'g' => {
                u64::try_from(text_int(self.line()?)?).map_err(|_| "a negative memo key".into())
            }
            b'q' | b'h' => Ok(self.u8()? as u64),
            _ => Ok(self.u32()? as u64),
        }
    }

    fn memo_get(&mut self, key: u64) -> Result<(), String> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo {key} was never set"))?;
        self.stack.push(id);
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Result<(), String> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    /// Adds `items` to the list or set on top of the stack (dropped when
    /// it is an object).
    fn extend(&mut self, items: Vec<Id>) -> Result<(), String> {
        let target = self.top()?;
        match &mut self.nodes[target] {
            Node::List(v) | Node::Set(v) => v.extend(items),
            Node::Opaque => {}
            other => return Err(format!("items added to {}", kind(other))),
        }
        Ok(())
    }

    /// Sets `pairs` (keys and values, alternating) in the dict on top of
    /// the stack (dropped when it is an object).
    fn set_items(&mut self, pairs: Vec<Id>) -> Result<(), String> {
        if pairs.len() % 2 != 0 {
            return Err("a key without its value".into());
        }
        let target = self.top()?;
        match &mut self.nodes[target] {
            Node::Dict(d) => d.extend(pairs.chunks_exact(2).map(|p| (p[0], p[1]))),
            Node::Opaque => {}
            other => return Err(format!("items set in {}", kind(other))),
        }
        Ok(())
    }

    /// Pops `n` values (what an object's construction consumes) and
    /// pushes the object.
    fn object(&mut self, n: usize) -> Result<(), String> {
        for _ in 0..n {
            self.pop()?;
        }
        self.push(Node::Opaque);
        Ok(())
    }

    /// Runs one opcode: `Some` with the result at `STOP`.
    fn step(&mut self, op: u8) -> Result<Option<Id>, String> {
        match op {
            // PROTO, FRAME (a hint for buffering: nothing to do)
            0x80 => {
                let v = self.u8()?;
                if v > 5 {
                    return Err(format!("protocol {v} (this reader knows 0 to 5)"));
                }
            }
            0x95 => {
                self.take(8)?;
            }
            b'.' => {
                let root = self.pop()?;
                return Ok(Some(root));
            }
            // The stack.
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.top().is_ok() {
                    self.pop()?;
                } else {
                    self.pop_mark()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let id = self.top()?;
                self.stack.push(id);
            }
            // The memo: a key as text (`PUT`, `GET`), in one byte
            // (`BINPUT`, `BINGET`) or in four (`LONG_BINPUT`, `LONG_BINGET`).
            b'p' | b'q' | b'r' => {
                let key = self.memo_key(op)?;
                self.memo_put(key)?;
            }
            b'g' | b'h' | b'j' => {
                let key = self.memo_key(op)?;
                self.memo_get(key)?;
            }
            0x94 => {
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            // Constants and numbers.
            b'N' => self.push(Node::None),
            0x88 => self.push(Node::Bool(true)),
            0x89 => self.push(Node::Bool(false)),
            b'K' => {
                let v = self.u8()?;
                self.push(Node::Int(v as i128));
            }
            b'M' => {
                let v = self.u16()?;
                self.push(Node::Int(v as i128));
            }
            b'J' => {
                let v = i32::from_le_bytes(self.array()?);
                self.push(Node::Int(i128::from(v)));
            }
            0x8a => {
                let n = self.u8()?;
                let bytes = self.take(n)?;
                self.push(long(bytes));
            }
            0x8b => {
                let n = self.i32_len()?;
                let bytes = self.take(n)?;
                self.push(long(bytes));
            }
            b'I' => {
                let text = self.line()?;
                let node = match text {
                    b"00" => Node::Bool(false),
                    b"01" => Node::Bool(true),
                    _ => int_node(text)?,
                };
                self.push(node);
            }
            b'L' => {
                let text = self.line()?;
                let text = text.strip_suffix(b"L").unwrap_or(text);
                let node = int_node(text)?;
                self.push(node);
            }
            b'G' => {
                let v = f64::from_be_bytes(self.array()?);
                self.push(Node::Float(v));
            }
            b'F' => {
                let text = self.line()?;
                let v = std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .ok_or("a FLOAT that is not a number")?;
                self.push(Node::Float(v));
            }
            // Strings and bytes.
            b'X' => {
                let n = self.u32()?;
                self.unicode(n)?;
            }
            0x8c => {
                let n = self.u8()?;
                self.unicode(n)?;
            }
            0x8d => {
                let n = self.u64()?;
                self.unicode(n)?;
            }
            b'T' => {
                let n = self.i32_len()?;
                self.bytes(n)?;
            }
            b'U' | b'C' => {
                let n = self.u8()?;
                self.bytes(n)?;
            }
            b'B' => {
                let n = self.u32()?;
                self.bytes(n)?;
            }
            0x8e | 0x96 => {
                let n = self.u64()?;
                self.bytes(n)?;
            }
            // Protocol 0's quoted and escaped strings: read when they
            // hold no escape, an object otherwise.
            b'S' => {
                let text = self.line()?;
                let node = match text {
                    [q @ (b'\'' | b'"'), inner @ .., last]
                        if last == q && !inner.contains(&b'\\') =>
                    {
                        Node::Bytes(inner.to_vec())
                    }
                    _ => Node::Opaque,
                };
                self.push(node);
            }
            b'V' => {
                let text = self.line()?;
                let node = match std::str::from_utf8(text) {
                    Ok(s) if !s.contains('\\') => Node::Str(s.to_string()),
                    _ => Node::Opaque,
                };
                self.push(node);
            }
            // Containers.
            b']' => self.push(Node::List(Vec::new())),
            b'}' => self.push(Node::Dict(Vec::new())),
            b')' => self.push(Node::Tuple(Vec::new())),
            0x8f => self.push(Node::Set(Vec::new())),
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Node::List(items));
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items));
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Node::Set(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Node::Tuple(items));
            }
            b'd' => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err("a key without its value".into());
                }
                let pairs = items.chunks_exact(2).map(|p| (p[0], p[1])).collect();
                self.push(Node::Dict(pairs));
            }
            b'a' => {
                let item = self.pop()?;
                self.extend(vec![item])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                self.extend(items)?;
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![key, value])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            // Objects, not constructed.
            b'c' => {
                self.line()?;
                self.line()?;
                self.push(Node::Opaque);
            }
            0x93 => self.object(2)?,
            b'R' | 0x81 => self.object(2)?,
            0x92 => self.object(3)?,
            b'b' => {
                self.pop()?;
                self.top()?;
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.pop_mark()?;
                self.push(Node::Opaque);
            }
            b'o' => {
                let items = self.pop_mark()?;
                if items.is_empty() {
                    return Err("OBJ without a class".into());
                }
                self.push(Node::Opaque);
            }
            0x82 => {
                self.take(1)?;
                self.push(Node::Opaque);
            }
            0x83 => {
                self.take(2)?;
                self.push(Node::Opaque);
            }
            0x84 => {
                self.take(4)?;
                self.push(Node::Opaque);
            }
            0x98 => {
                self.top()?;
            }
            b'P' | b'Q' => return Err("persistent ids are not supported".into()),
            0x97 => return Err("out-of-band buffers are not supported".into()),
            _ => return Err("an unknown opcode".into()),
        }
        Ok(None)
    }

    fn unicode(&mut self, n: usize) -> Result<(), String> {
        // Python writes lone surrogates as they are (`surrogatepass`):
        // replaced here, as no snapshot key or action holds one.
        let s = String::from_utf8_lossy(self.take(n)?).into_owned();
        self.push(Node::Str(s));
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> Result<(), String> {
        let b = self.take(n)?.to_vec();
        self.push(Node::Bytes(b));
        Ok(())
    }
}

/// What a value is, for an error.
fn kind(node: &Node) -> &'static str {
    match node {
        Node::None => "None",
        Node::Bool(_) => "a bool",
        Node::Int(_) | Node::BigInt => "an int",
        Node::Float(_) => "a float",
        Node::Str(_) => "a str",
        Node::Bytes(_) => "bytes",
        Node::List(_) => "a list",
        Node::Tuple(_) => "a tuple",
        Node::Dict(_) => "a dict",
        Node::Set(_) => "a set",
        Node::Opaque => "an object",
    }
}

/// A little-endian two's complement integer (`LONG1`, `LONG4`).
fn long(bytes: &[u8]) -> Node {
    if bytes.is_empty() {
        return Node::Int(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    // Bytes beyond the sixteenth that only extend the sign change nothing.
    let (low, high) = bytes.split_at(bytes.len().min(16));
    if high.iter().any(|&b| b != fill) {
        return Node::BigInt;
    }
    let mut v = [fill; 16];
    v[..low.len()].copy_from_slice(low);
    let x = i128::from_le_bytes(v);
    if (x < 0) != negative {
        return Node::BigInt;
    }
    Node::Int(x)
}

/// A decimal integer of a text opcode.
fn text_int(text: &[u8]) -> Result<i128, String> {
    match int_node(text)? {
        Node::Int(x) => Ok(x),
        _ => Err("an integer out of range".into()),
    }
}

/// A decimal integer of a text opcode, [`Node::BigInt`] when too large.
fn int_node(text: &[u8]) -> Result<Node, String> {
    let t = std::str::from_utf8(text)
        .map_err(|_| "an integer that is not text")?
        .trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{t:?} is not an integer"));
    }
    Ok(t.parse::<i128>().map_or(Node::BigInt, Node::Int))
}

// Compiled out under Miri, as the other trace tests are: the machine has
// no unsafe code, and a million-deep nesting would take Miri the better
// part of an hour to re-check safe logic.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    fn root(p: &[u8]) -> (Unpickled, Id) {
        let u = unpickle(p).unwrap();
        let r = u.root();
        (u, r)
    }

    #[test]
    fn longs_keep_their_sign_up_to_127_bits() {
        assert_eq!(long(&[]), Node::Int(0));
        assert_eq!(long(&[0xff]), Node::Int(-1));
        assert_eq!(long(&[0x00, 0x80]), Node::Int(-32768));
        // 2^64 - 1, as Python writes it: nine bytes, the last a sign byte.
        assert_eq!(
            long(&[0xff; 8].iter().copied().chain([0]).collect::<Vec<_>>()),
            Node::Int(u64::MAX.into())
        );
        assert_eq!(long(&[0; 17]), Node::Int(0));
        let mut big = [0u8; 17];
        big[16] = 1;
        assert_eq!(long(&big), Node::BigInt);
        let mut top = [0u8; 16];
        top[15] = 0x80; // -2^127 fits; 2^127 (a 17th byte of 0) does not
        assert_eq!(long(&top), Node::Int(i128::MIN));
        let mut over = [0u8; 17];
        over[15] = 0x80;
        assert_eq!(long(&over), Node::BigInt);
    }

    #[test]
    fn text_opcodes_read_as_python_reads_them() {
        // pickle.dumps([1, True, -7, 2**70, 'ab', 1.5], protocol=0)
        let p = b"(lp0\nI1\naI01\naI-7\naL1180591620717411303424L\naVab\np1\naF1.5\na.";
        let (u, r) = root(p);
        let Node::List(items) = u.node(r) else {
            panic!("{:?}", u.node(r))
        };
        let got: Vec<&Node> = items.iter().map(|&i| u.node(i)).collect();
        assert_eq!(
            got,
            [
                &Node::Int(1),
                &Node::Bool(true),
                &Node::Int(-7),
                &Node::Int(1 << 70),
                &Node::Str("ab".into()),
                &Node::Float(1.5)
            ]
        );
    }

    #[test]
    fn a_value_fetched_twice_is_one_node() {
        // x = [1]; pickle.dumps([x, x], protocol=2)
        let p = b"\x80\x02]q\x00(]q\x01K\x01ah\x01e.";
        let (u, r) = root(p);
        let Node::List(items) = u.node(r) else {
            panic!()
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
    }

    #[test]
    fn nesting_and_sharing_cost_no_recursion_and_no_copies() {
        // A list nested a million deep: one node a level, no recursion.
        let n = 1_000_000;
        let mut p = b"\x80\x02".to_vec();
        p.extend(std::iter::repeat_n(b']', n));
        p.extend(std::iter::repeat_n(b'a', n - 1));
        p.push(b'.');
        let u = unpickle(&p).unwrap();
        assert_eq!(u.nodes.len(), n);
        // Each list holds the one before twice (2^60 leaves as a tree):
        // one node and two indices a level.
        let mut q = b"\x80\x02]\x94".to_vec();
        for i in 0..60u32 {
            q.extend(b"](j");
            q.extend(i.to_le_bytes());
            q.extend(b"j");
            q.extend(i.to_le_bytes());
            q.extend(b"e\x94");
        }
        q.push(b'.');
        let u = unpickle(&q).unwrap();
        assert_eq!(u.nodes.len(), 61);
        let Node::List(items) = u.node(u.root()) else {
            panic!()
        };
        assert_eq!(items, &[59, 59]);
    }

    #[test]
    fn bad_pickles_are_errors_that_name_the_byte() {
        for (p, what) in [
            (&b""[..], "ends before its STOP"),
            (b"\x80\x02", "ends before its STOP"),
            (b"\x80\x09.", "protocol 9"),
            (b"\x80\x02.", "the stack is empty"),
            (b"\x80\x02h\x05.", "memo 5 was never set"),
            (b"\x80\x02X\xff\xff\xff\x7fab.", "bytes wanted"),
            (b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff.", "wanted"),
            (b"\x80\x02K\x01K\x02s.", "the stack is empty"),
            (b"\x80\x02K\x01K\x02K\x03s.", "items set in an int"),
            (b"\x80\x02K\x01K\x02a.", "items added to an int"),
            (b"\x80\x02(K\x01d.", "a key without its value"),
            (b"\x80\x02e.", "no mark"),
            (b"\x80\x02\xff.", "an unknown opcode"),
            (b"\x80\x02Q.", "persistent ids"),
            (b"\x80\x02I12x\n.", "is not an integer"),
            (b"\x80\x02T\xff\xff\xff\xff.", "negative length"),
        ] {
            let e = unpickle(p).err().unwrap_or_else(|| panic!("{p:?} read"));
            assert!(e.contains(what), "{p:?}: {e}");
            assert!(e.contains("at byte"), "{p:?}: {e}");
        }
    }

    #[test]
    fn objects_are_opaque_and_keep_the_stack_in_step() {
        // pickle.dumps([collections.OrderedDict([('a', 1)]), 7], protocol=2):
        // REDUCE, then SETITEM on the object, then an item after it.
        let p = b"\x80\x02]q\x00(ccollections\nOrderedDict\nq\x01)Rq\x02X\x01\x00\x00\x00aq\x03K\x01sK\x07e.";
        let (u, r) = root(p);
        let Node::List(items) = u.node(r) else {
            panic!()
        };
        assert_eq!(u.node(items[0]), &Node::Opaque);
        assert_eq!(u.node(items[1]), &Node::Int(7));
    }
}
