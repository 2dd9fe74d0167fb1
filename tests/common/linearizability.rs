//! Linearizability checker for histories recorded by concurrent test clients against a
//! key-value register with put, get and compare-and-swap: the Wing & Gong search with
//! Lowe's memoization of (linearized set, model state), as in porcupine. Keys are
//! independent, so the history is split by key and each part is checked on its own.
//!
//! An operation whose outcome is unknown (error or timeout: a write may or may not have
//! happened) returns at +infinity and accepts any output; failed reads are dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys and values are bytes; `&str` and `String` convert into them.
pub type Bytes = Vec<u8>;

/// Return time of an operation that never returned (its outcome is unknown).
pub const NEVER: u64 = u64::MAX;

/// How long `check` searches before giving up with an "undecided" error.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(20);

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Write `value` under `key`.
    Put { key: Bytes, value: Bytes },
    /// Read `key`.
    Get { key: Bytes },
    /// Write `new` if the current value is `expected` (`None`: the key is absent).
    Cas {
        key: Bytes,
        expected: Option<Bytes>,
        new: Bytes,
    },
}

impl Input {
    /// `Put` from anything byte-like.
    pub fn put(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Input::Put {
            key: key.into(),
            value: value.into(),
        }
    }
    /// `Get` from anything byte-like.
    pub fn get(key: impl Into<Bytes>) -> Self {
        Input::Get { key: key.into() }
    }
    /// `Cas` from anything byte-like.
    pub fn cas(key: impl Into<Bytes>, expected: Option<&str>, new: impl Into<Bytes>) -> Self {
        let expected = expected.map(|e| e.as_bytes().to_vec());
        Input::Cas {
            key: key.into(),
            expected,
            new: new.into(),
        }
    }
    fn key(&self) -> &[u8] {
        match self {
            Input::Put { key, .. } | Input::Get { key } | Input::Cas { key, .. } => key,
        }
    }
}

/// What the client observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// A `Put` succeeded.
    Ok,
    /// A `Get` read this value (`None`: absent).
    Value(Option<Bytes>),
    /// A `Cas` succeeded (`true`) or found another value (`false`).
    Swapped(bool),
    /// Error or timeout: the operation may or may not have taken effect.
    Unknown,
}

impl Output {
    /// `Value(Some(..))` from anything byte-like.
    pub fn value(v: impl Into<Bytes>) -> Self {
        Output::Value(Some(v.into()))
    }
}

/// One recorded operation; times are nanoseconds since the history started.
#[derive(Clone, Debug)]
pub struct Operation {
    pub client: u64,
    pub input: Input,
    pub call: u64,
    /// `NEVER` when the outcome is unknown.
    pub ret: u64,
    pub output: Output,
}

/// Handle for an operation recorded by [`History::call`].
#[derive(Clone, Copy, Debug)]
pub struct OpId(usize);

/// Thread-safe recorder shared by all clients of a test.
#[derive(Clone)]
pub struct History {
    inner: Arc<Mutex<(Instant, Vec<Operation>)>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            inner: Arc::new(Mutex::new((Instant::now(), Vec::new()))),
        }
    }
    /// Records that `client` invokes `input` now. Until `ret` is called the outcome is unknown.
    pub fn call(&self, client: u64, input: Input) -> OpId {
        let mut g = self.inner.lock().unwrap();
        let call = g.0.elapsed().as_nanos() as u64;
        g.1.push(Operation {
            client,
            input,
            call,
            ret: NEVER,
            output: Output::Unknown,
        });
        OpId(g.1.len() - 1)
    }
    /// Records that the operation returned `output` now.
    pub fn ret(&self, id: OpId, output: Output) {
        let mut g = self.inner.lock().unwrap();
        let now = g.0.elapsed().as_nanos() as u64;
        let op = &mut g.1[id.0];
        op.ret = if output == Output::Unknown {
            NEVER
        } else {
            now
        };
        op.output = output;
    }
    /// Records that the operation failed: a write may or may not have happened.
    pub fn fail(&self, id: OpId) {
        self.ret(id, Output::Unknown);
    }
    /// A copy of the operations recorded so far.
    pub fn ops(&self) -> Vec<Operation> {
        self.inner.lock().unwrap().1.clone()
    }
}

/// Checks the recorded history within [`DEFAULT_BUDGET`].
pub fn check(history: &History) -> Result<(), String> {
    check_ops(&history.ops(), DEFAULT_BUDGET)
}

/// Checks `ops` key by key; gives up with an error once `budget` is spent.
pub fn check_ops(ops: &[Operation], budget: Duration) -> Result<(), String> {
    let deadline = Instant::now() + budget;
    let mut by_key: BTreeMap<&[u8], Vec<&Operation>> = BTreeMap::new();
    for op in ops {
        if matches!(op.input, Input::Get { .. }) && op.output == Output::Unknown {
            continue; // a failed read has no effect and observed nothing
        }
        let kind_ok = match (&op.input, &op.output) {
            (_, Output::Unknown) => op.ret == NEVER,
            (Input::Put { .. }, Output::Ok)
            | (Input::Get { .. }, Output::Value(_))
            | (Input::Cas { .. }, Output::Swapped(_)) => op.ret >= op.call,
            _ => false,
        };
        if !kind_ok {
            return Err(format!("malformed operation: {}", show(op)));
        }
        by_key.entry(op.input.key()).or_default().push(op);
    }
    let mut undecided = Vec::new();
    for (key, part) in by_key {
        let key = String::from_utf8_lossy(key);
        match search(&part, deadline) {
            Verdict::Ok => {}
            Verdict::GaveUp(steps) => undecided.push(format!("{key:?} ({steps} steps)")),
            Verdict::Bad(why) => {
                return Err(format!(
                    "key {key:?}: history of {} ops is not linearizable\n{why}",
                    part.len()
                ));
            }
        }
    }
    if undecided.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "linearizability undecided: search budget of {budget:?} spent before finishing keys {}",
            undecided.join(", ")
        ))
    }
}

enum Verdict {
    Ok,
    GaveUp(u64),
    Bad(String),
}

/// Register state: the interned value, `None` when the key is absent.
type State = Option<u32>;

/// One key's operation with its values interned, so that states are cheap to copy and hash.
#[derive(Clone, Copy)]
enum Op {
    Put(u32),
    Get(Option<u32>),
    /// Expected, new value, outcome (`None`: unknown).
    Cas(Option<u32>, u32, Option<bool>),
}

/// The model: the state after `op` when its output is possible in `s`, else `None`.
fn step(s: State, op: Op) -> Option<State> {
    match op {
        Op::Put(v) => Some(Some(v)),
        Op::Get(v) => (v == s).then_some(s),
        Op::Cas(expected, new, outcome) => {
            // The model is deterministic, so an unknown outcome can only be this one.
            let swaps = s == expected;
            (outcome.unwrap_or(swaps) == swaps).then_some(if swaps { Some(new) } else { s })
        }
    }
}

/// The Wing & Gong / Lowe search over one key's operations.
fn search(ops: &[&Operation], deadline: Instant) -> Verdict {
    let mut ids: HashMap<&[u8], u32> = HashMap::new();
    let mut names: Vec<&[u8]> = Vec::new();
    let mut intern = |v| intern(&mut ids, &mut names, v);
    let model: Vec<Op> = ops
        .iter()
        .map(|op| match (&op.input, &op.output) {
            (Input::Put { value, .. }, _) => Op::Put(intern(value)),
            (Input::Get { .. }, Output::Value(v)) => Op::Get(v.as_deref().map(&mut intern)),
            (Input::Cas { expected, new, .. }, out) => Op::Cas(
                expected.as_deref().map(&mut intern),
                intern(new),
                matches!(out, Output::Swapped(_)).then_some(*out == Output::Swapped(true)),
            ),
            _ => unreachable!("failed reads are dropped and outputs validated in check_ops"),
        })
        .collect();

    // Doubly linked list of call/return events in time order (calls first on ties, so
    // operations touching in time count as concurrent). Node 0 is the head; the call of
    // op i is node 2i+1, its return node 2i+2.
    const NIL: usize = usize::MAX;
    let n = ops.len();
    let mut events: Vec<(u64, bool, usize)> = (ops.iter().enumerate())
        .flat_map(|(i, op)| [(op.call, false, 2 * i + 1), (op.ret, true, 2 * i + 2)])
        .collect();
    events.sort_unstable();
    let (mut next, mut prev) = (vec![NIL; 2 * n + 1], vec![NIL; 2 * n + 1]);
    let mut last = 0;
    for &(_, _, node) in &events {
        (next[last], prev[node], last) = (node, last, node);
    }
    let lift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        for x in [node, node + 1] {
            next[prev[x]] = next[x];
            if next[x] != NIL {
                prev[next[x]] = prev[x];
            }
        }
    };
    let unlift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        for x in [node + 1, node] {
            if next[x] != NIL {
                prev[next[x]] = x;
            }
            next[prev[x]] = x;
        }
    };

    let mut linearized = vec![0u64; n.div_ceil(64)];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state: State = None;
    let mut node = next[0];
    let mut steps = 0u64;
    let mut best: Option<String> = None;
    let mut best_depth = 0;
    while next[0] != NIL {
        steps += 1;
        if steps.is_multiple_of(4096) && Instant::now() > deadline {
            return Verdict::GaveUp(steps);
        }
        if node % 2 == 1 {
            let i = node / 2;
            if let Some(after) = step(state, model[i]) {
                // Set the bit in place and look the pair up; copy only states never seen.
                let bit = 1u64 << (i % 64);
                linearized[i / 64] |= bit;
                let key = (std::mem::take(&mut linearized), after);
                let new = !seen.contains(&key);
                linearized = key.0;
                if new {
                    seen.insert((linearized.clone(), after));
                    stack.push((node, state));
                    state = after;
                    lift(&mut next, &mut prev, node);
                    node = next[0];
                    continue;
                }
                linearized[i / 64] &= !bit;
            }
            node = next[node];
        } else {
            // A return whose call is still pending: nothing before it fits here; backtrack.
            if best.is_none() || stack.len() > best_depth {
                best_depth = stack.len();
                best = Some(stuck(ops, &names, &stack, state, &next, node));
            }
            let Some((call, before)) = stack.pop() else {
                return Verdict::Bad(best.unwrap_or_default());
            };
            let i = call / 2;
            linearized[i / 64] &= !(1 << (i % 64));
            state = before;
            unlift(&mut next, &mut prev, call);
            node = next[call];
        }
    }
    Verdict::Ok
}

/// The number standing for value `v`, assigned on first sight.
fn intern<'a>(ids: &mut HashMap<&'a [u8], u32>, names: &mut Vec<&'a [u8]>, v: &'a [u8]) -> u32 {
    *ids.entry(v).or_insert_with(|| {
        names.push(v);
        names.len() as u32 - 1
    })
}

/// Describes the deepest point of the search: the last ops linearized, the state, and the
/// pending ops none of which could go next.
fn stuck(
    ops: &[&Operation],
    names: &[&[u8]],
    stack: &[(usize, State)],
    state: State,
    next: &[usize],
    ret_node: usize,
) -> String {
    let value = |s: State| match s {
        Some(v) => format!("{:?}", String::from_utf8_lossy(names[v as usize])),
        None => "absent".to_string(),
    };
    let mut out = format!("  longest linearizable prefix: {} ops", stack.len());
    let tail = &stack[stack.len().saturating_sub(5)..];
    if !tail.is_empty() {
        out.push_str(", ending with:");
    }
    for &(call, _) in tail {
        let _ = write!(out, "\n      {}", show(ops[call / 2]));
    }
    let _ = write!(out, "\n  value then: {}\n  none of these", value(state));
    let _ = write!(
        out,
        " pending ops can take effect next (* has returned already):"
    );
    let _ = write!(out, "\n    * {}", show(ops[ret_node / 2 - 1]));
    let mut node = next[0];
    for _ in 0..10 {
        if node == ret_node {
            break;
        }
        if node + 1 != ret_node {
            let _ = write!(out, "\n      {}", show(ops[node / 2]));
        }
        node = next[node];
    }
    out
}

/// One line per operation: client, time window in ns, input and output.
fn show(op: &Operation) -> String {
    let s = |b: &[u8]| format!("{:?}", String::from_utf8_lossy(b));
    let input = match &op.input {
        Input::Put { key, value } => format!("put({}, {})", s(key), s(value)),
        Input::Get { key } => format!("get({})", s(key)),
        Input::Cas { key, expected, new } => {
            let e = expected.as_deref().map_or("absent".into(), s);
            format!("cas({}, {e} -> {})", s(key), s(new))
        }
    };
    let output = match &op.output {
        Output::Ok => "ok".to_string(),
        Output::Value(v) => v.as_deref().map_or("absent".into(), s),
        Output::Swapped(b) => b.to_string(),
        Output::Unknown => "unknown".to_string(),
    };
    let ret = Some(op.ret).filter(|&t| t != NEVER);
    let ret = ret.map_or("inf".to_string(), |t| t.to_string());
    format!(
        "client {} [{}..{ret}ns] {input} -> {output}",
        op.client, op.call
    )
}
