//! How a Go etcd server decodes a WatchRequest, and the error it gives for
//! one that does not decode.
//!
//! etcd 3.5 and 3.6 decode requests with gogo-protobuf's generated code,
//! whose errors name the Go message and field (`proto: wrong wireType = 0
//! for field Key`); prost's errors carry too little to rebuild that text (a
//! oneof is one field to it), so [`watch_request_error`] re-reads the bytes
//! the way that code does, checking what it checks in the same order, and
//! reports its first complaint.
//!
//! etcd 3.7's messages are protoc-gen-go's, decoded by protobuf-go, which
//! says [`PROTOBUF_GO_ERROR`] of any bytes it cannot parse and takes a known
//! field of another wire type than its own as an unknown field (skipped when
//! it parses as that wire type) where prost refuses it:
//! [`protobuf_go_watch_request`] re-reads the bytes by those rules and keeps
//! only the fields the Go message would hold, for prost to decode.

/// How the Go decoder reads one field.
#[derive(Clone, Copy)]
enum Kind {
    Varint,
    Bytes,
    /// A repeated enum: one varint, or a packed run of them.
    Varints,
    Message(&'static Schema),
}

/// A message: its Go name and its fields (number, Go name, kind).
struct Schema {
    name: &'static str,
    fields: &'static [(i32, &'static str, Kind)],
}

static WATCH_REQUEST: Schema = Schema {
    name: "WatchRequest",
    fields: &[
        (1, "CreateRequest", Kind::Message(&WATCH_CREATE_REQUEST)),
        (2, "CancelRequest", Kind::Message(&WATCH_CANCEL_REQUEST)),
        (3, "ProgressRequest", Kind::Message(&WATCH_PROGRESS_REQUEST)),
    ],
};

static WATCH_CREATE_REQUEST: Schema = Schema {
    name: "WatchCreateRequest",
    fields: &[
        (1, "Key", Kind::Bytes),
        (2, "RangeEnd", Kind::Bytes),
        (3, "StartRevision", Kind::Varint),
        (4, "ProgressNotify", Kind::Varint),
        (5, "Filters", Kind::Varints),
        (6, "PrevKv", Kind::Varint),
        (7, "WatchId", Kind::Varint),
        (8, "Fragment", Kind::Varint),
    ],
};

static WATCH_CANCEL_REQUEST: Schema = Schema {
    name: "WatchCancelRequest",
    fields: &[(1, "WatchId", Kind::Varint)],
};

static WATCH_PROGRESS_REQUEST: Schema = Schema {
    name: "WatchProgressRequest",
    fields: &[],
};

// gogo-protobuf's error values (io.ErrUnexpectedEOF and the generated ones).
const UNEXPECTED_EOF: &str = "unexpected EOF";
const INTEGER_OVERFLOW: &str = "proto: integer overflow";
const NEGATIVE_LENGTH: &str = "proto: negative length found during unmarshaling";
const UNEXPECTED_END_OF_GROUP: &str = "proto: unexpected end of group";

/// What etcd's decoder says of `bytes` as a WatchRequest; `None` if it
/// would accept them.
pub fn watch_request_error(bytes: &[u8]) -> Option<String> {
    message(&WATCH_REQUEST, bytes).err()
}

/// Reads a varint at `*at` as Go does: at most ten bytes, extra high bits dropped.
fn varint(data: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        if shift >= 64 {
            return Err(INTEGER_OVERFLOW.into());
        }
        let Some(&byte) = data.get(*at) else {
            return Err(UNEXPECTED_EOF.into());
        };
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// Reads a length prefix at `*at` and returns where the field ends. Go reads
/// the length into a signed int, so huge ones are negative.
fn field_end(data: &[u8], at: &mut usize) -> Result<usize, String> {
    let length = varint(data, at)? as i64;
    if length < 0 {
        return Err(NEGATIVE_LENGTH.into());
    }
    let end = (*at as i64).wrapping_add(length);
    if end < 0 {
        return Err(NEGATIVE_LENGTH.into());
    }
    if end as u64 > data.len() as u64 {
        return Err(UNEXPECTED_EOF.into());
    }
    Ok(end as usize)
}

fn message(schema: &Schema, data: &[u8]) -> Result<(), String> {
    let mut at = 0;
    while at < data.len() {
        let start = at;
        let key = varint(data, &mut at)?;
        // Go truncates the field number to an int32.
        let number = (key >> 3) as i32;
        let wire_type = key & 7;
        if wire_type == 4 {
            return Err(format!(
                "proto: {}: wiretype end group for non-group",
                schema.name
            ));
        }
        if number <= 0 {
            // Go prints the whole key as the "wire type".
            return Err(format!(
                "proto: {}: illegal tag {number} (wire type {key})",
                schema.name
            ));
        }
        let wrong = |name: &str| format!("proto: wrong wireType = {wire_type} for field {name}");
        match schema.fields.iter().find(|(n, _, _)| *n == number) {
            Some((_, name, Kind::Varint)) => {
                if wire_type != 0 {
                    return Err(wrong(name));
                }
                varint(data, &mut at)?;
            }
            Some((_, name, Kind::Bytes)) => {
                if wire_type != 2 {
                    return Err(wrong(name));
                }
                at = field_end(data, &mut at)?;
            }
            Some((_, name, Kind::Message(inner))) => {
                if wire_type != 2 {
                    return Err(wrong(name));
                }
                let end = field_end(data, &mut at)?;
                message(inner, &data[at..end])?;
                at = end;
            }
            Some((_, name, Kind::Varints)) => match wire_type {
                0 => {
                    varint(data, &mut at)?;
                }
                2 => {
                    let end = field_end(data, &mut at)?;
                    // Go's packed loop bounds each varint by the message, not the field.
                    while at < end {
                        varint(data, &mut at)?;
                    }
                }
                _ => return Err(wrong(name)),
            },
            None => {
                let skipped = skip(&data[start..])?;
                let end = (start as i64).wrapping_add(skipped);
                if skipped < 0 || end < 0 {
                    return Err(NEGATIVE_LENGTH.into());
                }
                if end as u64 > data.len() as u64 {
                    return Err(UNEXPECTED_EOF.into());
                }
                at = end as usize;
            }
        }
    }
    Ok(())
}

/// The length of the unknown field at the start of `data`, as Go's skip
/// function measures it: it does not check that the field fits.
fn skip(data: &[u8]) -> Result<i64, String> {
    let mut at: i64 = 0;
    let mut depth = 0u32;
    while at < data.len() as i64 {
        let mut index = at as usize;
        let key = varint(data, &mut index)?;
        match key & 7 {
            0 => {
                varint(data, &mut index)?;
                at = index as i64;
            }
            1 => at = index as i64 + 8,
            2 => {
                let length = varint(data, &mut index)? as i64;
                if length < 0 {
                    return Err(NEGATIVE_LENGTH.into());
                }
                at = (index as i64).wrapping_add(length);
            }
            3 => {
                depth += 1;
                at = index as i64;
            }
            4 => {
                if depth == 0 {
                    return Err(UNEXPECTED_END_OF_GROUP.into());
                }
                depth -= 1;
                at = index as i64;
            }
            5 => at = index as i64 + 4,
            other => return Err(format!("proto: illegal wireType {other}")),
        }
        if at < 0 {
            return Err(NEGATIVE_LENGTH.into());
        }
        if depth == 0 {
            return Ok(at);
        }
    }
    Err(UNEXPECTED_EOF.into())
}

/// protobuf-go's text for every wire-format fault (`errDecode` in
/// internal/impl/decode.go), whatever and wherever it is.
pub const PROTOBUF_GO_ERROR: &str = "proto: cannot parse invalid wire-format data";

/// The largest field number (protowire.MaxValidNumber).
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;

/// How deep protobuf-go follows groups nested in an unknown field
/// (protowire.DefaultRecursionLimit).
const GROUP_DEPTH_LIMIT: i32 = 10_000;

/// The WatchRequest etcd 3.7 reads from `bytes`: the bytes with every field
/// protobuf-go would not set on the message left out (prost then decodes
/// them as protobuf-go would), or `None` where protobuf-go fails.
pub fn protobuf_go_watch_request(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut kept = Vec::with_capacity(bytes.len());
    protobuf_go_message(&WATCH_REQUEST, bytes, &mut kept)?;
    Some(kept)
}

/// A varint as protowire.ConsumeVarint reads it (at most ten bytes, the
/// tenth 0 or 1), which is the rule prost's reader follows.
fn protobuf_go_varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut rest = data.get(*at..)?;
    let before = rest.len();
    let value = prost::encoding::decode_varint(&mut rest).ok()?;
    *at += before - rest.len();
    Some(value)
}

/// A length-delimited value at `*at` (protowire.ConsumeBytes): its bytes.
fn protobuf_go_bytes<'a>(data: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let length = protobuf_go_varint(data, at)?;
    if length > (data.len() - *at) as u64 {
        return None;
    }
    let value = &data[*at..*at + length as usize];
    *at += length as usize;
    Some(value)
}

/// Steps over one field value of `wire_type` (protowire's
/// consumeFieldValueD): a group must end with its own number.
fn protobuf_go_skip(
    number: u64,
    wire_type: u64,
    data: &[u8],
    at: &mut usize,
    depth: i32,
) -> Option<()> {
    match wire_type {
        0 => {
            protobuf_go_varint(data, at)?;
        }
        1 | 5 => {
            let width = if wire_type == 1 { 8 } else { 4 };
            if data.len() - *at < width {
                return None;
            }
            *at += width;
        }
        2 => {
            protobuf_go_bytes(data, at)?;
        }
        3 => {
            if depth < 0 {
                return None;
            }
            loop {
                let key = protobuf_go_varint(data, at)?;
                // Inside a group any number from 1 to 2^31-1 is taken (DecodeTag).
                let inner = key >> 3;
                if inner < 1 || inner > i32::MAX as u64 {
                    return None;
                }
                if key & 7 == 4 {
                    return (inner == number).then_some(());
                }
                protobuf_go_skip(inner, key & 7, data, at, depth - 1)?;
            }
        }
        _ => return None,
    }
    Some(())
}

/// Reads `data` as `schema` by protobuf-go's rules (unmarshalPointerEager
/// in internal/impl/decode.go), appending to `kept` each field it would set.
fn protobuf_go_message(schema: &Schema, data: &[u8], kept: &mut Vec<u8>) -> Option<()> {
    let mut at = 0;
    while at < data.len() {
        let start = at;
        let key = protobuf_go_varint(data, &mut at)?;
        let number = key >> 3;
        let wire_type = key & 7;
        // An end group outside any group is a fault, as is a number out of range.
        if !(1..=MAX_FIELD_NUMBER).contains(&number) || wire_type == 4 {
            return None;
        }
        let field = schema
            .fields
            .iter()
            .find(|(n, _, _)| *n as u64 == number)
            .map(|&(_, _, kind)| kind);
        match (field, wire_type) {
            (Some(Kind::Varint | Kind::Varints), 0) => {
                protobuf_go_varint(data, &mut at)?;
                kept.extend_from_slice(&data[start..at]);
            }
            (Some(Kind::Bytes), 2) => {
                protobuf_go_bytes(data, &mut at)?;
                kept.extend_from_slice(&data[start..at]);
            }
            (Some(Kind::Varints), 2) => {
                // Packed: each varint within the field.
                let packed = protobuf_go_bytes(data, &mut at)?;
                let mut inner = 0;
                while inner < packed.len() {
                    protobuf_go_varint(packed, &mut inner)?;
                }
                kept.extend_from_slice(&data[start..at]);
            }
            (Some(Kind::Message(inner)), 2) => {
                let value = protobuf_go_bytes(data, &mut at)?;
                let mut inner_kept = Vec::with_capacity(value.len());
                protobuf_go_message(inner, value, &mut inner_kept)?;
                prost::encoding::encode_key(
                    number as u32,
                    prost::encoding::WireType::LengthDelimited,
                    kept,
                );
                prost::encoding::encode_varint(inner_kept.len() as u64, kept);
                kept.extend_from_slice(&inner_kept);
            }
            // Unknown, or known with another wire type: skipped if it parses.
            _ => protobuf_go_skip(number, wire_type, data, &mut at, GROUP_DEPTH_LIMIT)?,
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::{PROTOBUF_GO_ERROR, protobuf_go_watch_request, watch_request_error};
    use crate::proto::etcdserverpb::{
        WatchCreateRequest, WatchRequest, WatchResponse, watch_request::RequestUnion,
    };

    fn error(bytes: &[u8]) -> String {
        watch_request_error(bytes).unwrap_or_else(|| "accepted".into())
    }

    /// The texts real etcd 3.5.1 sent for these bytes (tests/watch.rs checks them too).
    #[test]
    fn what_etcd_says() {
        assert_eq!(error(&[0xff]), "unexpected EOF");
        assert_eq!(error(&[0x0a, 0x05, 0x01]), "unexpected EOF");
        assert_eq!(
            error(&[0x00, 0x01]),
            "proto: WatchRequest: illegal tag 0 (wire type 0)"
        );
        assert_eq!(
            error(&[0x0c]),
            "proto: WatchRequest: wiretype end group for non-group"
        );
        assert_eq!(
            error(&[0x0f]),
            "proto: wrong wireType = 7 for field CreateRequest"
        );
        assert_eq!(
            error(&[0x0a, 0x02, 0x08, 0x01]),
            "proto: wrong wireType = 0 for field Key"
        );
    }

    #[test]
    fn unknown_fields_are_skipped_or_refused_as_go_does() {
        // Field 9 of WatchRequest, a varint: skipped.
        assert_eq!(error(&[0x48, 0x01]), "accepted");
        // Wire type 6 on an unknown field.
        assert_eq!(error(&[0x4e]), "proto: illegal wireType 6");
        // A fixed64 that runs past the end.
        assert_eq!(error(&[0x49, 0x01]), "unexpected EOF");
        // An end group with no start.
        assert_eq!(
            error(&[0x0a, 0x01, 0x4c]),
            "proto: WatchCreateRequest: wiretype end group for non-group"
        );
        // A group skipped whole.
        assert_eq!(error(&[0x4b, 0x08, 0x01, 0x4c]), "accepted");
        // An eleven-byte varint in an unknown field of a cancel.
        let mut long = vec![0x38];
        long.extend([0xff; 10]);
        long.push(0x01);
        assert_eq!(
            error(&[&[0x12, 12][..], &long].concat()),
            "proto: integer overflow"
        );
    }

    #[test]
    fn valid_requests_are_accepted() {
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(every_field_set())),
        };
        assert_eq!(error(&create.encode_to_vec()), "accepted");
        // Some other message's bytes, read as a WatchRequest.
        let response = WatchResponse {
            watch_id: 5,
            ..Default::default()
        };
        assert_eq!(
            error(&response.encode_to_vec()),
            "proto: wrong wireType = 0 for field CancelRequest"
        );
    }

    /// What etcd 3.7 reads from `bytes`.
    fn read_37(bytes: &[u8]) -> Result<WatchRequest, &'static str> {
        let kept = protobuf_go_watch_request(bytes).ok_or(PROTOBUF_GO_ERROR)?;
        Ok(WatchRequest::decode(&kept[..]).expect("kept fields decode"))
    }

    /// A create request with every field set.
    fn every_field_set() -> WatchCreateRequest {
        WatchCreateRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            start_revision: -3,
            progress_notify: true,
            filters: vec![0, 1],
            prev_kv: true,
            watch_id: 7,
            fragment: true,
        }
    }

    fn create(request: WatchCreateRequest) -> WatchRequest {
        WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(request)),
        }
    }

    /// Each payload real etcd 3.7.3 refused (tests/watch.rs sends most of them).
    #[test]
    fn protobuf_go_refuses_what_etcd_37_refuses() {
        for bytes in [
            &[0xff][..],
            &[0x0a, 0x05, 0x01],
            &[0x00, 0x01],
            &[0x0c],
            &[0x0f],
            // Field number 2^29, one above the largest.
            &[0x80, 0x80, 0x80, 0x80, 0x10],
            // An eleven-byte varint in an unknown field of a cancel.
            &[
                0x12, 0x0c, 0x38, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            // A ten-byte varint whose last byte is over 1.
            &[
                0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ],
            // Wire type 6 on an unknown field; a fixed64 past the end.
            &[0x4e],
            &[0x49, 0x01],
            // A group ended by another number; one never ended.
            &[0x4b, 0x54],
            &[0x4b, 0x08, 0x01],
            // A packed filter whose last varint runs past the field.
            &[0x0a, 0x03, 0x2a, 0x01, 0x80],
        ] {
            assert_eq!(read_37(bytes), Err(PROTOBUF_GO_ERROR), "{bytes:02x?}");
        }
    }

    #[test]
    fn protobuf_go_skips_known_fields_of_another_wire_type() {
        // Key as a varint: a create with no key, as etcd 3.7.3 took it.
        assert_eq!(
            read_37(&[0x0a, 0x02, 0x08, 0x01]),
            Ok(create(WatchCreateRequest::default()))
        );
        // The create itself as a varint, then a group: nothing set.
        assert_eq!(
            read_37(&[0x08, 0x05, 0x0b, 0x10, 0x01, 0x0c]),
            Ok(WatchRequest::default())
        );
        // A fixed32 watch id, then the real one.
        assert_eq!(
            read_37(&[0x0a, 0x07, 0x3d, 1, 2, 3, 4, 0x38, 0x09]),
            Ok(create(WatchCreateRequest {
                watch_id: 9,
                ..Default::default()
            }))
        );
    }

    #[test]
    fn protobuf_go_reads_valid_requests_whole() {
        let request = create(every_field_set());
        assert_eq!(read_37(&request.encode_to_vec()), Ok(request));
        // Unpacked filters too.
        assert_eq!(
            read_37(&[0x0a, 0x04, 0x28, 0x01, 0x28, 0x00]),
            Ok(create(WatchCreateRequest {
                filters: vec![1, 0],
                ..Default::default()
            }))
        );
    }
}
