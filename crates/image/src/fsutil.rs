//! Small filesystem helpers: disk usage, durability, mounts, safe removal.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drums_sys::{MntFlags, Syscall};

use crate::error::IoContext;
use crate::ImageError;

/// Disk usage of a tree in bytes, like `du -s --bytes` would count blocks:
/// allocated blocks rather than apparent sizes, hard links counted once, and
/// without crossing into other filesystems (a leftover mount inside a build
/// tree must not be counted, nor walked).
pub(crate) fn disk_usage(root: &Path) -> Result<u64, ImageError> {
    let root_meta = fs::symlink_metadata(root).ctx("stat", root)?;
    let dev = root_meta.dev();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![(root.to_path_buf(), root_meta)];
    while let Some((path, meta)) = stack.pop() {
        if meta.nlink() <= 1 || meta.is_dir() || seen.insert((meta.dev(), meta.ino())) {
            // st_blocks is always in 512-byte units.
            total += meta.blocks() * 512;
        }
        if !meta.is_dir() || meta.dev() != dev {
            continue;
        }
        for entry in fs::read_dir(&path).ctx("read directory", &path)? {
            let entry = entry.ctx("read directory", &path)?;
            let child = entry.path();
            let child_meta = fs::symlink_metadata(&child).ctx("stat", &child)?;
            if child_meta.dev() != dev {
                continue;
            }
            stack.push((child, child_meta));
        }
    }
    Ok(total)
}

/// Flushes the whole filesystem holding `path` (syncfs(2)). Used before
/// writing image.json, which promises a complete tree: after a power loss,
/// an image.json on disk must not describe files still only in the page cache.
pub(crate) fn sync_filesystem(path: &Path) -> Result<(), ImageError> {
    let dir = File::open(path).ctx("open", path)?;
    nix::unistd::syncfs(dir.as_raw_fd())
        .map_err(|e| ImageError::io("sync filesystem of", path, e.into()))
}

/// fsync(2) on a directory, making renames and new entries in it durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), ImageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("sync directory", dir)
}

/// Creates (or replaces) `path` with `contents` and mode `mode`.
///
/// An existing entry is removed first rather than opened for writing, so a
/// symlink planted at `path` inside a rootfs (e.g. `etc/hosts -> /etc/hosts`)
/// is replaced instead of followed out of the tree onto the host. The mode is
/// set explicitly because the daemon's umask must not decide whether users
/// inside the sandbox can read the file.
pub(crate) fn replace_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), ImageError> {
    remove_if_exists(path)?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .ctx("create", path)?;
    f.write_all(contents).ctx("write", path)?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .ctx("set permissions of", path)?;
    Ok(())
}

/// Removes a file or symlink (not following it); a missing entry is fine.
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), ImageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("remove", path, e)),
    }
}

/// Mount points at or below `path`, deepest first, from /proc/self/mountinfo.
pub(crate) fn mounts_under(path: &Path) -> Result<Vec<PathBuf>, ImageError> {
    // mountinfo lists canonical paths; a path that does not exist has no mounts.
    let path = match fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ImageError::io("resolve", path, e)),
    };
    let info = "/proc/self/mountinfo";
    let text = fs::read_to_string(info).ctx("read", info)?;
    let mut mounts: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(&path))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts.dedup();
    Ok(mounts)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a tree drums created itself (a build directory), first detaching
/// anything still mounted inside it: debootstrap mounts /proc and /sys in
/// the target while installing, and if it dies before unmounting them,
/// deleting the tree would walk into (and fail on, or worse, delete from) the
/// mounted filesystems. A missing tree is fine.
pub(crate) fn remove_build_tree(sys: &dyn Syscall, path: &Path) -> Result<(), ImageError> {
    for m in mounts_under(path)? {
        sys.umount2(&m, MntFlags::MNT_DETACH)
            .map_err(|e| ImageError::io("unmount", &m, e.source.into()))?;
    }
    remove_tree(path)
}

/// Removes a tree that must not have anything mounted inside it. Used for
/// images, where a mount was made by someone else (a session) and is not
/// drums-image's to undo.
pub(crate) fn remove_tree(path: &Path) -> Result<(), ImageError> {
    if !mounts_under(path)?.is_empty() {
        return Err(ImageError::Busy {
            path: path.to_path_buf(),
        });
    }
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("remove", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/trailing\\04"), "/trailing\\04");
    }

    #[test]
    fn proc_is_a_mount_and_tempdirs_have_none() {
        assert!(mounts_under(Path::new("/proc"))
            .unwrap()
            .contains(&PathBuf::from("/proc")));
        let tmp = tempfile::tempdir().unwrap();
        assert!(mounts_under(tmp.path()).unwrap().is_empty());
        assert!(mounts_under(&tmp.path().join("missing"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn disk_usage_counts_hard_links_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("a"), vec![1u8; 64 * 1024]).unwrap();
        let one = disk_usage(&root).unwrap();
        assert!(one >= 64 * 1024, "{one}");
        fs::hard_link(root.join("a"), root.join("b")).unwrap();
        assert_eq!(disk_usage(&root).unwrap(), one);
        fs::write(root.join("c"), vec![1u8; 64 * 1024]).unwrap();
        assert!(disk_usage(&root).unwrap() >= one + 64 * 1024);
    }

    #[test]
    fn replace_file_does_not_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::write(&outside, "host").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        replace_file(&link, b"image", 0o644).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "host");
        assert_eq!(fs::read_to_string(&link).unwrap(), "image");
        assert!(!fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            fs::metadata(&link).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }
}
