//! Every exported metric name, in one place (as scraped: counters with
//! their `_total`).

pub const VALIDATED: &str = "antidote_records_validated_total";
pub const PASSED: &str = "antidote_records_passed_total";
pub const EVALUATED: &str = "antidote_records_evaluated_total";
pub const FETCH_REWRITE_CPU: &str = "antidote_fetch_rewrite_cpu_seconds_total";
pub const INVALID: &str = "antidote_records_invalid_total";
pub const DLT_WRITES: &str = "antidote_dlt_writes_total";
pub const DLT_WRITE_SECONDS: &str = "antidote_dlt_write_duration_seconds";
pub const HELD_PARTITIONS: &str = "antidote_held_partitions";
pub const HELD_BATCHES: &str = "antidote_held_batches_total";
pub const FETCH_REWRITE_SECONDS: &str = "antidote_fetch_rewrite_duration_seconds";
pub const RESPONSE_RELAY_SECONDS: &str = "antidote_response_relay_duration_seconds";
pub const CONNECTIONS_OPEN: &str = "antidote_connections_open";
pub const CONNECTIONS_ACCEPTED: &str = "antidote_connections_accepted_total";
pub const UPSTREAM_ERRORS: &str = "antidote_upstream_errors_total";
pub const CONNECTIONS_REFUSED: &str = "antidote_connections_refused_total";
pub const REGISTRY_REQUESTS: &str = "antidote_schema_registry_requests_total";
pub const BUILD_INFO: &str = "antidote_build_info";
pub const START_TIME: &str = "antidote_process_start_time_seconds";
pub const DIVERSIONS: &str = "antidote_dlt_diversions_total";
pub const JUDGED_AHEAD: &str = "antidote_fetch_judged_ahead_records_total";
pub const DEADLINE_CUTS: &str = "antidote_fetch_deadline_cuts_total";
pub const LEDGER_LAG: &str = "antidote_dlt_ledger_lag_records";
pub const DLT_REFUSED: &str = "antidote_dlt_records_refused_total";

/// The name a counter is registered under: the encoder adds `_total`.
pub(super) fn counter_base(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}
