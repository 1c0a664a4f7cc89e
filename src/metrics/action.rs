//! The `action` label of `antidote_records_invalid_total`: what happened
//! to an invalid record. The labels of fetch actions are the policy
//! action's own (`policy::Action::label`).

use crate::policy::Action;

/// What happened to an invalid record (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAction {
    /// Met on fetch by its policy's action (`on_invalid`): diverted now or
    /// by an earlier fetch, dropped, or passed.
    Met(Action),
    /// Refused at Produce (`on_produce: reject`): never written.
    Rejected,
}

impl InvalidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidAction::Met(a) => a.label(),
            InvalidAction::Rejected => "rejected",
        }
    }

    /// Whether the record went to a dead-letter topic (the history's
    /// diverted series).
    pub fn diverted(self) -> bool {
        matches!(self, InvalidAction::Met(a) if a.writes())
    }
}

impl From<Action> for InvalidAction {
    fn from(a: Action) -> Self {
        InvalidAction::Met(a)
    }
}
