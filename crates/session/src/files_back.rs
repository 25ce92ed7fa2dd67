//! Files put back in place: what differs between a version's files (the
//! upper layer in its snapshot) and a live session's (its upper layer now),
//! and the steps that make the session's root show the version's files
//! again. The steps are written through the session's own root, its
//! overlay, never into a layer under it: overlayfs does not allow its layers
//! to change while it is mounted. A rollback whose processes did nothing
//! since its target uses this instead of a CRIU restore (docs/engine.md,
//! "A files-only rollback in place").
//!
//! Only what the overlay can be made to show exactly is planned: regular
//! files, directories, symlinks and whiteouts, with no hard links and no
//! extended attributes of their own, over an image layer that needs no
//! uncovering. Anything else is [`Refused`], and the caller restores with
//! CRIU. A regular file is taken as unchanged when its inode number, change
//! time, modification time, size, mode and owner are those of the
//! version's: a snapshot keeps inode numbers and times, and no write leaves
//! the change time as it was.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// Why the fast path does not apply; the caller restores with CRIU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Owner, mode and times to give an entry (owners as stored on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
}

/// One step, on a path relative to the session's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Unlink a file, symlink or whiteout's cover, or remove an empty
    /// directory (its entries were removed by the steps before).
    Remove {
        rel: PathBuf,
        dir: bool,
    },
    /// Write the version's file `src` (on the host, in its snapshot) at
    /// `rel`: over the file there (`fresh` false), or as a new one.
    File {
        rel: PathBuf,
        src: PathBuf,
        meta: Meta,
        fresh: bool,
    },
    Dir {
        rel: PathBuf,
        meta: Meta,
    },
    Symlink {
        rel: PathBuf,
        target: PathBuf,
        meta: Meta,
    },
    /// A directory's owner and mode.
    Owner {
        rel: PathBuf,
        meta: Meta,
    },
    /// A directory's times, after its entries changed.
    Times {
        rel: PathBuf,
        meta: Meta,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    File,
    Dir { opaque: bool },
    Symlink(PathBuf),
    Whiteout,
    Other(&'static str),
}

#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    meta: Meta,
    ino: u64,
    nlink: u64,
    size: u64,
    ctime: (i64, i64),
    /// An extended attribute that is not overlayfs's own bookkeeping.
    xattrs: bool,
}

/// overlayfs's own attributes that a put-back through the overlay keeps
/// right by itself.
const OVERLAY_OWN: &[&str] = &[
    "trusted.overlay.origin",
    "trusted.overlay.impure",
    "trusted.overlay.opaque",
];

fn entry(path: &Path) -> std::io::Result<Option<Entry>> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let ft = md.file_type();
    let names = xattr_names(path)?;
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir {
            opaque: names.iter().any(|n| n == "trusted.overlay.opaque")
                && xattr(path, "trusted.overlay.opaque")?.as_deref() == Some(b"y"),
        }
    } else if ft.is_symlink() {
        Kind::Symlink(std::fs::read_link(path)?)
    } else if ft.is_char_device() && md.rdev() == 0 {
        Kind::Whiteout
    } else {
        Kind::Other("a device, socket or fifo")
    };
    Ok(Some(Entry {
        kind,
        meta: Meta {
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            atime: (md.atime(), md.atime_nsec()),
            mtime: (md.mtime(), md.mtime_nsec()),
        },
        ino: md.ino(),
        nlink: md.nlink(),
        size: md.size(),
        ctime: (md.ctime(), md.ctime_nsec()),
        xattrs: names.iter().any(|n| !OVERLAY_OWN.contains(&n.as_str())),
    }))
}

fn cpath(path: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

/// The names of `path`'s extended attributes (not following a symlink).
fn xattr_names(path: &Path) -> std::io::Result<Vec<String>> {
    let p = cpath(path)?;
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: p is a valid C string; buf is writable for its length.
        let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < 1 << 16 => buf.resize(buf.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect())
}

fn xattr(path: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    let (p, n) = (cpath(path)?, std::ffi::CString::new(name).expect("no NUL"));
    let mut buf = [0u8; 256];
    // SAFETY: valid C strings; buf is writable for its length.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(buf[..len as usize].to_vec()))
}

fn names(dir: &Path) -> std::io::Result<BTreeSet<OsString>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.map(|e| e.file_name())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(e),
    }
}

/// The image layer `lower`'s entry at `rel` where the overlay would show
/// it: every directory above it a real directory (a symlink above is no
/// directory to the overlay).
fn lower_entry(lower: &Path, rel: &Path) -> std::io::Result<Option<std::fs::Metadata>> {
    let mut p = lower.to_owned();
    let parts: Vec<_> = rel.components().collect();
    for (i, c) in parts.iter().enumerate() {
        p.push(c);
        match std::fs::symlink_metadata(&p) {
            Ok(md) if i + 1 == parts.len() => return Ok(Some(md)),
            Ok(md) if md.is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// What the overlay shows at a path.
enum Shows<'a> {
    Nothing,
    /// The image's entry; `true` if a directory.
    Lower(bool),
    Upper(&'a Entry),
}

struct Planner<'a> {
    version: &'a Path,
    live: &'a Path,
    lower: &'a Path,
    steps: Vec<Step>,
}

/// The steps that make a root whose upper layer is `live` over image layer
/// `lower` show what the upper layer `version` shows over the same image.
pub fn plan(version: &Path, live: &Path, lower: &Path) -> Result<Vec<Step>, Refused> {
    let mut p = Planner {
        version,
        live,
        lower,
        steps: Vec::new(),
    };
    p.dir(Path::new(""), true, true)?;
    Ok(p.steps)
}

fn io<'a>(what: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Refused + 'a {
    move |e| Refused(format!("{what} {}: {e}", path.display()))
}

impl Planner<'_> {
    /// Plan directory `rel`, which exists on both sides (`live_exists`: in the
    /// live upper layer too); `lower` whether the image shows through it.
    /// Returns whether anything in it changes.
    fn dir(&mut self, rel: &Path, lower: bool, live_exists: bool) -> Result<bool, Refused> {
        let (v, l) = (self.version.join(rel), self.live.join(rel));
        let mut all = names(&v).map_err(io("list", &v))?;
        if live_exists {
            all.extend(names(&l).map_err(io("list", &l))?);
        }
        let mut changed = false;
        for name in all {
            let rel = rel.join(&name);
            let ve = entry(&self.version.join(&rel)).map_err(io("read", &rel))?;
            let le = match live_exists {
                true => entry(&self.live.join(&rel)).map_err(io("read", &rel))?,
                false => None,
            };
            changed |= self.one(&rel, ve.as_ref(), le.as_ref(), lower)?;
        }
        Ok(changed)
    }

    /// Plan one path; whether it changes.
    fn one(
        &mut self,
        rel: &Path,
        ve: Option<&Entry>,
        le: Option<&Entry>,
        lower: bool,
    ) -> Result<bool, Refused> {
        let img_md = match lower {
            true => lower_entry(self.lower, rel).map_err(io("read the image's", rel))?,
            false => None,
        };
        let img = img_md.as_ref().map(|m| m.is_dir());
        fn shows(e: Option<&Entry>, img: Option<bool>) -> Shows<'_> {
            match (e, img) {
                (Some(e), _) if e.kind != Kind::Whiteout => Shows::Upper(e),
                (Some(_), _) => Shows::Nothing,
                (None, Some(dir)) => Shows::Lower(dir),
                (None, None) => Shows::Nothing,
            }
        }
        let refuse = |why: &str| Err(Refused(format!("{}: {why}", rel.display())));
        match (shows(ve, img), shows(le, img)) {
            (Shows::Nothing, Shows::Nothing) | (Shows::Lower(_), Shows::Lower(_)) => Ok(false),
            // The image's directory, copied up since: the same directory.
            (Shows::Lower(true), Shows::Upper(l)) if l.kind == (Kind::Dir { opaque: false }) => {
                let md = img_md.expect("the image has it");
                let own = |up: u32, image: u32| up == image || up == image + crate::ids::DISK_BASE;
                if md.mode() & 0o7777 != l.meta.mode
                    || !own(l.meta.uid, md.uid())
                    || !own(l.meta.gid, md.gid())
                {
                    return refuse("the image's directory changed its owner or mode");
                }
                let below = self.dir(rel, true, true)?;
                let image_times = Meta {
                    mode: l.meta.mode,
                    uid: l.meta.uid,
                    gid: l.meta.gid,
                    atime: (md.atime(), md.atime_nsec()),
                    mtime: (md.mtime(), md.mtime_nsec()),
                };
                let changed = below || image_times.mtime != l.meta.mtime;
                if changed {
                    self.steps.push(Step::Times {
                        rel: rel.to_owned(),
                        meta: image_times,
                    });
                }
                Ok(changed)
            }
            (Shows::Lower(_), _) => {
                refuse("the version shows the image's entry, which the overlay cannot uncover")
            }
            (Shows::Nothing, Shows::Lower(true)) => {
                refuse("the version removed a directory of the image")
            }
            (Shows::Nothing, Shows::Lower(false)) => {
                self.steps.push(Step::Remove {
                    rel: rel.to_owned(),
                    dir: false,
                });
                Ok(true)
            }
            (Shows::Nothing, Shows::Upper(l)) => {
                self.remove(rel, l, img)?;
                Ok(true)
            }
            (Shows::Upper(v), now) => self.put(rel, v, now, img),
        }
    }

    /// Remove the live entry `l` at `rel` (and all below it).
    fn remove(&mut self, rel: &Path, l: &Entry, img: Option<bool>) -> Result<(), Refused> {
        if let Kind::Dir { .. } = l.kind {
            if img.is_some() {
                return Err(Refused(format!(
                    "{}: a directory over the image's entry is not removed in place",
                    rel.display()
                )));
            }
            let here = self.live.join(rel);
            for name in names(&here).map_err(io("list", &here))? {
                let child = rel.join(&name);
                let e = entry(&self.live.join(&child)).map_err(io("read", &child))?;
                if let Some(e) = e {
                    if e.kind != Kind::Whiteout {
                        self.remove(&child, &e, None)?;
                    }
                }
            }
        }
        self.steps.push(Step::Remove {
            rel: rel.to_owned(),
            dir: matches!(l.kind, Kind::Dir { .. }),
        });
        Ok(())
    }

    /// Make `rel` show the version's entry `v`, where it shows `now`.
    fn put(
        &mut self,
        rel: &Path,
        v: &Entry,
        now: Shows<'_>,
        img: Option<bool>,
    ) -> Result<bool, Refused> {
        let refuse = |why: &str| Err(Refused(format!("{}: {why}", rel.display())));
        if let Kind::Other(what) = v.kind {
            return refuse(what);
        }
        // Unchanged, or a directory whose own metadata may change.
        if let Shows::Upper(l) = &now {
            match (&v.kind, &l.kind) {
                (Kind::Dir { opaque: a }, Kind::Dir { opaque: b }) => {
                    if a != b {
                        return refuse("a directory that became opaque or stopped being so");
                    }
                    let owner = (v.meta.mode, v.meta.uid, v.meta.gid)
                        != (l.meta.mode, l.meta.uid, l.meta.gid);
                    if owner {
                        self.steps.push(Step::Owner {
                            rel: rel.to_owned(),
                            meta: v.meta.clone(),
                        });
                    }
                    let below = self.dir(rel, img.is_some() && !a, true)?;
                    if below || owner || v.meta.mtime != l.meta.mtime {
                        self.times(rel, v);
                    }
                    return Ok(below || owner || v.meta.mtime != l.meta.mtime);
                }
                (Kind::File, Kind::File)
                    if (v.ino, v.ctime, v.meta.mtime, v.size, v.nlink)
                        == (l.ino, l.ctime, l.meta.mtime, l.size, l.nlink)
                        && (v.meta.mode, v.meta.uid, v.meta.gid)
                            == (l.meta.mode, l.meta.uid, l.meta.gid) =>
                {
                    return Ok(false)
                }
                (Kind::Symlink(a), Kind::Symlink(b))
                    if a == b && (v.meta.uid, v.meta.gid) == (l.meta.uid, l.meta.gid) =>
                {
                    return Ok(false)
                }
                _ => {}
            }
        }
        if v.xattrs {
            return refuse("it has extended attributes of its own");
        }
        if v.nlink > 1 && v.kind == Kind::File {
            return refuse("it has hard links");
        }
        // A file rewritten where a file is: in place.
        if let (Kind::File, Shows::Upper(l)) = (&v.kind, &now) {
            if l.kind == Kind::File {
                if l.nlink > 1 {
                    return refuse("the live file has hard links");
                }
                self.steps.push(Step::File {
                    rel: rel.to_owned(),
                    src: self.version.join(rel),
                    meta: v.meta.clone(),
                    fresh: false,
                });
                return Ok(true);
            }
        }
        match now {
            Shows::Nothing => {}
            Shows::Lower(true) => match v.kind {
                // The image's directory stays: the version's entries go in.
                Kind::Dir { opaque: false } => {
                    self.steps.push(Step::Owner {
                        rel: rel.to_owned(),
                        meta: v.meta.clone(),
                    });
                    self.dir(rel, true, false)?;
                    self.times(rel, v);
                    return Ok(true);
                }
                _ => return refuse("the image's directory would have to go"),
            },
            Shows::Lower(false) => self.steps.push(Step::Remove {
                rel: rel.to_owned(),
                dir: false,
            }),
            Shows::Upper(l) => self.remove(rel, l, img)?,
        }
        match &v.kind {
            Kind::File => self.steps.push(Step::File {
                rel: rel.to_owned(),
                src: self.version.join(rel),
                meta: v.meta.clone(),
                fresh: true,
            }),
            Kind::Symlink(target) => self.steps.push(Step::Symlink {
                rel: rel.to_owned(),
                target: target.clone(),
                meta: v.meta.clone(),
            }),
            Kind::Dir { opaque } => {
                // A directory made over an image's entry is opaque.
                if img.is_some() && !opaque {
                    return refuse("a directory that merges with the image's");
                }
                self.steps.push(Step::Dir {
                    rel: rel.to_owned(),
                    meta: v.meta.clone(),
                });
                self.dir(rel, false, false)?;
                self.times(rel, v);
            }
            Kind::Whiteout | Kind::Other(_) => unreachable!("handled above"),
        }
        Ok(true)
    }

    fn times(&mut self, rel: &Path, v: &Entry) {
        self.steps.push(Step::Times {
            rel: rel.to_owned(),
            meta: v.meta.clone(),
        });
    }
}

/// Open `rel` (relative) beneath `root`: no symlink, no mount crossed, no
/// `..` out of it. The session is frozen while this runs, but its tree is
/// still its own: a name that is not what the plan saw fails the step.
fn beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = nix::fcntl::openat2(root.as_raw_fd(), rel, how).map_err(std::io::Error::from)?;
    // SAFETY: openat2 just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn split(rel: &Path) -> std::io::Result<(&Path, &std::ffi::OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
    }
}

fn ts(t: (i64, i64)) -> nix::sys::time::TimeSpec {
    nix::sys::time::TimeSpec::new(t.0, t.1)
}

/// Carry out `steps` in the tree whose root is `root` (the session's root,
/// `/proc/INIT/root`), with owners mapped from disk by `owner`. Stops at the
/// first step that fails: the caller then restores with CRIU, which replaces
/// everything this did.
pub fn apply(
    root: BorrowedFd<'_>,
    steps: &[Step],
    owner: impl Fn(u32) -> Option<u32>,
) -> Result<(), (PathBuf, std::io::Error)> {
    let ids = |m: &Meta| -> std::io::Result<(nix::unistd::Uid, nix::unistd::Gid)> {
        match (owner(m.uid), owner(m.gid)) {
            (Some(u), Some(g)) => Ok((u.into(), g.into())),
            _ => Err(std::io::Error::other(format!(
                "owner {}:{} is outside the session's ids",
                m.uid, m.gid
            ))),
        }
    };
    let set = |fd: BorrowedFd<'_>, m: &Meta| -> std::io::Result<()> {
        let (u, g) = ids(m)?;
        nix::unistd::fchown(fd.as_raw_fd(), Some(u), Some(g))?;
        // After the owner: a chown clears set-id bits.
        nix::sys::stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(m.mode))?;
        Ok(())
    };
    for step in steps {
        let rel = match step {
            Step::Remove { rel, .. }
            | Step::File { rel, .. }
            | Step::Dir { rel, .. }
            | Step::Symlink { rel, .. }
            | Step::Owner { rel, .. }
            | Step::Times { rel, .. } => rel,
        };
        let done: std::io::Result<()> = (|| {
            let (parent, name) = split(rel)?;
            match step {
                Step::Remove { dir, .. } => {
                    let p = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                    let how = match dir {
                        true => nix::unistd::UnlinkatFlags::RemoveDir,
                        false => nix::unistd::UnlinkatFlags::NoRemoveDir,
                    };
                    nix::unistd::unlinkat(Some(p.as_raw_fd()), name, how)?;
                }
                Step::File {
                    src, meta, fresh, ..
                } => {
                    let p = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                    let flags = OFlag::O_WRONLY
                        | OFlag::O_CLOEXEC
                        | OFlag::O_NOFOLLOW
                        | match fresh {
                            true => OFlag::O_CREAT | OFlag::O_EXCL,
                            false => OFlag::O_TRUNC,
                        };
                    let fd = nix::fcntl::openat(
                        Some(p.as_raw_fd()),
                        name,
                        flags,
                        Mode::from_bits_truncate(0o600),
                    )?;
                    // SAFETY: openat just returned this descriptor.
                    let mut dst = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                    let mut from = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(src)?;
                    std::io::copy(&mut from, &mut dst)?;
                    set(dst.as_fd(), meta)?;
                    nix::sys::stat::futimens(dst.as_raw_fd(), &ts(meta.atime), &ts(meta.mtime))?;
                }
                Step::Dir { meta, .. } => {
                    let p = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                    nix::sys::stat::mkdirat(
                        Some(p.as_raw_fd()),
                        name,
                        Mode::from_bits_truncate(0o700),
                    )?;
                    let d = beneath(root, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                    set(d.as_fd(), meta)?;
                }
                Step::Symlink { target, meta, .. } => {
                    let p = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                    nix::unistd::symlinkat(target.as_path(), Some(p.as_raw_fd()), name)?;
                    let (u, g) = ids(meta)?;
                    nix::unistd::fchownat(
                        Some(p.as_raw_fd()),
                        name,
                        Some(u),
                        Some(g),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )?;
                    nix::sys::stat::utimensat(
                        Some(p.as_raw_fd()),
                        name,
                        &ts(meta.atime),
                        &ts(meta.mtime),
                        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
                    )?;
                }
                Step::Owner { meta, .. } => {
                    let d = beneath(root, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                    set(d.as_fd(), meta)?;
                }
                Step::Times { meta, .. } => {
                    let d = beneath(root, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                    nix::sys::stat::futimens(d.as_raw_fd(), &ts(meta.atime), &ts(meta.mtime))?;
                }
            }
            Ok(())
        })();
        done.map_err(|e| (rel.clone(), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path, files: &[(&str, &str)]) {
        for (rel, content) in files {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }

    fn rels(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Remove { rel, dir } => {
                    format!("rm{} {}", if *dir { "dir" } else { "" }, rel.display())
                }
                Step::File { rel, fresh, .. } => {
                    format!("{} {}", if *fresh { "new" } else { "write" }, rel.display())
                }
                Step::Dir { rel, .. } => format!("mkdir {}", rel.display()),
                Step::Symlink { rel, .. } => format!("ln {}", rel.display()),
                Step::Owner { rel, .. } => format!("owner {}", rel.display()),
                Step::Times { rel, .. } => format!("times {}", rel.display()),
            })
            .collect()
    }

    /// A version layer `v`, and a live layer `l` that starts as its
    /// snapshot would (`keep` the very same inode: a hard link), then changed.
    fn layers(t: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (v, l, img) = (t.join("v"), t.join("l"), t.join("img"));
        tree(&img, &[("etc/os", "debian")]);
        tree(
            &v,
            &[("root/keep", "k"), ("root/edit", "old"), ("root/gone", "g")],
        );
        std::fs::create_dir_all(l.join("root")).unwrap();
        std::fs::hard_link(v.join("root/keep"), l.join("root/keep")).unwrap();
        tree(&l, &[("root/edit", "new"), ("root/new/deep/x", "x")]);
        (v, l, img)
    }

    #[test]
    fn the_plan_puts_back_what_changed_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let (v, l, img) = layers(t.path());
        let got = rels(&plan(&v, &l, &img).unwrap());
        let pos = |s: &str| {
            got.iter()
                .position(|g| g == s)
                .unwrap_or_else(|| panic!("{s}: {got:?}"))
        };
        pos("write root/edit");
        pos("new root/gone");
        // Children go before their directory.
        assert!(pos("rm root/new/deep/x") < pos("rmdir root/new/deep"));
        assert!(pos("rmdir root/new/deep") < pos("rmdir root/new"));
        assert!(!got.iter().any(|g| g.ends_with("keep")), "{got:?}");
        // The image shows through both: nothing to do there.
        assert!(!got.iter().any(|g| g.contains("etc")), "{got:?}");
    }

    #[test]
    fn what_the_overlay_cannot_show_exactly_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (v, l, img) = layers(t.path());
        // The live layer covers the image's file that the version shows.
        tree(&l, &[("etc/os", "mine")]);
        let Err(Refused(why)) = plan(&v, &l, &img) else {
            panic!("planned")
        };
        assert!(
            why.starts_with("etc/os: ") && why.contains("cannot uncover"),
            "{why}"
        );
        std::fs::remove_dir_all(l.join("etc")).unwrap();
        // A fifo in the version.
        nix::unistd::mkfifo(&v.join("root/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let Err(Refused(why)) = plan(&v, &l, &img) else {
            panic!("planned")
        };
        assert!(why.starts_with("root/fifo: "), "{why}");
        std::fs::remove_file(v.join("root/fifo")).unwrap();
        // A file of the version with another name (a hard link).
        std::fs::hard_link(v.join("root/gone"), v.join("root/also")).unwrap();
        let Err(Refused(why)) = plan(&v, &l, &img) else {
            panic!("planned")
        };
        assert!(why.contains("hard links"), "{why}");
    }
}
