//! The raw SASL phase of one client connection.
//!
//! After a SaslHandshake v0 that the broker accepts, the client's next
//! frames are raw SASL tokens: 4-byte-length-prefixed blobs, not Kafka
//! requests (protocol-notes §7), each answered by one raw blob. This module
//! owns that phase: how many client tokens it lasts, read from the
//! mechanism named in the handshake request (PLAIN and OAUTHBEARER one,
//! SCRAM-SHA-256/512 two: client-first and client-final); when it opens
//! (the broker's answer accepts a v0 handshake); when it ends (the last
//! token is forwarded, or the client sends another handshake); and which v0
//! handshakes are refused: those of a mechanism whose end cannot be known
//! (GSSAPI, any other) while policies are loaded.
//!
//! While the phase is open every client frame is a token, as the broker
//! reads it; outside it every frame is classified as a request, and one
//! outside the offered versions is refused. A frame is never taken for a
//! token once the phase has ended: an OAUTHBEARER failure, where the broker
//! answers with an error token and waits for one more client message
//! (`\x01`), ends with that message refused and the connection closed, as
//! the broker closes it too. The one open-ended case left is a v0 exchange
//! of a mechanism of unknown length with no policy loaded: frames that are
//! no request in the offered versions stay tokens until the next handshake
//! (and no longer, should policies be loaded meanwhile).

use std::sync::Mutex;

use kafka_protocol::messages::ApiKey;

use crate::proxy::error::RelayError;
use crate::transport::frame::{self, Cursor, RESPONSE_ID_END};

/// How many client tokens follow a SaslHandshake once it is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tokens {
    /// This many raw tokens, each answered by one (none after a v1
    /// handshake: its tokens travel in SaslAuthenticate requests).
    Count(u8),
    /// A v0 mechanism whose exchange has no length the proxy knows.
    Unknown,
}

/// What the next client frame is, as the phase sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Raw {
    /// A request, classified as usual.
    Closed,
    /// A raw token of the open phase: forwarded unread, one raw answer.
    Token,
    /// A v0 exchange of unknown length: with no policy loaded, a frame
    /// that is no request in the offered versions is a token.
    Unbounded,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Closed,
    Open(u8),
    Unbounded,
}

/// The phase of one connection, shared by its two pumps: the response
/// side opens it, the request side counts tokens and closes it.
#[derive(Debug, Default)]
pub(super) struct SaslPhase(Mutex<State>);

impl SaslPhase {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client sent a SaslHandshake (classified as a request): until the
    /// broker accepts it, frames are requests.
    pub fn handshake_sent(&self) {
        *self.state() = State::Closed;
    }

    /// The broker answered a SaslHandshake of `version` whose request
    /// announced `tokens`; called before the client sees the answer, hence
    /// before its first token can arrive.
    pub fn handshake_answered(&self, tokens: Tokens, version: i16, answer: &[u8]) {
        let accepted = version == 0 && handshake_accepted(answer).unwrap_or(false);
        *self.state() = match tokens {
            Tokens::Count(n) if accepted && n > 0 => State::Open(n),
            Tokens::Unknown if accepted => State::Unbounded,
            _ => State::Closed,
        };
    }

    /// What the client frame that just arrived is; a token uses up one of
    /// the phase's, and the last one ends it.
    pub fn next_frame(&self) -> Raw {
        let mut s = self.state();
        match *s {
            State::Closed => Raw::Closed,
            State::Unbounded => Raw::Unbounded,
            State::Open(n) => {
                *s = if n > 1 {
                    State::Open(n - 1)
                } else {
                    State::Closed
                };
                Raw::Token
            }
        }
    }
}

/// The client tokens of a v0 exchange for `mechanism`, `None` when its end
/// cannot be known (GSSAPI's rounds depend on the Kerberos exchange; other
/// mechanisms are not known at all). Names are case-sensitive, as Kafka's.
fn client_tokens(mechanism: &[u8]) -> Option<u8> {
    match mechanism {
        b"PLAIN" | b"OAUTHBEARER" => Some(1),
        b"SCRAM-SHA-256" | b"SCRAM-SHA-512" => Some(2),
        _ => None,
    }
}

/// The raw tokens a SaslHandshake request announces. A v0 handshake for a
/// mechanism whose end cannot be known is refused (the connection closes)
/// while policies are loaded: its tokens would leave no point after which
/// frames are surely requests again.
pub(super) fn handshake(
    request: &[u8],
    version: i16,
    policies_loaded: bool,
) -> Result<Tokens, RelayError> {
    if version != 0 {
        return Ok(Tokens::Count(0));
    }
    let mechanism = handshake_mechanism(request);
    if let Some(n) = mechanism.and_then(client_tokens) {
        return Ok(Tokens::Count(n));
    }
    if !policies_loaded {
        return Ok(Tokens::Unknown);
    }
    let name = match mechanism {
        Some(m) => format!("{:?}", String::from_utf8_lossy(&m[..m.len().min(64)])),
        None => "(unreadable)".into(),
    };
    Err(RelayError::Refused(format!(
        "SaslHandshake v0 with mechanism {name}: the proxy cannot tell where its raw \
         token exchange ends, and policies are loaded; use PLAIN, SCRAM-SHA-256/512 or \
         OAUTHBEARER, or SaslHandshake v1 (SaslAuthenticate)"
    )))
}

/// The mechanism a SaslHandshake request names (header v1, then a string).
fn handshake_mechanism(request: &[u8]) -> Option<&[u8]> {
    let flexible = ApiKey::SaslHandshake.request_header_version(0) >= 2;
    let mut r = Cursor::new(request, frame::request_body_offset(request, flexible)?);
    let len = usize::try_from(r.i16()?).ok()?;
    r.bytes(len)
}

/// Whether a SaslHandshake answer (v0 header, then error_code) accepts
/// the mechanism.
fn handshake_accepted(answer: &[u8]) -> Option<bool> {
    Cursor::new(answer, RESPONSE_ID_END)
        .i16()
        .map(|code| code == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::classify::classify;
    use crate::proxy::exchange::{Classified, Context, Handling, Send};
    use bytes::Bytes;

    fn request(key: i16, version: i16, body: &[u8]) -> Bytes {
        let mut b = vec![];
        b.extend_from_slice(&key.to_be_bytes());
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes());
        b.extend_from_slice(&4i16.to_be_bytes());
        b.extend_from_slice(b"test");
        if ApiKey::try_from(key).is_ok_and(|k| k.request_header_version(version) >= 2) {
            b.push(0); // no tagged fields
        }
        b.extend_from_slice(body);
        frame::with_length_prefix(&b)
    }

    fn handshake_request(version: i16, mechanism: &str) -> Bytes {
        let len = mechanism.len() as i16;
        request(
            17,
            version,
            &[&len.to_be_bytes()[..], mechanism.as_bytes()].concat(),
        )
    }

    fn answer(code: i16) -> Bytes {
        let mut b = 9i32.to_be_bytes().to_vec();
        b.extend_from_slice(&code.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // no mechanisms
        frame::with_length_prefix(&b)
    }

    /// One client frame through the connection's phase and `classify`, as
    /// the request pump does.
    fn step(
        phase: &SaslPhase,
        frame: &Bytes,
        policies_loaded: bool,
    ) -> Result<Classified, RelayError> {
        let ctx = Context {
            raw: phase.next_frame(),
            policies_loaded,
            produce_guard: None,
            offer: crate::proxy::versions::Offer::default(),
            share: None,
        };
        let c = classify(frame, frame::peek_request(frame), &ctx)?;
        if matches!(
            c.pending.as_ref().map(|p| &p.handling),
            Some(Handling::SaslHandshake(_))
        ) {
            phase.handshake_sent();
        }
        Ok(c)
    }

    /// A v0 handshake for `mechanism` the broker accepts.
    fn accepted_v0(phase: &SaslPhase, mechanism: &str, policies_loaded: bool) {
        let c = step(phase, &handshake_request(0, mechanism), policies_loaded).unwrap();
        let Some(Handling::SaslHandshake(tokens)) = c.pending.map(|p| p.handling) else {
            panic!("not a handshake");
        };
        assert!(matches!(c.send, Send::Original));
        phase.handshake_answered(tokens, 0, &answer(0));
    }

    fn is_token(c: &Classified) -> bool {
        matches!(c.send, Send::Original)
            && c.pending
                .as_ref()
                .is_some_and(|p| p.correlation_id.is_none())
    }

    /// Fetch v3 (out of the offered range, no top-level error code): refused
    /// by closing the connection, never forwarded.
    fn assert_fetch_v3_refused(phase: &SaslPhase) {
        let fetch3 = request(1, 3, &[0; 16]);
        let r = step(phase, &fetch3, true);
        assert!(matches!(r, Err(RelayError::BadRequest(_))), "{r:?}");
    }

    #[test]
    fn after_a_plain_v0_exchange_an_out_of_range_fetch_is_refused_not_relayed() {
        let phase = SaslPhase::default();
        accepted_v0(&phase, "PLAIN", true);
        // One token, whatever it looks like (here like a Fetch v3).
        assert!(is_token(
            &step(&phase, &request(1, 3, b"\0alice\0pw"), true).unwrap()
        ));
        assert_eq!(phase.next_frame(), Raw::Closed);
        assert_fetch_v3_refused(&phase);
        // DescribeQuorum v2 gets its UNSUPPORTED_VERSION answer from the proxy.
        let c = step(&phase, &request(55, 2, &[]), true).unwrap();
        assert!(matches!(c.send, Send::Nothing));
        assert!(matches!(c.pending.unwrap().handling, Handling::Local(_)));
        // Offered requests are classified as usual.
        let c = step(&phase, &request(3, 1, &[0, 0, 0, 0]), true).unwrap();
        assert_eq!(c.pending.unwrap().correlation_id, Some(7));
    }

    #[test]
    fn after_scrams_two_tokens_an_out_of_range_fetch_is_refused_not_relayed() {
        for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let phase = SaslPhase::default();
            accepted_v0(&phase, mechanism, true);
            let first = frame::with_length_prefix(b"n,,n=alice,r=nonce");
            let last = frame::with_length_prefix(b"c=biws,r=nonce+server,p=proof");
            assert!(is_token(&step(&phase, &first, true).unwrap()));
            assert_eq!(phase.next_frame(), Raw::Token, "client-final is a token");
            let phase = SaslPhase::default();
            accepted_v0(&phase, mechanism, true);
            assert!(is_token(&step(&phase, &first, true).unwrap()));
            assert!(is_token(&step(&phase, &last, true).unwrap()));
            assert_fetch_v3_refused(&phase);
        }
    }

    #[test]
    fn oauthbearer_takes_one_token_and_a_later_kvsep_is_no_token() {
        let phase = SaslPhase::default();
        accepted_v0(&phase, "OAUTHBEARER", true);
        let token = frame::with_length_prefix(b"n,,\x01auth=Bearer abc\x01\x01");
        assert!(is_token(&step(&phase, &token, true).unwrap()));
        // After an error token the broker waits for "\x01"; the phase is
        // over, so it is no request and the connection closes.
        let kvsep = frame::with_length_prefix(b"\x01");
        assert!(matches!(
            step(&phase, &kvsep, true),
            Err(RelayError::BadRequest(_))
        ));
    }

    #[test]
    fn a_gssapi_v0_handshake_with_policies_loaded_is_refused() {
        for mechanism in ["GSSAPI", "plain", "X-UNKNOWN", ""] {
            let r = step(
                &SaslPhase::default(),
                &handshake_request(0, mechanism),
                true,
            );
            let Err(RelayError::Refused(msg)) = r else {
                panic!("{mechanism}: {r:?}");
            };
            assert!(msg.contains(&format!("{mechanism:?}")), "{msg}");
        }
        // A truncated one too.
        let r = step(&SaslPhase::default(), &request(17, 0, &[0, 9, b'G']), true);
        assert!(matches!(r, Err(RelayError::Refused(_))), "{r:?}");
        // With no policy loaded it is relayed, and its exchange is open-ended.
        let phase = SaslPhase::default();
        accepted_v0(&phase, "GSSAPI", false);
        assert_eq!(phase.next_frame(), Raw::Unbounded);
        assert!(is_token(
            &step(&phase, &frame::with_length_prefix(b"\x60\x81"), false).unwrap()
        ));
        // Until the next handshake.
        step(&phase, &handshake_request(1, "GSSAPI"), false).unwrap();
        assert_eq!(phase.next_frame(), Raw::Closed);
    }

    #[test]
    fn a_v1_handshake_path_is_unchanged() {
        for policies_loaded in [false, true] {
            let phase = SaslPhase::default();
            for mechanism in ["PLAIN", "GSSAPI", "X-UNKNOWN"] {
                let c = step(&phase, &handshake_request(1, mechanism), policies_loaded).unwrap();
                let p = c.pending.unwrap();
                assert_eq!(p.correlation_id, Some(7));
                let Handling::SaslHandshake(tokens) = p.handling else {
                    panic!("not a handshake");
                };
                assert_eq!(tokens, Tokens::Count(0));
                phase.handshake_answered(tokens, 1, &answer(0));
                assert_eq!(phase.next_frame(), Raw::Closed);
            }
            // Its tokens travel in SaslAuthenticate requests.
            let auth = request(36, 2, &[10, 0, b'a', 0, b'p', b'w', b'1', 0, 0, 0]);
            let c = step(&phase, &auth, policies_loaded).unwrap();
            let p = c.pending.unwrap();
            assert_eq!(p.correlation_id, Some(7));
            assert!(matches!(p.handling, Handling::Forward));
        }
    }

    #[test]
    fn only_an_accepted_v0_answer_opens_the_phase() {
        assert_eq!(handshake_accepted(&answer(0)), Some(true));
        assert_eq!(handshake_accepted(&answer(33)), Some(false));
        assert_eq!(handshake_accepted(&[0, 0, 0, 4, 0, 0, 0, 9]), None);
        let phase = SaslPhase::default();
        phase.handshake_answered(Tokens::Count(1), 0, &answer(33));
        assert_eq!(phase.next_frame(), Raw::Closed);
        phase.handshake_answered(Tokens::Count(1), 0, &[0, 0, 0, 4, 0, 0, 0, 9]);
        assert_eq!(phase.next_frame(), Raw::Closed);
        phase.handshake_answered(Tokens::Count(2), 0, &answer(0));
        phase.handshake_sent(); // a new handshake closes it
        assert_eq!(phase.next_frame(), Raw::Closed);
    }
}
