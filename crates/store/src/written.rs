//! How much file data a subvolume gained after a given transaction: the
//! "bytes written" of a files artifact, read from btrfs' own metadata.
//!
//! btrfs stamps every file extent with the transaction (generation) that wrote
//! it, and a snapshot shares its source's extent items unchanged. So the file
//! extents of artifact N whose generation is newer than the transaction that
//! created artifact N-1 are exactly the data written in between, which is what
//! `btrfs subvolume find-new` lists. The scan is one TREE_SEARCH ioctl per 4 KiB
//! of items over the subvolume's tree; tree blocks older than the generation
//! are skipped by the kernel, so an unchanged subvolume costs almost nothing.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::btrfs::{open_dir, BTRFS_IOCTL_MAGIC};
use crate::StoreError;

/// BTRFS_EXTENT_DATA_KEY: the item that maps a file range to its data.
const EXTENT_DATA_KEY: u32 = 108;
/// BTRFS_FILE_EXTENT_INLINE / _REG / _PREALLOC.
const EXTENT_INLINE: u8 = 0;
const EXTENT_REG: u8 = 1;
/// Size of struct btrfs_ioctl_search_header.
const SEARCH_HEADER: usize = 32;
/// Offsets in struct btrfs_file_extent_item (packed).
const FE_GENERATION: usize = 0;
const FE_RAM_BYTES: usize = 8;
const FE_TYPE: usize = 20;
const FE_DISK_BYTENR: usize = 21;
const FE_NUM_BYTES: usize = 45;
const FE_REG_SIZE: usize = 53;

/// struct btrfs_ioctl_search_key.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SearchKey {
    pub tree_id: u64,
    pub min_objectid: u64,
    pub max_objectid: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    pub min_transid: u64,
    pub max_transid: u64,
    pub min_type: u32,
    pub max_type: u32,
    pub nr_items: u32,
    pub unused: u32,
    pub unused1: [u64; 4],
}

/// struct btrfs_ioctl_search_args: the key and a 4 KiB page in total.
#[repr(C)]
pub(crate) struct SearchArgs {
    pub key: SearchKey,
    pub buf: [u8; 4096 - std::mem::size_of::<SearchKey>()],
}

const _: () = assert!(std::mem::size_of::<SearchKey>() == 104);
const _: () = assert!(std::mem::size_of::<SearchArgs>() == 4096);

mod ioctl {
    use super::{SearchArgs, BTRFS_IOCTL_MAGIC};

    nix::ioctl_readwrite!(tree_search, BTRFS_IOCTL_MAGIC, 17, SearchArgs);
}

/// File data a subvolume gained after a transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Logical bytes of file data in extents written after the transaction:
    /// new files, appends and overwrites, counted by the file range each
    /// extent covers (before compression). A range written several times in
    /// between counts once, since only extents still referenced are seen.
    /// Not counted: metadata (names, attributes, directories), deletions,
    /// holes and preallocated space.
    pub bytes: u64,
    /// How many such extents (inline ones included).
    pub extents: u64,
}

/// The file data the subvolume at `subvol` holds in extents newer than
/// transaction `generation`. For a files artifact, pass the previous
/// artifact's creation transaction ([`crate::SubvolumeInfo::created`]) and the
/// new artifact's path; with 0, everything the subvolume references counts.
pub fn written_since(subvol: &Path, generation: u64) -> Result<Written, StoreError> {
    if !crate::is_subvolume(subvol) {
        return Err(StoreError::NotSubvolume {
            path: subvol.into(),
        });
    }
    let dir = open_dir(subvol)?;
    let mut args = SearchArgs {
        key: SearchKey {
            // 0: the tree of the subvolume the fd is in.
            tree_id: 0,
            min_objectid: 0,
            max_objectid: u64::MAX,
            min_offset: 0,
            max_offset: u64::MAX,
            // Prunes tree blocks not changed since then; items in newer blocks
            // can still be older, so each extent's own generation is checked too.
            min_transid: generation.saturating_add(1),
            max_transid: u64::MAX,
            min_type: EXTENT_DATA_KEY,
            max_type: EXTENT_DATA_KEY,
            nr_items: 0,
            unused: 0,
            unused1: [0; 4],
        },
        buf: [0; 4096 - std::mem::size_of::<SearchKey>()],
    };
    let mut written = Written::default();
    loop {
        args.key.nr_items = u32::MAX;
        // SAFETY: `dir` is an open fd for the call's duration and `args` is a
        // properly sized, initialised btrfs_ioctl_search_args (checked above);
        // the kernel fills `buf` with at most its size and updates the key.
        unsafe { ioctl::tree_search(dir.as_raw_fd(), &mut args) }.map_err(|errno| {
            StoreError::Ioctl {
                op: "search the tree of",
                path: subvol.into(),
                source: errno.into(),
            }
        })?;
        let found = args.key.nr_items;
        if found == 0 {
            return Ok(written);
        }
        let mut at = 0usize;
        let mut last = (0u64, 0u32, 0u64);
        for _ in 0..found {
            let header = &args.buf[at..at + SEARCH_HEADER];
            let objectid = u64_at(header, 8);
            let offset = u64_at(header, 16);
            let kind = u32::from_le_bytes(header[24..28].try_into().expect("4 bytes"));
            let len = u32::from_le_bytes(header[28..32].try_into().expect("4 bytes")) as usize;
            let item = &args.buf[at + SEARCH_HEADER..at + SEARCH_HEADER + len];
            at += SEARCH_HEADER + len;
            last = (objectid, kind, offset);
            // The key range is compared as a whole (objectid, type, offset), so
            // other item types between the bounds come back too.
            if kind == EXTENT_DATA_KEY {
                written.add(item, generation);
            }
        }
        // Continue after the last key returned.
        let (objectid, kind, offset) = last;
        match offset.checked_add(1) {
            Some(next) => {
                args.key.min_objectid = objectid;
                args.key.min_type = kind;
                args.key.min_offset = next;
            }
            None => match objectid.checked_add(1) {
                Some(next) => {
                    args.key.min_objectid = next;
                    args.key.min_type = 0;
                    args.key.min_offset = 0;
                }
                None => return Ok(written),
            },
        }
    }
}

impl Written {
    /// Count one btrfs_file_extent_item if it is newer than `generation`.
    fn add(&mut self, item: &[u8], generation: u64) {
        if item.len() <= FE_TYPE || u64_at(item, FE_GENERATION) <= generation {
            return;
        }
        match item[FE_TYPE] {
            EXTENT_INLINE => {
                self.bytes += u64_at(item, FE_RAM_BYTES);
                self.extents += 1;
            }
            // disk_bytenr 0 is a hole, not data.
            EXTENT_REG if item.len() >= FE_REG_SIZE && u64_at(item, FE_DISK_BYTENR) != 0 => {
                self.bytes += u64_at(item, FE_NUM_BYTES);
                self.extents += 1;
            }
            _ => {}
        }
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number_matches_the_kernel_header() {
        // _IOWR(0x94, 17, struct btrfs_ioctl_search_args), 4096 bytes.
        assert_eq!(
            nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 17, 4096),
            0xd000_9411
        );
    }

    fn extent(generation: u64, kind: u8, disk_bytenr: u64, num_bytes: u64) -> Vec<u8> {
        let mut item = vec![0u8; FE_REG_SIZE];
        item[0..8].copy_from_slice(&generation.to_le_bytes());
        item[8..16].copy_from_slice(&num_bytes.to_le_bytes());
        item[FE_TYPE] = kind;
        item[21..29].copy_from_slice(&disk_bytenr.to_le_bytes());
        item[45..53].copy_from_slice(&num_bytes.to_le_bytes());
        item
    }

    #[test]
    fn counts_newer_data_extents_only() {
        let mut w = Written::default();
        w.add(&extent(10, EXTENT_REG, 4096, 8192), 9);
        w.add(&extent(9, EXTENT_REG, 4096, 8192), 9); // old
        w.add(&extent(10, EXTENT_REG, 0, 8192), 9); // hole
        w.add(&extent(10, 2, 4096, 8192), 9); // prealloc
        let mut inline = extent(11, EXTENT_INLINE, 0, 0);
        inline.truncate(FE_TYPE + 1);
        inline[8..16].copy_from_slice(&100u64.to_le_bytes());
        w.add(&inline, 9);
        assert_eq!(
            w,
            Written {
                bytes: 8192 + 100,
                extents: 2
            }
        );
    }
}
