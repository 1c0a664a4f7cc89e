//! Writing one record with acks=all, outside the DLT writer's batches: a
//! replayed record (`dlt replay`), a re-driven one, a marker. Retries only
//! the errors that guarantee nothing was written (leader moved or unknown).

use std::time::Duration;

use crate::client::{errors, ClientError, Cluster};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{0}")]
    Produce(String),
}

/// Produce one record with acks=all and no producer id (markers, re-drive):
/// its offset.
pub async fn produce_plain(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    record: &NewRecord,
) -> Result<i64, WriteError> {
    send(cluster, topic, partition, record, &BuildOptions::default())
        .await?
        .map_err(|()| WriteError::Produce(format!("{topic}-{partition}: producer fenced")))
}

/// One record as one batch built with `opts`: `Ok(Err(()))` when the
/// broker says its producer is fenced or out of sequence.
pub async fn send(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    record: &NewRecord,
    opts: &BuildOptions,
) -> Result<Result<i64, ()>, WriteError> {
    let batch = build_batch(std::slice::from_ref(record), opts)
        .map_err(|e| WriteError::Produce(e.to_string()))?;
    let mut last = String::new();
    for attempt in 0..3u32 {
        let p = cluster.produce(topic, partition, batch.clone()).await?;
        match p.error_code {
            0 => return Ok(Ok(p.base_offset)),
            errors::PRODUCER_FENCED
            | errors::INVALID_PRODUCER_EPOCH
            | errors::OUT_OF_ORDER_SEQUENCE_NUMBER
            | errors::UNKNOWN_PRODUCER_ID => return Ok(Err(())),
            code @ (errors::NOT_LEADER_OR_FOLLOWER | errors::LEADER_NOT_AVAILABLE) => {
                last = format!("{topic}-{partition}: leader not available (error {code})");
                cluster.reset();
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            code => {
                let msg = p
                    .error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                return Err(WriteError::Produce(format!(
                    "{topic}-{partition}: produce error {code} {msg}"
                )));
            }
        }
    }
    Err(WriteError::Produce(last))
}
