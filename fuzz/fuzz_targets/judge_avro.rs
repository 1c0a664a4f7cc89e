//! Judge arbitrary value bytes under the reference avro policy
//! (`policies/geofence-avro.yaml`): decode, schema and rules must never panic.
#![no_main]

#[path = "judge_common.rs"]
mod common;

use std::sync::{Arc, OnceLock};

use antidote::policy::Policy;
use libfuzzer_sys::fuzz_target;

static POLICY: OnceLock<Arc<Policy>> = OnceLock::new();

fuzz_target!(|data: &[u8]| common::judge(&POLICY, "geofence-avro.yaml", b"", data));
