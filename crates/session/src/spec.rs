//! Validating a create request: every bad input is refused here, before
//! anything is created.

use drums_api::{CreateSession, Limits};

use crate::limits::LimitPolicy;
use crate::SessionError;

pub use drums_api::{Egress, Network, Profile};

/// Egress as a request or a manifest names it: only a known value passes.
pub fn parse_egress(s: &str) -> Result<Egress, SessionError> {
    s.parse()
        .map_err(|_| SessionError::Invalid(format!("unknown egress {s:?}: use none or nat")))
}

/// A network as a manifest names it: only a known value passes.
pub fn parse_network(s: &str) -> Result<Network, SessionError> {
    s.parse().map_err(|_| {
        SessionError::Invalid(format!(
            "the version's manifest names an unknown network {s:?}"
        ))
    })
}

/// A validated request.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: Option<String>,
    pub profile: Profile,
    pub image: String,
    pub limits: Limits,
    pub network: Network,
    pub egress: Egress,
    /// Set for the desktop profile (with defaults filled in).
    pub desktop: Option<DesktopSpec>,
    pub privileged: bool,
}

/// What the guest agent starts the desktop with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DesktopSpec {
    /// `WIDTHxHEIGHT`.
    pub screen: String,
    pub url: Option<String>,
}

/// The screen a desktop gets when the request names none.
pub const DEFAULT_SCREEN: &str = "1280x800";

/// A session's name: see [`validate_name_of`].
pub fn validate_name(name: &str) -> Result<(), SessionError> {
    validate_name_of("session", name)
}

/// A name of a session or checkpoint (`what`): one plain component, since it
/// becomes part of paths, cgroup names and host names.
pub fn validate_name_of(what: &str, name: &str) -> Result<(), SessionError> {
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
            "invalid {what} name {name:?}: use 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )))
    }
}

impl Spec {
    /// The spec of the session a files-only version was taken of, for its
    /// cold start on those files: same image, limits, network and
    /// confinement. A desktop's screen and page are not in a manifest, so a
    /// desktop session's files-only version does not start cold.
    pub(crate) fn of_version(
        s: &drums_checkpoint::SourceSession,
        limits: Limits,
    ) -> Result<Spec, SessionError> {
        if s.profile != Profile::Headless.as_str() {
            return Err(SessionError::Conflict(format!(
                "a files-only version of a {} session cannot start cold (its desktop's options are not recorded)",
                s.profile
            )));
        }
        let network = parse_network(&s.network)?;
        Ok(Spec {
            name: Some(s.name.clone()),
            profile: Profile::Headless,
            image: s.image.clone(),
            limits,
            network,
            egress: parse_egress(&s.egress)?,
            desktop: None,
            privileged: s.privileged,
        })
    }

    /// Validate `req`; limits it does not name come from `policy`'s defaults.
    pub fn from_request(req: &CreateSession, policy: &LimitPolicy) -> Result<Spec, SessionError> {
        if let Some(n) = &req.name {
            validate_name(n)?;
        }
        let profile = match req.profile.as_deref() {
            None => Profile::Headless,
            Some(p) => p.parse().map_err(|_| {
                SessionError::Invalid(format!(
                    "unknown profile {p:?}: this drums offers {}",
                    Profile::ALL
                        .iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
        };
        let desktop = match (profile, &req.desktop) {
            (Profile::Desktop, opts) => {
                let opts = opts.clone().unwrap_or_default();
                let screen = opts.screen.unwrap_or_else(|| DEFAULT_SCREEN.into());
                validate_screen(&screen)?;
                if let Some(url) = &opts.url {
                    validate_url(url)?;
                }
                Some(DesktopSpec {
                    screen,
                    url: opts.url,
                })
            }
            (_, Some(_)) => {
                return Err(SessionError::Invalid(format!(
                    "desktop options need the desktop profile, not {:?}",
                    profile.as_str()
                )));
            }
            _ => None,
        };
        let default_image = if desktop.is_some() {
            "desktop"
        } else {
            "default"
        };
        let network = match req.network.as_deref().unwrap_or("bridge") {
            "bridge" => Network::Bridge,
            "none" => Network::None,
            other => {
                return Err(SessionError::Invalid(format!(
                    "unknown network {other:?}: use bridge or none"
                )));
            }
        };
        let egress = parse_egress(req.egress.as_deref().unwrap_or("none"))?;
        if egress == Egress::Nat && network != Network::Bridge {
            return Err(SessionError::Invalid(
                "egress nat needs network bridge".into(),
            ));
        }
        let limits = policy.effective_for(profile, &req.limits)?;
        Ok(Spec {
            name: req.name.clone(),
            profile,
            image: req.image.clone().unwrap_or_else(|| default_image.into()),
            limits,
            network,
            egress,
            desktop,
            privileged: req.privileged,
        })
    }
}

/// The device policy of a session: runc's allow-list, or every device for a
/// privileged one.
pub fn devices(privileged: bool) -> drums_cgroup::Devices {
    if privileged {
        drums_cgroup::Devices::All
    } else {
        drums_cgroup::Devices::AllowList
    }
}

/// `WIDTHxHEIGHT`, each 64 to 8192 (what Xvfb and a screenshot can hold).
fn validate_screen(s: &str) -> Result<(), SessionError> {
    let ok = s.split_once('x').is_some_and(|(w, h)| {
        [w, h].iter().all(|n| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && n.parse::<u32>().is_ok_and(|v| (64..=8192).contains(&v))
        })
    });
    if ok {
        Ok(())
    } else {
        Err(SessionError::Invalid(format!(
            "invalid screen {s:?}: expected WIDTHxHEIGHT such as 1280x800, each 64 to 8192"
        )))
    }
}

/// A URL Chromium is given as its first page: it becomes a command-line
/// argument, so nothing that looks like an option and no control characters.
fn validate_url(url: &str) -> Result<(), SessionError> {
    let ok = !url.is_empty()
        && !url.starts_with('-')
        && url.len() <= 8192
        && url.contains(':')
        && !url.chars().any(|c| c.is_control());
    if ok {
        Ok(())
    } else {
        Err(SessionError::Invalid(format!(
            "invalid url {url:?}: expected an absolute URL such as https://example.com or data:text/html,..."
        )))
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

    fn policy() -> LimitPolicy {
        crate::limits::test_policy()
    }

    #[test]
    fn desktop_defaults_and_bad_desktop_input() {
        let d = Spec::from_request(
            &CreateSession {
                profile: Some("desktop".into()),
                ..Default::default()
            },
            &policy(),
        )
        .unwrap();
        assert_eq!(d.image, "desktop");
        assert_eq!(
            d.desktop,
            Some(DesktopSpec {
                screen: "1280x800".into(),
                url: None
            })
        );
        let h = Spec::from_request(&CreateSession::default(), &policy()).unwrap();
        assert_eq!((h.image.as_str(), h.desktop), ("default", None));
        let with = |screen: &str, url: Option<&str>| CreateSession {
            profile: Some("desktop".into()),
            desktop: Some(drums_api::DesktopOptions {
                screen: Some(screen.into()),
                url: url.map(Into::into),
            }),
            ..Default::default()
        };
        assert!(
            Spec::from_request(&with("1920x1080", Some("https://example.com")), &policy()).is_ok()
        );
        for bad in [
            "1920",
            "0x0",
            "1920x1080x24",
            "+1920x1080",
            "99999x10",
            "axb",
        ] {
            let e = Spec::from_request(&with(bad, None), &policy())
                .unwrap_err()
                .to_string();
            assert!(e.contains("invalid screen"), "{bad:?}: {e}");
        }
        for bad in [
            "--remote-debugging-address=0.0.0.0",
            "example.com",
            "a:\nb",
            "",
        ] {
            let e = Spec::from_request(&with("800x600", Some(bad)), &policy())
                .unwrap_err()
                .to_string();
            assert!(e.contains("invalid url"), "{bad:?}: {e}");
        }
        let mut headless = with("800x600", None);
        headless.profile = None;
        let e = Spec::from_request(&headless, &policy())
            .unwrap_err()
            .to_string();
        assert!(e.contains("need the desktop profile"), "{e}");
    }

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
        assert!(Spec::from_request(&r, &policy())
            .unwrap_err()
            .to_string()
            .starts_with("unknown profile \"gpu\""));
        r.profile = None;
        r.network = Some("host".into());
        assert!(Spec::from_request(&r, &policy())
            .unwrap_err()
            .to_string()
            .contains("use bridge or none"));
        r.network = None;
        r.limits.memory_bytes = Some(1000);
        assert!(Spec::from_request(&r, &policy()).is_err());
        r.limits = Limits {
            memory_bytes: Some(256 << 20),
            pids_max: Some(100),
            cpus: Some(0.5),
            disk_bytes: None,
        };
        let s = Spec::from_request(&r, &policy()).unwrap();
        // What the request names wins; the defaults fill the rest.
        assert_eq!(s.limits.memory_bytes, Some(256 << 20));
        assert_eq!(s.limits.disk_bytes, Some(10 << 30));
        r.limits.disk_bytes = Some(0);
        assert!(Spec::from_request(&r, &policy())
            .unwrap_err()
            .to_string()
            .contains("below the minimum of 16 MiB"));
        assert_eq!(s.image, "default");
        assert_eq!(s.network, Network::Bridge);
        assert_eq!(s.egress, Egress::None, "egress is off by default");
    }

    #[test]
    fn egress_is_none_or_nat_and_nat_needs_the_bridge() {
        let req = |network: Option<&str>, egress: Option<&str>| CreateSession {
            network: network.map(Into::into),
            egress: egress.map(Into::into),
            ..Default::default()
        };
        let nat = Spec::from_request(&req(None, Some("nat")), &policy()).unwrap();
        assert_eq!(nat.egress, Egress::Nat);
        let none = Spec::from_request(&req(Some("none"), Some("none")), &policy()).unwrap();
        assert_eq!(none.egress, Egress::None);
        for bad in ["NAT", "open", "", "nat "] {
            let e = Spec::from_request(&req(None, Some(bad)), &policy())
                .unwrap_err()
                .to_string();
            assert_eq!(e, format!("unknown egress {bad:?}: use none or nat"));
        }
        let e = Spec::from_request(&req(Some("none"), Some("nat")), &policy())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "egress nat needs network bridge");
    }

    #[test]
    fn hostnames_are_valid_labels() {
        assert_eq!(hostname_for("Agent-1", "abc"), "agent-1");
        assert_eq!(hostname_for("a_b", "abc"), "drums-abc");
        assert_eq!(hostname_for("a.b", "abc"), "drums-abc");
    }
}
