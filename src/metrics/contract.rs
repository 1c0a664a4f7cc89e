//! Failures of the schema registry's data-contract rules whose action is
//! `NONE` (counted, the record goes on): the core counts them as it judges
//! (`policy::contract::none_counts`), and this series follows those
//! totals when metrics are rendered, so the judge reports nothing itself.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::series::register;
use crate::policy::contract::none_counts;

pub const CONTRACT_NONE: &str = "antidote_contract_rule_none_total";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    subject: String,
    rule: String,
    mode: &'static str,
}

/// The series of this module.
#[derive(Default)]
pub struct ContractMetrics {
    none: Family<RuleLabels, Counter>,
}

impl ContractMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            CONTRACT_NONE,
            "Records that failed a schema registry data-contract rule with onFailure NONE (delivered or written, counted only), by subject, rule and mode (READ on fetch, WRITE at the door).",
            self.none.clone(),
        );
    }

    /// Bring the series up to the core's totals.
    ///
    /// Call site: `Metrics::render`.
    pub(super) fn sync(&self) {
        for (subject, rule, side, total) in none_counts() {
            let labels = RuleLabels {
                subject,
                rule,
                mode: side.mode(),
            };
            let c = self.none.get_or_create(&labels);
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        }
    }

    /// A series at zero, for the tests that every documented name is
    /// exported.
    #[cfg(test)]
    pub(super) fn touch(&self, subject: &str, rule: &str) {
        let labels = RuleLabels {
            subject: subject.into(),
            rule: rule.into(),
            mode: "READ",
        };
        let _ = self.none.get_or_create(&labels);
    }
}
