//! Watch service, differential against real etcd 3.5.1: each test runs one scenario
//! (writes, watch requests, reads of the response stream) against a fresh etcd and a
//! fresh cetera at the same time and compares the two transcripts step by step (see
//! `common::differential`). Header fields that identify the server (cluster_id,
//! member_id, raft_term) are never shown; revisions are, and both servers see the same
//! writes, so they agree on them.
//!
//! Where etcd's response boundaries depend on timing (a watcher catching up on history
//! gets its events batched as they are found), the transcript records the control
//! responses (created, canceled) and each watch id's flattened event sequence instead.
//! Where several watchers on a stream answer one write, responses are sorted by watch id:
//! etcd sends them in no particular order.
//!
//! Also here: two guarantees checked as invariants because etcd's exact output there is
//! timing-dependent (RequestProgress during a replay, compaction racing a replay), and
//! `etcdctl watch` (plain, JSON, compacted, interactive with `progress`), compared
//! between the two servers.
//!
//! `CETERA_DIFF_SELF_CHECK=1` compares etcd with a second etcd instead: that must pass.
//! `CETERA_DIFF_VERBOSE=1` prints etcd's transcripts.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::watch_create_request::FilterType;
use cetera::proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RequestOp, TxnRequest, WatchCreateRequest,
    request_op::Request as Op,
};
use cetera::proto::ops;
use common::{Side, differential, progress_notify_interval_flag};
use tokio_stream::StreamExt as _;

/// How long to listen for responses that must not come.
const SILENCE: Duration = Duration::from_millis(300);

/// A watch on one key, from now, no options.
fn key(key: &[u8]) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.to_vec(),
        ..Default::default()
    }
}

/// A watch on `[key, range_end)`.
fn range(key: &[u8], range_end: &[u8]) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        ..Default::default()
    }
}

/// A watch on every key (`"\0"` to `"\0"`), as `etcdctl watch --prefix ""` sends.
fn everything() -> WatchCreateRequest {
    range(b"\0", b"\0")
}

// ---------------------------------------------------------------------------------------
// Start revisions
// ---------------------------------------------------------------------------------------

/// start_revision 0 means "from the next write"; only the watched key's events come, one
/// response per revision, header revision = the event's revision.
#[tokio::test]
async fn from_now_on_one_key() {
    differential(&[], &[], async |s: &mut Side| {
        s.put(b"a", b"before").await;
        let mut ws = s.watch();
        ws.create(key(b"a"));
        s.recv(&mut ws, "created, header = current revision").await;
        s.quiet(&mut ws, SILENCE, "the earlier put is not replayed")
            .await;
        s.put(b"a", b"1").await;
        s.recv(&mut ws, "PUT a=1").await;
        s.put(b"b", b"1").await;
        s.put(b"ab", b"1").await;
        s.put(b"a", b"2").await;
        s.recv(&mut ws, "PUT a=2; b and ab are not watched").await;
        s.delete(b"a", b"").await;
        s.recv(&mut ws, "DELETE a: key and mod_revision only").await;
        s.put(b"a", b"3").await;
        s.recv(&mut ws, "PUT a=3: recreated, version 1").await;
        // Writes that change nothing make no events (and no revision).
        s.delete(b"missing", b"").await;
        s.delete(b"m", b"n").await;
        let read_only = TxnRequest {
            success: vec![RequestOp {
                request: Some(Op::RequestRange(
                    cetera::proto::etcdserverpb::RangeRequest {
                        key: b"a".to_vec(),
                        ..Default::default()
                    },
                )),
            }],
            ..Default::default()
        };
        s.txn("read-only txn", read_only).await;
        s.quiet(&mut ws, SILENCE, "no events for writes that change nothing")
            .await;
        s.put(b"a", b"3").await;
        s.recv(&mut ws, "PUT of the same value: still an event")
            .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// prev_kv: every non-create event carries the kv as of mod_revision - 1.
#[tokio::test]
async fn prev_kv_on_put_and_delete() {
    differential(&[], &[], async |s: &mut Side| {
        s.put(b"a", b"1").await;
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            prev_kv: true,
            ..range(b"a", b"c")
        });
        s.recv(&mut ws, "created").await;
        s.put(b"a", b"2").await;
        s.recv(&mut ws, "PUT a=2 with prev a=1").await;
        s.put(b"b", b"1").await;
        s.recv(&mut ws, "PUT b=1 (a create): no prev_kv").await;
        s.delete(b"a", b"").await;
        s.recv(&mut ws, "DELETE a with prev a=2").await;
        s.put(b"a", b"3").await;
        s.recv(&mut ws, "PUT a=3 after delete: a create, no prev_kv")
            .await;
        s.put_req(PutRequest {
            key: b"b".to_vec(),
            ignore_value: true,
            ..Default::default()
        })
        .await;
        s.recv(&mut ws, "PUT b with ignore_value: old value, prev_kv")
            .await;
        s.delete(b"a", b"c").await;
        s.recv(
            &mut ws,
            "DELETE a and b in one response, by key, each with prev",
        )
        .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// Watchers starting in the past replay history (with prev_kv when asked), then go on
/// live. Batching while catching up is timing-dependent, so the replay is compared
/// flattened.
#[tokio::test]
async fn historical_start_revisions() {
    differential(&[], &[], async |s: &mut Side| {
        s.put(b"a", b"1").await; // 2
        s.put(b"b", b"1").await; // 3
        s.put(b"a", b"2").await; // 4
        s.delete(b"b", b"").await; // 5
        let txn = TxnRequest {
            success: vec![ops::put(b"c", b"1", 0), ops::put(b"d", b"1", 0)],
            ..Default::default()
        };
        s.txn("txn put c, d", txn).await; // 6
        s.put(b"a", b"3").await; // 7
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            start_revision: 2,
            ..key(b"a")
        });
        ws.create(WatchCreateRequest {
            start_revision: 3,
            prev_kv: true,
            ..range(b"a", b"\0")
        });
        ws.create(WatchCreateRequest {
            start_revision: 7,
            prev_kv: true,
            ..key(b"a")
        });
        ws.create(WatchCreateRequest {
            start_revision: 1,
            ..everything()
        });
        s.recv_flat(&mut ws, 4, 3 + 6 + 1 + 7, "four created, then the replays")
            .await;
        s.put(b"a", b"4").await;
        s.recv_sorted(&mut ws, 4, "live PUT a=4 for every watcher")
            .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// A start revision in the future: created at once, events only from that revision.
#[tokio::test]
async fn future_start_revision() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            start_revision: 4,
            prev_kv: true,
            ..key(b"a")
        });
        s.recv(&mut ws, "created at revision 1").await;
        s.put(b"a", b"2").await;
        s.put(b"a", b"3").await;
        s.quiet(&mut ws, SILENCE, "revisions 2 and 3 are before the start")
            .await;
        s.put(b"a", b"4").await;
        s.recv(&mut ws, "PUT a=4 at revision 4").await;
        s.put(b"a", b"5").await;
        s.recv(&mut ws, "PUT a=5").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// A start revision below the compact revision: created, then canceled with the compact
/// revision. At the compact revision itself: fine, but prev_kv older than it is gone.
#[tokio::test]
async fn compacted_start_revision() {
    differential(&[], &[], async |s: &mut Side| {
        for v in [b"1", b"2", b"3", b"4", b"5"] {
            s.put(b"a", v).await; // 2..=6
        }
        s.compact(4).await;
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            start_revision: 2,
            prev_kv: true,
            ..key(b"a")
        });
        ws.create(WatchCreateRequest {
            start_revision: 4,
            prev_kv: true,
            ..key(b"a")
        });
        ws.create(WatchCreateRequest {
            start_revision: 3,
            ..everything()
        });
        s.recv_flat(
            &mut ws,
            5,
            3,
            "three created; 0 and 2 canceled with compact_revision 4; 1 replays from 4",
        )
        .await;
        s.put(b"a", b"6").await;
        s.recv(&mut ws, "only watcher 1 is left").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// A negative start revision.
#[tokio::test]
async fn negative_start_revision() {
    differential(&[], &[], async |s: &mut Side| {
        s.put(b"a", b"1").await;
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            start_revision: -5,
            ..key(b"a")
        });
        // etcd 3.5.1 takes the watch (created, then the put); 3.7 refuses
        // it in one answer, created and canceled.
        let answers = if common::oracle().is_36_or_later() {
            1
        } else {
            2
        };
        s.recv_flat(&mut ws, answers, 0, "start_revision -5").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "the stream still works").await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Key ranges and filters
// ---------------------------------------------------------------------------------------

/// Single key, range, prefix, from-key, and the empty key (which means "\0").
#[tokio::test]
async fn key_ranges() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        let watchers = [
            ("0: [a, c)", range(b"a", b"c")),
            ("1: prefix p/", range(b"p/", b"p0")),
            ("2: from m", range(b"m", b"\0")),
            ("3: empty key (= key \\0)", key(b"")),
            ("4: empty key to \\0 (everything)", range(b"", b"\0")),
            ("5: \\0 to \\0 (everything)", everything()),
            ("6: key \\xff", key(b"\xff")),
        ];
        for (label, create) in watchers {
            ws.create(create);
            s.recv(&mut ws, &format!("created {label}")).await;
        }
        // (key, how many watchers see it)
        let writes: [(&[u8], usize); 10] = [
            (b"a", 3),
            (b"b", 3),
            (b"c", 2),
            (b"p/", 4),
            (b"p/x", 4),
            (b"p0", 3),
            (b"m", 3),
            (b"\0", 3),
            (b"\0\0", 2),
            (b"\xff", 4),
        ];
        for (k, n) in writes {
            s.put(k, b"v").await;
            s.recv_sorted(&mut ws, n, &format!("events for {}", common::show(k)))
                .await;
        }
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// key >= range_end: created and canceled at once, watch_id -1; no id is used up.
#[tokio::test]
async fn empty_range_is_refused() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(range(b"b", b"a"));
        s.recv(&mut ws, "key b, range_end a").await;
        ws.create(range(b"a", b"a"));
        s.recv(&mut ws, "key a, range_end a").await;
        ws.create(range(b"", b"\x00\x00"));
        s.recv(&mut ws, "empty key, range_end \\0\\0: a valid range")
            .await;
        ws.create(key(b"x"));
        s.recv(&mut ws, "next automatic id").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// NOPUT and NODELETE; a watcher whose events are all filtered gets no response at all.
#[tokio::test]
async fn filters() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            filters: vec![FilterType::Noput as i32],
            prev_kv: true,
            ..key(b"a")
        });
        s.recv(&mut ws, "created 0: NOPUT").await;
        ws.create(WatchCreateRequest {
            filters: vec![FilterType::Nodelete as i32],
            prev_kv: true,
            ..key(b"a")
        });
        s.recv(&mut ws, "created 1: NODELETE").await;
        ws.create(WatchCreateRequest {
            filters: vec![FilterType::Noput as i32, FilterType::Nodelete as i32],
            ..key(b"a")
        });
        s.recv(&mut ws, "created 2: both filters").await;
        s.put(b"a", b"1").await;
        s.recv(&mut ws, "PUT goes to 1 only").await;
        s.put(b"a", b"2").await;
        s.recv(&mut ws, "PUT goes to 1 only").await;
        s.delete(b"a", b"").await;
        s.recv(&mut ws, "DELETE goes to 0 only").await;
        let txn = TxnRequest {
            success: vec![ops::put(b"a", b"3", 0), ops::delete(b"a")],
            ..Default::default()
        };
        // etcd refuses a put and a delete of one key in one txn; use two keys instead.
        s.txn("txn put a, delete a (refused)", txn).await;
        s.put(b"b", b"1").await;
        let txn = TxnRequest {
            success: vec![ops::put(b"a", b"4", 0), ops::delete(b"b")],
            ..Default::default()
        };
        s.txn("txn put a, delete b", txn).await;
        s.recv(&mut ws, "PUT a to 1").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Watch ids, cancel, several watchers
// ---------------------------------------------------------------------------------------

/// Automatic ids start at 0 on every stream and skip ids the client chose; a client id in
/// use is refused (created + canceled, watch_id -1).
#[tokio::test]
async fn watch_ids() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            watch_id: 1,
            ..key(b"a")
        });
        s.recv(&mut ws, "client id 1").await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "automatic: 0").await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "automatic: 2, since 1 is taken").await;
        ws.create(WatchCreateRequest {
            watch_id: 1,
            ..key(b"b")
        });
        s.recv(&mut ws, "client id 1 again: duplicate").await;
        ws.create(WatchCreateRequest {
            watch_id: 2,
            ..key(b"b")
        });
        s.recv(&mut ws, "client id 2, taken by an automatic id")
            .await;
        ws.create(WatchCreateRequest {
            watch_id: 100,
            ..key(b"a")
        });
        s.recv(&mut ws, "client id 100").await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "automatic: 3").await;

        let mut other = s.watch();
        other.create(key(b"a"));
        s.recv(&mut other, "another stream starts again at 0").await;

        s.put(b"a", b"1").await;
        s.recv_sorted(&mut ws, 5, "watchers 0, 1, 2, 3, 100 see the PUT")
            .await;
        s.recv(&mut other, "and the other stream's watcher 0").await;
        s.put(b"b", b"1").await;
        s.quiet(&mut ws, SILENCE, "the refused watchers on b do not exist")
            .await;
    })
    .await;
}

/// A cancel is answered with {watch_id, canceled}; cancelling an unknown id is ignored;
/// the id is not reused by the next automatic id.
#[tokio::test]
async fn cancel() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(key(b"a"));
        s.recv(&mut ws, "created 0").await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "created 1").await;
        s.put(b"a", b"1").await;
        s.recv_sorted(&mut ws, 2, "both see the PUT").await;
        ws.cancel(0);
        s.recv(&mut ws, "cancel 0").await;
        s.put(b"a", b"2").await;
        s.recv(&mut ws, "only 1 sees the next PUT").await;
        ws.cancel(0);
        s.quiet(&mut ws, SILENCE, "cancel 0 again: no answer").await;
        ws.cancel(42);
        s.quiet(&mut ws, SILENCE, "cancel an id never used: no answer")
            .await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "the next automatic id").await;
        ws.cancel(1);
        s.recv(&mut ws, "cancel 1").await;
        s.put(b"a", b"3").await;
        s.recv(&mut ws, "only the newest sees the PUT").await;
    })
    .await;
}

/// Creates sent back to back, refused ones among them, are answered in the order sent:
/// the Go client pairs created responses with its requests first-in first-out.
#[tokio::test]
async fn creates_answered_in_order() {
    differential(&[], &[], async |s: &mut Side| {
        for i in 0..5u8 {
            s.put(&[b'k', b'0' + i], b"v").await; // 2..=6
        }
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            start_revision: 2,
            ..range(b"k", b"l")
        });
        ws.create(range(b"k", b"j"));
        ws.create(WatchCreateRequest {
            watch_id: 7,
            start_revision: 5,
            prev_kv: true,
            ..range(b"k", b"l")
        });
        ws.create(WatchCreateRequest {
            watch_id: 7,
            ..key(b"k0")
        });
        ws.create(WatchCreateRequest {
            start_revision: 100,
            ..key(b"k0")
        });
        ws.create(key(b"k4"));
        s.recv_flat(&mut ws, 6, 5 + 2, "six created in order, then replays")
            .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// Requests etcd tolerates: an empty WatchRequest is ignored, an unknown filter value
/// filters nothing, a negative client-chosen watch id is used as is.
#[tokio::test]
async fn odd_requests() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.send_empty();
        s.quiet(&mut ws, SILENCE, "empty WatchRequest: ignored")
            .await;
        ws.create(WatchCreateRequest {
            filters: vec![7],
            ..key(b"a")
        });
        s.recv(&mut ws, "unknown filter 7").await;
        ws.create(WatchCreateRequest {
            watch_id: -5,
            ..key(b"a")
        });
        s.recv(&mut ws, "client watch id -5").await;
        ws.create(WatchCreateRequest {
            watch_id: -1,
            ..key(b"a")
        });
        s.recv(&mut ws, "client watch id -1").await;
        s.put(b"a", b"1").await;
        s.delete(b"a", b"").await;
        s.recv_flat(&mut ws, 0, 6, "each watcher sees PUT and DELETE")
            .await;
        ws.cancel(-5);
        s.recv(&mut ws, "cancel -5").await;
        ws.send_empty();
        ws.create(key(b"b"));
        s.recv(&mut ws, "the stream still works").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// A client that half-closes its side keeps the stream: etcd goes on sending events, and
/// the call ends only when the client cancels it or its deadline passes, whatever the
/// client sent before (nothing, an empty WatchRequest, a cancel of an unknown id).
#[tokio::test]
async fn half_closed_stream_stays_open() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(key(b"a"));
        s.recv(&mut ws, "created").await;
        ws.close_send();
        s.put(b"a", b"1").await;
        s.recv(&mut ws, "after the half-close: PUT a=1").await;
        s.put(b"a", b"2").await;
        s.recv(&mut ws, "and PUT a=2").await;
        drop(ws);

        type Send = fn(&common::WatchStream);
        let cases: [(&str, Send); 3] = [
            ("nothing sent", |_| {}),
            ("an empty WatchRequest", |ws| ws.send_empty()),
            ("a cancel of an unknown id", |ws| ws.cancel(42)),
        ];
        for (what, send) in cases {
            let mut ws = s.watch();
            send(&ws);
            ws.close_send();
            let step = format!("{what}, then half-close: the call goes on");
            s.quiet(&mut ws, SILENCE, &step).await;
        }

        // A Go server sends a stream's headers with its first message, and tonic's
        // client times out waiting for them, so the deadline is seen only on a stream
        // that has answered something.
        let mut ws = s.watch_with_deadline(Duration::from_secs(3));
        ws.create(key(b"a"));
        s.recv(&mut ws, "created, on a call with a deadline").await;
        ws.close_send();
        let outcome = ws.recv(Duration::from_secs(20)).await;
        s.note(
            "half-closed: the call ends at its deadline",
            at_deadline(outcome.map_or_else(|e| e, |r| common::show_watch_response(&r))),
        );
    })
    .await;
}

/// How a call is seen to end at its deadline, with etcd 3.7.3's two answers as one.
/// Its gRPC-Go (v1.83) ends a call with a deadline twice over, racing: the call's context
/// expires, so etcd's Watch handler returns DeadlineExceeded (`watchServer.Watch` in
/// server/etcdserver/api/v3rpc/watch.go), and a transport timer of the same length resets
/// the stream with CANCEL (`operateHeaders` in internal/transport/http2_server.go), which
/// tonic reports as Cancelled. Whichever reaches the connection first wins (a status written
/// after the reset is dropped): against one member, 13 runs of 20 gave Cancelled and 7
/// DeadlineExceeded. The timer came with grpc-go's pull request 8071 (2025); etcd 3.5.1's
/// gRPC-Go has none, so its one answer stays as it is. cetera always answers
/// DeadlineExceeded, one of etcd 3.7.3's.
fn at_deadline(outcome: String) -> String {
    const ETCD_37_ANSWERS: [&str; 2] = [
        "stream error DeadlineExceeded: context deadline exceeded",
        "stream error Cancelled: h2 protocol error: error reading a body from connection",
    ];
    if common::oracle().is_36_or_later() && ETCD_37_ANSWERS.contains(&outcome.as_str()) {
        "ended at its deadline (DeadlineExceeded, or Cancelled by the reset)".to_string()
    } else {
        outcome
    }
}

/// A codec that sends its messages' bytes as they are, to put undecodable bytes on a
/// Watch stream, and decodes WatchResponses.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = cetera::proto::etcdserverpb::WatchResponse;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = cetera::proto::etcdserverpb::WatchResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        prost::Message::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// Sends `payload` as the only message of a Watch stream, keeping the sending side open,
/// and describes how the call ends.
async fn send_raw(channel: tonic::transport::Channel, payload: Vec<u8>) -> String {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("channel ready");
    let requests = tokio_stream::iter([payload]).chain(tokio_stream::pending());
    let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
    let call = grpc.streaming(tonic::Request::new(requests), path, RawCodec);
    let ended = |status: tonic::Status| format!("ERR {:?}: {}", status.code(), status.message());
    match tokio::time::timeout(Duration::from_secs(10), async {
        let mut responses = call.await?.into_inner();
        let mut seen = Vec::new();
        while let Some(response) = responses.message().await? {
            seen.push(common::show_watch_response(&response));
        }
        Ok::<_, tonic::Status>(format!("ended OK after [{}]", seen.join("; ")))
    })
    .await
    {
        Ok(Ok(text)) => text,
        Ok(Err(status)) => ended(status),
        Err(_) => "still open after 10s".to_string(),
    }
}

/// Undecodable bytes on a Watch stream end the call with INTERNAL and gRPC's unmarshal
/// message, which quotes the protobuf decoder's error (gogo-protobuf's in 3.5, protobuf-go's
/// one text in 3.7); an oversized message, with RESOURCE_EXHAUSTED. A known field of another
/// wire type is refused by 3.5 and skipped by 3.7.
#[tokio::test]
async fn undecodable_request() {
    differential(&[], &[], async |s: &mut Side| {
        let payloads: [(&str, &[u8]); 13] = [
            ("a truncated tag", &[0xff]),
            ("a field longer than the message", &[0x0a, 0x05, 0x01]),
            ("field 0", &[0x00, 0x01]),
            ("an end-group tag", &[0x0c]),
            ("wire type 7", &[0x0f]),
            ("a bad field inside the create", &[0x0a, 0x02, 0x08, 0x01]),
            ("field 2^29", &[0x80, 0x80, 0x80, 0x80, 0x10]),
            ("wire type 6, unknown field", &[0x4e]),
            ("a group never ended", &[0x4b, 0x08, 0x01]),
            (
                "a packed filter running past its field",
                &[0x0a, 0x03, 0x2a, 0x01, 0x80],
            ),
            (
                "a fixed32 watch id in a create",
                &[0x0a, 0x07, 0x3d, 1, 2, 3, 4, 0x38, 0x09],
            ),
            (
                "an eleven-byte varint in a cancel",
                &[
                    0x12, 0x0c, 0x38, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                    0x01,
                ],
            ),
            ("a message over the size limit", &[0x0a; 3 << 20]),
        ];
        for (what, payload) in payloads {
            let outcome = send_raw(s.channel.clone(), payload.to_vec()).await;
            s.note(what, outcome);
        }
    })
    .await;
}

/// With fragment=true, a response larger than max-request-bytes + 512 KiB with at least
/// two events is split; every piece but the last has fragment=true. Without it, one big
/// response.
#[tokio::test]
async fn fragments() {
    differential(&[], &[], async |s: &mut Side| {
        let big = vec![b'x'; 750_000];
        for k in [b"a", b"b", b"c"] {
            s.put(k, &big).await;
        }
        s.put(b"d", b"small").await;
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            prev_kv: true,
            fragment: true,
            ..everything()
        });
        s.recv(&mut ws, "created 0 with fragment").await;
        let mut plain = s.watch();
        plain.create(WatchCreateRequest {
            prev_kv: true,
            ..everything()
        });
        s.recv(&mut plain, "created 0 without fragment").await;
        s.delete(b"a", b"e").await;
        s.recv(&mut ws, "first fragment").await;
        s.recv(&mut ws, "last fragment").await;
        s.recv(&mut plain, "one response").await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Atomicity
// ---------------------------------------------------------------------------------------

/// All events of one revision come in one response, in the order the Txn made them
/// (a DeleteRange's deletions by key).
#[tokio::test]
async fn txn_events_in_one_response() {
    differential(&[], &[], async |s: &mut Side| {
        for k in [b"c", b"d", b"e", b"z"] {
            s.put(k, b"1").await;
        }
        let mut ws = s.watch();
        ws.create(WatchCreateRequest {
            prev_kv: true,
            ..everything()
        });
        s.recv(&mut ws, "created").await;
        ws.create(range(b"a", b"d"));
        s.recv(&mut ws, "created, sees part of the txn").await;
        let txn = TxnRequest {
            success: vec![
                ops::put(b"b", b"1", 0),
                ops::delete(b"c"),
                ops::put(b"a", b"1", 0),
                RequestOp::from(DeleteRangeRequest {
                    key: b"d".to_vec(),
                    range_end: b"f".to_vec(),
                    ..Default::default()
                }),
                ops::put(b"z", b"2", 0),
            ],
            ..Default::default()
        };
        s.txn("txn put b, delete c, put a, delete d..f, put z", txn)
            .await;
        s.recv_sorted(&mut ws, 2, "one response per watcher with all its events")
            .await;
        s.delete(b"\0", b"\0").await;
        s.recv_sorted(&mut ws, 2, "delete everything: by key").await;
        let nested = TxnRequest {
            success: vec![
                ops::put(b"y", b"1", 0),
                RequestOp {
                    request: Some(Op::RequestTxn(TxnRequest {
                        success: vec![ops::put(b"x", b"1", 0), ops::put(b"b", b"2", 0)],
                        ..Default::default()
                    })),
                },
                ops::put(b"w", b"1", 0),
            ],
            ..Default::default()
        };
        s.txn("nested txn put y, (put x, put b), put w", nested)
            .await;
        s.recv_sorted(&mut ws, 2, "nested txn: one response per watcher")
            .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------------------

/// RequestProgress on a synced stream: watch_id -1, header revision = current.
#[tokio::test]
async fn request_progress() {
    differential(&[], &[], async |s: &mut Side| {
        let mut ws = s.watch();
        ws.request_progress();
        s.recv(&mut ws, "progress on a stream without watchers")
            .await;
        ws.create(key(b"a"));
        s.recv(&mut ws, "created").await;
        s.put(b"b", b"1").await;
        ws.request_progress();
        s.recv(&mut ws, "progress after an unwatched write").await;
        s.put(b"a", b"1").await;
        s.recv(&mut ws, "PUT a").await;
        ws.request_progress();
        s.recv(&mut ws, "progress after the event").await;
        ws.cancel(0);
        s.recv(&mut ws, "canceled").await;
        s.put(b"b", b"2").await;
        ws.request_progress();
        s.recv(&mut ws, "progress after the last watcher is gone")
            .await;
        s.quiet(&mut ws, SILENCE, "nothing else").await;
    })
    .await;
}

/// progress_notify with a short interval: notifications carry the watcher's own id,
/// no events, header revision = current; only watchers that asked get them. Their timing
/// and count are not compared.
#[tokio::test]
async fn progress_notify() {
    let etcd = [progress_notify_interval_flag(), "300ms"];
    let cetera = ["--watch-progress-notify-interval", "300ms"];
    differential(&etcd, &cetera, async |s: &mut Side| {
        let mut ws = s.watch();
        ws.create(key(b"q"));
        s.recv(&mut ws, "created 0, without progress_notify").await;
        ws.create(WatchCreateRequest {
            progress_notify: true,
            ..key(b"a")
        });
        s.recv(&mut ws, "created 1, with progress_notify").await;
        first_notification(s, &mut ws, 1, "a notification at revision 1").await;
        s.put(b"b", b"1").await;
        first_notification(s, &mut ws, 2, "after an unwatched write: revision 2").await;
        s.put(b"a", b"1").await;
        s.recv(&mut ws, "the PUT").await;
        first_notification(s, &mut ws, 3, "then revision 3").await;
        ws.create(WatchCreateRequest {
            progress_notify: true,
            start_revision: 2,
            ..key(b"b")
        });
        s.recv_flat(&mut ws, 1, 1, "created 2 (catching up), its event")
            .await;
    })
    .await;
}

/// Reads notifications for up to 3 s until one reports at least `revision`; records it,
/// or anything else that arrived: events, or a notification for another watch id.
async fn first_notification(s: &mut Side, ws: &mut common::WatchStream, revision: i64, step: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut other = Vec::new();
    let outcome = loop {
        match ws
            .recv(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            Ok(r) => {
                let is_progress = r.events.is_empty() && !r.created && !r.canceled;
                if !is_progress || r.watch_id != 1 {
                    other.push(format!("unexpected: {}", common::show_watch_response(&r)));
                } else if common::header_rev(&r.header) >= revision {
                    break common::show_watch_response(&r);
                }
            }
            Err(e) => break format!("ERROR: {e}"),
        }
    };
    other.push(outcome);
    s.note(step, other.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Guarantees while catching up (invariants rather than comparison: what etcd does here
// depends on timing)
// ---------------------------------------------------------------------------------------

/// Puts `count` keys `big/N` with `value_bytes`-byte values, one revision each.
async fn put_many(endpoint: &str, count: usize, value_bytes: usize) {
    let mut kv =
        cetera::proto::etcdserverpb::kv_client::KvClient::new(common::channel(endpoint).await);
    for n in 0..count {
        kv.put(PutRequest {
            key: format!("big/{n:04}").into_bytes(),
            value: vec![b'v'; value_bytes],
            ..Default::default()
        })
        .await
        .expect("put");
    }
}

/// RequestProgress while a watcher is still replaying history: the answer (watch_id
/// -1, current revision) must come after every event up to that revision, as the
/// apiserver's consistent reads assume. cetera only: etcd 3.5.1 answers at once, ahead
/// of the replay (fixed in later 3.5 releases).
#[tokio::test]
async fn request_progress_waits_for_catch_up() {
    let cetera = common::Cetera::start().await;
    put_many(&cetera.endpoint(), 300, 2000).await; // revisions 2..=301
    let mut ws = common::WatchStream::open(common::channel(&cetera.endpoint()).await, false);
    ws.create(WatchCreateRequest {
        start_revision: 2,
        prev_kv: true,
        ..range(b"big/", b"big0")
    });
    for _ in 0..5 {
        ws.request_progress();
    }
    let created = ws.recv(common::WAIT).await.expect("created");
    assert!(created.created, "{}", common::show_watch_response(&created));
    let (mut next, mut answers) = (2, 0);
    while answers < 5 {
        let r = ws.recv(common::WAIT).await.expect("response");
        if r.watch_id == -1 {
            let rev = common::header_rev(&r.header);
            assert_eq!(rev, 301, "progress answer at the current revision");
            assert_eq!(next, 302, "progress at {rev} before the event at {next}");
            answers += 1;
            continue;
        }
        for event in &r.events {
            let rev = event.kv.as_ref().expect("kv").mod_revision;
            assert_eq!(rev, next, "events in order, none missing");
            next += 1;
        }
    }
}

/// A watcher replaying history for a client that does not read, overtaken by a
/// compaction: its events must stay contiguous, ending either with every revision or
/// with a cancel whose compact_revision shows the next revision is gone. Never a silent
/// gap. Runs on etcd too, to show the check is fair.
#[tokio::test]
async fn compaction_during_catch_up_never_skips() {
    let cetera = common::Cetera::start().await;
    compaction_during_catch_up(&cetera.endpoint()).await;
}

#[tokio::test]
async fn compaction_during_catch_up_never_skips_on_etcd() {
    let Some(etcd) = common::Etcd::start().await else {
        return;
    };
    compaction_during_catch_up(&etcd.endpoint()).await;
}

async fn compaction_during_catch_up(endpoint: &str) {
    // 1500 revisions, 4.5 MB: etcd replays at most 1000 revisions per response, and
    // the first response alone is more than the client's HTTP/2 window takes in while
    // it does not read, so the rest is still to be read when the compaction comes.
    put_many(endpoint, 1500, 3000).await; // revisions 2..=1501
    let channel = common::channel(endpoint).await;
    let mut ws = common::WatchStream::open(channel.clone(), false);
    ws.create(WatchCreateRequest {
        start_revision: 2,
        ..range(b"big/", b"big0")
    });
    // Compacts right away, racing the start of the replay, while not reading: the
    // replay stalls on flow control.
    let mut kv = cetera::proto::etcdserverpb::kv_client::KvClient::new(channel);
    kv.compact(cetera::proto::etcdserverpb::CompactionRequest {
        revision: 1400,
        physical: true,
    })
    .await
    .expect("compact");
    let created = ws.recv(common::WAIT).await.expect("created");
    assert!(created.created, "{}", common::show_watch_response(&created));
    let mut next = 2;
    loop {
        let r = ws
            .recv(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("after revision {}: {e}", next - 1));
        for event in &r.events {
            let rev = event.kv.as_ref().expect("kv").mod_revision;
            assert_eq!(rev, next, "events contiguous: {rev} after {}", next - 1);
            next += 1;
        }
        if r.canceled {
            assert!(
                r.compact_revision > next,
                "canceled at compact revision {} although revision {next} was still there",
                r.compact_revision
            );
            eprintln!(
                "canceled after revision {} (compacted at {})",
                next - 1,
                r.compact_revision
            );
            return;
        }
        if next == 1502 {
            eprintln!("every revision delivered despite the compaction");
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// etcdctl watch
// ---------------------------------------------------------------------------------------

/// `etcdctl watch` in the background on a prefix, with and without --prev-kv and JSON
/// output, while another etcdctl writes: stdout must match.
#[tokio::test]
async fn etcdctl_watch() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    differential(&[], &[], async |s: &mut Side| {
        run_etcdctl(s, &etcdctl, &["put", "p/a", "0"]); // revision 2
        run_etcdctl(s, &etcdctl, &["put", "p/b", "0"]); // revision 3
        let watchers = [
            background(
                &etcdctl,
                &s.addr,
                &["watch", "--prefix", "p/", "--rev", "2"],
            ),
            background(
                &etcdctl,
                &s.addr,
                &["watch", "--prefix", "p/", "--rev", "3", "--prev-kv"],
            ),
            background(
                &etcdctl,
                &s.addr,
                &["watch", "p/a", "--rev", "2", "-w", "json"],
            ),
            background(&etcdctl, &s.addr, &["watch", "p/b", "p/d", "--rev", "2"]),
        ];
        // Each has replayed something once its output settles: from then on, the
        // watchers are synced and get one response per revision (while catching up,
        // etcd's batching depends on timing).
        for (_, out) in &watchers {
            settled_output(out);
        }
        run_etcdctl(s, &etcdctl, &["put", "p/a", "1"]);
        run_etcdctl(s, &etcdctl, &["put", "p/b", "héllo wörld"]);
        run_etcdctl(s, &etcdctl, &["put", "q/x", "not watched"]);
        run_etcdctl(s, &etcdctl, &["put", "p/c", "multi\nline"]);
        run_etcdctl(s, &etcdctl, &["del", "p/a"]);
        // One revision with three events.
        etcdctl_stdin(
            s,
            &etcdctl,
            &["txn"],
            "\nput p/x 1\nput p/y 2\ndel p/c\n\n\n",
        );
        run_etcdctl(s, &etcdctl, &["del", "--prefix", "p/"]);
        for (mut child, out) in watchers {
            let text = settled_output(&out);
            let _ = child.kill();
            let _ = child.wait();
            s.note("etcdctl watch output", common::normalize_etcdctl(&text));
        }
    })
    .await;
}

fn run_etcdctl(s: &mut Side, etcdctl: &Path, args: &[&str]) {
    let out = common::run_etcdctl(etcdctl, &s.addr, args);
    s.note(
        format!("etcdctl {}", args.join(" ")),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    );
}

/// Starts etcdctl with stdout going to a temp file; returns the child and the file.
fn background(
    etcdctl: &Path,
    addr: &str,
    args: &[&str],
) -> (std::process::Child, tempfile::NamedTempFile) {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let child = Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={addr}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen temp file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcdctl");
    (child, out)
}

/// The file's text once it is non-empty and has not changed for 500 ms (or after 5 s).
fn settled_output(file: &tempfile::NamedTempFile) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut last, mut since) = (String::new(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        if text != last {
            (last, since) = (text, Instant::now());
        } else if (!last.is_empty() && since.elapsed() > Duration::from_millis(500))
            || Instant::now() > deadline
        {
            return last;
        }
    }
}

/// Runs etcdctl with `stdin` as its input and records its stdout and stderr.
fn etcdctl_stdin(s: &mut Side, etcdctl: &Path, args: &[&str], stdin: &str) {
    let mut child = Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", s.addr))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("etcdctl output");
    s.note(
        format!("etcdctl {} <<< {stdin:?}", args.join(" ")),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    );
}

/// `etcdctl watch --rev` below the compact revision: etcdctl reports the cancellation.
#[tokio::test]
async fn etcdctl_watch_compacted() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    differential(&[], &[], async |s: &mut Side| {
        for v in ["1", "2", "3"] {
            run_etcdctl(s, &etcdctl, &["put", "c/a", v]);
        }
        run_etcdctl(s, &etcdctl, &["compaction", "3"]);
        let out = Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", s.addr))
            .args(["watch", "c/a", "--rev", "2"])
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl watch");
        s.note(
            "etcdctl watch c/a --rev 2",
            format!(
                "{}{}{}",
                String::from_utf8_lossy(&out.stdout),
                common::normalize_etcdctl(&String::from_utf8_lossy(&out.stderr)),
                out.status
            ),
        );
    })
    .await;
}

/// `etcdctl watch -i`: watch commands typed on stdin, and `progress`.
#[tokio::test]
async fn etcdctl_watch_interactive() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    differential(&[], &[], async |s: &mut Side| {
        let out = tempfile::NamedTempFile::new().expect("temp file");
        let mut child = Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", s.addr))
            .args(["watch", "-i"])
            .stdin(Stdio::piped())
            .stdout(out.reopen().expect("reopen temp file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcdctl");
        let mut stdin = child.stdin.take().expect("stdin");
        run_etcdctl(s, &etcdctl, &["put", "i/a", "1"]);
        writeln!(stdin, "watch --rev 2 --prefix i/").expect("write stdin");
        s.note("watch --rev 2 --prefix i/", settled_output(&out));
        writeln!(stdin, "progress").expect("write stdin");
        s.note("progress", settled_output(&out));
        run_etcdctl(s, &etcdctl, &["put", "i/b", "2"]);
        writeln!(stdin, "progress").expect("write stdin");
        s.note("put, then progress", settled_output(&out));
        drop(stdin);
        let _ = child.kill();
        let _ = child.wait();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_start_revision_is_refused_from_3_5_24_and_3_6_6() {
    for (version, refused) in [("3.5.13", false), ("3.5.24", true), ("3.6.11", true)] {
        let server = common::Cetera::start_with(&["--emulated-etcd-version", version]).await;
        let mut ws = common::WatchStream::open(common::channel(&server.endpoint()).await, false);
        ws.create(WatchCreateRequest {
            key: b"k".to_vec(),
            start_revision: -1,
            ..Default::default()
        });
        let created = ws.recv(Duration::from_secs(5)).await.unwrap();
        assert!(created.created, "{version}: {created:?}");
        let shown = (created.canceled, created.watch_id, created.cancel_reason);
        let expected = if refused {
            (
                true,
                -1,
                "etcdserver: mvcc: required revision has been compacted".to_string(),
            )
        } else {
            (false, 0, String::new())
        };
        assert_eq!(shown, expected, "{version}");
    }
}
