//! Repairs the HTTP/2 `:authority` that some etcd clients send.
//!
//! etcdctl 3.4 sends the whole endpoint URL (`http://127.0.0.1:2379`) as the
//! `:authority` of Maintenance calls, and clientv3 3.5.0 sends
//! `#initially=[...]`. grpc-go servers (etcd) ignore it; the Rust HTTP/2 stack
//! refuses such a request with PROTOCOL_ERROR. This adapter sits between the
//! socket and the HTTP/2 server: it decodes the first request's header block,
//! and if the authority is valid (every well-behaved client) it steps aside
//! for the rest of the connection. Otherwise it re-encodes every header block
//! of that connection with the authority repaired (or dropped if nothing
//! sensible can be salvaged).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The HTTP/2 default frame size, which the server does not raise.
const MAX_FRAME_LEN: usize = 16_384;
/// A header block larger than this is passed on untouched for the server to judge.
const MAX_HEADER_BLOCK: usize = 1 << 20;

enum State {
    /// Waiting for the 24-byte client preface.
    Preface,
    /// Looking at the first header block.
    Inspecting(Box<Decoder<'static>>),
    /// Re-encoding every header block with a repaired authority.
    Rewriting(Box<Codec>),
    /// Out of the way: bytes flow straight through.
    Passthrough,
}

/// HPACK state of a rewritten connection: the client's encoder mirrored by
/// `decoder`, the server's decoder mirrored by `encoder`.
struct Codec {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

/// A client connection whose request headers are repaired when needed.
pub struct AuthorityRepair<S> {
    inner: S,
    state: State,
    /// Bytes read from the client and not yet processed.
    raw: BytesMut,
    /// Processed bytes waiting to be read by the HTTP/2 server.
    ready: BytesMut,
}

impl<S> AuthorityRepair<S> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        AuthorityRepair {
            inner,
            state: State::Preface,
            raw: BytesMut::new(),
            ready: BytesMut::new(),
        }
    }

    /// Moves whatever can be decided from `raw` to `ready`; false if more input is needed.
    fn process(&mut self) -> bool {
        match &mut self.state {
            State::Passthrough => {
                let rest = self.raw.split();
                self.ready.unsplit(rest);
                false
            }
            State::Preface => {
                // Not HTTP/2 (an HTTP/1.1 request for the gateway): nothing to repair.
                let seen = self.raw.len().min(PREFACE_LEN);
                if self.raw[..seen] != PREFACE[..seen] {
                    self.state = State::Passthrough;
                    return true;
                }
                if self.raw.len() < PREFACE_LEN {
                    return false;
                }
                let preface = self.raw.split_to(PREFACE_LEN);
                self.ready.unsplit(preface);
                self.state = State::Inspecting(Box::default());
                true
            }
            State::Inspecting(_) | State::Rewriting(_) => self.process_frame(),
        }
    }

    /// Handles the next complete frame, or header block, in `raw`.
    fn process_frame(&mut self) -> bool {
        let Some((len, kind, _)) = frame_header(&self.raw) else {
            return false;
        };
        if kind != HEADERS {
            if self.raw.len() < FRAME_HEADER_LEN + len {
                return false;
            }
            let frame = self.raw.split_to(FRAME_HEADER_LEN + len);
            self.ready.unsplit(frame);
            return true;
        }
        let Some((block, block_len, end_stream, stream_id)) = header_block(&self.raw) else {
            if self.raw.len() > MAX_HEADER_BLOCK {
                self.state = State::Passthrough;
                return true;
            }
            return false;
        };
        let frames = self.raw.split_to(block_len);

        // Any way out below but a rewrite leaves the connection in passthrough.
        let state = std::mem::replace(&mut self.state, State::Passthrough);
        let (mut codec, headers) = match state {
            State::Inspecting(mut decoder) => match decoder.decode(&block) {
                Ok(headers) if needs_repair(&headers) => {
                    let codec = Codec {
                        decoder: *decoder,
                        encoder: Encoder::new(),
                    };
                    (Box::new(codec), headers)
                }
                // A well-behaved client (or one the server should judge): step aside for good.
                _ => {
                    self.ready.unsplit(frames);
                    return true;
                }
            },
            State::Rewriting(mut codec) => match codec.decoder.decode(&block) {
                Ok(headers) => (codec, headers),
                Err(_) => {
                    self.ready.unsplit(frames);
                    return true;
                }
            },
            State::Preface | State::Passthrough => unreachable!("not a frame state"),
        };
        let headers = repair(headers);
        let encoded = codec
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        write_header_frames(&mut self.ready, &encoded, end_stream, stream_id);
        self.state = State::Rewriting(codec);
        true
    }
}

/// Length, type and flags of the frame at the start of `buf`, once its header is there.
fn frame_header(buf: &[u8]) -> Option<(usize, u8, u8)> {
    if buf.len() < FRAME_HEADER_LEN {
        return None;
    }
    let len = (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
    Some((len, buf[3], buf[4]))
}

/// The header block of the HEADERS frame (and its CONTINUATION frames) at the
/// start of `buf`: the block, the bytes its frames span, END_STREAM and the
/// stream id. None until every frame of the block is in `buf`.
fn header_block(buf: &[u8]) -> Option<(Vec<u8>, usize, bool, u32)> {
    let mut block = Vec::new();
    let mut offset = 0;
    let mut end_stream = false;
    let mut stream_id = 0;
    loop {
        let (len, kind, flags) = frame_header(&buf[offset..])?;
        let payload = buf.get(offset + FRAME_HEADER_LEN..offset + FRAME_HEADER_LEN + len)?;
        let mut fragment = payload;
        if kind == HEADERS {
            end_stream = flags & END_STREAM != 0;
            stream_id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let mut pad = 0;
            if flags & PADDED != 0 {
                pad = usize::from(*fragment.first()?);
                fragment = &fragment[1..];
            }
            if flags & PRIORITY != 0 {
                fragment = fragment.get(5..)?;
            }
            fragment = fragment.get(..fragment.len().checked_sub(pad)?)?;
        } else if kind != CONTINUATION {
            // A protocol violation; hand it over whole and let the server say so.
            return None;
        }
        block.extend_from_slice(fragment);
        offset += FRAME_HEADER_LEN + len;
        if flags & END_HEADERS != 0 {
            return Some((block, offset, end_stream, stream_id));
        }
    }
}

fn write_header_frames(out: &mut BytesMut, block: &[u8], end_stream: bool, stream_id: u32) {
    let mut chunks = block.chunks(MAX_FRAME_LEN).peekable();
    let mut first = true;
    // An empty block still needs its HEADERS frame.
    let empty: &[u8] = &[];
    let mut next = chunks.next().or(Some(empty));
    while let Some(chunk) = next {
        next = chunks.next();
        let mut flags = 0;
        if first && end_stream {
            flags |= END_STREAM;
        }
        if next.is_none() {
            flags |= END_HEADERS;
        }
        let kind = if first { HEADERS } else { CONTINUATION };
        out.put_uint(chunk.len() as u64, 3);
        out.put_u8(kind);
        out.put_u8(flags);
        out.put_u32(stream_id);
        out.put_slice(chunk);
        first = false;
    }
}

fn needs_repair(headers: &[(Vec<u8>, Vec<u8>)]) -> bool {
    headers.iter().any(|(name, value)| {
        name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err()
    })
}

/// Replaces an invalid `:authority` with the host:port of the first URL in it,
/// or drops it.
fn repair(headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    headers
        .into_iter()
        .filter_map(|(name, value)| {
            if name != b":authority" || http::uri::Authority::try_from(value.as_slice()).is_ok() {
                return Some((name, value));
            }
            salvage_authority(&value).map(|authority| (name, authority))
        })
        .collect()
}

/// "http://host:port/..." or "#initially=[https://host:port;...]" -> "host:port".
fn salvage_authority(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let after_scheme = &text[text.find("://")? + 3..];
    let end = after_scheme
        .find(['/', ']', ';', ',', ' '])
        .unwrap_or(after_scheme.len());
    let candidate = &after_scheme[..end];
    http::uri::Authority::try_from(candidate).ok()?;
    Some(candidate.as_bytes().to_vec())
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRepair<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if matches!(this.state, State::Passthrough) && this.raw.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.process() {
                continue;
            }
            if !this.ready.is_empty() {
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // End of input: hand over any partial frame as it is.
                let rest = this.raw.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.ready.unsplit(rest);
                this.state = State::Passthrough;
                continue;
            }
            this.raw.extend_from_slice(read.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRepair<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    /// No, even where the socket could: h2 then copies a frame's payload of
    /// up to 1 KiB into its write buffer instead of chaining it (256 bytes
    /// with vectored writes), and it flushes before the frame after a
    /// chained one. A single-key Range's answer (about 350 bytes) went out
    /// in two writes, headers and data, then trailers; copied, a response
    /// leaves in one write, together with the others ready at that moment.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<S: Connected> Connected for AuthorityRepair<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salvages_host_and_port_from_urls() {
        assert_eq!(
            salvage_authority(b"http://127.0.0.1:2379").unwrap(),
            b"127.0.0.1:2379"
        );
        assert_eq!(
            salvage_authority(b"#initially=[https://a.example:2379;https://b:2379]").unwrap(),
            b"a.example:2379"
        );
        assert!(salvage_authority(b"no url here").is_none());
    }

    fn request_bytes(authority: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        out.put_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        // A SETTINGS frame first, as clients send it.
        out.put_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let mut encoder = Encoder::new();
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/etcdserverpb.Maintenance/Status"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
        ];
        let block = encoder.encode(headers);
        write_header_frames(&mut out, &block, false, 1);
        // A DATA frame after the headers must come through untouched.
        out.put_slice(&[0, 0, 2, 0x0, 0x1, 0, 0, 0, 1, 0xab, 0xcd]);
        out.to_vec()
    }

    async fn pass_through(input: Vec<u8>) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut repaired = AuthorityRepair::new(std::io::Cursor::new(input));
        let mut out = Vec::new();
        repaired.read_to_end(&mut out).await.unwrap();
        out
    }

    fn decoded_headers(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let rest = &bytes[PREFACE_LEN + FRAME_HEADER_LEN..];
        let (block, _, _, stream_id) = header_block(rest).unwrap();
        assert_eq!(stream_id, 1);
        Decoder::new().decode(&block).unwrap()
    }

    #[tokio::test]
    async fn valid_authority_passes_byte_for_byte() {
        let input = request_bytes(b"127.0.0.1:2379");
        assert_eq!(pass_through(input.clone()).await, input);
    }

    #[tokio::test]
    async fn url_authority_is_repaired_and_the_rest_kept() {
        let output = pass_through(request_bytes(b"http://127.0.0.1:2379")).await;
        let headers = decoded_headers(&output);
        let authority = headers.iter().find(|(n, _)| n == b":authority").unwrap();
        assert_eq!(authority.1, b"127.0.0.1:2379");
        assert!(
            headers
                .iter()
                .any(|(n, v)| n == b":path" && v == b"/etcdserverpb.Maintenance/Status")
        );
        assert!(output.ends_with(&[0, 0, 2, 0x0, 0x1, 0, 0, 0, 1, 0xab, 0xcd]));
    }

    #[tokio::test]
    async fn http1_requests_pass_untouched() {
        // Short and long ones: the first bytes already tell them from HTTP/2.
        for request in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1:2379\r\nContent-Length: 2\r\n\r\n{}",
        ] {
            assert_eq!(pass_through(request.to_vec()).await, request);
        }
    }
}
