//! Judge arbitrary value bytes under the reference json policy
//! (`policies/geofence.yaml`): decode, schema and rules must never panic.
#![no_main]

#[path = "judge_common.rs"]
mod common;

use std::sync::{Arc, OnceLock};

use antidote::policy::Policy;
use libfuzzer_sys::fuzz_target;

static POLICY: OnceLock<Arc<Policy>> = OnceLock::new();

/// A reference trigger, judged first: the layout and the template are
/// learned from it, so mutations of the corpus's triggers reach the
/// template's steps (`policy/json/capture/flat/template.rs`).
const WARM: &[u8] = br#"{"device_id":"device-00000000","geofence_id":"fence-00042","lat":48.1,"lon":2.35,"transition":"ENTER","speed_mps":3.5,"event_time_ms":1780000000000,"accuracy_m":4.0}"#;

fuzz_target!(|data: &[u8]| common::judge(&POLICY, "geofence.yaml", WARM, data));
