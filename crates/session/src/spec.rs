//! Validating a create request: every bad input is refused here, before
//! anything is created.

use drums_api::{CreateSession, Limits};

use crate::SessionError;

/// Profiles this build can start.
pub const PROFILES: &[&str] = &["headless"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// A loopback-only network namespace.
    None,
    /// A veth to the host bridge, with its own address; no route beyond the bridge.
    Bridge,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Bridge => "bridge",
        }
    }
}

/// A validated request.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: Option<String>,
    pub profile: String,
    pub image: String,
    pub limits: Limits,
    pub network: Network,
}

pub fn validate_name(name: &str) -> Result<(), SessionError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SessionError::Invalid(format!(
            "invalid session name {name:?}: use 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )))
    }
}

impl Spec {
    pub fn from_request(req: &CreateSession) -> Result<Spec, SessionError> {
        if let Some(n) = &req.name {
            validate_name(n)?;
        }
        let profile = req.profile.clone().unwrap_or_else(|| "headless".into());
        if !PROFILES.contains(&profile.as_str()) {
            return Err(SessionError::Invalid(format!(
                "unknown profile {profile:?}: this drums offers {}",
                PROFILES.join(", ")
            )));
        }
        let network = match req.network.as_deref().unwrap_or("bridge") {
            "bridge" => Network::Bridge,
            "none" => Network::None,
            other => {
                return Err(SessionError::Invalid(format!(
                    "unknown network {other:?}: use bridge or none"
                )));
            }
        };
        let limits = drums_cgroup::Limits {
            memory_bytes: req.limits.memory_bytes,
            pids_max: req.limits.pids_max,
            cpus: req.limits.cpus,
        };
        limits
            .validate()
            .map_err(|e| SessionError::Invalid(e.to_string()))?;
        Ok(Spec {
            name: req.name.clone(),
            profile,
            image: req.image.clone().unwrap_or_else(|| "default".into()),
            limits: req.limits.clone(),
            network,
        })
    }
}

/// A hostname for a session: its name when that is a valid host name label,
/// else `drums-<id>`.
pub fn hostname_for(name: &str, id: &str) -> String {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if label {
        name.to_ascii_lowercase()
    } else {
        format!("drums-{id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_names_profiles_networks_and_limits() {
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(64), "../etc"] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
        validate_name("agent-1.test_x").unwrap();
        let mut r = CreateSession {
            profile: Some("gpu".into()),
            ..Default::default()
        };
        assert!(Spec::from_request(&r)
            .unwrap_err()
            .to_string()
            .starts_with("unknown profile \"gpu\""));
        r.profile = None;
        r.network = Some("host".into());
        assert!(Spec::from_request(&r)
            .unwrap_err()
            .to_string()
            .contains("use bridge or none"));
        r.network = None;
        r.limits.memory_bytes = Some(1000);
        assert!(Spec::from_request(&r).is_err());
        r.limits = Limits {
            memory_bytes: Some(256 << 20),
            pids_max: Some(100),
            cpus: Some(0.5),
        };
        let s = Spec::from_request(&r).unwrap();
        assert_eq!(s.image, "default");
        assert_eq!(s.network, Network::Bridge);
    }

    #[test]
    fn hostnames_are_valid_labels() {
        assert_eq!(hostname_for("Agent-1", "abc"), "agent-1");
        assert_eq!(hostname_for("a_b", "abc"), "drums-abc");
        assert_eq!(hostname_for("a.b", "abc"), "drums-abc");
    }
}
