//! A dump's images written into a version's directory in the store, sharing
//! with the parent version's images every page they already hold.
//!
//! CRIU cannot dump incrementally on this kernel (no soft-dirty tracking), so
//! each process artifact is a whole dump; yet from one turn to the next most
//! of a session's memory is unchanged (97% of the pages of a Python server's
//! second dump were in its first). CRIU dumps into a staging tmpfs; this
//! copies the images into the store (btrfs), and where a 4 KiB page of a
//! `pages-*.img` equals one of the parent's, clones it (`FICLONERANGE`)
//! instead of writing it. The result is an ordinary, complete image
//! directory: restore, export and retention see files, and the parent can be
//! deleted (its extents stay while a child shares them). Only the new pages
//! are written and stored.
//!
//! Pages are matched by content, not address: a page is looked up by its
//! CRC-32 among the parent's pages, and cloned only when its bytes are equal,
//! so a collision costs a missed share, never a wrong page.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{fsync_dir, hash_through, hex, io, CheckpointError, ImageFile, Result};

/// CRIU writes memory pages of this size, aligned, in `pages-*.img`; btrfs
/// shares extents in blocks of it.
const PAGE: usize = 4096;

/// What [`commit_images`] wrote.
#[derive(Debug)]
pub struct Committed {
    /// The images, for the manifest (sizes and checksums of the whole files).
    pub images: Vec<ImageFile>,
    /// Bytes written to the store.
    pub written: u64,
    /// Bytes shared with the parent's images instead.
    pub shared: u64,
    /// Why nothing could be shared though a parent was named (its images
    /// could not be read: retention may have just deleted them).
    pub unshared: Option<String>,
}

/// Whether `name` is one of CRIU's page images (raw, page-aligned memory).
fn is_pages(name: &str) -> bool {
    name.starts_with("pages-") && name.ends_with(".img")
}

/// The parent's pages, by checksum, for lookups.
struct Parent {
    files: Vec<(File, memmap2::Mmap)>,
    /// A page's CRC-32: its first occurrence (file, page index).
    index: HashMap<u32, (usize, usize)>,
}

impl Parent {
    fn open(dir: &Path) -> Result<Parent> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(io("list", dir))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| is_pages(n))
            .collect();
        names.sort();
        for name in names {
            let p = dir.join(&name);
            let f = File::open(&p).map_err(io("open", &p))?;
            if f.metadata().map_err(io("stat", &p))?.len() == 0 {
                continue;
            }
            // SAFETY: a sealed version's images are never written again
            // (drumsd's own, in its store); a shared mapping of them is read
            // only.
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io("map", &p))?;
            let i = files.len();
            for (n, page) in map.chunks_exact(PAGE).enumerate() {
                index.entry(crc32fast::hash(page)).or_insert((i, n));
            }
            files.push((f, map));
        }
        Ok(Parent { files, index })
    }

    /// Where the parent holds `page`, byte for byte.
    fn find(&self, page: &[u8]) -> Option<(usize, usize)> {
        let &(f, n) = self.index.get(&crc32fast::hash(page))?;
        let theirs = &self.files[f].1[n * PAGE..(n + 1) * PAGE];
        (theirs == page).then_some((f, n))
    }
}

/// `struct file_clone_range` of linux/fs.h.
#[repr(C)]
struct FileCloneRange {
    src_fd: i64,
    src_offset: u64,
    src_length: u64,
    dest_offset: u64,
}

nix::ioctl_write_ptr!(ficlonerange, 0x94, 13, FileCloneRange);

/// A run of pages of a new image: written, or cloned from a parent's file.
#[derive(Clone, Copy)]
enum Run {
    Write {
        from: usize,
        pages: usize,
    },
    Clone {
        from: usize,
        file: usize,
        at: usize,
        pages: usize,
    },
}

/// Copy the images CRIU dumped into `staged` to `dest` (which must not hold
/// them yet), sharing with the images in `parent` every page they hold.
/// `between` runs after each image, so a caller can stop the copy there
/// (drumsd's fault points). Every file and `dest` are fsynced. A failure
/// leaves `dest` partly written: the caller removes it.
pub fn commit_images(
    staged: &Path,
    dest: &Path,
    parent: Option<&Path>,
    mut between: impl FnMut(&str) -> Result<()>,
) -> Result<Committed> {
    let (parent, unshared) = match parent.map(Parent::open).transpose() {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut names: Vec<String> = std::fs::read_dir(staged)
        .map_err(io("list", staged))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    std::fs::create_dir_all(dest).map_err(io("create", dest))?;
    let mut out = Committed {
        images: Vec::new(),
        written: 0,
        shared: 0,
        unshared,
    };
    // Once the store refuses a clone (not btrfs), every page is written.
    let mut clones = true;
    for name in names {
        let from = staged.join(&name);
        let meta = std::fs::metadata(&from).map_err(io("stat", &from))?;
        if !meta.is_file() {
            continue;
        }
        let to = dest.join(&name);
        let dst = File::options()
            .write(true)
            .create_new(true)
            .open(&to)
            .map_err(io("create", &to))?;
        let src = File::open(&from).map_err(io("open", &from))?;
        let sha256 = match &parent {
            Some(parent) if is_pages(&name) && meta.len() > 0 => {
                // SAFETY: the staging directory is drumsd's own (a tmpfs only
                // root reaches) and CRIU is done writing it.
                let map = unsafe { memmap2::Mmap::map(&src) }.map_err(io("map", &from))?;
                let (written, shared) = copy_sharing(&map, &dst, &to, parent, &mut clones)?;
                out.written += written;
                out.shared += shared;
                hex(&Sha256::digest(&map[..]))
            }
            _ => {
                out.written += meta.len();
                let mut w = &dst;
                hash_through(&src, &from, |b| w.write_all(b).map_err(io("write", &to)))?
            }
        };
        dst.sync_all().map_err(io("fsync", &to))?;
        out.images.push(ImageFile {
            name: name.clone(),
            size: meta.len(),
            sha256,
        });
        between(&name)?;
    }
    fsync_dir(dest)?;
    Ok(out)
}

/// Write `new` (a pages image) to `dst`, cloning the pages `parent` holds.
/// Returns the bytes written and the bytes shared.
fn copy_sharing(
    new: &[u8],
    dst: &File,
    to: &Path,
    parent: &Parent,
    clones: &mut bool,
) -> Result<(u64, u64)> {
    let mut runs: Vec<Run> = Vec::new();
    for (n, page) in new.chunks(PAGE).enumerate() {
        let found = (*clones && page.len() == PAGE)
            .then(|| parent.find(page))
            .flatten();
        match (runs.last_mut(), found) {
            (
                Some(Run::Clone {
                    file, at, pages, ..
                }),
                Some((f, m)),
            ) if *file == f && *at + *pages == m => *pages += 1,
            (Some(Run::Write { pages, .. }), None) => *pages += 1,
            (_, Some((file, at))) => runs.push(Run::Clone {
                from: n,
                file,
                at,
                pages: 1,
            }),
            (_, None) => runs.push(Run::Write { from: n, pages: 1 }),
        }
    }
    let (mut written, mut shared) = (0u64, 0u64);
    for run in runs {
        let (from, pages) = match run {
            Run::Write { from, pages } | Run::Clone { from, pages, .. } => (from, pages),
        };
        let bytes = &new[from * PAGE..((from + pages) * PAGE).min(new.len())];
        if let (Run::Clone { file, at, .. }, true) = (run, *clones) {
            let range = FileCloneRange {
                src_fd: parent.files[file].0.as_raw_fd() as i64,
                src_offset: (at * PAGE) as u64,
                src_length: bytes.len() as u64,
                dest_offset: (from * PAGE) as u64,
            };
            // SAFETY: both descriptors are open for the call; the struct is
            // the kernel's layout.
            match unsafe { ficlonerange(dst.as_raw_fd(), &range) } {
                Ok(_) => {
                    shared += bytes.len() as u64;
                    continue;
                }
                // Not a filesystem that shares extents: write from here on.
                Err(_) => *clones = false,
            }
        }
        dst.write_all_at(bytes, (from * PAGE) as u64)
            .map_err(io("write", to))?;
        written += bytes.len() as u64;
    }
    Ok((written, shared))
}

/// Why a commit stopped between two images (a caller's fault point).
pub fn interrupted(why: impl Into<String>) -> CheckpointError {
    CheckpointError::Interrupted(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE]
    }

    /// The copy is the staged file, byte for byte, whether or not the
    /// directory's filesystem can share (a test's tmp is usually not btrfs;
    /// drumsd's store is, and tests/versions.rs checks that pages are shared
    /// there). Every byte is either written or shared.
    #[test]
    fn a_commit_copies_every_image_exactly() {
        let tmp = tempfile::tempdir().unwrap();
        let (parent, staged, dest) = (
            tmp.path().join("parent"),
            tmp.path().join("staged"),
            tmp.path().join("dest"),
        );
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::create_dir_all(&staged).unwrap();
        std::fs::write(
            parent.join("pages-1.img"),
            [page(1), page(2), page(3)].concat(),
        )
        .unwrap();
        // Two runs from the parent (1,2 and 3), a new page, a partial tail.
        let new = [page(1), page(2), page(9), page(3), vec![7u8; 100]].concat();
        std::fs::write(staged.join("pages-4.img"), &new).unwrap();
        std::fs::write(staged.join("core-1.img"), b"core").unwrap();
        let mut seen = Vec::new();
        let c = commit_images(&staged, &dest, Some(&parent), |n| {
            seen.push(n.to_owned());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, ["core-1.img", "pages-4.img"]);
        assert_eq!(std::fs::read(dest.join("pages-4.img")).unwrap(), new);
        assert_eq!(std::fs::read(dest.join("core-1.img")).unwrap(), b"core");
        assert_eq!(c.written + c.shared, new.len() as u64 + 4);
        assert!(c.shared == 0 || c.shared == 3 * PAGE as u64, "{c:?}");
        let sha = hex(&Sha256::digest(&new));
        assert_eq!(c.images[1].sha256, sha);
        assert_eq!(c.images[1].size, new.len() as u64);
        // A stop between images is the caller's error, after the first.
        let again = tmp.path().join("again");
        let e = commit_images(&staged, &again, Some(&parent), |_| {
            Err(interrupted("the fault x was injected"))
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "writing the images stopped: the fault x was injected"
        );
        assert!(again.join("core-1.img").exists() && !again.join("pages-4.img").exists());
    }
}
