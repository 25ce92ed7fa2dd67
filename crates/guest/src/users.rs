//! User and group lookup from the session's own `/etc/passwd` and `/etc/group`.
//!
//! We parse the files directly instead of calling `getpwnam(3)`: NSS would load
//! whatever modules the *agent binary's* libc was built to expect, and the
//! session image may have a different libc, no `nsswitch.conf`, or none at all.
//! The flat files are what every image has and what `su`/`login` inside it see.

use std::io;
use std::path::{Path, PathBuf};

pub const PASSWD: &str = "/etc/passwd";
pub const GROUP: &str = "/etc/group";

/// Who a command runs as, fully resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// `None` for a numeric uid that has no passwd entry.
    pub name: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
    /// Supplementary groups, always including the primary `gid`.
    pub groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user not found: {0}")]
    NotFound(String),
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Resolves `spec` (a user name, a numeric uid, or `None` for root) against the
/// live `/etc/passwd` and `/etc/group`.
pub fn lookup(spec: Option<&str>) -> Result<Account, UserError> {
    let passwd = read_optional(Path::new(PASSWD))?;
    let group = read_optional(Path::new(GROUP))?;
    lookup_in(spec, &passwd, &group)
}

/// A missing file reads as empty: minimal images (a static busybox, a scratch
/// image) may have no `/etc/passwd`, and running as root must still work there.
fn read_optional(path: &Path) -> Result<String, UserError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(UserError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// [`lookup`] over file contents, for tests.
///
/// A name is tried first (a user may literally be called "1000"), then an
/// all-digit spec as a uid. A numeric uid with no entry is still accepted, as
/// `docker exec -u` does, with gid = uid, `HOME=/` and `/bin/sh`; an unknown
/// *name* is an error.
pub fn lookup_in(spec: Option<&str>, passwd: &str, group: &str) -> Result<Account, UserError> {
    let entries: Vec<PasswdEntry<'_>> = passwd.lines().filter_map(PasswdEntry::parse).collect();
    let entry = match spec {
        None => entries.iter().find(|e| e.uid == 0),
        Some(spec) => entries.iter().find(|e| e.name == spec).or_else(|| {
            let uid: u32 = parse_id(spec)?;
            entries.iter().find(|e| e.uid == uid)
        }),
    };
    let Some(entry) = entry else {
        return match spec {
            None => Ok(Account {
                name: Some("root".into()),
                uid: 0,
                gid: 0,
                home: "/root".into(),
                shell: "/bin/sh".into(),
                groups: vec![0],
            }),
            Some(spec) => match parse_id(spec) {
                Some(uid) => Ok(Account {
                    name: None,
                    uid,
                    gid: uid,
                    home: "/".into(),
                    shell: "/bin/sh".into(),
                    groups: vec![uid],
                }),
                None => Err(UserError::NotFound(spec.to_owned())),
            },
        };
    };
    let mut groups = vec![entry.gid];
    for line in group.lines() {
        if let Some((gid, members)) = parse_group(line) {
            if members.split(',').any(|m| m == entry.name) && !groups.contains(&gid) {
                groups.push(gid);
            }
        }
    }
    Ok(Account {
        name: Some(entry.name.to_owned()),
        uid: entry.uid,
        gid: entry.gid,
        home: if entry.home.is_empty() {
            "/".into()
        } else {
            entry.home.into()
        },
        shell: if entry.shell.is_empty() {
            // An empty shell field means /bin/sh to login(1).
            "/bin/sh".into()
        } else {
            entry.shell.to_owned()
        },
        groups,
    })
}

fn parse_id(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
    shell: &'a str,
}

impl<'a> PasswdEntry<'a> {
    /// `name:password:uid:gid:gecos:home:shell`; malformed lines, comments and
    /// NIS `+`/`-` compat lines are skipped rather than failing the lookup of an
    /// unrelated user.
    fn parse(line: &'a str) -> Option<Self> {
        if line.starts_with(['#', '+', '-']) {
            return None;
        }
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0].is_empty() {
            return None;
        }
        Some(Self {
            name: f[0],
            uid: parse_id(f[2])?,
            gid: parse_id(f[3])?,
            home: f[5],
            shell: f[6],
        })
    }
}

/// `name:password:gid:member,member` → (gid, members).
fn parse_group(line: &str) -> Option<(u32, &str)> {
    if line.starts_with(['#', '+', '-']) {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 4 {
        return None;
    }
    Some((parse_id(f[2])?, f[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken line
user:x:1000:1000:A User,,,:/home/user:
1234:x:4321:4321::/home/numeric:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
";
    const GROUP: &str = "\
root:x:0:
sudo:x:27:user
audio:x:29:daemon,user
user:x:1000:
nogroup:x:65534:
bad:x:notanumber:user
";

    #[test]
    fn by_name_with_supplementary_groups() {
        let a = lookup_in(Some("user"), PASSWD, GROUP).unwrap();
        assert_eq!(a.name.as_deref(), Some("user"));
        assert_eq!((a.uid, a.gid), (1000, 1000));
        assert_eq!(a.home, PathBuf::from("/home/user"));
        assert_eq!(a.shell, "/bin/sh", "empty shell defaults to /bin/sh");
        assert_eq!(a.groups, vec![1000, 27, 29]);
    }

    #[test]
    fn by_uid() {
        let a = lookup_in(Some("65534"), PASSWD, GROUP).unwrap();
        assert_eq!(a.name.as_deref(), Some("nobody"));
        assert_eq!(a.groups, vec![65534]);
    }

    #[test]
    fn name_wins_over_uid() {
        let a = lookup_in(Some("1234"), PASSWD, GROUP).unwrap();
        assert_eq!(a.uid, 4321);
    }

    #[test]
    fn default_is_root() {
        let a = lookup_in(None, PASSWD, GROUP).unwrap();
        assert_eq!((a.uid, a.home.to_str().unwrap()), (0, "/root"));
        let a = lookup_in(None, "", "").unwrap();
        assert_eq!((a.uid, a.gid, a.groups.as_slice()), (0, 0, &[0][..]));
    }

    #[test]
    fn unknown_numeric_uid_is_synthesised() {
        let a = lookup_in(Some("4242"), PASSWD, GROUP).unwrap();
        assert_eq!(a.name, None);
        assert_eq!((a.uid, a.gid, a.home.to_str().unwrap()), (4242, 4242, "/"));
    }

    #[test]
    fn unknown_name_is_an_error() {
        let err = lookup_in(Some("ghost"), PASSWD, GROUP).unwrap_err();
        assert!(matches!(err, UserError::NotFound(ref n) if n == "ghost"));
        assert_eq!(err.to_string(), "user not found: ghost");
    }
}
