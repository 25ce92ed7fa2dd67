//! The `.vmx` file: a drums session spec in VMware's own syntax, so the path
//! OSWorld hands to `vmrun` can name it.
//!
//! The syntax is VMware's: one `key = "value"` per line, `#` comments, keys
//! case-insensitive, and `|XX` hex escapes inside quoted values (VMware writes
//! a `"` as `|22`). As VMware does, keys this program does not know are
//! ignored, so a real VM's `.vmx` lines may stay; an unknown `drums.*` key is
//! an error instead, because it is almost certainly a typo of one we do know.
//!
//! Format version: `drums.version = "1"`. Adding an optional key keeps the
//! version; changing what a key means, or making one required, needs a bump.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use drums_api::{CreateSession, DesktopOptions, Limits};

/// The only spec version this build reads.
pub const VERSION: &str = "1";

/// Every `drums.*` key this version knows.
pub const DRUMS_KEYS: &[&str] = &[
    "drums.version",
    "drums.profile",
    "drums.image",
    "drums.url",
    "drums.screen",
    "drums.memory",
    "drums.cpus",
    "drums.pids",
    "drums.network",
];

/// The profile a `.vmx` gets without `drums.profile`: a VMware VM is a desktop.
pub const DEFAULT_PROFILE: &str = "desktop";

#[derive(Debug, thiserror::Error)]
pub enum VmxError {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("line {line}: unknown key {key:?} (drums keys are {})", DRUMS_KEYS.join(", "))]
    UnknownKey { line: usize, key: String },
    #[error("line {line}: {key:?} is given twice")]
    Duplicate { line: usize, key: String },
    #[error("no drums.version: not a drums session spec (add drums.version = \"{VERSION}\")")]
    MissingVersion,
    #[error("drums.version {0:?} is not supported: this vmrun reads version {VERSION}")]
    Version(String),
    #[error("no displayName: it names the drums session")]
    MissingName,
    #[error("{key} {value:?}: {message}")]
    Invalid {
        key: &'static str,
        value: String,
        message: String,
    },
}

/// A parsed, validated spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The drums session name (`displayName`).
    pub name: String,
    pub profile: String,
    pub image: Option<String>,
    pub url: Option<String>,
    pub screen: Option<String>,
    pub limits: Limits,
    pub network: Option<String>,
}

impl Spec {
    pub fn load(path: &Path) -> Result<Spec, VmxError> {
        let text = std::fs::read_to_string(path).map_err(|source| VmxError::Read {
            path: path.to_owned(),
            source,
        })?;
        parse(&text)
    }

    /// The `POST /v1/sessions` body that starts this VM.
    pub fn create_request(&self) -> CreateSession {
        let desktop = (self.url.is_some() || self.screen.is_some()).then(|| DesktopOptions {
            url: self.url.clone(),
            screen: self.screen.clone(),
        });
        CreateSession {
            name: Some(self.name.clone()),
            profile: Some(self.profile.clone()),
            desktop,
            image: self.image.clone(),
            limits: self.limits.clone(),
            network: self.network.clone(),
            // A VM is never privileged: vmrun drives untrusted desktops.
            privileged: false,
            // A .vmx has no egress key: its sessions keep drums' default.
            egress: None,
            run: false,
        }
    }
}

/// Parse and validate a `.vmx` text.
pub fn parse(text: &str) -> Result<Spec, VmxError> {
    let pairs = pairs(text)?;
    let get = |k: &str| pairs.get(k).map(String::as_str);
    match get("drums.version") {
        None => return Err(VmxError::MissingVersion),
        Some(VERSION) => {}
        Some(v) => return Err(VmxError::Version(v.to_owned())),
    }
    let name = get("displayname").ok_or(VmxError::MissingName)?.to_owned();
    validate_name(&name)?;
    let profile = get("drums.profile").unwrap_or(DEFAULT_PROFILE).to_owned();
    if profile.is_empty() {
        return Err(invalid("drums.profile", "", "must not be empty"));
    }
    let screen = get("drums.screen").map(str::to_owned);
    if let Some(s) = &screen {
        validate_screen(s)?;
    }
    let mut limits = Limits::default();
    if let Some(m) = get("drums.memory") {
        limits.memory_bytes = Some(
            drums_client::parse_size(m).map_err(|e| invalid("drums.memory", m, &e.to_string()))?,
        );
    }
    if let Some(c) = get("drums.cpus") {
        limits.cpus = Some(
            c.parse::<f64>()
                .ok()
                .filter(|c| c.is_finite() && *c > 0.0)
                .ok_or_else(|| invalid("drums.cpus", c, "use a positive number of cores"))?,
        );
    }
    if let Some(p) = get("drums.pids") {
        limits.pids_max = Some(
            p.parse::<u64>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| invalid("drums.pids", p, "use a positive integer"))?,
        );
    }
    Ok(Spec {
        name,
        profile,
        image: get("drums.image").map(str::to_owned),
        url: get("drums.url").map(str::to_owned),
        screen,
        limits,
        network: get("drums.network").map(str::to_owned),
    })
}

fn invalid(key: &'static str, value: &str, message: &str) -> VmxError {
    VmxError::Invalid {
        key,
        value: value.to_owned(),
        message: message.to_owned(),
    }
}

/// The keys drums reads (lowercased) and their values. Other keys are
/// VMware's and are dropped, duplicates included (VMware keeps the last).
fn pairs(text: &str) -> Result<BTreeMap<String, String>, VmxError> {
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let (k, v) = l.split_once('=').ok_or_else(|| VmxError::Syntax {
            line,
            message: "expected key = \"value\"".into(),
        })?;
        let key = k.trim();
        if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '"') {
            return Err(VmxError::Syntax {
                line,
                message: format!("bad key {key:?}"),
            });
        }
        let value = value(v.trim(), line)?;
        let key = key.to_ascii_lowercase();
        let ours = key == "displayname" || key.starts_with("drums.");
        if !ours {
            continue;
        }
        if key.starts_with("drums.") && !DRUMS_KEYS.contains(&key.as_str()) {
            return Err(VmxError::UnknownKey { line, key });
        }
        if out.contains_key(&key) {
            return Err(VmxError::Duplicate { line, key });
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// A value: `"quoted"` (with `|XX` escapes, and an optional `# comment`
/// after it) or, leniently, bare up to a `#`.
fn value(v: &str, line: usize) -> Result<String, VmxError> {
    let syntax = |message: &str| VmxError::Syntax {
        line,
        message: message.to_owned(),
    };
    let Some(rest) = v.strip_prefix('"') else {
        let bare = v.split('#').next().unwrap_or("").trim();
        return Ok(bare.to_owned());
    };
    let close = rest
        .find('"')
        .ok_or_else(|| syntax("unterminated quoted value"))?;
    let after = rest[close + 1..].trim();
    if !(after.is_empty() || after.starts_with('#')) {
        return Err(syntax("text after the closing quote"));
    }
    unescape(&rest[..close]).map_err(|e| syntax(&e.to_string()))
}

/// A quoted value's `|XX` escapes that are not.
#[derive(Debug, thiserror::Error)]
enum BadEscape {
    #[error("bad escape at {0:?}: use |XX with two hex digits")]
    NotHex(String),
    #[error("escapes make invalid UTF-8")]
    Utf8,
}

/// VMware's `|XX` escapes (two hex digits, one byte).
fn unescape(s: &str) -> Result<String, BadEscape> {
    if !s.contains('|') {
        return Ok(s.to_owned());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'|' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| BadEscape::NotHex(s[i..].to_owned()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| BadEscape::Utf8)
}

/// Session names as drumsd accepts them (crates/session/src/spec.rs), checked
/// here so a bad `.vmx` fails before a daemon is started for it.
pub fn validate_name(name: &str) -> Result<(), VmxError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(invalid(
            "displayName",
            name,
            "use 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit",
        ))
    }
}

pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn validate_screen(s: &str) -> Result<(), VmxError> {
    let ok = s
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .is_some_and(|(w, h)| w > 0 && h > 0);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "drums.screen",
            s,
            "use WIDTHxHEIGHT, e.g. 1920x1080",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
.encoding = "UTF-8"
# an OSWorld VM, run by drums
config.version = "8"
displayName = "osworld-1"
drums.version = "1"
drums.profile = "desktop"
drums.image = "desktop"
drums.url = "https://example.org/a#b"
drums.screen = "1920x1080"
drums.memory = "4g"
drums.network = "bridge"
memsize = "4096"
"#;

    #[test]
    fn good_spec() {
        let s = parse(GOOD).unwrap();
        assert_eq!(s.name, "osworld-1");
        assert_eq!(s.profile, "desktop");
        assert_eq!(s.image.as_deref(), Some("desktop"));
        assert_eq!(s.url.as_deref(), Some("https://example.org/a#b"));
        assert_eq!(s.screen.as_deref(), Some("1920x1080"));
        assert_eq!(s.limits.memory_bytes, Some(4 << 30));
        assert_eq!(s.network.as_deref(), Some("bridge"));
        let r = s.create_request();
        assert_eq!(r.name.as_deref(), Some("osworld-1"));
        assert_eq!(
            r.desktop,
            Some(DesktopOptions {
                url: Some("https://example.org/a#b".into()),
                screen: Some("1920x1080".into()),
            })
        );
    }

    #[test]
    fn minimal_spec_defaults_to_desktop() {
        let s = parse("drums.version = \"1\"\ndisplayName = \"vm\"\n").unwrap();
        assert_eq!(s.profile, DEFAULT_PROFILE);
        assert_eq!(s.image, None);
        assert_eq!(s.create_request().desktop, None);
        assert_eq!(s.limits, Limits::default());
    }

    #[test]
    fn headless_spec() {
        let s = parse(
            "drums.version = \"1\"\ndisplayName = \"t\"\ndrums.profile = \"headless\"\ndrums.image = \"default\"\ndrums.cpus = \"0.5\"\ndrums.pids = \"100\"\n",
        )
        .unwrap();
        assert_eq!(s.profile, "headless");
        assert_eq!(s.limits.cpus, Some(0.5));
        assert_eq!(s.limits.pids_max, Some(100));
    }

    #[test]
    fn missing_version() {
        assert!(matches!(
            parse("displayName = \"vm\"\n"),
            Err(VmxError::MissingVersion)
        ));
    }

    #[test]
    fn wrong_version() {
        let e = parse("drums.version = \"2\"\ndisplayName = \"vm\"\n").unwrap_err();
        assert!(matches!(&e, VmxError::Version(v) if v == "2"));
        assert!(e.to_string().contains("reads version 1"), "{e}");
    }

    #[test]
    fn missing_name() {
        assert!(matches!(
            parse("drums.version = \"1\"\n"),
            Err(VmxError::MissingName)
        ));
        assert!(matches!(
            parse("drums.version = \"1\"\ndisplayName = \"my vm\"\n"),
            Err(VmxError::Invalid {
                key: "displayName",
                ..
            })
        ));
    }

    #[test]
    fn unknown_drums_key_is_an_error_other_keys_are_not() {
        let e = parse("drums.version = \"1\"\ndisplayName = \"vm\"\ndrums.memroy = \"1g\"\n")
            .unwrap_err();
        assert!(matches!(&e, VmxError::UnknownKey { line: 3, key } if key == "drums.memroy"));
        parse("drums.version = \"1\"\ndisplayName = \"vm\"\nethernet0.present = \"TRUE\"\nsata0:1.fileName = \"x.iso\"\n")
            .unwrap();
    }

    #[test]
    fn keys_are_case_insensitive_and_duplicates_of_ours_refused() {
        let s = parse("DRUMS.VERSION = \"1\"\nDisplayName = \"vm\"\n").unwrap();
        assert_eq!(s.name, "vm");
        let e =
            parse("drums.version = \"1\"\ndisplayName = \"a\"\ndisplayname = \"b\"\n").unwrap_err();
        assert!(matches!(e, VmxError::Duplicate { line: 3, .. }));
        // VMware's own keys may repeat: not ours to judge.
        parse("drums.version = \"1\"\ndisplayName = \"a\"\nx = \"1\"\nx = \"2\"\n").unwrap();
    }

    #[test]
    fn quoting() {
        let v = |s: &str| value(s, 1);
        assert_eq!(v("\"a # b\"").unwrap(), "a # b");
        assert_eq!(v("\"x\"   # trailing comment").unwrap(), "x");
        assert_eq!(v("\"\"").unwrap(), "");
        assert_eq!(v("\"say |22hi|22 |7C\"").unwrap(), "say \"hi\" |");
        assert_eq!(v("bare # comment").unwrap(), "bare");
        assert_eq!(v("\"  spaces kept  \"").unwrap(), "  spaces kept  ");
        assert!(matches!(v("\"open"), Err(VmxError::Syntax { .. })));
        assert!(matches!(v("\"a\" b"), Err(VmxError::Syntax { .. })));
        assert!(matches!(v("\"a|2\""), Err(VmxError::Syntax { .. })));
        assert!(matches!(v("\"a|zz\""), Err(VmxError::Syntax { .. })));
        // A line without `=`.
        assert!(matches!(
            parse("drums.version = \"1\"\njust words\n"),
            Err(VmxError::Syntax { line: 2, .. })
        ));
        // CRLF files, as Windows-made .vmx files are.
        let s = parse("drums.version = \"1\"\r\ndisplayName = \"vm\"\r\n").unwrap();
        assert_eq!(s.name, "vm");
    }

    #[test]
    fn bad_values() {
        let base = "drums.version = \"1\"\ndisplayName = \"vm\"\n";
        for (line, key) in [
            ("drums.memory = \"lots\"", "drums.memory"),
            ("drums.screen = \"1920\"", "drums.screen"),
            ("drums.screen = \"0x10\"", "drums.screen"),
            ("drums.cpus = \"-1\"", "drums.cpus"),
            ("drums.pids = \"0\"", "drums.pids"),
            ("drums.profile = \"\"", "drums.profile"),
        ] {
            let e = parse(&format!("{base}{line}\n")).unwrap_err();
            assert!(
                matches!(&e, VmxError::Invalid { key: k, .. } if *k == key),
                "{line}: {e}"
            );
        }
    }
}
