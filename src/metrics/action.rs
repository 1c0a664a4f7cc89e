//! The `action` label of `antidote_records_invalid_total`: what happened
//! to an invalid record.

/// What happened to an invalid record (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAction {
    /// Written to its dead-letter topic and removed from the response.
    Diverted,
    /// Removed from the response, not written anywhere (`on_invalid: drop`).
    Dropped,
    /// Delivered to the consumer although invalid (`on_invalid: pass`).
    PassedInvalid,
    /// Refused at Produce (`on_produce: reject`): never written.
    Rejected,
}

impl InvalidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidAction::Diverted => "diverted",
            InvalidAction::Dropped => "dropped",
            InvalidAction::PassedInvalid => "passed_invalid",
            InvalidAction::Rejected => "rejected",
        }
    }
}

impl From<crate::policy::Action> for InvalidAction {
    fn from(a: crate::policy::Action) -> Self {
        match a {
            crate::policy::Action::Divert => InvalidAction::Diverted,
            crate::policy::Action::Drop => InvalidAction::Dropped,
            crate::policy::Action::Pass => InvalidAction::PassedInvalid,
        }
    }
}

impl From<crate::plan::Outcome> for InvalidAction {
    fn from(o: crate::plan::Outcome) -> Self {
        match o {
            crate::plan::Outcome::DivertedBefore => InvalidAction::Diverted,
            crate::plan::Outcome::Dropped => InvalidAction::Dropped,
            crate::plan::Outcome::Passed => InvalidAction::PassedInvalid,
        }
    }
}
