//! The proxy's own Kafka client: one connection, typed requests, one request
//! in flight at a time. Used for the proxy's metadata lookups, by the
//! dead-letter producer and ledger loader, and by the `dlt` commands. It
//! negotiates versions with ApiVersions on connect and picks, per API, the
//! highest version both sides support within a range the caller names.
//!
//! Hand-written on purpose, over `kafka-protocol`'s message types: rdkafka
//! would bring C code and OpenSSL into the proxy, and rskafka drops
//! duplicate and null headers, which a DLT record must keep byte for byte.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};

use crate::config::HostPort;

mod cluster;
#[cfg(any(test, feature = "mock-broker"))]
pub mod mock_broker;
#[cfg(test)]
mod tests;
use crate::transport::frame::{with_length_prefix, FrameReader};
use crate::transport::net::{self, BoxIo};
use crate::transport::tls;
pub use cluster::Cluster;

/// Why a request through the proxy's own client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{addr}: {source}")]
    Io {
        addr: HostPort,
        source: std::io::Error,
    },
    #[error("{addr}: {msg}")]
    Protocol { addr: HostPort, msg: String },
    #[error("{addr}: the broker supports no version of {key:?} in {min}..={max}")]
    NoVersion {
        addr: HostPort,
        key: ApiKey,
        min: i16,
        max: i16,
    },
    #[error("{addr}: no response within {timeout:?}")]
    Timeout { addr: HostPort, timeout: Duration },
}

/// How to reach a cluster.
#[derive(Clone)]
pub struct Endpoint {
    pub tls: Option<tls::Upstream>,
    pub sasl: Option<crate::sasl::SaslConfig>,
    pub timeout: Duration,
    pub max_frame: u32,
}

impl Endpoint {
    /// How the proxy's own connections reach the upstream cluster.
    pub fn upstream(c: &crate::config::Config) -> Result<Endpoint, tls::TlsError> {
        Ok(Endpoint {
            tls: c.upstream.tls.as_ref().map(tls::connector).transpose()?,
            sasl: c.upstream.sasl.clone(),
            timeout: c.upstream.connect_timeout,
            max_frame: c.limits.max_frame_bytes,
        })
    }

    /// How to reach the dead-letter cluster: the upstream settings when it is
    /// the upstream cluster (each overridable), its own otherwise.
    pub fn dead_letter(c: &crate::config::Config) -> Result<Endpoint, tls::TlsError> {
        let dlt = &c.dead_letter;
        // A dead-letter cluster that does not answer must fail within the
        // time a response may wait for its diversions, not the (longer)
        // upstream connect timeout.
        let up = Endpoint {
            timeout: c.upstream.connect_timeout.min(dlt.timeout),
            ..Endpoint::upstream(c)?
        };
        let own_tls = dlt.tls.as_ref().map(tls::connector).transpose()?;
        Ok(match &dlt.bootstrap_servers {
            None => Endpoint {
                tls: own_tls.or(up.tls.clone()),
                sasl: dlt.sasl.clone().or(up.sasl.clone()),
                ..up
            },
            Some(_) => Endpoint {
                tls: own_tls,
                sasl: dlt.sasl.clone(),
                ..up
            },
        })
    }
}

/// One connection to one broker.
pub struct Connection {
    addr: HostPort,
    reader: FrameReader<ReadHalf<BoxIo>>,
    writer: WriteHalf<BoxIo>,
    next_correlation: i32,
    versions: HashMap<i16, (i16, i16)>,
    timeout: Duration,
}

const CLIENT_ID: &str = "antidote";

impl Connection {
    /// Connect and learn the broker's API versions.
    pub async fn connect(addr: &HostPort, ep: &Endpoint) -> Result<Connection, ClientError> {
        let io = net::connect(addr, ep.tls.as_ref(), ep.timeout)
            .await
            .map_err(|source| ClientError::Io {
                addr: addr.clone(),
                source,
            })?;
        let (r, w) = tokio::io::split(io);
        let mut conn = Connection {
            addr: addr.clone(),
            reader: FrameReader::new(r, ep.max_frame),
            writer: w,
            next_correlation: 1,
            versions: HashMap::new(),
            timeout: ep.timeout,
        };
        let resp = conn
            .send_at(
                ApiVersionsRequest::default()
                    .with_client_software_name(StrBytes::from_static_str("antidote"))
                    .with_client_software_version(StrBytes::from_static_str(env!(
                        "CARGO_PKG_VERSION"
                    ))),
                3,
            )
            .await?;
        conn.versions = resp
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        if let Some(sasl) = &ep.sasl {
            conn.authenticate(sasl).await?;
        }
        Ok(conn)
    }

    /// SaslHandshake v1 + SaslAuthenticate: PLAIN or SCRAM.
    async fn authenticate(&mut self, cfg: &crate::sasl::SaslConfig) -> Result<(), ClientError> {
        use crate::sasl::{plain_token, Mechanism, Scram};
        use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
        let password = cfg.password().map_err(|e| self.protocol(&e.to_string()))?;
        let hs = self
            .send(
                SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_static_str(cfg.mechanism.name())),
                1,
                1,
            )
            .await?;
        if hs.error_code != 0 {
            let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(self.protocol(&format!(
                "SASL mechanism {} refused (error {}); the broker offers {offered:?}",
                cfg.mechanism.name(),
                hs.error_code
            )));
        }
        let step =
            |token: Vec<u8>| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
        let fail = |code: i16, msg: Option<StrBytes>| {
            format!(
                "SASL authentication failed (error {code}): {}",
                msg.as_ref().map(|m| m.as_str()).unwrap_or("")
            )
        };
        match cfg.mechanism {
            Mechanism::Plain => {
                let r = self
                    .send(step(plain_token(&cfg.username, &password)), 0, 2)
                    .await?;
                if r.error_code != 0 {
                    return Err(self.protocol(&fail(r.error_code, r.error_message)));
                }
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let mut scram = Scram::new(
                    cfg.mechanism,
                    &cfg.username,
                    &password,
                    &Scram::random_nonce(),
                );
                let r = self
                    .send(step(scram.client_first().into_bytes()), 0, 2)
                    .await?;
                if r.error_code != 0 {
                    return Err(self.protocol(&fail(r.error_code, r.error_message)));
                }
                let server_first = String::from_utf8_lossy(&r.auth_bytes).into_owned();
                let client_final = scram
                    .client_final_off_runtime(&server_first)
                    .await
                    .map_err(|e| self.protocol(&e.to_string()))?;
                let r = self.send(step(client_final.into_bytes()), 0, 2).await?;
                if r.error_code != 0 {
                    return Err(self.protocol(&fail(r.error_code, r.error_message)));
                }
                scram
                    .verify_server_final(&String::from_utf8_lossy(&r.auth_bytes))
                    .map_err(|e| self.protocol(&e.to_string()))?;
            }
        }
        Ok(())
    }

    pub fn addr(&self) -> &HostPort {
        &self.addr
    }

    /// The highest version of `R` both sides support within `min..=max`.
    pub fn version<R: Request>(&self, min: i16, max: i16) -> Result<i16, ClientError> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| self.protocol("unknown api key"))?;
        let ours = key.valid_versions();
        let (lo, hi) = self
            .versions
            .get(&R::KEY)
            .copied()
            .unwrap_or((i16::MAX, -1));
        let v = hi.min(max).min(ours.max);
        if v < lo.max(min).max(ours.min) {
            return Err(ClientError::NoVersion {
                addr: self.addr.clone(),
                key,
                min,
                max,
            });
        }
        Ok(v)
    }

    /// Send `req` at the highest common version within `min..=max`.
    pub async fn send<R: Request>(
        &mut self,
        req: R,
        min: i16,
        max: i16,
    ) -> Result<R::Response, ClientError> {
        let v = self.version::<R>(min, max)?;
        self.send_at(req, v).await
    }

    /// Send `req` at exactly version `v` and wait for its response.
    pub async fn send_at<R: Request>(
        &mut self,
        req: R,
        v: i16,
    ) -> Result<R::Response, ClientError> {
        let body = self.frame(&req, v)?;
        let timeout = self.timeout;
        let addr = self.addr.clone();
        tokio::time::timeout(timeout, self.exchange::<R>(body, v))
            .await
            .map_err(|_| ClientError::Timeout { addr, timeout })?
    }

    /// Encode `req` as a frame with the next correlation id.
    fn frame<R: Request>(&mut self, req: &R, v: i16) -> Result<Bytes, ClientError> {
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(v)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, R::header_version(v))
            .and_then(|_| req.encode(&mut buf, v))
            .map_err(|e| self.protocol(&format!("encoding {:?}: {e}", R::KEY)))?;
        Ok(with_length_prefix(&buf))
    }

    async fn exchange<R: Request>(
        &mut self,
        frame: Bytes,
        v: i16,
    ) -> Result<R::Response, ClientError> {
        let correlation = self.next_correlation.wrapping_sub(1);
        self.writer
            .write_all(&frame)
            .await
            .map_err(|e| self.io(e))?;
        self.writer.flush().await.map_err(|e| self.io(e))?;
        let resp = match self.reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => return Err(self.protocol("connection closed")),
            Err(e) => return Err(self.protocol(&e.to_string())),
        };
        let mut body = resp.slice(4..);
        let key = ApiKey::try_from(R::KEY).map_err(|_| self.protocol("unknown api key"))?;
        let header = kafka_protocol::messages::ResponseHeader::decode(
            &mut body,
            key.response_header_version(v),
        )
        .map_err(|e| self.protocol(&format!("response header: {e}")))?;
        if header.correlation_id != correlation {
            return Err(self.protocol("correlation id mismatch"));
        }
        <R::Response as Decodable>::decode(&mut body, v)
            .map_err(|e| self.protocol(&format!("decoding {key:?} v{v} response: {e}")))
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn protocol(&self, msg: &str) -> ClientError {
        ClientError::Protocol {
            addr: self.addr.clone(),
            msg: msg.to_string(),
        }
    }
}

/// The one table of Kafka error codes antidote uses, taken from the
/// vendored kafka-protocol's `ResponseError` (never written by hand), as
/// constants so that they can be matched on.
pub mod errors {
    use kafka_protocol::ResponseError as E;

    pub const OFFSET_OUT_OF_RANGE: i16 = E::OffsetOutOfRange.code();
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = E::UnknownTopicOrPartition.code();
    pub const LEADER_NOT_AVAILABLE: i16 = E::LeaderNotAvailable.code();
    pub const NOT_LEADER_OR_FOLLOWER: i16 = E::NotLeaderOrFollower.code();
    pub const MESSAGE_TOO_LARGE: i16 = E::MessageTooLarge.code();
    /// A CreateTime record stamped beyond the topic's
    /// `message.timestamp.{before,after}.max.ms` of the broker's clock.
    pub const INVALID_TIMESTAMP: i16 = E::InvalidTimestamp.code();
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = E::CoordinatorLoadInProgress.code();
    pub const COORDINATOR_NOT_AVAILABLE: i16 = E::CoordinatorNotAvailable.code();
    pub const NOT_COORDINATOR: i16 = E::NotCoordinator.code();
    pub const RECORD_LIST_TOO_LARGE: i16 = E::RecordListTooLarge.code();
    /// Retriable and "not written", which is what a Produce batch refused
    /// for a spent decode budget is.
    pub const NOT_ENOUGH_REPLICAS: i16 = E::NotEnoughReplicas.code();
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = E::TopicAuthorizationFailed.code();
    pub const UNSUPPORTED_VERSION: i16 = E::UnsupportedVersion.code();
    pub const TOPIC_ALREADY_EXISTS: i16 = E::TopicAlreadyExists.code();
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = E::OutOfOrderSequenceNumber.code();
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = E::DuplicateSequenceNumber.code();
    pub const INVALID_PRODUCER_EPOCH: i16 = E::InvalidProducerEpoch.code();
    pub const CONCURRENT_TRANSACTIONS: i16 = E::ConcurrentTransactions.code();
    pub const UNKNOWN_PRODUCER_ID: i16 = E::UnknownProducerId.code();
    /// KIP-467: not retriable.
    pub const INVALID_RECORD: i16 = E::InvalidRecord.code();
    pub const PRODUCER_FENCED: i16 = E::ProducerFenced.code();
    /// Retriable: a Produce v13+ topic id the proxy could not resolve, so
    /// it cannot tell whether a policy covers it.
    pub const UNKNOWN_TOPIC_ID: i16 = E::UnknownTopicId.code();
}

/// An error that belongs to no one broker (no leader known, no bootstrap
/// server answered, ...).
pub fn no_broker(msg: String) -> ClientError {
    ClientError::Protocol {
        addr: HostPort {
            host: "-".into(),
            port: 0,
        },
        msg,
    }
}
