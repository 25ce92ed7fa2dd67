//! Real btrfs stores on loop devices: these need root, /dev/loop-control and
//! mkfs.btrfs, and a temp directory that is not itself on btrfs.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use drums_store::{
    create_subvolume, delete_subvolume, is_subvolume, snapshot, subvolume_changed,
    subvolume_generation, subvolume_info, written_since, Backing, Store, StoreError, Written,
};

const GIB: u64 = 1 << 30;

/// Unmounts whatever is still mounted at the store root when a test fails halfway,
/// so a failure does not leave mounts and loop devices behind.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        while mounted_at(&self.0) {
            if nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH).is_err() {
                break;
            }
        }
    }
}

fn mount_points() -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
        .collect()
}

fn mounted_at(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

/// Loop devices whose backing file is `image`.
fn loop_devices_of(image: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/sys/block").unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            let backing = backing.trim_end();
            let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
            if Path::new(backing) == image {
                found.push(name);
            }
        }
    }
    found
}

/// A temp dir on a non-btrfs filesystem, canonicalized like the store does.
fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fs = nix::sys::statfs::statfs(dir.path()).unwrap();
    assert_ne!(
        fs.filesystem_type(),
        nix::sys::statfs::BTRFS_SUPER_MAGIC,
        "these tests need a temp dir that is not on btrfs"
    );
    dir
}

fn assert_cleaned_up(root: &Path, image: &Path) {
    assert!(!mounted_at(root), "{} still mounted", root.display());
    assert_eq!(
        loop_devices_of(image),
        Vec::<String>::new(),
        "loop device still attached"
    );
}

#[test]
fn loop_store_subvolumes_and_snapshots() {
    let tmp = state_dir();
    let state = fs::canonicalize(tmp.path()).unwrap();
    let guard = MountGuard(state.join("store"));
    let store = Store::open(&state, GIB).unwrap();
    let root = store.root().to_path_buf();
    assert_eq!(root, guard.0);
    let image = state.join("store.img");
    let Backing::Loop { image: img, device } = store.backing().clone() else {
        panic!("expected a loop-backed store, got {:?}", store.backing());
    };
    assert_eq!(img, image);
    assert!(device.to_string_lossy().starts_with("/dev/loop"));
    assert!(mounted_at(&root));
    assert_eq!(loop_devices_of(&image).len(), 1);
    // Sparse: 1 GiB apparent, far less allocated.
    let meta = fs::metadata(&image).unwrap();
    assert_eq!(meta.len(), GIB);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < GIB / 4);

    // A subvolume with a file in it.
    let upper = root.join("upper");
    create_subvolume(&upper).unwrap();
    assert!(is_subvolume(&upper));
    fs::write(upper.join("file"), b"hello").unwrap();
    let gen_before = subvolume_generation(&upper).unwrap();
    assert!(gen_before > 0);
    let sync = |p: &Path| {
        let dir = fs::File::open(p).unwrap();
        nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)).unwrap();
    };
    sync(&upper);
    let changed_before = subvolume_changed(&upper).unwrap();
    let gen_synced = subvolume_generation(&upper).unwrap();

    // Read-only snapshot: same contents, no writes.
    let ro = root.join("ro");
    snapshot(&upper, &ro, true).unwrap();
    // Taking it moved the source's generation (its root node was copied),
    // not its contents' (what the inspector's cross-check reads).
    sync(&upper);
    assert!(subvolume_generation(&upper).unwrap() > gen_synced);
    assert_eq!(subvolume_changed(&upper).unwrap(), changed_before);
    assert!(is_subvolume(&ro));
    assert_eq!(fs::read(ro.join("file")).unwrap(), b"hello");
    let err = fs::File::create(ro.join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = fs::OpenOptions::new()
        .append(true)
        .open(ro.join("file"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let upper_info = subvolume_info(&upper).unwrap();
    let ro_info = subvolume_info(&ro).unwrap();
    assert!(ro_info.readonly);
    assert!(!upper_info.readonly);
    assert_eq!(ro_info.parent_uuid, upper_info.uuid);
    assert_ne!(ro_info.id, upper_info.id);

    // A writable snapshot of the read-only one (how a checkpoint is restored).
    let rw = root.join("rw");
    snapshot(&ro, &rw, false).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(rw.join("file"))
        .unwrap()
        .write_all(b" world")
        .unwrap();
    fs::write(rw.join("new"), b"x").unwrap();
    assert_eq!(fs::read(rw.join("file")).unwrap(), b"hello world");
    assert_eq!(fs::read(ro.join("file")).unwrap(), b"hello");

    // Writing to the original moves its generation and its contents'
    // on, once committed (the fd is closed in `sync`: an open one would
    // keep the filesystem busy at close).
    fs::write(upper.join("file2"), b"more").unwrap();
    sync(&upper);
    assert!(subvolume_generation(&upper).unwrap() > gen_before);
    assert!(subvolume_changed(&upper).unwrap() > changed_before);

    // Errors name what went wrong.
    let plain = root.join("plain");
    fs::create_dir(&plain).unwrap();
    assert!(!is_subvolume(&plain));
    assert!(matches!(
        delete_subvolume(&plain),
        Err(StoreError::NotSubvolume { .. })
    ));
    let err = snapshot(&plain, &root.join("nope"), true).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{} is not a btrfs subvolume", plain.display())
    );
    let err = snapshot(&upper, &ro, true).unwrap_err();
    assert!(matches!(err, StoreError::Snapshot { .. }), "{err}");
    assert!(!is_subvolume(&state), "ext4 dirs are never subvolumes");
    let err = create_subvolume(&state.join("on-ext4")).unwrap_err();
    assert!(matches!(err, StoreError::Ioctl { .. }), "{err}");

    // Delete everything, including the read-only snapshot.
    for path in [&upper, &ro, &rw] {
        assert!(delete_subvolume(path).unwrap(), "{}", path.display());
        assert!(!path.exists());
        assert!(
            !delete_subvolume(path).unwrap(),
            "second delete reports absent"
        );
    }

    store.close().unwrap();
    assert_cleaned_up(&root, &image);
    drop(guard);
}

#[test]
fn reopen_reuses_a_mount_left_by_a_crash() {
    let tmp = state_dir();
    let state = fs::canonicalize(tmp.path()).unwrap();
    let root = state.join("store");
    let image = state.join("store.img");
    let _guard = MountGuard(root.clone());

    let first = Store::open(&state, GIB).unwrap();
    create_subvolume(&first.root().join("kept")).unwrap();
    fs::write(first.root().join("kept/file"), b"still here").unwrap();
    let first_backing = first.backing().clone();
    // A crashed daemon never closes its store.
    drop(first);

    let second = Store::open(&state, GIB).unwrap();
    assert_eq!(second.backing(), &first_backing);
    assert_eq!(
        mount_points().iter().filter(|m| **m == root).count(),
        1,
        "reopening must not stack a second mount"
    );
    assert_eq!(loop_devices_of(&image).len(), 1);
    assert!(is_subvolume(&root.join("kept")));
    assert_eq!(fs::read(root.join("kept/file")).unwrap(), b"still here");
    second.close().unwrap();
    assert_cleaned_up(&root, &image);

    // After a clean close, opening again mounts the existing image, contents intact.
    let third = Store::open(&state, GIB).unwrap();
    assert_eq!(fs::read(root.join("kept/file")).unwrap(), b"still here");
    assert!(delete_subvolume(&root.join("kept")).unwrap());
    third.close().unwrap();
    assert_cleaned_up(&root, &image);
}

#[test]
fn state_dir_on_btrfs_is_used_natively() {
    let tmp = state_dir();
    let state = fs::canonicalize(tmp.path()).unwrap();
    let _guard = MountGuard(state.join("store"));
    let outer = Store::open(&state, GIB).unwrap();

    // The outer store's root is on btrfs, so a store inside it needs no image.
    let inner_state = outer.root().join("state");
    let inner = Store::open(&inner_state, GIB).unwrap();
    assert_eq!(inner.backing(), &Backing::Native);
    assert_eq!(inner.root(), inner_state.join("store"));
    assert!(inner.root().is_dir());
    assert!(!inner_state.join("store.img").exists());
    let sub = inner.root().join("s");
    create_subvolume(&sub).unwrap();
    assert!(is_subvolume(&sub));
    inner.close().unwrap();
    assert!(sub.exists(), "closing a native store leaves it alone");
    assert!(delete_subvolume(&sub).unwrap());

    outer.close().unwrap();
    assert_cleaned_up(&state.join("store"), &state.join("store.img"));
}

#[test]
fn tiny_image_is_refused_before_mkfs() {
    let tmp = state_dir();
    let err = Store::open(tmp.path(), 1 << 20).unwrap_err();
    assert!(matches!(err, StoreError::ImageTooSmall { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "store image size 1048576 bytes is below the minimum of 128 MiB"
    );
}

/// Write `bytes` to a new file in `dir` in 1 MiB chunks, syncing as it goes;
/// returns the bytes written and the error that stopped it, if any.
fn fill(dir: &Path, name: &str, bytes: u64) -> (u64, Option<std::io::Error>) {
    let mut f = fs::File::create(dir.join(name)).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0;
    while written < bytes {
        if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_data()) {
            return (written, Some(e));
        }
        written += chunk.len() as u64;
    }
    (written, None)
}

#[test]
fn qgroups_limit_a_subvolume_its_snapshots_and_the_group() {
    use drums_store::{
        create_subvolume_with, enable_quota, ensure_qgroup, limit_qgroup, snapshot_with,
        QgroupInherit, QgroupLimitKind, SESSIONS_QGROUP,
    };
    const MIB: u64 = 1 << 20;
    let tmp = state_dir();
    let state = fs::canonicalize(tmp.path()).unwrap();
    let _guard = MountGuard(state.join("store"));
    let store = Store::open(&state, GIB).unwrap();
    let root = store.root().to_path_buf();
    enable_quota(&root).unwrap();
    // Twice is fine: a daemon restart enables again.
    enable_quota(&root).unwrap();
    ensure_qgroup(&root, SESSIONS_QGROUP).unwrap();
    ensure_qgroup(&root, SESSIONS_QGROUP).unwrap();
    limit_qgroup(
        &root,
        SESSIONS_QGROUP,
        QgroupLimitKind::Referenced,
        Some(400 * MIB),
    )
    .unwrap();

    // A session-like subvolume limited to 64 MiB: the write past it fails with
    // EDQUOT, the quota errno, and what fits is kept.
    let a = root.join("a");
    create_subvolume_with(&a, &QgroupInherit::session(Some(64 * MIB))).unwrap();
    let (written, err) = fill(&a, "fill", 200 * MIB);
    let err = err.expect("a 64 MiB quota stops a 200 MiB write");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(
        (32 * MIB..=64 * MIB).contains(&written),
        "wrote {written} bytes under a 64 MiB quota"
    );
    // Deleting frees quota again.
    fs::remove_file(a.join("fill")).unwrap();
    nix::unistd::sync();
    let (_, err) = fill(&a, "small", 8 * MIB);
    assert!(err.is_none(), "{err:?}");

    // A read-only snapshot (a checkpoint) and a writable snapshot of it (a
    // sibling) with the same limit. The limit bounds exclusive bytes, so the
    // sibling starts with what the checkpoint holds and the same budget for new
    // writes; nothing it shares counts against it.
    let ro = root.join("ro");
    snapshot_with(&a, &ro, true, &QgroupInherit::session(None)).unwrap();
    let b = root.join("b");
    snapshot_with(&ro, &b, false, &QgroupInherit::session(Some(64 * MIB))).unwrap();
    assert_eq!(fs::metadata(b.join("small")).unwrap().len(), 8 * MIB);
    let (written, err) = fill(&b, "fill", 200 * MIB);
    let err = err.expect("the sibling's quota stops it too");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(
        (32 * MIB..=64 * MIB).contains(&written),
        "sibling wrote {written} bytes"
    );

    // Lifting a subvolume's limit leaves the group's: all members together
    // stop at 400 MiB although the file system has room for more.
    limit_qgroup(&b, 0, QgroupLimitKind::Exclusive, None).unwrap();
    let (written, err) = fill(&b, "more", 1024 * MIB);
    let err = err.expect("the group's limit stops the unlimited member");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(
        written < 400 * MIB,
        "wrote {written} bytes past a 400 MiB group"
    );

    for sv in [&b, &ro, &a] {
        assert!(delete_subvolume(sv).unwrap());
    }
    store.close().unwrap();
    assert_cleaned_up(&root, &state.join("store.img"));
}

/// The bytes a files artifact adds: data extents newer than the previous
/// artifact's creation, counted from the new read-only snapshot.
#[test]
fn written_since_counts_the_data_written_between_two_snapshots() {
    let tmp = state_dir();
    let state = fs::canonicalize(tmp.path()).unwrap();
    let guard = MountGuard(state.join("store"));
    let store = Store::open(&state, GIB).unwrap();
    let root = store.root().to_path_buf();
    let image = state.join("store.img");
    const KIB: u64 = 1024;

    let upper = root.join("upper");
    create_subvolume(&upper).unwrap();
    fs::write(upper.join("big"), vec![7u8; 1024 * KIB as usize]).unwrap();
    fs::write(upper.join("small"), b"tiny").unwrap();
    let first = root.join("a1");
    snapshot(&upper, &first, true).unwrap();
    let a1 = subvolume_info(&first).unwrap();
    assert!(a1.created > 0 && a1.readonly);
    // Everything, then nothing newer than its own creation.
    let all = written_since(&first, 0).unwrap();
    assert!(all.bytes >= 1024 * KIB + 4, "{all:?}");
    assert_eq!(
        written_since(&first, a1.created).unwrap(),
        Written::default()
    );

    // 256 KiB appended to a new file and 64 KiB overwritten in the old one.
    fs::write(upper.join("new"), vec![1u8; 256 * KIB as usize]).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(upper.join("big"))
            .unwrap();
        f.write_all_at(&vec![9u8; 64 * KIB as usize], 128 * KIB)
            .unwrap();
    }
    let second = root.join("a2");
    snapshot(&upper, &second, true).unwrap();
    let delta = written_since(&second, a1.created).unwrap();
    assert_eq!(delta.bytes, 320 * KIB, "{delta:?}");
    assert_eq!(delta.extents, 2, "{delta:?}");
    // The first artifact did not change.
    assert_eq!(
        written_since(&first, a1.created).unwrap(),
        Written::default()
    );
    let err = written_since(&state, 0).unwrap_err();
    assert!(matches!(err, StoreError::NotSubvolume { .. }), "{err}");

    for path in [&second, &first, &upper] {
        assert!(delete_subvolume(path).unwrap());
    }
    store.close().unwrap();
    assert_cleaned_up(&root, &image);
    drop(guard);
}
