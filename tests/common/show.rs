//! One-line text forms of keys, values, events, watch responses and call
//! outcomes, for transcripts and assertion messages.

use cetera::proto::etcdserverpb::{ResponseHeader, WatchResponse};

/// Bytes as a quoted, escaped string: `"a/\x00"`; beyond 64 bytes shortened to
/// `"first bytes..."(N bytes)`.
pub fn show(bytes: &[u8]) -> String {
    const SHOWN: usize = 64;
    let escaped: String = bytes
        .iter()
        .take(SHOWN)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > SHOWN {
        format!("\"{escaped}...\"({} bytes)", bytes.len())
    } else {
        format!("\"{escaped}\"")
    }
}

/// A key-value in one line: `"k"="v" c=2 m=3 ver=2` (plus `lease=N` when leased).
pub fn show_kv(kv: &cetera::proto::mvccpb::KeyValue) -> String {
    let mut s = format!(
        "{}={} c={} m={} ver={}",
        show(&kv.key),
        show(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version
    );
    if kv.lease != 0 {
        s += &format!(" lease={}", kv.lease);
    }
    s
}

/// A watch event in one line: `PUT "k"="v" c=2 m=3 ver=2 prev=[...]`.
pub fn show_event(event: &cetera::proto::mvccpb::Event) -> String {
    let kind = match event.r#type {
        0 => "PUT".to_string(),
        1 => "DELETE".to_string(),
        t => format!("type={t}"),
    };
    let kv = event.kv.as_ref().map(show_kv).unwrap_or("no kv".into());
    match &event.prev_kv {
        Some(prev) => format!("{kind} {kv} prev=[{}]", show_kv(prev)),
        None => format!("{kind} {kv}"),
    }
}

/// A watch response in one line, without the header fields that identify the server:
/// `rev=5 id=0 created`, `rev=6 id=0 events=[PUT ...; DELETE ...]`.
pub fn show_watch_response(r: &WatchResponse) -> String {
    let mut s = format!(
        "rev={} id={}",
        r.header.as_ref().map_or(-1, |h| h.revision),
        r.watch_id
    );
    if r.created {
        s += " created";
    }
    if r.canceled {
        s += " canceled";
    }
    if r.compact_revision != 0 {
        s += &format!(" compact_revision={}", r.compact_revision);
    }
    if !r.cancel_reason.is_empty() {
        s += &format!(" reason={:?}", r.cancel_reason);
    }
    if r.fragment {
        s += " fragment";
    }
    if !r.events.is_empty() {
        let events: Vec<String> = r.events.iter().map(show_event).collect();
        s += &format!(" events=[{}]", events.join("; "));
    }
    s
}

/// The revision in a response header (0 when there is no header).
pub fn header_rev(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

/// A unary call's outcome as text: `show(response)`, or `ERR <code>: <message>`.
pub fn outcome<T>(
    result: Result<tonic::Response<T>, tonic::Status>,
    show: impl FnOnce(&T) -> String,
) -> String {
    match result {
        Ok(r) => show(r.get_ref()),
        Err(s) => format!("ERR {:?}: {}", s.code(), s.message()),
    }
}
