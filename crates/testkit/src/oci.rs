//! What the daemon's OCI test images and `drums bench image` write alike:
//! the media types and annotation an image layout names, and a layer's tar
//! of a directory tree.
//!
//! The names are spelled out here rather than taken from `drums-oci`, which
//! the tests check: a fixture that shared a typo with the code under test
//! would agree with it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// The annotation that tags a manifest in a layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The content of a layout's `oci-layout` file: the layout format's version.
pub const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
/// The `Env` an image config starts with.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The mtime of entries written by hand, so that a layer's digest is the
/// same from run to run.
pub const FIXED_MTIME: u64 = 1_700_000_000;

/// A tree that could not be read into a tar: the operation, on which path.
#[derive(thiserror::Error)]
#[error("{op} {}", path.display())]
pub struct OciError {
    op: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

impl OciError {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The message and its causes, for a test's `.expect` (`write_chain`).
impl std::fmt::Debug for OciError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::write_chain(f, self)
    }
}

fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OciError + 'a {
    move |source| OciError {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Append the tree at `root` to `b`, in name order, so that the same tree
/// makes the same tar: paths relative without a "./" prefix ("etc/passwd"),
/// the root itself left out. Numeric owners, modes, mtimes, symlinks, hard
/// links and FIFOs are kept. Device nodes and sockets are left out: a layer
/// from a registry may hold devices, but a runtime gives a container its
/// /dev. Extended attributes (file capabilities) are not written. Returns
/// the number of entries written.
pub fn append_tree<W: Write>(b: &mut tar::Builder<W>, root: &Path) -> Result<u64, OciError> {
    let mut entries = 0;
    append_dir(b, root, Path::new(""), &mut HashMap::new(), &mut entries)?;
    Ok(entries)
}

fn append_dir<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    links: &mut HashMap<(u64, u64), PathBuf>,
    entries: &mut u64,
) -> Result<(), OciError> {
    // `root.join("")` would end in a slash, which an error would show.
    let dir = if rel.as_os_str().is_empty() {
        root.to_owned()
    } else {
        root.join(rel)
    };
    let mut names = std::fs::read_dir(&dir)
        .and_then(|rd| {
            rd.map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<Vec<_>>>()
        })
        .map_err(at("read directory", &dir))?;
    names.sort();
    for name in names {
        let path = rel.join(&name);
        let full = root.join(&path);
        let meta = std::fs::symlink_metadata(&full).map_err(at("stat", &full))?;
        let ft = meta.file_type();
        let mut h = tar::Header::new_gnu();
        h.set_mode(meta.mode() & 0o7777);
        h.set_uid(meta.uid().into());
        h.set_gid(meta.gid().into());
        h.set_mtime(meta.mtime().max(0) as u64);
        h.set_size(0);
        let appended = if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            b.append_data(&mut h, &path, io::empty())
                .map_err(at("append to the tar", &full))?;
            *entries += 1;
            append_dir(b, root, &path, links, entries)?;
            continue;
        } else if ft.is_symlink() {
            h.set_entry_type(tar::EntryType::Symlink);
            let target = std::fs::read_link(&full).map_err(at("read link", &full))?;
            b.append_link(&mut h, &path, target)
        } else if ft.is_file() {
            let first = (meta.nlink() > 1)
                .then(|| links.get(&(meta.dev(), meta.ino())).cloned())
                .flatten();
            if let Some(first) = first {
                h.set_entry_type(tar::EntryType::Link);
                b.append_link(&mut h, &path, first)
            } else {
                if meta.nlink() > 1 {
                    links.insert((meta.dev(), meta.ino()), path.clone());
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(meta.len());
                let f = File::open(&full).map_err(at("open", &full))?;
                b.append_data(&mut h, &path, f)
            }
        } else if ft.is_fifo() {
            h.set_entry_type(tar::EntryType::Fifo);
            b.append_data(&mut h, &path, io::empty())
        } else {
            // Character and block devices, sockets.
            continue;
        };
        appended.map_err(at("append to the tar", &full))?;
        *entries += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tar: &[u8]) -> Vec<(String, tar::EntryType, Option<String>)> {
        tar::Archive::new(tar)
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().entry_type(),
                    link,
                )
            })
            .collect()
    }

    fn tar_of(root: &Path) -> (u64, Vec<u8>) {
        let mut b = tar::Builder::new(Vec::new());
        let n = append_tree(&mut b, root).unwrap();
        (n, b.into_inner().unwrap())
    }

    /// Name order, the root left out, a second hard link as a link to the
    /// first, symlinks and FIFOs kept, sockets left out; and the same tree
    /// makes the same bytes.
    #[test]
    fn a_tree_in_name_order_with_its_links() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir(r.join("etc")).unwrap();
        std::fs::write(r.join("etc/b"), b"bee").unwrap();
        std::fs::hard_link(r.join("etc/b"), r.join("z-link")).unwrap();
        std::os::unix::fs::symlink("etc/b", r.join("a-sym")).unwrap();
        nix::unistd::mkfifo(
            &r.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(r.join("sock")).unwrap();

        let (n, tar) = tar_of(r);
        use tar::EntryType as E;
        assert_eq!(
            entries(&tar),
            [
                ("a-sym".into(), E::Symlink, Some("etc/b".into())),
                ("etc".into(), E::Directory, None),
                ("etc/b".into(), E::Regular, None),
                ("fifo".into(), E::Fifo, None),
                ("z-link".into(), E::Link, Some("etc/b".into())),
            ]
        );
        assert_eq!(n, 5);
        assert_eq!(tar_of(r).1, tar, "the same tree, the same tar");
    }

    #[test]
    fn an_unreadable_tree_names_its_path() {
        let t = tempfile::tempdir().unwrap();
        let gone = t.path().join("nothing here");
        let mut b = tar::Builder::new(Vec::new());
        let e = append_tree(&mut b, &gone).unwrap_err();
        assert_eq!(e.path(), gone);
        assert_eq!(e.to_string(), format!("read directory {}", gone.display()));
        assert!(format!("{e:?}").contains("No such file"), "{e:?}");
    }
}
