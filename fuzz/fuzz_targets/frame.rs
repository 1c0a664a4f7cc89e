//! Request/response framing over arbitrary bytes: `FrameReader` must hand
//! out whole frames (length prefix included, within the limit) or a clean
//! error, never panic or over-allocate; the header peekers must not panic.
#![no_main]

use std::sync::OnceLock;

use antidote::transport::frame::{peek_correlation_id, peek_request, request_body_offset, FrameReader};
use libfuzzer_sys::fuzz_target;

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap())
}

fuzz_target!(|data: &[u8]| {
    // First two bytes choose the frame limit (up to 64 KiB), the rest is the stream.
    let (max, stream) = match data {
        [a, b, rest @ ..] => (u32::from(u16::from_le_bytes([*a, *b])), rest),
        _ => (1024, data),
    };
    rt().block_on(async {
        let mut reader = FrameReader::new(stream, max);
        let mut consumed = 0usize;
        loop {
            match reader.next().await {
                Ok(Some(frame)) => {
                    assert!(frame.len() >= 4);
                    let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
                    assert_eq!(frame.len(), 4 + len, "frame length matches its prefix");
                    assert!(len as u64 <= u64::from(max), "frame over the limit");
                    assert_eq!(&frame[..], &stream[consumed..consumed + frame.len()], "frames are the stream's bytes");
                    consumed += frame.len();
                    let _ = peek_request(&frame);
                    let _ = peek_correlation_id(&frame);
                    if let Some(off) = request_body_offset(&frame, false) {
                        assert!(off <= frame.len());
                    }
                    if let Some(off) = request_body_offset(&frame, true) {
                        assert!(off <= frame.len());
                    }
                }
                Ok(None) => {
                    assert_eq!(consumed, stream.len(), "clean end only between frames");
                    break;
                }
                Err(_) => break,
            }
        }
    });
});
