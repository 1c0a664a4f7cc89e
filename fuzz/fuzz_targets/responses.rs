//! Every broker response the proxy decodes, from arbitrary bytes: decoding
//! (and, for the responses the relay rewrites, the rewrite itself) must
//! return a value or an error, never panic, and never ask the allocator for
//! more than the input could justify. A declared count or length that
//! reserves memory up front (kafka-protocol 0.18 before the vendored patch)
//! trips the allocation cap below and is reported as a crash, whether or
//! not the machine could have served the request.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};

use antidote::proxy::addresses::{rewrite_body, Addresses, Seen};
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use libfuzzer_sys::fuzz_target;

/// Inputs are capped at 64 KiB (-max_len in scripts/fuzz-smoke.sh); no sane
/// decode of one needs a single allocation of 16 MiB.
const MAX_ALLOCATION: usize = 16 << 20;

struct Capped;

unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn check(size: usize) {
    if size > MAX_ALLOCATION {
        // Allocators must not unwind: report and abort (libFuzzer records
        // the input as a crash).
        eprintln!("allocation of {size} bytes from a fuzz input of at most 64 KiB");
        std::process::abort();
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

/// Decode `body` as `T` at `version`, ignoring the outcome.
fn decode<T: Decodable>(body: &Bytes, version: i16) {
    let _ = T::decode(&mut body.clone(), version);
}

fuzz_target!(|data: &[u8]| {
    let [which, version, rest @ ..] = data else {
        return;
    };
    let body = Bytes::copy_from_slice(rest);
    let v = i16::from(*version % 20);
    let addrs = Addresses::new("127.0.0.1", 29000);
    match which % 12 {
        0 => {
            // With and without `limits.fetch_max_version`.
            let offer = antidote::proxy::versions::Offer {
                fetch_max: (version & 0x80 != 0).then_some(15),
                share_groups: version & 0x40 != 0,
            };
            let _ = antidote::proxy::versions::rewrite(body, v % 6, offer);
        }
        1 => {
            let _ = rewrite_body(ApiKey::Metadata, v % 14, body, &addrs, &mut Seen::default());
        }
        2 => {
            let _ = rewrite_body(ApiKey::FindCoordinator, v % 7, body, &addrs, &mut Seen::default());
        }
        3 => {
            let _ = rewrite_body(ApiKey::DescribeCluster, v % 3, body, &addrs, &mut Seen::default());
        }
        4 => {
            let _ = rewrite_body(ApiKey::Produce, 10 + v % 4, body, &addrs, &mut Seen::default());
            let key = if v % 2 == 0 { ApiKey::ShareFetch } else { ApiKey::ShareAcknowledge };
            let _ = rewrite_body(key, 1 + v % 2, rest_bytes(rest), &addrs, &mut Seen::default());
        }
        5 => decode::<FetchResponse>(&body, 4 + v % 15),
        6 => decode::<ProduceResponse>(&body, 3 + v % 11),
        7 => decode::<InitProducerIdResponse>(&body, v % 6),
        8 => decode::<CreateTopicsResponse>(&body, v % 8),
        9 => decode::<ListOffsetsResponse>(&body, v % 11),
        10 => decode::<SaslHandshakeResponse>(&body, v % 2),
        _ => {
            decode::<SaslAuthenticateResponse>(&body, v % 3);
            decode::<ResponseHeader>(&body, v % 2);
        }
    }
});

fn rest_bytes(rest: &[u8]) -> Bytes {
    Bytes::copy_from_slice(rest)
}
