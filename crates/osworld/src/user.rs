//! The desktop user that OSWorld commands run as, read from the session's
//! own /etc/passwd and /etc/group (not through NSS: the guest agent must see
//! the image's accounts, whatever libc would consult).

use std::path::{Path, PathBuf};

use crate::error::ConfigError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSpec {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
    /// Supplementary groups (from /etc/group), including `gid`.
    pub groups: Vec<u32>,
}

impl UserSpec {
    /// Looks `name` up in /etc/passwd and /etc/group.
    pub fn lookup(name: &str) -> Result<UserSpec, ConfigError> {
        UserSpec::lookup_in(name, Path::new("/etc/passwd"), Path::new("/etc/group"))
    }

    /// Looks `name` up in the given passwd and group files.
    pub fn lookup_in(name: &str, passwd: &Path, group: &Path) -> Result<UserSpec, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let passwd_text = read(passwd)?;
        let group_text = read(group)?;
        let mut user = parse_passwd(&passwd_text, name).ok_or_else(|| ConfigError::NoSuchUser {
            name: name.to_string(),
            path: passwd.to_path_buf(),
        })?;
        user.groups = parse_groups(&group_text, name, user.gid);
        Ok(user)
    }
}

fn parse_passwd(text: &str, name: &str) -> Option<UserSpec> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(UserSpec {
            name: name.to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: PathBuf::from(f[5]),
            shell: f[6].to_string(),
            groups: Vec::new(),
        })
    })
}

fn parse_groups(text: &str, name: &str, primary: u32) -> Vec<u32> {
    let mut groups = vec![primary];
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let Ok(gid) = f[2].parse::<u32>() else {
            continue;
        };
        if f[3].split(',').any(|m| m == name) && !groups.contains(&gid) {
            groups.push(gid);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_and_supplementary_groups() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:,,,:/home/user:/bin/bash\n";
        let group = "root:x:0:\naudio:x:29:pulse,user\nvideo:x:44:user\nuser:x:1000:\nbad\n";
        let u = parse_passwd(passwd, "user").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert_eq!(parse_groups(group, "user", 1000), vec![1000, 29, 44]);
        assert!(parse_passwd(passwd, "nobody").is_none());
    }

    #[test]
    fn missing_user_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        let g = dir.path().join("group");
        std::fs::write(&p, "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(&g, "root:x:0:\n").unwrap();
        let err = UserSpec::lookup_in("user", &p, &g).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("look up user user in {}", p.display())
        );
        let err = UserSpec::lookup_in("user", &dir.path().join("none"), &g).unwrap_err();
        assert!(err.to_string().starts_with("read "));
    }
}
