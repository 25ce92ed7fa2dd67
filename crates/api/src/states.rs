//! The API's closed sets: a session's state, profile, network and egress, a
//! version's state, a job's state and priority, a logged command's state. On the wire and in the
//! catalog each is its lowercase name (the same text as before they were
//! types); inside drums each is an enum, so a comparison is checked by the
//! compiler and a `match` names every case; text outside the set parses to
//! [`UnknownName`]. With the `sql` feature each is
//! stored as that text through rusqlite's `ToSql` and `FromSql`.

use std::fmt;

use crate::UnknownName;

macro_rules! closed_set {
    (@join $first:literal $(, $rest:literal)*) => { concat!($first $(, ", ", $rest)*) };
    (
        $(#[$meta:meta])*
        $name:ident ($what:literal) {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in the order the set is written.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Its name on the wire and in the catalog.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<$name, UnknownName> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownName {
                        what: $what,
                        value: s.to_owned(),
                        choices: closed_set!(@join $($text),+),
                    }),
                }
            }
        }

        #[cfg(feature = "sql")]
        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.as_str().into())
            }
        }

        #[cfg(feature = "sql")]
        impl rusqlite::types::FromSql for $name {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<$name> {
                v.as_str()?
                    .parse()
                    .map_err(|e: UnknownName| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    };
}

closed_set! {
    /// Where a session is in its life.
    SessionState("session state") {
        /// Being built: by a create, a restore, a rollback or a recovery.
        Creating = "creating",
        Running = "running",
        /// Being removed: no new version starts.
        Removing = "removing",
    }
}

closed_set! {
    /// What a session runs.
    Profile("profile") {
        /// No display.
        Headless = "headless",
        /// Xvfb, openbox and Chromium (docs/desktop.md).
        Desktop = "desktop",
    }
}

closed_set! {
    /// A session's network.
    Network("network") {
        /// A veth to the host bridge, with its own address; no route beyond
        /// the bridge.
        Bridge = "bridge",
        /// A loopback-only network namespace.
        None = "none",
    }
}

closed_set! {
    /// Whether a bridge session may leave the host (docs/security.md, "The
    /// network").
    Egress("egress") {
        /// The default: nothing beyond its bridge port (and on the host only
        /// the ports drums serves to sessions).
        None = "none",
        /// A default route via the bridge, masqueraded out of the host; the
        /// host and private ranges stay unreachable.
        Nat = "nat",
    }
}

closed_set! {
    /// Where a version (a checkpoint) is in its life (docs/engine.md).
    VersionState("version state") {
        /// An import being unpacked.
        Pending = "pending",
        /// CRIU or the snapshot is taking it.
        Dumping = "dumping",
        /// Taken; its manifest is being written.
        Versioning = "versioning",
        Done = "done",
        Failed = "failed",
        /// Being removed: a removal a crash cut short is finished at start.
        Removing = "removing",
    }
}

closed_set! {
    /// Where a checkpoint job is.
    JobState("job state") {
        Queued = "queued",
        Running = "running",
        Done = "done",
        Failed = "failed",
    }
}

closed_set! {
    /// Where a command run through a coordinated session's exec is, in the
    /// command log that a recovery replays.
    CommandState("command state") {
        Running = "running",
        Done = "done",
        Failed = "failed",
        /// Run again after a recovery, to its end.
        Reissued = "reissued",
        /// Its caller went away, which stops it.
        Cancelled = "cancelled",
        /// Run again after a recovery, its output differed from what the
        /// caller already had.
        Diverged = "diverged",
        /// drumsd stopped while it ran.
        Interrupted = "interrupted",
    }
}

closed_set! {
    /// A checkpoint job's queue.
    Priority("priority") {
        Normal = "normal",
        /// Someone waits for it (a checkpoint, a promoted job).
        High = "high",
    }
}

// closed_set! derives one list for every set; these two sets have a default.
#[allow(clippy::derivable_impls)]
impl Default for Profile {
    fn default() -> Profile {
        Profile::Headless
    }
}

#[allow(clippy::derivable_impls)]
impl Default for Egress {
    fn default() -> Egress {
        Egress::None
    }
}

impl VersionState {
    /// Not yet published: what the sweep drops at start.
    pub const IN_FLIGHT: [VersionState; 3] = [
        VersionState::Pending,
        VersionState::Dumping,
        VersionState::Versioning,
    ];

    pub fn in_flight(self) -> bool {
        VersionState::IN_FLIGHT.contains(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_its_text_on_the_wire_and_back() {
        fn round_trip<T>(all: &[T])
        where
            T: Copy + PartialEq + fmt::Debug + fmt::Display + std::str::FromStr + serde::Serialize,
            T: serde::de::DeserializeOwned,
            <T as std::str::FromStr>::Err: fmt::Debug,
        {
            for v in all {
                let text = v.to_string();
                assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(text));
                assert_eq!(
                    serde_json::from_value::<T>(serde_json::json!(text)).unwrap(),
                    *v
                );
                assert_eq!(text.parse::<T>().unwrap(), *v);
            }
        }
        round_trip(SessionState::ALL);
        round_trip(Profile::ALL);
        round_trip(Network::ALL);
        round_trip(Egress::ALL);
        round_trip(VersionState::ALL);
        round_trip(JobState::ALL);
        round_trip(CommandState::ALL);
        round_trip(Priority::ALL);
        let texts: Vec<&str> = SessionState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(texts, ["creating", "running", "removing"]);
    }

    #[test]
    fn an_unknown_value_names_the_set_and_its_values() {
        let e = "paused".parse::<SessionState>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown session state \"paused\" (creating, running, removing)"
        );
        assert!(serde_json::from_value::<Egress>(serde_json::json!("open")).is_err());
    }
}
