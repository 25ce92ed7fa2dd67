//! The five recovery strategies of the Crab paper's evaluation (section 7),
//! as drums runs them: each is a turn policy of the coordinator's drumsd
//! and what the agent's operator does after a failure.

use drums_api::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// A fresh sandbox, and the agent's chat history as it was: the model
    /// goes on, the sandbox's state is lost.
    ChatOnly,
    /// drumsd restores the newest files-only version (the `files` policy):
    /// the files come back, the processes start cold.
    ChatFiles,
    /// drumsd restores the newest version, both artifacts at every turn
    /// (the `full` policy).
    Full,
    /// drumsd restores the newest version, each turn taking what the
    /// inspector says it changed (drums' default).
    Selective,
    /// A fresh sandbox, and the agent starts its task again from turn 0.
    Restart,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::ChatOnly,
        Strategy::ChatFiles,
        Strategy::Full,
        Strategy::Selective,
        Strategy::Restart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::ChatOnly => "chat-only",
            Strategy::ChatFiles => "chat+files",
            Strategy::Full => "full",
            Strategy::Selective => "selective",
            Strategy::Restart => "restart",
        }
    }

    /// A short tag for session names.
    pub fn tag(self) -> &'static str {
        match self {
            Strategy::ChatOnly => "co",
            Strategy::ChatFiles => "cf",
            Strategy::Full => "fu",
            Strategy::Selective => "se",
            Strategy::Restart => "re",
        }
    }

    /// What each turn's end takes.
    pub fn policy(self) -> Policy {
        match self {
            Strategy::ChatOnly | Strategy::Restart => Policy::Off,
            Strategy::ChatFiles => Policy::Files,
            Strategy::Full => Policy::Full,
            Strategy::Selective => Policy::Selective,
        }
    }

    /// drumsd brings the session back itself, from its versions; otherwise
    /// the operator replaces it with a fresh one.
    pub fn drumsd_recovers(self) -> bool {
        self.policy() != Policy::Off
    }
}

/// The error is clap's message for `--strategy` (no source to keep).
impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Strategy, String> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown strategy {s:?} ({})",
                    Strategy::ALL.map(Strategy::name).join(", ")
                )
            })
    }
}
