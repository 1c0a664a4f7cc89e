//! The proxy's own Kafka client: one connection, typed requests, one request
//! in flight at a time. Used for the proxy's metadata lookups and, later, by
//! the dead-letter producer and the `dlt` commands. It negotiates versions
//! with ApiVersions on connect and picks, per API, the highest version both
//! sides support within a range the caller names.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};

use crate::config::HostPort;
use crate::proxy::frame::{FrameReader, with_length_prefix};
use crate::proxy::net::{self, BoxIo};
use crate::proxy::tls;

/// Why a request through the proxy's own client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{addr}: {source}")]
    Io { addr: HostPort, source: std::io::Error },
    #[error("{addr}: {msg}")]
    Protocol { addr: HostPort, msg: String },
    #[error("{addr}: the broker supports no version of {key:?} in {min}..={max}")]
    NoVersion { addr: HostPort, key: ApiKey, min: i16, max: i16 },
    #[error("{addr}: no response within {timeout:?}")]
    Timeout { addr: HostPort, timeout: Duration },
}

/// How to reach a cluster.
#[derive(Clone)]
pub struct Endpoint {
    pub tls: Option<tls::Upstream>,
    pub timeout: Duration,
    pub max_frame: u32,
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
            .map_err(|source| ClientError::Io { addr: addr.clone(), source })?;
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
                    .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION"))),
                3,
            )
            .await?;
        conn.versions = resp
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(conn)
    }

    pub fn addr(&self) -> &HostPort {
        &self.addr
    }

    /// The highest version of `R` both sides support within `min..=max`.
    pub fn version<R: Request>(&self, min: i16, max: i16) -> Result<i16, ClientError> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| self.protocol("unknown api key"))?;
        let ours = key.valid_versions();
        let (lo, hi) = self.versions.get(&R::KEY).copied().unwrap_or((i16::MAX, -1));
        let v = hi.min(max).min(ours.max);
        if v < lo.max(min).max(ours.min) {
            return Err(ClientError::NoVersion { addr: self.addr.clone(), key, min, max });
        }
        Ok(v)
    }

    /// Send `req` at the highest common version within `min..=max`.
    pub async fn send<R: Request>(&mut self, req: R, min: i16, max: i16) -> Result<R::Response, ClientError> {
        let v = self.version::<R>(min, max)?;
        self.send_at(req, v).await
    }

    /// Send `req` at exactly version `v` and wait for its response.
    pub async fn send_at<R: Request>(&mut self, req: R, v: i16) -> Result<R::Response, ClientError> {
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

    async fn exchange<R: Request>(&mut self, frame: Bytes, v: i16) -> Result<R::Response, ClientError> {
        let correlation = self.next_correlation.wrapping_sub(1);
        self.writer.write_all(&frame).await.map_err(|e| self.io(e))?;
        self.writer.flush().await.map_err(|e| self.io(e))?;
        let resp = match self.reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => return Err(self.protocol("connection closed")),
            Err(e) => return Err(self.protocol(&e.to_string())),
        };
        let mut body = resp.slice(4..);
        let key = ApiKey::try_from(R::KEY).map_err(|_| self.protocol("unknown api key"))?;
        let header = kafka_protocol::messages::ResponseHeader::decode(&mut body, key.response_header_version(v))
            .map_err(|e| self.protocol(&format!("response header: {e}")))?;
        if header.correlation_id != correlation {
            return Err(self.protocol("correlation id mismatch"));
        }
        <R::Response as Decodable>::decode(&mut body, v)
            .map_err(|e| self.protocol(&format!("decoding {key:?} v{v} response: {e}")))
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io { addr: self.addr.clone(), source }
    }

    fn protocol(&self, msg: &str) -> ClientError {
        ClientError::Protocol { addr: self.addr.clone(), msg: msg.to_string() }
    }
}
