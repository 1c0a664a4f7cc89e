//! A cluster through the proxy's own client: brokers learned from metadata,
//! one connection per broker, partition leaders per topic, and the few
//! cluster-wide requests the proxy makes (metadata, create topic, log
//! start, produce to a leader).

use std::collections::HashMap;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{errors, no_broker, ClientError, Connection, Endpoint};
use crate::config::HostPort;

/// A cluster seen through the proxy's own client: brokers from metadata,
/// one connection per broker, partition leaders per topic.
pub struct Cluster {
    bootstrap: Vec<HostPort>,
    ep: Endpoint,
    brokers: HashMap<i32, HostPort>,
    conns: HashMap<i32, Connection>,
    bootstrap_conn: Option<Connection>,
    /// The bootstrap server tried first, and the one `bootstrap_conn` is to.
    /// A server that accepts connections but never answers (a frozen
    /// broker: its kernel still completes handshakes) would otherwise take
    /// every attempt, the first server that accepts being the one used: a
    /// failure moves the next server to the front.
    first: usize,
    used: Option<usize>,
    /// topic -> leader node id per partition (index = partition).
    leaders: HashMap<String, Vec<i32>>,
}

impl Cluster {
    pub fn new(bootstrap: Vec<HostPort>, ep: Endpoint) -> Self {
        Cluster {
            bootstrap,
            ep,
            brokers: HashMap::new(),
            conns: HashMap::new(),
            bootstrap_conn: None,
            first: 0,
            used: None,
            leaders: HashMap::new(),
        }
    }

    /// A connection to any broker (the bootstrap connection, kept open).
    pub async fn any(&mut self) -> Result<&mut Connection, ClientError> {
        if self.bootstrap_conn.is_none() {
            let mut last = None;
            let n = self.bootstrap.len();
            for i in (0..n).map(|k| (self.first + k) % n) {
                match Connection::connect(&self.bootstrap[i], &self.ep).await {
                    Ok(c) => {
                        self.bootstrap_conn = Some(c);
                        // Servers that failed to connect before it go last.
                        self.first = i;
                        self.used = Some(i);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if self.bootstrap_conn.is_none() {
                return Err(last.unwrap_or_else(|| no_broker("no bootstrap servers".into())));
            }
        }
        self.bootstrap_conn.as_mut().ok_or_else(unreachable_conn)
    }

    /// Fetch metadata for `topics` (all topics when `None`) and remember
    /// brokers and leaders.
    pub async fn metadata(
        &mut self,
        topics: Option<&[String]>,
    ) -> Result<kafka_protocol::messages::MetadataResponse, ClientError> {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::messages::{MetadataRequest, TopicName};
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
                    })
                    .collect()
            }));
        let resp = match self.any().await?.send(req, 4, 12).await {
            Ok(r) => r,
            Err(e) => {
                self.drop_bootstrap();
                return Err(e);
            }
        };
        for b in &resp.brokers {
            if let Ok(port) = u16::try_from(b.port) {
                self.brokers.insert(
                    b.node_id.0,
                    HostPort {
                        host: b.host.to_string(),
                        port,
                    },
                );
            }
        }
        for t in &resp.topics {
            let Some(name) = &t.name else { continue };
            if t.error_code != 0 {
                self.leaders.remove(name.0.as_str());
                continue;
            }
            let mut leaders = vec![-1; t.partitions.len()];
            for p in &t.partitions {
                if let Some(slot) = usize::try_from(p.partition_index)
                    .ok()
                    .and_then(|i| leaders.get_mut(i))
                {
                    *slot = p.leader_id.0;
                }
            }
            self.leaders.insert(name.to_string(), leaders);
        }
        Ok(resp)
    }

    /// Partition count of `topic`, or `None` if it does not exist.
    pub async fn partitions(&mut self, topic: &str) -> Result<Option<usize>, ClientError> {
        if !self.leaders.contains_key(topic) {
            self.metadata(Some(&[topic.to_string()])).await?;
        }
        Ok(self.leaders.get(topic).map(Vec::len))
    }

    /// Partition count of `topic` as last seen in metadata, without asking.
    pub fn known_partitions(&self, topic: &str) -> Option<usize> {
        self.leaders.get(topic).map(Vec::len)
    }

    /// Create `topic` with topic `configs` (e.g. `max.message.bytes`); an
    /// already existing topic is not an error.
    pub async fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
        configs: &[(&str, String)],
    ) -> Result<(), ClientError> {
        use kafka_protocol::messages::create_topics_request::{
            CreatableTopic, CreatableTopicConfig,
        };
        use kafka_protocol::messages::{CreateTopicsRequest, TopicName};
        let configs = configs
            .iter()
            .map(|(k, v)| {
                CreatableTopicConfig::default()
                    .with_name(StrBytes::from_string(k.to_string()))
                    .with_value(Some(StrBytes::from_string(v.clone())))
            })
            .collect();
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_num_partitions(partitions)
                .with_replication_factor(replication)
                .with_configs(configs)]);
        let conn = self.any().await?;
        let addr = conn.addr().clone();
        let resp = conn.send(req, 0, 7).await?;
        for t in &resp.topics {
            if t.error_code != 0 && t.error_code != errors::TOPIC_ALREADY_EXISTS {
                return Err(ClientError::Protocol {
                    addr,
                    msg: format!(
                        "creating topic {topic}: error {} {}",
                        t.error_code,
                        t.error_message.as_ref().map(|m| m.as_str()).unwrap_or("")
                    ),
                });
            }
        }
        self.leaders.remove(topic);
        Ok(())
    }

    /// The log start offset of `topic`/`partition` (ListOffsets, earliest):
    /// where reading it from the beginning starts once retention has
    /// deleted its first segments.
    pub async fn log_start(&mut self, topic: &str, partition: i32) -> Result<i64, ClientError> {
        const EARLIEST: i64 = -2;
        self.list_offset(topic, partition, EARLIEST).await
    }

    /// ListOffsets of `topic`/`partition` for `timestamp` (ms, or -2
    /// earliest, -1 latest): the first offset whose timestamp is at or after
    /// it, -1 if none.
    pub async fn list_offset(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<i64, ClientError> {
        use kafka_protocol::messages::list_offsets_request::{
            ListOffsetsPartition, ListOffsetsTopic,
        };
        use kafka_protocol::messages::ListOffsetsRequest;
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(timestamp)])]);
        let conn = self.leader(topic, partition).await?;
        let addr = conn.addr().clone();
        let resp = conn.send(req, 1, 7).await?;
        let p = resp
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| {
                no_broker(format!("{topic}-{partition}: no partition in ListOffsets"))
            })?;
        if p.error_code != 0 {
            return Err(ClientError::Protocol {
                addr,
                msg: format!("{topic}-{partition}: ListOffsets error {}", p.error_code),
            });
        }
        Ok(p.offset)
    }

    /// The node id of the leader of `topic`/`partition` (metadata looked up
    /// when not known).
    pub async fn leader_id(&mut self, topic: &str, partition: i32) -> Result<i32, ClientError> {
        let known = |c: &Self| {
            c.leaders
                .get(topic)
                .and_then(|l| l.get(usize::try_from(partition).ok()?).copied())
                .filter(|&n| n >= 0)
        };
        if let Some(n) = known(self) {
            return Ok(n);
        }
        self.metadata(Some(&[topic.to_string()])).await?;
        known(self).ok_or_else(|| no_broker(format!("no leader for {topic}-{partition}")))
    }

    /// A connection to the leader of `topic`/`partition`.
    pub async fn leader(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<&mut Connection, ClientError> {
        let known = self
            .leaders
            .get(topic)
            .and_then(|l| l.get(partition as usize))
            .is_some_and(|&n| n >= 0);
        if !known {
            self.metadata(Some(&[topic.to_string()])).await?;
        }
        let node = self
            .leaders
            .get(topic)
            .and_then(|l| l.get(partition as usize).copied())
            .filter(|&n| n >= 0)
            .ok_or_else(|| no_broker(format!("no leader for {topic}-{partition}")))?;
        self.node(node).await
    }

    /// Write `batch` to `topic`/`partition` on its leader with acks=all;
    /// the partition's part of the response (its error code, base offset).
    pub async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<PartitionProduceResponse, ClientError> {
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch))])]);
        let resp = self.leader(topic, partition).await?.send(req, 3, 9).await?;
        resp.responses
            .into_iter()
            .flat_map(|t| t.partition_responses)
            .find(|p| p.index == partition)
            .ok_or_else(|| {
                no_broker(format!(
                    "{topic}-{partition}: no partition in the produce response"
                ))
            })
    }

    /// A connection to the transaction coordinator of `transactional_id`
    /// (FindCoordinator, key type 1): InitProducerId with a transactional
    /// id must go there, or a cluster of several brokers answers
    /// NOT_COORDINATOR. A coordinator error (still loading, not available)
    /// is returned as an error for the caller to retry.
    pub async fn transaction_coordinator(
        &mut self,
        transactional_id: &str,
    ) -> Result<&mut Connection, ClientError> {
        let conn = self.any().await?;
        let v = conn.version::<FindCoordinatorRequest>(1, 6)?;
        let key = StrBytes::from_string(transactional_id.to_string());
        let mut req = FindCoordinatorRequest::default().with_key_type(1);
        req = if v >= 4 {
            req.with_coordinator_keys(vec![key])
        } else {
            req.with_key(key)
        };
        let resp = conn.send_at(req, v).await?;
        let (code, node) = match resp.coordinators.first() {
            Some(c) if v >= 4 => (c.error_code, c.node_id.0),
            _ => (resp.error_code, resp.node_id.0),
        };
        if code != 0 || node < 0 {
            return Err(no_broker(format!(
                "FindCoordinator for {transactional_id}: error {code}"
            )));
        }
        if !self.brokers.contains_key(&node) {
            self.metadata(None).await?;
        }
        self.node(node).await
    }

    /// A connection to broker `node`.
    pub async fn node(&mut self, node: i32) -> Result<&mut Connection, ClientError> {
        if !self.conns.contains_key(&node) {
            let addr = self
                .brokers
                .get(&node)
                .cloned()
                .ok_or_else(|| no_broker(format!("broker {node} unknown")))?;
            let conn = Connection::connect(&addr, &self.ep).await?;
            self.conns.insert(node, conn);
        }
        self.conns.get_mut(&node).ok_or_else(unreachable_conn)
    }

    /// Forget the cached leaders of `topic` (a broker answered that it no
    /// longer leads one of its partitions): the next request for it looks
    /// them up in metadata again. Connections stay open.
    pub fn forget_leaders(&mut self, topic: &str) {
        self.leaders.remove(topic);
    }

    /// Drop every connection and cached leader (after an error).
    pub fn reset(&mut self) {
        self.conns.clear();
        self.bootstrap_conn = None;
        self.used = None;
        self.leaders.clear();
    }

    /// Drop the bootstrap connection after a request through it failed:
    /// the next one starts at the bootstrap server after the one it was to.
    fn drop_bootstrap(&mut self) {
        if let Some(i) = self.used.take() {
            self.first = (i + 1) % self.bootstrap.len().max(1);
        }
        self.bootstrap_conn = None;
    }
}

fn unreachable_conn() -> ClientError {
    no_broker("no connection".into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::mock_broker::MockBroker;

    /// A bootstrap server that accepts connections and never answers, as a
    /// frozen broker does (its kernel completes the handshakes): once a
    /// connection to it timed out, later connections (after a reset) go
    /// to the server that answered, not through it again first.
    #[tokio::test]
    async fn a_silent_bootstrap_server_is_passed_over_after_a_timeout() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let silent_addr = HostPort {
            host: "127.0.0.1".into(),
            port: silent.local_addr().expect("addr").port(),
        };
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = held.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = silent.accept().await {
                h.lock().expect("lock").push(sock); // kept open, never read
            }
        });
        let accepted = || held.lock().expect("lock").len();
        let mock = MockBroker::start().await;
        mock.add_topic("t", 1);
        let ep = Endpoint {
            tls: None,
            sasl: None,
            timeout: Duration::from_millis(300),
            max_frame: 1 << 20,
        };
        let mut cluster = Cluster::new(vec![silent_addr, mock.addr.clone()], ep);
        let t = ["t".to_string()];
        cluster
            .metadata(Some(&t))
            .await
            .expect("through the second server");
        assert_eq!(accepted(), 1);
        for _ in 0..3 {
            cluster.reset();
            cluster.metadata(Some(&t)).await.expect("metadata");
        }
        assert_eq!(accepted(), 1, "the silent server was tried first again");
        assert_eq!(cluster.known_partitions("t"), Some(1));
    }
}
