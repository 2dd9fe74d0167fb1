//! Differential test: real etcd 3.5.1 is the oracle. Both etcd and cetera start fresh,
//! receive the same seeded random sequence of KV requests (Put, Range, DeleteRange, Txn,
//! Compact) over the raw generated gRPC clients, and must answer identically: Ok
//! responses equal after clearing the header fields that identify the member
//! (cluster_id, member_id, raft_term); errors equal in gRPC code and message.
//!
//! The key space is tiny so that operations collide: the same keys are rewritten,
//! deleted, compared and read at old revisions over and over.
//!
//! Two things are deliberately not compared: the order of kvs that tie on a non-key sort
//! target (see `canonicalize_ties`), and out-of-enum sort options (etcd 3.5.1 crashes on
//! an unknown sort target). Everything else etcd does, quirks included, is the contract.
//!
//! Knobs (environment variables):
//! - `CETERA_DIFF_SEED=N`: run only seed N (test `random_ops_chosen_seed`); with
//!   `CETERA_DIFF_LEASES=1`, with leases.
//! - `CETERA_DIFF_OPS=N`: operations per seed (default 1000).
//! - `CETERA_DIFF_VERBOSE=1`: print every request and response.
//! - `CETERA_DIFF_KEEP_GOING=1`: after a mismatch on a read-only request, report it and
//!   go on (a mismatching write ends the seed, since the stores have diverged).
//! - `CETERA_DIFF_SELF_CHECK=1`: compare etcd with a second etcd instead of cetera; it
//!   must pass, which shows the generated requests are deterministic.
//!
//! The `random_ops_with_leases_*` seeds also grant leases (ids chosen by the servers),
//! put keys with them and compare keys' LEASE with them (`leases`), so that the order
//! of the ids each server hands out counts, as it does for a client comparing LEASE
//! with GREATER or LESS.

mod common;
#[path = "differential/leases.rs"]
mod leases;

use std::fmt::Debug;
use std::time::Duration;

use cetera::proto::etcdserverpb::range_request::SortTarget;
use cetera::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse, compare::TargetUnion, kv_client::KvClient,
    lease_client::LeaseClient, request_op::Request as Op, response_op::Response as OpResponse,
};
use cetera::proto::mvccpb::KeyValue;
use common::{Cetera, Etcd};
use leases::{GrantedIds, LEASE_SLOT};
use tonic::transport::{Channel, Endpoint};

/// Small key space, sorted, with binary keys at both ends of the byte range.
const KEYS: [&[u8]; 12] = [
    b"\x00",
    b"\x00\x01",
    b"a",
    b"a/1",
    b"a/2",
    b"a/3",
    b"ab",
    b"b",
    b"b/1",
    b"c",
    b"\xff",
    b"\xff\xff",
];

/// Prefixes whose ranges cover several of `KEYS`.
const PREFIXES: [&[u8]; 6] = [b"\x00", b"a", b"a/", b"b", b"c", b"\xff"];

/// Values that repeat, so VALUE compares can be equal.
const VALUES: [&[u8]; 5] = [b"x", b"y", b"\x00", b"\xff\x00", b"long value long value"];

/// A lease id that was never granted.
const NO_SUCH_LEASE: i64 = 0x1234_5678;

/// The TTL of the leases the generator grants: none expires while a seed runs.
const LEASE_TTL: i64 = 3600;

/// etcd's defaults: `--max-txn-ops` and `--max-request-bytes`.
const MAX_TXN_OPS: usize = 128;
const MAX_REQUEST_BYTES: usize = 1_572_864;

// ---------------------------------------------------------------------------------------
// Servers and clients
// ---------------------------------------------------------------------------------------

/// The server compared against etcd: cetera, or in self-check mode another etcd.
enum Subject {
    Cetera(Cetera),
    Etcd(Etcd),
}

/// The clients of one server, and the lease ids it chose.
struct Clients {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    leases: GrantedIds,
}

/// Both servers, fresh, with clients each. The servers live as long as the pair.
struct Pair {
    etcd: Clients,
    subject: Clients,
    subject_name: &'static str,
    servers: (Etcd, Subject),
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v == "true")
}

async fn client(endpoint: String) -> Clients {
    let channel = Endpoint::from_shared(endpoint)
        .expect("endpoint URL")
        .connect_timeout(Duration::from_secs(5))
        // Physical compaction waits for the deletion; generous, but no hang forever.
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect");
    Clients {
        // Responses may carry values near the request size limit several times over.
        kv: KvClient::new(channel.clone()).max_decoding_message_size(64 << 20),
        lease: LeaseClient::new(channel),
        leases: GrantedIds::default(),
    }
}

/// Starts etcd and the subject with the same extra flags; `None` when etcd is not
/// installed (outside CI), so the test skips.
async fn start_pair(args: &[&str]) -> Option<Pair> {
    let (etcd, subject) = if env_flag("CETERA_DIFF_SELF_CHECK") {
        let (a, b) = tokio::join!(Etcd::start_with(args), Etcd::start_with(args));
        (a?, Subject::Etcd(b?))
    } else {
        let (a, b) = tokio::join!(Etcd::start_with(args), Cetera::start_with(args));
        (a?, Subject::Cetera(b))
    };
    let (subject_endpoint, subject_name) = match &subject {
        Subject::Cetera(c) => (c.endpoint(), "cetera"),
        Subject::Etcd(e) => (e.endpoint(), "etcd #2"),
    };
    Some(Pair {
        etcd: client(etcd.endpoint()).await,
        subject: client(subject_endpoint).await,
        subject_name,
        servers: (etcd, subject),
    })
}

#[derive(Clone, Debug)]
enum Request {
    Range(RangeRequest),
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    /// A LeaseGrant with the id left to the server.
    Grant(LeaseGrantRequest),
}

#[derive(Debug, PartialEq)]
enum Response {
    Range(RangeResponse),
    Put(PutResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    Grant(LeaseGrantResponse),
}

/// What a server answered: a response, or the gRPC status code and message.
type Outcome = Result<Response, (tonic::Code, String)>;

impl Response {
    fn header(&self) -> Option<&ResponseHeader> {
        match self {
            Response::Range(r) => r.header.as_ref(),
            Response::Put(r) => r.header.as_ref(),
            Response::Delete(r) => r.header.as_ref(),
            Response::Txn(r) => r.header.as_ref(),
            Response::Compact(r) => r.header.as_ref(),
            Response::Grant(r) => r.header.as_ref(),
        }
    }

    /// Clears what legitimately differs between two servers: their identities and raft
    /// terms, also in the per-op responses nested in a Txn.
    fn normalize(&mut self) {
        match self {
            Response::Range(r) => clear_header(&mut r.header),
            Response::Put(r) => clear_header(&mut r.header),
            Response::Delete(r) => clear_header(&mut r.header),
            Response::Txn(r) => normalize_txn(r),
            Response::Compact(r) => clear_header(&mut r.header),
            Response::Grant(r) => clear_header(&mut r.header),
        }
    }

    /// Replaces the lease ids `server` chose with their stand-ins (a grant's id is
    /// recorded first).
    fn name_leases(&mut self, server: &mut GrantedIds) {
        match self {
            Response::Range(r) => server.kvs(&mut r.kvs),
            Response::Put(r) => server.kvs(&mut r.prev_kv),
            Response::Delete(r) => server.kvs(&mut r.prev_kvs),
            Response::Txn(r) => server.txn_response(r),
            Response::Compact(_) => {}
            Response::Grant(r) => r.id = server.granted(r.id),
        }
    }
}

fn clear_header(header: &mut Option<ResponseHeader>) {
    if let Some(h) = header {
        h.cluster_id = 0;
        h.member_id = 0;
        h.raft_term = 0;
    }
}

fn normalize_txn(txn: &mut TxnResponse) {
    clear_header(&mut txn.header);
    for op in &mut txn.responses {
        match &mut op.response {
            Some(OpResponse::ResponseRange(r)) => clear_header(&mut r.header),
            Some(OpResponse::ResponsePut(r)) => clear_header(&mut r.header),
            Some(OpResponse::ResponseDeleteRange(r)) => clear_header(&mut r.header),
            Some(OpResponse::ResponseTxn(r)) => normalize_txn(r),
            None => {}
        }
    }
}

async fn send(clients: &mut Clients, mut request: Request) -> Outcome {
    match &mut request {
        Request::Put(r) => clients.leases.put_lease(&mut r.lease),
        Request::Txn(r) => clients.leases.txn(r),
        _ => {}
    }
    let kv = &mut clients.kv;
    let result = match request {
        Request::Range(r) => kv.range(r).await.map(|r| Response::Range(r.into_inner())),
        Request::Put(r) => kv.put(r).await.map(|r| Response::Put(r.into_inner())),
        Request::Delete(r) => kv
            .delete_range(r)
            .await
            .map(|r| Response::Delete(r.into_inner())),
        Request::Txn(r) => kv.txn(r).await.map(|r| Response::Txn(r.into_inner())),
        Request::Compact(r) => kv
            .compact(r)
            .await
            .map(|r| Response::Compact(r.into_inner())),
        Request::Grant(r) => clients
            .lease
            .lease_grant(r)
            .await
            .map(|r| Response::Grant(r.into_inner())),
    };
    match result {
        Ok(mut response) => {
            response.normalize();
            response.name_leases(&mut clients.leases);
            Ok(response)
        }
        Err(status) => Err((status.code(), status.message().to_string())),
    }
}

/// Puts kvs that tie on a non-key sort target into key order.
///
/// etcd sorts a Range by VERSION, CREATE, MOD or VALUE with Go's `sort.Sort`, which is
/// not stable: the order of kvs with equal sort values is an accident of the Go version
/// etcd was built with (3.5.1 uses Go 1.16's quicksort; Go 1.19+ uses pdqsort), so no
/// client can rely on it. When a limit cut the sorted list (`more`), which of the tied
/// kvs made it into the last group is just as accidental; there only the sort values
/// are compared.
fn canonicalize_ties(request: &Request, outcome: &mut Outcome) {
    match (request, outcome) {
        (Request::Range(q), Ok(Response::Range(r))) => canonical_range(q, r),
        (Request::Txn(q), Ok(Response::Txn(r))) => canonical_txn(q, r),
        _ => {}
    }
}

fn canonical_txn(request: &TxnRequest, response: &mut TxnResponse) {
    let ops = if response.succeeded {
        &request.success
    } else {
        &request.failure
    };
    for (op, r) in ops.iter().zip(&mut response.responses) {
        match (&op.request, &mut r.response) {
            (Some(Op::RequestRange(q)), Some(OpResponse::ResponseRange(r))) => {
                canonical_range(q, r)
            }
            (Some(Op::RequestTxn(q)), Some(OpResponse::ResponseTxn(r))) => canonical_txn(q, r),
            _ => {}
        }
    }
}

fn canonical_range(request: &RangeRequest, response: &mut RangeResponse) {
    let target = request.sort_target;
    if target == SortTarget::Key as i32 {
        return; // keys are unique: no ties
    }
    // Only the field sorted on; equal for kvs that tie.
    let sort_value = |kv: &KeyValue| match target {
        t if t == SortTarget::Version as i32 => KeyValue {
            version: kv.version,
            ..Default::default()
        },
        t if t == SortTarget::Create as i32 => KeyValue {
            create_revision: kv.create_revision,
            ..Default::default()
        },
        t if t == SortTarget::Mod as i32 => KeyValue {
            mod_revision: kv.mod_revision,
            ..Default::default()
        },
        _ => KeyValue {
            value: kv.value.clone(),
            ..Default::default()
        },
    };
    let kvs = &mut response.kvs;
    let mut start = 0;
    while start < kvs.len() {
        let tie = sort_value(&kvs[start]);
        let end = start
            + kvs[start..]
                .iter()
                .take_while(|kv| sort_value(kv) == tie)
                .count();
        if end == kvs.len() && response.more {
            for kv in &mut kvs[start..end] {
                *kv = sort_value(kv);
            }
        } else {
            kvs[start..end].sort_by(|a, b| a.key.cmp(&b.key));
        }
        start = end;
    }
}

/// True for errors that come from the transport rather than from the server's logic: the
/// process died or stopped answering. etcd's own errors all start with "etcdserver:".
fn is_transport_error(outcome: &Outcome) -> bool {
    matches!(outcome, Err((code, msg))
        if matches!(code, tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled)
            && !msg.starts_with("etcdserver:"))
}

/// The last lines of a server's output, where a crash's panic message is.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl Pair {
    /// Sends the request to both servers at once and returns (etcd, subject). Panics if
    /// etcd, the oracle, did not answer: two dead servers must not count as agreement.
    async fn send(&mut self, request: &Request) -> (Outcome, Outcome) {
        let (expected, actual) = tokio::join!(
            send(&mut self.etcd, request.clone()),
            send(&mut self.subject, request.clone())
        );
        let (mut expected, mut actual) = (expected, actual);
        canonicalize_ties(request, &mut expected);
        canonicalize_ties(request, &mut actual);
        if is_transport_error(&expected) {
            panic!(
                "etcd (the oracle) failed to answer: {}\n  request: {}\n----- etcd output -----\n{}",
                readable(&expected),
                readable(request),
                log_tail(&self.servers.0.log())
            );
        }
        (expected, actual)
    }

    fn subject_log(&self) -> String {
        match &self.servers.1 {
            Subject::Cetera(c) => c.log(),
            Subject::Etcd(e) => e.log(),
        }
    }

    /// Sends to both and panics, showing everything, unless they answer the same.
    async fn check(&mut self, context: &str, request: Request) {
        let (expected, actual) = self.send(&request).await;
        if expected != actual {
            panic!("{}", self.mismatch(context, &request, &expected, &actual));
        }
    }

    fn mismatch(
        &self,
        context: &str,
        request: &Request,
        expected: &Outcome,
        actual: &Outcome,
    ) -> String {
        let mut report = format!(
            "etcd and {} disagree ({context})\n  request: {}\n  etcd:    {}\n  {}:{} {}",
            self.subject_name,
            readable(request),
            readable(expected),
            self.subject_name,
            " ".repeat(8usize.saturating_sub(self.subject_name.len() + 1)),
            readable(actual),
        );
        if is_transport_error(actual) {
            report += &format!(
                "\n----- {} output -----\n{}",
                self.subject_name,
                log_tail(&self.subject_log())
            );
        }
        report
    }
}

// ---------------------------------------------------------------------------------------
// Readable output
// ---------------------------------------------------------------------------------------

/// `{:?}` with byte fields (keys, values) shown as escaped strings instead of lists of
/// numbers, and very long ones shortened.
fn readable<T: Debug>(value: &T) -> String {
    let debug = format!("{value:?}");
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug.as_str();
    while let Some(open) = rest.find('[') {
        let (before, from_open) = rest.split_at(open);
        out.push_str(before);
        let is_bytes_field = ["key: ", "value: ", "range_end: ", "Value("]
            .iter()
            .any(|f| before.ends_with(f));
        let close = from_open.find(']');
        let bytes = close.filter(|_| is_bytes_field).and_then(|close| {
            let inner = &from_open[1..close];
            if inner.is_empty() {
                return Some((close, Vec::new()));
            }
            inner
                .split(", ")
                .map(|n| n.parse::<u8>().ok())
                .collect::<Option<Vec<u8>>>()
                .map(|b| (close, b))
        });
        match bytes {
            Some((close, b)) => {
                out.push_str(&escape(&b));
                rest = &from_open[close + 1..];
            }
            None => {
                out.push('[');
                rest = &from_open[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn escape(bytes: &[u8]) -> String {
    const SHOWN: usize = 48;
    let mut s = String::from("b\"");
    for &b in bytes.iter().take(SHOWN) {
        s.extend(std::ascii::escape_default(b).map(char::from));
    }
    s.push('"');
    if bytes.len() > SHOWN {
        s.push_str(&format!("...({} bytes)", bytes.len()));
    }
    s
}

// ---------------------------------------------------------------------------------------
// Request generator
// ---------------------------------------------------------------------------------------

/// splitmix64: tiny, seedable, and stable forever (unlike a library's default RNG).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `p` percent.
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// Uniform in `lo..=hi`; `lo` if the range is empty.
    fn between(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below((hi - lo + 1) as u64) as i64
        }
    }
}

/// The smallest key greater than every key with this prefix; "\0" (= to the end of the
/// key space) when the prefix is all 0xff bytes.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// Generates requests from a seed. Knows the current and compact revisions (taken from
/// etcd's answers) so that it can aim at old, current, compacted and future revisions.
struct Generator {
    rng: Rng,
    /// Whether leases are granted, put with and compared with; off, the sequence of a
    /// seed is what it was before leases were.
    with_leases: bool,
    /// Leases granted so far (stand-ins `LEASE_SLOT..LEASE_SLOT + granted`).
    granted: i64,
    /// Current store revision (an empty etcd is at 1).
    rev: i64,
    /// Last successful compaction revision, 0 if none.
    compacted: i64,
    /// Keys still available for writes in a txn that avoids duplicate keys; `None` when
    /// the txn being built may repeat keys.
    fresh_keys: Option<Vec<&'static [u8]>>,
}

impl Generator {
    fn new(seed: u64, with_leases: bool) -> Generator {
        Generator {
            rng: Rng(seed),
            with_leases,
            granted: 0,
            rev: 1,
            compacted: 0,
            fresh_keys: None,
        }
    }

    /// Updates the revisions from etcd's answer to `request`.
    fn observe(&mut self, request: &Request, outcome: &Outcome) {
        if let Ok(response) = outcome {
            if let Some(h) = response.header() {
                self.rev = self.rev.max(h.revision);
            }
            if let Request::Compact(c) = request {
                self.compacted = self.compacted.max(c.revision);
            }
            if let Request::Grant(_) = request {
                self.granted += 1;
            }
        }
    }

    fn request(&mut self) -> Request {
        if self.with_leases && self.rng.percent(4) {
            return Request::Grant(LeaseGrantRequest {
                ttl: LEASE_TTL,
                id: 0,
            });
        }
        match self.rng.below(100) {
            0..25 => Request::Put(self.put()),
            25..50 => Request::Range(self.range()),
            50..62 => Request::Delete(self.delete()),
            62..97 => Request::Txn(self.top_txn()),
            _ => Request::Compact(self.compact()),
        }
    }

    fn key(&mut self) -> Vec<u8> {
        match self.rng.below(100) {
            0 => Vec::new(), // InvalidArgument "key is not provided"
            1..4 => self.rng.pick(&[&b"a/0"[..], b"zz", b"\x01"]).to_vec(), // never written
            _ => self.rng.pick(&KEYS).to_vec(),
        }
    }

    /// A key for a write; unique within the txn when building a duplicate-free txn.
    fn write_key(&mut self) -> Vec<u8> {
        if let Some(pool) = &mut self.fresh_keys
            && !pool.is_empty()
        {
            let i = self.rng.below(pool.len() as u64) as usize;
            return pool.swap_remove(i).to_vec();
        }
        self.key()
    }

    fn value(&mut self) -> Vec<u8> {
        match self.rng.below(10) {
            0..2 => Vec::new(),
            2..6 => self.rng.pick(&VALUES).to_vec(),
            _ => {
                let len = self.rng.between(1, 8) as usize;
                (0..len).map(|_| self.rng.next_u64() as u8).collect()
            }
        }
    }

    /// A range_end for `key`: none (single key), the prefix end, "\0" (everything from
    /// key), another key (possibly below key: an empty range), or key itself.
    fn range_end(&mut self, key: &[u8]) -> Vec<u8> {
        match self.rng.below(100) {
            0..35 => Vec::new(),
            35..55 => prefix_end(key),
            55..67 => vec![0],
            67..87 => self.rng.pick(&KEYS).to_vec(),
            87..94 => [key, b"\x00"].concat(),
            _ => key.to_vec(),
        }
    }

    /// A key and range_end pair: mostly key-based, sometimes a whole prefix or all keys.
    fn key_range(&mut self) -> (Vec<u8>, Vec<u8>) {
        match self.rng.below(100) {
            0..15 => {
                let p = self.rng.pick(&PREFIXES);
                (p.to_vec(), prefix_end(p))
            }
            15..19 => (vec![0], vec![0]),
            _ => {
                let key = self.key();
                let end = self.range_end(&key);
                (key, end)
            }
        }
    }

    /// A read revision: current (0, -1 or explicit), old, at or below the compact
    /// revision, or in the future.
    fn read_revision(&mut self) -> i64 {
        let (rev, compacted) = (self.rev, self.compacted);
        match self.rng.below(100) {
            0..45 => 0,
            45..52 => rev,
            52..55 => -1,
            55..72 => self.rng.between(compacted.max(1), rev),
            72..78 if compacted > 0 => compacted,
            78..84 if compacted > 1 => self.rng.between(1, compacted - 1),
            84..92 => rev + self.rng.between(1, 3),
            _ => self.rng.between(1, rev),
        }
    }

    /// A revision for min/max filters and compares: mostly recent ones, which are likely
    /// to be some key's create or mod revision.
    fn some_revision(&mut self) -> i64 {
        match self.rng.below(10) {
            0..3 => 0,
            3..7 => self.rev - self.rng.between(0, 12),
            _ => self.rng.between(0, self.rev + 1),
        }
    }

    fn range(&mut self) -> RangeRequest {
        let (key, range_end) = self.key_range();
        let mut r = RangeRequest {
            key,
            range_end,
            revision: self.read_revision(),
            ..Default::default()
        };
        r.limit = match self.rng.below(100) {
            0..50 => 0,
            50..52 => -1,
            _ => self.rng.between(1, 5),
        };
        if self.rng.percent(60) {
            // Only valid enum values: etcd 3.5.1 crashes (nil sorter) on an unknown sort
            // target, and accepts an unknown sort order that newer versions reject, so
            // it is no oracle for either.
            r.sort_order = self.rng.between(0, 2) as i32;
            r.sort_target = self.rng.between(0, 4) as i32;
        }
        if self.rng.percent(12) {
            r.min_mod_revision = self.some_revision();
        }
        if self.rng.percent(12) {
            r.max_mod_revision = self.some_revision();
        }
        if self.rng.percent(12) {
            r.min_create_revision = self.some_revision();
        }
        if self.rng.percent(12) {
            r.max_create_revision = self.some_revision();
        }
        r.keys_only = self.rng.percent(15);
        r.count_only = self.rng.percent(12);
        r.serializable = self.rng.percent(20);
        r
    }

    fn put(&mut self) -> PutRequest {
        let mut p = PutRequest {
            key: self.write_key(),
            value: self.value(),
            prev_kv: self.rng.percent(35),
            ..Default::default()
        };
        if self.rng.percent(6) {
            p.ignore_value = true;
            // With a value: "value is provided".
            if self.rng.percent(75) {
                p.value.clear();
            }
        }
        if self.rng.percent(6) {
            p.ignore_lease = true;
        }
        if self.rng.percent(3) {
            // NotFound "requested lease not found" (also with ignore_lease: "lease is
            // provided").
            p.lease = NO_SUCH_LEASE;
        }
        if self.with_leases && self.granted > 0 && self.rng.percent(40) {
            p.lease = self.granted_lease();
        }
        p
    }

    /// The stand-in for one of the leases granted so far (there is one).
    fn granted_lease(&mut self) -> i64 {
        LEASE_SLOT + self.rng.below(self.granted as u64) as i64
    }

    fn delete(&mut self) -> DeleteRangeRequest {
        let (key, range_end) = if self.fresh_keys.is_some() {
            (self.write_key(), Vec::new())
        } else {
            self.key_range()
        };
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: self.rng.percent(40),
        }
    }

    fn compare(&mut self) -> Compare {
        let key = self.key();
        let range_end = if self.rng.percent(20) {
            self.range_end(&key)
        } else {
            Vec::new()
        };
        let target = self.rng.between(0, 4) as i32;
        let union = match target {
            0 => TargetUnion::Version(self.rng.between(0, 4)),
            1 => TargetUnion::CreateRevision(self.some_revision()),
            2 => TargetUnion::ModRevision(self.some_revision()),
            3 => TargetUnion::Value(self.value()),
            _ if self.with_leases && self.granted > 0 && self.rng.percent(60) => {
                TargetUnion::Lease(self.granted_lease())
            }
            _ => TargetUnion::Lease(if self.rng.percent(70) {
                0
            } else {
                NO_SUCH_LEASE
            }),
        };
        // Rarely: no target value, or one of the wrong kind (etcd compares against the
        // zero value then).
        let target_union = match self.rng.below(100) {
            0..2 => None,
            2..4 => Some(TargetUnion::Version(1)),
            _ => Some(union),
        };
        Compare {
            result: self.rng.between(0, 3) as i32,
            target,
            key,
            range_end,
            target_union,
        }
    }

    fn request_op(&mut self, depth: u32) -> RequestOp {
        let request = match self.rng.below(100) {
            0..35 => Op::RequestRange(self.range()),
            35..67 => Op::RequestPut(self.put()),
            67..87 => Op::RequestDeleteRange(self.delete()),
            _ if depth < 2 => Op::RequestTxn(self.txn(depth + 1)),
            _ => Op::RequestRange(self.range()),
        };
        RequestOp {
            request: Some(request),
        }
    }

    fn ops(&mut self, depth: u32) -> Vec<RequestOp> {
        let n = match self.rng.below(10) {
            0..2 => 0,
            2..5 => 1,
            5..8 => 2,
            _ => self.rng.between(3, 5),
        };
        (0..n).map(|_| self.request_op(depth)).collect()
    }

    fn txn(&mut self, depth: u32) -> TxnRequest {
        let compares = match self.rng.below(10) {
            0..2 => 0,
            2..7 => 1,
            _ => self.rng.between(2, 3),
        };
        TxnRequest {
            compare: (0..compares).map(|_| self.compare()).collect(),
            success: self.ops(depth),
            failure: self.ops(depth),
        }
    }

    /// A top-level txn: random (half of them free of duplicate keys, so that writes
    /// succeed), or a hand-written shape, or one at the ops limit.
    fn top_txn(&mut self) -> TxnRequest {
        let mut txn = match self.rng.below(100) {
            0..12 => self.special_txn(),
            12..15 => self.big_txn(),
            _ => {
                if self.rng.percent(50) {
                    let mut pool = KEYS.to_vec();
                    pool.extend([&b"a/0"[..], b"zz"]);
                    self.fresh_keys = Some(pool);
                }
                let txn = self.txn(0);
                self.fresh_keys = None;
                txn
            }
        };
        if self.rng.percent(2) {
            // An op with no request: "key not found", checked in either branch.
            let branch = if self.rng.percent(50) {
                &mut txn.success
            } else {
                &mut txn.failure
            };
            let at = self.rng.below(branch.len() as u64 + 1) as usize;
            branch.insert(at, RequestOp { request: None });
        }
        if contains_delete(&txn.success) || contains_delete(&txn.failure) {
            // etcd checks ignore_value/ignore_lease against the state before the txn but
            // applies them after earlier ops; if a delete in the same txn removed the key
            // (possible when the duplicate check misses it), etcd 3.5 panics. Keep the
            // oracle alive.
            clear_ignore_flags(&mut txn.success);
            clear_ignore_flags(&mut txn.failure);
        }
        txn
    }

    /// Txns at and just over the --max-txn-ops limit, in each of the three lists.
    fn big_txn(&mut self) -> TxnRequest {
        let n = if self.rng.percent(50) {
            MAX_TXN_OPS
        } else {
            MAX_TXN_OPS + 1
        };
        let mut txn = TxnRequest::default();
        match self.rng.below(3) {
            0 => txn.compare = (0..n).map(|_| self.compare()).collect(),
            1 => txn.success = (0..n).map(|_| RequestOp::from(self.range())).collect(),
            _ => txn.failure = (0..n).map(|_| RequestOp::from(self.range())).collect(),
        }
        txn
    }

    /// Hand-written shapes around the duplicate-key rules and read-your-writes.
    fn special_txn(&mut self) -> TxnRequest {
        let k = self.rng.pick(&KEYS).to_vec();
        let k2 = self.rng.pick(&KEYS).to_vec();
        let v = self.value();
        let put = |key: &[u8], value: &[u8]| {
            RequestOp::from(PutRequest {
                key: key.to_vec(),
                value: value.to_vec(),
                ..Default::default()
            })
        };
        let delete = |key: &[u8], end: &[u8]| {
            RequestOp::from(DeleteRangeRequest {
                key: key.to_vec(),
                range_end: end.to_vec(),
                prev_kv: true,
            })
        };
        let get = |key: &[u8]| {
            RequestOp::from(RangeRequest {
                key: key.to_vec(),
                ..Default::default()
            })
        };
        let nested = |success: Vec<RequestOp>, failure: Vec<RequestOp>, compare: Vec<Compare>| {
            RequestOp::from(TxnRequest {
                compare,
                success,
                failure,
            })
        };
        let cmp = self.compare();
        let ops = match self.rng.below(16) {
            // Same key put twice: duplicate.
            0 => vec![put(&k, &v), put(&k, b"2")],
            // Put inside a deleted prefix: duplicate.
            1 => vec![delete(b"a/", b"a0"), put(b"a/2", &v)],
            // Put, then delete of the same key (and the reverse): duplicate.
            2 => vec![put(&k, &v), delete(&k, b"")],
            3 => vec![delete(&k, b""), put(&k, &v)],
            // Same key in an outer and a nested put: duplicate across levels.
            4 => vec![put(&k, &v), nested(vec![put(&k, b"n")], vec![], vec![cmp])],
            // Delete nested, put outside it: duplicate.
            5 => vec![
                nested(vec![delete(b"a", b"b")], vec![], vec![cmp]),
                put(&k, &v),
            ],
            // Then- and else-branch of one nested txn put the same key: allowed.
            6 => vec![nested(
                vec![put(&k, b"then")],
                vec![put(&k, b"else")],
                vec![cmp],
            )],
            // Two nested txns putting the same key (else of the second): duplicate.
            7 => vec![
                nested(vec![put(&k, b"1")], vec![], vec![]),
                nested(vec![], vec![put(&k, b"2")], vec![cmp]),
            ],
            // Overlapping deletes: allowed.
            8 => vec![delete(b"a", b"c"), delete(&k, b""), delete(b"a/", b"a0")],
            // Delete to the end of the key space ("\0"), then a put: etcd's interval
            // check treats "\0" as an ordinary (low) end.
            9 => vec![delete(&k, b"\x00"), put(&k2, &v)],
            // Reads inside a txn see the txn's earlier writes.
            10 => vec![put(&k, &v), get(&k), delete(&k2, b""), get(&k2)],
            // A nested compare after an outer write.
            11 => vec![
                put(&k, &v),
                nested(vec![get(&k)], vec![get(&k2)], vec![cmp]),
            ],
            // A nested txn reading what its parent wrote, and writing more.
            12 => vec![
                put(&k, &v),
                nested(vec![get(b"a"), put(&k2, b"n")], vec![], vec![]),
            ],
            // Delete everything and read it back.
            13 => vec![delete(b"\x00", b"\x00"), get(&k)],
            // Nested duplicate inside one branch: duplicate.
            14 => vec![nested(vec![put(&k, b"1"), put(&k, b"2")], vec![], vec![])],
            // Overlapping deletes across levels: allowed.
            _ => vec![
                delete(&k, b"\x00"),
                nested(vec![delete(&k, b"")], vec![get(&k)], vec![cmp]),
            ],
        };
        let compare = if self.rng.percent(50) {
            vec![]
        } else {
            vec![self.compare()]
        };
        if self.rng.percent(70) {
            TxnRequest {
                compare,
                success: ops,
                failure: vec![],
            }
        } else {
            TxnRequest {
                compare,
                success: vec![],
                failure: ops,
            }
        }
    }

    fn compact(&mut self) -> CompactionRequest {
        let (rev, compacted) = (self.rev, self.compacted);
        let revision = match self.rng.below(100) {
            // Old, not yet compacted.
            0..40 if compacted < rev => self.rng.between(compacted + 1, rev),
            // The current revision.
            40..60 => rev,
            // Already compacted (also exactly at the compact revision).
            60..75 => self.rng.between(compacted.min(1), compacted),
            // Future.
            75..90 => rev + self.rng.between(1, 3),
            // Nonsense.
            90..95 => self.rng.between(-1, 0),
            _ => self.rng.between(1, rev),
        };
        CompactionRequest {
            revision,
            physical: self.rng.percent(30),
        }
    }
}

fn contains_delete(ops: &[RequestOp]) -> bool {
    ops.iter().any(|op| match &op.request {
        Some(Op::RequestDeleteRange(_)) => true,
        Some(Op::RequestTxn(t)) => contains_delete(&t.success) || contains_delete(&t.failure),
        _ => false,
    })
}

fn clear_ignore_flags(ops: &mut [RequestOp]) {
    for op in ops {
        match &mut op.request {
            Some(Op::RequestPut(p)) => {
                p.ignore_value = false;
                p.ignore_lease = false;
            }
            Some(Op::RequestTxn(t)) => {
                clear_ignore_flags(&mut t.success);
                clear_ignore_flags(&mut t.failure);
            }
            _ => {}
        }
    }
}

/// True if the request cannot change the store, so a mismatch leaves both in step.
fn is_read_only(request: &Request) -> bool {
    fn ops_read_only(ops: &[RequestOp]) -> bool {
        ops.iter().all(|op| match &op.request {
            Some(Op::RequestRange(_)) | None => true,
            Some(Op::RequestTxn(t)) => ops_read_only(&t.success) && ops_read_only(&t.failure),
            _ => false,
        })
    }
    match request {
        Request::Range(_) => true,
        Request::Txn(t) => ops_read_only(&t.success) && ops_read_only(&t.failure),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

fn ops_per_seed() -> usize {
    std::env::var("CETERA_DIFF_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn chosen_seed() -> Option<u64> {
    std::env::var("CETERA_DIFF_SEED")
        .ok()
        .map(|v| v.parse().expect("CETERA_DIFF_SEED must be a number"))
}

/// Runs one seed's random sequence on fresh servers, with leases or not; panics at the
/// first mismatch (or, with CETERA_DIFF_KEEP_GOING, at the end, listing all).
async fn run_seed(seed: u64, with_leases: bool) {
    let Some(mut pair) = start_pair(&[]).await else {
        return;
    };
    let ops = ops_per_seed();
    let verbose = env_flag("CETERA_DIFF_VERBOSE");
    let keep_going = env_flag("CETERA_DIFF_KEEP_GOING");
    let mut generator = Generator::new(seed, with_leases);
    let mut mismatches = Vec::new();
    // What etcd answered, by kind: shows whether the generator reaches every case.
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..ops {
        let request = generator.request();
        let (expected, actual) = pair.send(&request).await;
        if verbose {
            eprintln!(
                "#{i} {}\n    -> {}",
                readable(&request),
                readable(&expected)
            );
        }
        if expected != actual {
            let context = format!(
                "seed {seed}, op #{i} of {ops}; reproduce with CETERA_DIFF_SEED={seed} \
                 CETERA_DIFF_LEASES={} CETERA_DIFF_OPS={} cargo nextest run --test differential",
                u8::from(with_leases),
                i + 1
            );
            let report = pair.mismatch(&context, &request, &expected, &actual);
            if !keep_going {
                panic!("{report}");
            }
            eprintln!("{report}\n");
            mismatches.push(report);
            if !is_read_only(&request) {
                eprintln!("(seed {seed}: the stores may have diverged; stopping this seed)");
                break;
            }
        }
        *tally.entry(outcome_kind(&request, &expected)).or_default() += 1;
        generator.observe(&request, &expected);
    }
    eprintln!("seed {seed}: what etcd answered:");
    for (kind, n) in &tally {
        eprintln!("  {n:5}  {kind}");
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches for seed {seed}:\n\n{}",
        mismatches.len(),
        mismatches.join("\n\n")
    );
}

/// A short classification of an outcome for the tally.
fn outcome_kind(request: &Request, outcome: &Outcome) -> String {
    let name = match request {
        Request::Range(_) => "Range",
        Request::Put(_) => "Put",
        Request::Delete(_) => "DeleteRange",
        Request::Txn(_) => "Txn",
        Request::Compact(_) => "Compact",
        Request::Grant(_) => "LeaseGrant",
    };
    match outcome {
        Ok(Response::Txn(t)) => format!("{name} ok, succeeded={}", t.succeeded),
        Ok(Response::Range(r)) => format!("{name} ok, {} kvs", r.kvs.len().min(3)),
        Ok(Response::Delete(d)) => format!("{name} ok, deleted {}", d.deleted.min(2)),
        Ok(_) => format!("{name} ok"),
        Err((code, msg)) => format!("{name} {code:?}: {msg}"),
    }
}

/// One test per seed so that they run in parallel and fail independently; each skips
/// when CETERA_DIFF_SEED picks another seed.
macro_rules! seed_tests {
    ($($name:ident = $seed:expr, $with_leases:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            if chosen_seed().is_none() {
                run_seed($seed, $with_leases).await;
            }
        }
    )*};
}

seed_tests! {
    random_ops_seed_1 = 1, false;
    random_ops_seed_2 = 2, false;
    random_ops_seed_3 = 3, false;
    random_ops_seed_4 = 4, false;
    random_ops_seed_5 = 5, false;
    random_ops_with_leases_seed_1 = 1, true;
    random_ops_with_leases_seed_2 = 2, true;
    random_ops_with_leases_seed_3 = 3, true;
}

/// `CETERA_DIFF_SEED`, with leases when `CETERA_DIFF_LEASES=1`.
#[tokio::test]
async fn random_ops_chosen_seed() {
    if let Some(seed) = chosen_seed() {
        run_seed(seed, env_flag("CETERA_DIFF_LEASES")).await;
    }
}

fn put_request(key: &[u8], value_len: usize) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: vec![b'v'; value_len],
        ..Default::default()
    }
}

/// --max-request-bytes (default 1.5 MiB): a Put just under is fine, just over is
/// "request is too large"; the same inside a Txn.
#[tokio::test]
async fn request_size_limit() {
    let Some(mut pair) = start_pair(&[]).await else {
        return;
    };
    // etcd measures the request wrapped in its raft envelope, a few dozen bytes more than
    // the Put itself, so "just under" leaves room for that.
    let under = MAX_REQUEST_BYTES - 1024;
    let over = MAX_REQUEST_BYTES + 1;
    for (what, len) in [("put just under", under), ("put just over", over)] {
        pair.check(what, Request::Put(put_request(b"big", len)))
            .await;
    }
    for (what, len) in [("txn just under", under), ("txn just over", over)] {
        let txn = TxnRequest {
            success: vec![RequestOp::from(put_request(b"big2", len))],
            ..Default::default()
        };
        pair.check(what, Request::Txn(txn)).await;
    }
    // Reading the big values back: responses are not limited.
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    pair.check("range over big values", Request::Range(all))
        .await;

    // Far beyond the limit, the gRPC layer rejects the message (grpc-go allows the
    // limit + 512 KiB). The message text comes from the gRPC library, so only the code
    // is compared.
    let huge = Request::Put(put_request(b"huge", 3 << 20));
    let (expected, actual) = pair.send(&huge).await;
    let code = |o: &Outcome| o.as_ref().err().map(|e| e.0);
    assert!(
        code(&expected).is_some() && code(&expected) == code(&actual),
        "{}",
        pair.mismatch("put of 3 MiB, gRPC code only", &huge, &expected, &actual)
    );
}

/// Non-default --max-txn-ops and --max-request-bytes are honoured the same way.
#[tokio::test]
async fn custom_limits() {
    let Some(mut pair) = start_pair(&["--max-txn-ops", "4", "--max-request-bytes", "4096"]).await
    else {
        return;
    };
    let get = |key: &[u8]| {
        RequestOp::from(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })
    };
    for n in [4, 5] {
        let txn = TxnRequest {
            success: (0..n).map(|_| get(b"a")).collect(),
            ..Default::default()
        };
        pair.check(&format!("txn with {n} ops"), Request::Txn(txn))
            .await;
    }
    for len in [3000, 4097] {
        pair.check(
            &format!("put of {len} bytes"),
            Request::Put(put_request(b"k", len)),
        )
        .await;
    }
}
