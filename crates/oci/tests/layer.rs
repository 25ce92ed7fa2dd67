//! Layers applied onto real trees (needs root: a layer's files belong to
//! other users). Each test writes below its own temporary directory, and
//! checks that nothing outside the tree was touched.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use drums_oci::{apply, LayerError, LayerLimits};
use sha2::{Digest, Sha256};

fn need_root() {
    if !nix::unistd::Uid::effective().is_root() {
        panic!("this test needs root (a layer's files belong to other users); CI runs it as root. NOT SKIPPED: failing on purpose");
    }
}

const MTIME: u64 = 1_700_000_000;

/// A tar stream written header by header, so that it can hold what the
/// `tar` crate's builder refuses to write (absolute paths, `..`).
#[derive(Default)]
struct Layer {
    b: Vec<u8>,
}

impl Layer {
    #[allow(clippy::too_many_arguments)]
    fn raw(
        &mut self,
        name: &[u8],
        kind: tar::EntryType,
        mode: u32,
        owner: (u64, u64),
        data: &[u8],
        link: &[u8],
        dev: (u32, u32),
    ) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        let g = h.as_gnu_mut().unwrap();
        g.name[..name.len()].copy_from_slice(name);
        g.linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        h.set_device_major(dev.0).unwrap();
        h.set_device_minor(dev.1).unwrap();
        h.set_cksum();
        self.b.extend_from_slice(h.as_bytes());
        self.b.extend_from_slice(data);
        self.b
            .extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
        self
    }
    fn dir(&mut self, p: &str, mode: u32) -> &mut Self {
        self.raw(
            p.as_bytes(),
            tar::EntryType::Directory,
            mode,
            (0, 0),
            b"",
            b"",
            (0, 0),
        )
    }
    fn file(&mut self, p: &str, mode: u32, owner: (u64, u64), data: &[u8]) -> &mut Self {
        self.raw(
            p.as_bytes(),
            tar::EntryType::Regular,
            mode,
            owner,
            data,
            b"",
            (0, 0),
        )
    }
    fn symlink(&mut self, p: &str, target: &str) -> &mut Self {
        self.raw(
            p.as_bytes(),
            tar::EntryType::Symlink,
            0o777,
            (0, 0),
            b"",
            target.as_bytes(),
            (0, 0),
        )
    }
    fn hardlink(&mut self, p: &str, target: &str) -> &mut Self {
        self.raw(
            p.as_bytes(),
            tar::EntryType::Link,
            0o644,
            (0, 0),
            b"",
            target.as_bytes(),
            (0, 0),
        )
    }
    fn end(&mut self) -> Vec<u8> {
        let mut out = self.b.clone();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }
}

fn sha(b: &[u8]) -> String {
    let d = Sha256::digest(b);
    format!(
        "sha256:{}",
        d.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

/// Every path below `dir`, relative, sorted: a tree's shape.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_layer_makes_its_tree_and_its_diff_id_is_its_streams_sha256() {
    need_root();
    let stream = Layer::default()
        .dir("./", 0o755)
        .dir("./etc/", 0o755)
        .file(
            "./etc/passwd",
            0o644,
            (0, 0),
            b"root:x:0:0::/root:/bin/sh\n",
        )
        .file("./home/u/notes", 0o640, (1000, 1001), b"mine\n")
        .file("./usr/bin/su", 0o4755, (0, 0), b"#!/bin/sh\n")
        .hardlink("./usr/bin/su2", "./usr/bin/su")
        .symlink("./bin", "usr/bin")
        .symlink("./etc/localtime", "/usr/share/zoneinfo/UTC")
        .raw(
            b"./run/fifo",
            tar::EntryType::Fifo,
            0o600,
            (0, 0),
            b"",
            b"",
            (0, 0),
        )
        .end();
    for (how, blob) in [("plain", stream.clone()), ("gzip", gzip(&stream))] {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let a = apply(r, &blob[..], &LayerLimits::default()).unwrap();
        assert_eq!(
            a.diff_id,
            sha(&stream),
            "{how}: the diff-id is of the uncompressed stream"
        );
        assert_eq!(a.bytes, 26 + 5 + 10, "{how}");
        assert_eq!(a.whiteouts, 0);
        assert_eq!(read(&r.join("etc/passwd")), "root:x:0:0::/root:/bin/sh\n");
        let notes = std::fs::metadata(r.join("home/u/notes")).unwrap();
        assert_eq!(
            (notes.uid(), notes.gid(), notes.mode() & 0o7777),
            (1000, 1001, 0o640)
        );
        // Made for it, as other runtimes do: 0755, root.
        let home = std::fs::metadata(r.join("home/u")).unwrap();
        assert_eq!((home.uid(), home.mode() & 0o7777), (0, 0o755));
        let su = std::fs::metadata(r.join("usr/bin/su")).unwrap();
        assert_eq!(
            su.mode() & 0o7777,
            0o4755,
            "{how}: setuid kept after the chown"
        );
        assert_eq!(su.mtime(), MTIME as i64);
        assert_eq!(
            std::fs::metadata(r.join("usr/bin/su2")).unwrap().ino(),
            su.ino()
        );
        assert_eq!(
            std::fs::read_link(r.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert_eq!(
            std::fs::read_link(r.join("etc/localtime")).unwrap(),
            Path::new("/usr/share/zoneinfo/UTC")
        );
        assert!(std::fs::symlink_metadata(r.join("run/fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        // Directory times are the layer's, set after their children.
        assert_eq!(
            std::fs::metadata(r.join("etc")).unwrap().mtime(),
            MTIME as i64
        );
        assert_eq!(
            std::fs::metadata(r.join("etc"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
    }
}

#[test]
fn whiteouts_and_opaque_directories_hide_what_the_layers_below_made() {
    need_root();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let base = Layer::default()
        .file("a/x", 0o644, (0, 0), b"x")
        .file("a/y", 0o644, (0, 0), b"y")
        .file("b/dir/deep/z", 0o644, (0, 0), b"z")
        .file("keep/old", 0o644, (0, 0), b"old")
        .file("f", 0o644, (0, 0), b"a file, then a directory")
        .end();
    apply(r, &base[..], &LayerLimits::default()).unwrap();
    // The same changes, `f` made a directory first or not.
    let top = |dir_f: bool| {
        let mut l = Layer::default();
        l.file("a/.wh.x", 0o644, (0, 0), b"")
            .file("b/.wh.dir", 0o644, (0, 0), b"")
            .file(".wh.nothing-there", 0o644, (0, 0), b"")
            .file("keep/new", 0o644, (0, 0), b"new")
            .file("keep/.wh..wh..opq", 0o644, (0, 0), b"")
            .file("keep/after", 0o644, (0, 0), b"after");
        if dir_f {
            l.dir("f", 0o755);
        }
        l.file("f/inside", 0o644, (0, 0), b"").end()
    };
    // `f/inside` goes through a file: refused, since the layer below made
    // it a file and this one never made it a directory.
    let e = apply(r, &top(false)[..], &LayerLimits::default()).unwrap_err();
    assert!(
        matches!(e, LayerError::Refused { ref path, .. } if path == "f/inside"),
        "{e}"
    );
    let top = top(true);
    let a = apply(r, &top[..], &LayerLimits::default()).unwrap();
    assert_eq!(a.whiteouts, 4);
    assert_eq!(
        tree(r),
        [
            "a",
            "a/y",
            "b",
            "f",
            "f/inside",
            "keep",
            "keep/after",
            "keep/new"
        ]
    );
}

#[test]
fn a_path_through_a_symlink_is_resolved_inside_the_tree() {
    need_root();
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let base = Layer::default()
        .dir("usr/bin", 0o755)
        .symlink("bin", "/usr/bin")
        .symlink("host", outside.path().to_str().unwrap())
        .symlink("etc/root", "/")
        .end();
    apply(r, &base[..], &LayerLimits::default()).unwrap();
    // A tree a lower layer could not have made, but that must not matter.
    std::os::unix::fs::symlink("../../../../..", r.join("up")).unwrap();
    let top = Layer::default()
        .file("bin/tool", 0o755, (0, 0), b"tool")
        .file("etc/root/at-root", 0o644, (0, 0), b"")
        .file("up/climbed", 0o644, (0, 0), b"")
        .end();
    apply(r, &top[..], &LayerLimits::default()).unwrap();
    assert_eq!(read(&r.join("usr/bin/tool")), "tool");
    assert!(r.join("at-root").exists() && r.join("climbed").exists());
    // The absolute symlink names the tree's own path, which is not there.
    let evil = Layer::default()
        .file("host/planted", 0o644, (0, 0), b"")
        .end();
    let e = apply(r, &evil[..], &LayerLimits::default()).unwrap_err();
    assert!(matches!(e, LayerError::Refused { .. }), "{e}");
    assert!(tree(outside.path()).is_empty(), "wrote outside the tree");
}

#[test]
fn bad_layers_are_refused_with_the_entry_named_and_nothing_outside_changes() {
    need_root();
    use tar::EntryType as T;
    let big = LayerLimits {
        max_bytes: 10,
        max_entries: 3,
        ..LayerLimits::default()
    };
    let full = Layer::default()
        .file("a", 0o644, (0, 0), &[7u8; 2000])
        .end();
    let cases: Vec<(&str, Vec<u8>, LayerLimits, &str)> = vec![
        (
            "dot-dot above the root",
            Layer::default().file("a/../../x", 0o644, (0, 0), b"").end(),
            LayerLimits::default(),
            "\"..\"",
        ),
        (
            "hard link into AUFS metadata",
            Layer::default()
                .file(".wh..wh.plnk/1.2", 0o644, (0, 0), b"")
                .hardlink("a", ".wh..wh.plnk/1.2")
                .end(),
            LayerLimits::default(),
            "AUFS",
        ),
        (
            "hard link to nothing",
            Layer::default().hardlink("a", "missing").end(),
            LayerLimits::default(),
            "not there",
        ),
        (
            "hard link to a directory",
            Layer::default().dir("d", 0o755).hardlink("a", "d").end(),
            LayerLimits::default(),
            "directory",
        ),
        (
            "hard link with dot-dot",
            Layer::default().hardlink("a", "../../etc/shadow").end(),
            LayerLimits::default(),
            "\"..\"",
        ),
        (
            "unknown entry type",
            Layer::default()
                .raw(b"s", T::new(b'Z'), 0o644, (0, 0), b"", b"", (0, 0))
                .end(),
            LayerLimits::default(),
            "entry type",
        ),
        (
            "bigger than its limit",
            Layer::default().file("a", 0o644, (0, 0), &[0u8; 11]).end(),
            big,
            "bytes",
        ),
        (
            "more entries than its limit",
            Layer::default()
                .dir("a", 0o755)
                .dir("b", 0o755)
                .dir("c", 0o755)
                .dir("d", 0o755)
                .end(),
            big,
            "entries",
        ),
        (
            "truncated in a file",
            full[..1024].to_vec(),
            LayerLimits::default(),
            "read the layer",
        ),
        (
            "truncated gzip",
            gzip(&full)[..40].to_vec(),
            LayerLimits::default(),
            "read the layer",
        ),
        (
            "zstd",
            vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0],
            LayerLimits::default(),
            "zstd",
        ),
    ];
    for (what, blob, limits, says) in cases {
        let outside = tempfile::tempdir().unwrap();
        let root = outside.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        let e = match apply(&root, &blob[..], &limits) {
            Ok(a) => panic!("{what}: accepted ({a:?})"),
            Err(e) => e,
        };
        let text = format!("{e}");
        assert!(text.contains(says), "{what}: {text}");
        assert_eq!(
            tree(outside.path()).first().map(String::as_str),
            Some("tree"),
            "{what}"
        );
        assert!(
            tree(outside.path()).iter().all(|p| p.starts_with("tree")),
            "{what}: wrote outside the tree: {:?}",
            tree(outside.path())
        );
    }
    // Cut between two entries, a tar stream still reads to its end: the
    // diff-id, which the caller checks against the config's, tells.
    let two = Layer::default()
        .file("a", 0o644, (0, 0), b"a")
        .file("b", 0o644, (0, 0), b"b")
        .end();
    let root = tempfile::tempdir().unwrap();
    let a = apply(root.path(), &two[..1024], &LayerLimits::default()).unwrap();
    assert_ne!(a.diff_id, sha(&two));
}

/// A whiteout removes one entry of its own directory: `.wh..` (the
/// directory itself) and `.wh...` (its parent: for the layer's root, the
/// staging of every pull and import) are refused, and what is beside the
/// tree stays.
#[test]
fn a_whiteout_names_one_entry_of_its_directory() {
    need_root();
    for name in [".wh..", ".wh...", "d/.wh..", "d/.wh...", "d/e/.wh..."] {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("canary"), "canary").unwrap();
        let root = outside.path().join("tree");
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/e/f"), "f").unwrap();
        let blob = Layer::default().file(name, 0o644, (0, 0), b"").end();
        let e = apply(&root, &blob[..], &LayerLimits::default()).unwrap_err();
        assert!(
            format!("{e}").contains("whiteout must name one entry"),
            "{name}: {e}"
        );
        assert_eq!(read(&outside.path().join("canary")), "canary", "{name}");
        assert_eq!(read(&root.join("d/e/f")), "f", "{name}");
    }
}

/// Everything a layer writes is charged against the room before it is
/// written: content and `ENTRY_BYTES` an entry. Past it the layer is
/// refused, saying so; within it, the charge is what was written.
#[test]
fn a_layer_is_charged_what_it_writes_against_its_room() {
    need_root();
    use drums_oci::ENTRY_BYTES;
    let content = Layer::default()
        .file("a", 0o644, (0, 0), &[1u8; 3000])
        .end();
    let room = |room| LayerLimits {
        room,
        ..LayerLimits::default()
    };
    let root = tempfile::tempdir().unwrap();
    let e = apply(root.path(), &content[..], &room(ENTRY_BYTES + 2999)).unwrap_err();
    assert!(matches!(e, LayerError::NoRoom { .. }), "{e}");
    assert!(format!("{e}").contains("room"), "{e}");
    assert!(
        !root.path().join("a").exists(),
        "written before it was charged"
    );
    let a = apply(root.path(), &content[..], &room(ENTRY_BYTES + 3000)).unwrap();
    assert_eq!(a.charged, ENTRY_BYTES + 3000);
    // Empty entries are not free.
    let mut many = Layer::default();
    for i in 0..20 {
        many.dir(&format!("d{i}"), 0o755);
    }
    let many = many.end();
    let root = tempfile::tempdir().unwrap();
    let e = apply(root.path(), &many[..], &room(19 * ENTRY_BYTES)).unwrap_err();
    assert!(matches!(e, LayerError::NoRoom { .. }), "{e}");
}

/// Every character or block device below `dir` (not following links).
fn devices(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|p| {
            let t = std::fs::symlink_metadata(dir.join(p)).unwrap().file_type();
            t.is_char_device() || t.is_block_device()
        })
        .collect()
}

/// A layer from a debootstrap root holds `/dev/console`; others hold block
/// devices and hard links to them. The layer is applied, no node is made
/// (what was at its path before is gone, as the layer says), a hard link to
/// a skipped node is skipped too, each is listed with why, and the diff-id
/// is still the whole stream's. A fifo is made.
#[test]
fn device_nodes_are_skipped_never_made_and_the_diff_id_is_the_whole_streams() {
    need_root();
    use drums_oci::{Skip, Skipped};
    use tar::EntryType as T;
    let base = Layer::default()
        .file("dev/console", 0o644, (0, 0), b"a file, below")
        .file("dev/sda", 0o644, (0, 0), b"a file, below")
        .end();
    let stream = Layer::default()
        .dir("dev", 0o755)
        .raw(b"dev/console", T::Char, 0o600, (0, 5), b"", b"", (5, 1))
        .raw(b"./dev/sda", T::Block, 0o660, (0, 6), b"", b"", (8, 0))
        .hardlink("dev/console-again", "dev/console")
        .hardlink("dev/sda-again", "/dev/sda")
        .raw(b"run/initctl", T::Fifo, 0o600, (0, 0), b"", b"", (0, 0))
        .file("dev/after", 0o644, (0, 0), b"after")
        .end();
    for (how, blob) in [("plain", stream.clone()), ("gzip", gzip(&stream))] {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        apply(r, &base[..], &LayerLimits::default()).unwrap();
        let a = apply(r, &blob[..], &LayerLimits::default()).unwrap();
        assert_eq!(a.diff_id, sha(&stream), "{how}: the whole stream's");
        assert_eq!(
            a.skipped,
            vec![
                Skipped {
                    path: "dev/console".into(),
                    what: Skip::Device {
                        block: false,
                        major: 5,
                        minor: 1
                    }
                },
                Skipped {
                    path: "./dev/sda".into(),
                    what: Skip::Device {
                        block: true,
                        major: 8,
                        minor: 0
                    }
                },
                Skipped {
                    path: "dev/console-again".into(),
                    what: Skip::LinkToDevice {
                        target: "dev/console".into()
                    }
                },
                Skipped {
                    path: "dev/sda-again".into(),
                    what: Skip::LinkToDevice {
                        target: "./dev/sda".into()
                    }
                },
            ],
            "{how}"
        );
        assert!(devices(r).is_empty(), "{how}: {:?}", devices(r));
        assert_eq!(tree(r), ["dev", "dev/after", "run", "run/initctl"], "{how}");
        assert!(std::fs::symlink_metadata(r.join("run/initctl"))
            .unwrap()
            .file_type()
            .is_fifo());
    }
}

/// Once something real is put where a device node was skipped, a hard link
/// there links to it; once a whiteout removed the skipped node, a hard link
/// to it is to nothing, as to any removed file.
#[test]
fn a_skipped_device_node_stops_counting_once_its_path_is_reused_or_whited_out() {
    need_root();
    use tar::EntryType as T;
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let reused = Layer::default()
        .raw(b"dev/null", T::Char, 0o666, (0, 0), b"", b"", (1, 3))
        .file("dev/null", 0o644, (0, 0), b"a file now")
        .hardlink("dev/null-link", "dev/null")
        .end();
    let a = apply(r, &reused[..], &LayerLimits::default()).unwrap();
    assert_eq!(a.skipped.len(), 1, "{:?}", a.skipped);
    assert_eq!(
        std::fs::metadata(r.join("dev/null-link")).unwrap().ino(),
        std::fs::metadata(r.join("dev/null")).unwrap().ino()
    );
    let whited = Layer::default()
        .raw(b"dev/zero", T::Char, 0o666, (0, 0), b"", b"", (1, 5))
        .file("dev/.wh.zero", 0o644, (0, 0), b"")
        .hardlink("dev/zero-link", "dev/zero")
        .end();
    let e = apply(r, &whited[..], &LayerLimits::default()).unwrap_err();
    assert!(
        matches!(e, LayerError::Refused { ref path, .. } if path == "dev/zero-link"),
        "{e}"
    );
    assert!(devices(r).is_empty(), "{:?}", devices(r));
}

/// Paths are read as podman reads them: a leading `/` is the layer's root,
/// `a/../b` is `b` (only a `..` above the root is refused, above). A symlink
/// is kept as written, one that climbs above the root too: the session can
/// make such a link itself, and every later entry through it is resolved
/// inside the tree.
#[test]
fn absolute_paths_dot_dots_inside_and_climbing_symlinks_are_read_as_podman_reads_them() {
    need_root();
    let outside = tempfile::tempdir().unwrap();
    let root = outside.path().join("tree");
    std::fs::create_dir(&root).unwrap();
    let r = root.as_path();
    let stream = Layer::default()
        .file("/etc/abs", 0o644, (0, 0), b"abs")
        .hardlink("etc/abs-link", "/etc/abs")
        .file("a/../b", 0o644, (0, 0), b"b")
        .symlink("up/l", "../../..")
        .file("up/l/x/through", 0o644, (0, 0), b"through")
        .end();
    let a = apply(r, &stream[..], &LayerLimits::default()).unwrap();
    assert!(a.skipped.is_empty(), "{:?}", a.skipped);
    assert_eq!(read(&r.join("etc/abs")), "abs");
    assert_eq!(
        std::fs::metadata(r.join("etc/abs-link")).unwrap().ino(),
        std::fs::metadata(r.join("etc/abs")).unwrap().ino()
    );
    assert_eq!(read(&r.join("b")), "b");
    assert!(!r.join("a").exists());
    assert_eq!(
        std::fs::read_link(r.join("up/l")).unwrap(),
        Path::new("../../..")
    );
    // `up/l/x/through`: the link climbs to the tree's root, not past it.
    assert_eq!(read(&r.join("x/through")), "through");
    assert!(
        tree(outside.path()).iter().all(|p| p.starts_with("tree")),
        "wrote outside the tree: {:?}",
        tree(outside.path())
    );
}

/// AUFS's metadata at the root (docker's `.wh..wh.plnk`, `.wh..wh.aufs`)
/// and a `.wh..wh.` entry that is not the opaque marker are read past and
/// listed, as docker and podman skip them; the opaque marker still works.
#[test]
fn aufs_metadata_is_skipped_and_the_opaque_marker_still_hides() {
    need_root();
    use drums_oci::Skip;
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let base = Layer::default().file("d/old", 0o644, (0, 0), b"").end();
    apply(r, &base[..], &LayerLimits::default()).unwrap();
    let stream = Layer::default()
        .dir(".wh..wh.plnk", 0o700)
        .file(".wh..wh.plnk/12.34", 0o644, (0, 0), b"x")
        .file(".wh..wh.aufs", 0o600, (0, 0), b"")
        .file("d/.wh..wh.other", 0o644, (0, 0), b"")
        .file("d/.wh..wh..opq", 0o644, (0, 0), b"")
        .file("d/new", 0o644, (0, 0), b"")
        .end();
    let a = apply(r, &stream[..], &LayerLimits::default()).unwrap();
    assert_eq!(a.skipped.len(), 4, "{:?}", a.skipped);
    assert!(a.skipped.iter().all(|s| s.what == Skip::WhiteoutMeta));
    assert_eq!(a.whiteouts, 1);
    assert_eq!(a.bytes, 0, "nothing of the metadata was written");
    assert_eq!(tree(r), ["d", "d/new"]);
}
