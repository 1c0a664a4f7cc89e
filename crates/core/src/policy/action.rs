//! The actions for an invalid record (`on_invalid`), and everything each
//! one decides: its name in a policy file, what it does to the record in
//! a Fetch response (`removes`, `writes`) and the `action` label it is
//! counted under. The planner, the share proxy and the metrics ask these
//! methods and never match on the variants, so a new action is a variant
//! and its arms here.

use serde::Deserialize;

/// What to do with an invalid record, as a policy names it. A record
/// whose class is `transient` is always planned as `Divert` (held there,
/// never written), whatever the policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Written to the policy's dead-letter topic, then removed from the
    /// response (the default).
    #[default]
    Divert,
    /// Removed from the response and written nowhere.
    Drop,
    /// Delivered as it is, and counted.
    Pass,
}

impl Action {
    /// Whether the record leaves its batch: the client never sees it (a
    /// share consumer's proxy acknowledges it for the client).
    pub fn removes(self) -> bool {
        match self {
            Action::Divert | Action::Drop => true,
            Action::Pass => false,
        }
    }

    /// Whether the record is written to its dead-letter topic, and the
    /// response released only once the write is acknowledged.
    pub fn writes(self) -> bool {
        match self {
            Action::Divert => true,
            Action::Drop | Action::Pass => false,
        }
    }

    /// The `action` label of `antidote_records_invalid_total`.
    pub fn label(self) -> &'static str {
        match self {
            Action::Divert => "diverted",
            Action::Drop => "dropped",
            Action::Pass => "passed_invalid",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Action;

    #[test]
    fn policy_names_parse_to_their_actions() {
        for (name, action) in [
            ("divert", Action::Divert),
            ("drop", Action::Drop),
            ("pass", Action::Pass),
        ] {
            let parsed: Action = serde_yaml::from_str(name).unwrap();
            assert_eq!(parsed, action);
        }
        assert!(serde_yaml::from_str::<Action>("quarantine").is_err());
    }

    #[test]
    fn only_a_removed_record_can_be_written() {
        for a in [Action::Divert, Action::Drop, Action::Pass] {
            assert!(!a.writes() || a.removes(), "{a:?}");
        }
    }
}
