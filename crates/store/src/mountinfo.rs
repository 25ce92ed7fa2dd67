//! Just enough of /proc/self/mountinfo to tell what is mounted at a path.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::StoreError;

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo, reduced to the fields the store needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// The topmost mount whose mount point is exactly `path` (mounts stack, and the last
/// line for a mount point is the one a lookup of that path sees).
pub(crate) fn mount_at(path: &Path) -> Result<Option<MountEntry>, StoreError> {
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|source| StoreError::Read {
        path: MOUNTINFO.into(),
        source,
    })?;
    Ok(parse(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

// Format (proc(5)): id parent major:minor root mount-point options [optional...] - fstype source super-options
fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let source = right.next()?;
    Some(MountEntry {
        mount_point: PathBuf::from(OsString::from_vec(unescape(mount_point))),
        fstype: fstype.to_owned(),
        source: String::from_utf8_lossy(&unescape(source)).into_owned(),
    })
}

/// The kernel writes space, tab, newline and backslash in paths as three-digit octal
/// escapes (`\040`), so paths with those characters only compare equal once decoded.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_unescapes() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - btrfs /dev/loop3 rw,ssd\n\
                    37 35 98:0 / /mnt/c rw - ext4 /dev/vda rw\n";
        let entries = parse(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(entries[0].fstype, "btrfs");
        assert_eq!(entries[0].source, "/dev/loop3");
        assert_eq!(entries[1].mount_point, PathBuf::from("/mnt/c"));
    }

    #[test]
    fn leaves_odd_backslashes_alone() {
        assert_eq!(unescape("a\\b"), b"a\\b");
        assert_eq!(unescape("a\\"), b"a\\");
        assert_eq!(unescape("\\134x"), b"\\x");
    }
}
