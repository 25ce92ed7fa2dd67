//! inotify and fanotify watches: what a tree watches, and telling CRIU the
//! path of each watched inode.
//!
//! CRIU dumps a watch as the watched inode's file handle and, where it can,
//! a path. It finds the path by opening the handle, which overlayfs cannot
//! do (its handles of type 0xf8 open only with `nfs_export=on`), and then,
//! with `force_irmap`, by scanning directories for the inode ("irmap"). A
//! watch found by neither fails the dump: `fsnotify: Can't dump that handle`.
//! A session's root is an overlay, so every watch on its files failed unless
//! it was under a scan path.
//!
//! Scanning more paths is no cure: a scan path is searched recursively, in
//! the frozen window, and no list covers what agents watch. Instead drums
//! hands CRIU the answer. Before a dump it reads each watch from
//! `/proc/PID/fdinfo` ([`marks`]), finds and checks its path itself (the
//! caller's job: it knows the session's layers), and writes them to the
//! images directory as CRIU's own irmap cache image ([`write_irmap_cache`]),
//! the file a pre-dump leaves for its dump. CRIU loads it first, checks each
//! entry against the inode again (a `stat` of the path from the tree's root),
//! and uses it without scanning anything.

use std::io;
use std::path::Path;

use protobuf::CodedOutputStream;

use crate::CriuError;

/// The cache's name in the images (or work) directory: no `.img`, unlike
/// the images (criu/image-desc.c).
pub const IRMAP_CACHE: &str = "irmap-cache";
/// CRIU's IMG_SERVICE_MAGIC, then IRMAP_CACHE_MAGIC (criu/include/magic.h).
const IRMAP_CACHE_MAGICS: [u32; 2] = [0x5510_5940, 0x5700_4059];

/// One inode watched by an inotify or fanotify fd, as `/proc/PID/fdinfo`
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub pid: i32,
    pub fd: i32,
    /// The inode's device in the kernel's encoding (major << 20 | minor),
    /// as fdinfo and CRIU's images carry it.
    pub s_dev: u32,
    pub ino: u64,
    /// The file handle the kernel encoded for the inode, when shown.
    pub handle: Option<Handle>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    pub kind: i32,
    pub bytes: Vec<u8>,
}

/// Every inode mark of the inotify and fanotify fds of `pids`. A process or
/// fd that goes away meanwhile has none; nothing else is an error, since
/// the dump that follows sees the same files.
pub fn marks(pids: &[i32]) -> Vec<Mark> {
    let mut out = Vec::new();
    for &pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for entry in fds.flatten() {
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let t = target.as_os_str().as_encoded_bytes();
            if t != b"anon_inode:inotify" && t != b"anon_inode:[fanotify]" {
                continue;
            }
            let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) {
                out.extend(
                    parse_fdinfo(&info)
                        .into_iter()
                        .map(|(s_dev, ino, handle)| Mark {
                            pid,
                            fd,
                            s_dev,
                            ino,
                            handle,
                        }),
                );
            }
        }
    }
    out
}

/// The inode marks of one fdinfo text: lines `inotify wd:1 ino:105 sdev:2c
/// mask:.. ignored_mask:0 fhandle-bytes:2c fhandle-type:f8 f_handle:00..`
/// and `fanotify ino:.. sdev:.. mflags:.. ..` (a fanotify mount or
/// filesystem mark names no inode and is not one). Numbers are hex.
fn parse_fdinfo(text: &str) -> Vec<(u32, u64, Option<Handle>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix("inotify ")
            .or_else(|| line.strip_prefix("fanotify "))
        else {
            continue;
        };
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix(':'))
        };
        let hex = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok());
        let (Some(ino), Some(s_dev)) = (hex("ino"), hex("sdev")) else {
            continue;
        };
        let Ok(s_dev) = u32::try_from(s_dev) else {
            continue;
        };
        let handle = match (hex("fhandle-type"), field("f_handle").and_then(unhex)) {
            (Some(kind), Some(bytes)) => {
                i32::try_from(kind).ok().map(|kind| Handle { kind, bytes })
            }
            _ => None,
        };
        out.push((s_dev, ino, handle));
    }
    out
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The kernel's encoding of a device number (fdinfo's `sdev`, CRIU's
/// MKKDEV), from a `stat`'s `st_dev`.
pub fn kernel_dev(st_dev: u64) -> u32 {
    let (major, minor) = (libc::major(st_dev), libc::minor(st_dev));
    (major << 20) | (minor & 0xf_ffff)
}

/// Writes `entries` (device in the kernel's encoding, inode, absolute path
/// inside the dumped tree's root) as CRIU's irmap cache into `dir`, the
/// dump's work directory (its images directory unless the request names
/// another). The framing is CRIU's (two little-endian magics, then a u32
/// size and a protobuf `irmap_cache_entry { uint32 dev = 1; uint64 inode =
/// 2; string path = 3; }` per entry, images/fh.proto); rust-criu ships only
/// the RPC protos, so the three fields are written here.
pub fn write_irmap_cache(dir: &Path, entries: &[(u32, u64, String)]) -> Result<(), CriuError> {
    let path = dir.join(IRMAP_CACHE);
    let io_err = |source: io::Error| CriuError::Io {
        op: "write irmap cache",
        path: path.clone(),
        source,
    };
    std::fs::write(
        &path,
        encode_irmap_cache(entries).map_err(|e| io_err(e.into()))?,
    )
    .map_err(io_err)
}

fn encode_irmap_cache(entries: &[(u32, u64, String)]) -> protobuf::Result<Vec<u8>> {
    let mut out = Vec::new();
    for m in IRMAP_CACHE_MAGICS {
        out.extend_from_slice(&m.to_le_bytes());
    }
    for (dev, ino, path) in entries {
        let mut msg = Vec::new();
        {
            let mut os = CodedOutputStream::vec(&mut msg);
            os.write_uint32(1, *dev)?;
            os.write_uint64(2, *ino)?;
            os.write_string(3, path)?;
            os.flush()?;
        }
        out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        out.extend_from_slice(&msg);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An fdinfo as kernel 6.18 prints it for watches on an overlay.
    const FDINFO: &str = "pos:\t0\nflags:\t00\nmnt_id:\t17\nino:\t1039\n\
inotify wd:3 ino:105 sdev:2c mask:302 ignored_mask:0 fhandle-bytes:2c fhandle-type:f8 f_handle:00000000fb29004d19459cf0a9e6478da50dbfd496c81dbd0501000000000000000100000000000007000000\n\
inotify wd:2 ino:108 sdev:2c mask:302 ignored_mask:0 fhandle-bytes:2c fhandle-type:f8 f_handle:00000000fb29044d\n\
fanotify mnt_id:22 mflags:0 mask:1 ignored_mask:0\n\
fanotify ino:7 sdev:800001 mflags:0 mask:1 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:0700000000000000\n\
inotify wd:9 ino:zz sdev:2c\n";

    #[test]
    fn fdinfo_gives_each_inode_mark() {
        let got = parse_fdinfo(FDINFO);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (0x2c, 0x105));
        assert_eq!(got[0].2.as_ref().unwrap().kind, 0xf8);
        assert_eq!(got[0].2.as_ref().unwrap().bytes.len(), 0x2c);
        assert_eq!(
            got[1].2.as_ref().unwrap().bytes,
            [0, 0, 0, 0, 0xfb, 0x29, 0x04, 0x4d]
        );
        assert_eq!((got[2].0, got[2].1), (0x80_0001, 7));
    }

    #[test]
    fn devices_take_the_kernels_encoding() {
        assert_eq!(kernel_dev(libc::makedev(0, 44)), 0x2c);
        assert_eq!(kernel_dev(libc::makedev(8, 1)), 0x80_0001);
        assert_eq!(
            kernel_dev(libc::makedev(259, 0x12345)),
            (259 << 20) | 0x12345
        );
    }

    #[test]
    fn the_cache_is_criu_framed_protobuf() {
        let b = encode_irmap_cache(&[(0x2c, 0x105, "/etc/a".into())]).unwrap();
        assert_eq!(&b[..8], &[0x40, 0x59, 0x10, 0x55, 0x59, 0x40, 0x00, 0x57]);
        // size 13: 08 2c | 10 85 02 | 1a 06 "/etc/a"
        assert_eq!(&b[8..12], &13u32.to_le_bytes());
        assert_eq!(&b[12..], b"\x08\x2c\x10\x85\x02\x1a\x06/etc/a");
    }
}
