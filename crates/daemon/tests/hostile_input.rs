//! drumsd against hostile input (issue 23, docs/security.md "drumsd against
//! hostile input"): what a session, an image or an archive hands drumsd,
//! tried as an attacker would. Each case must be refused or contained, with
//! drumsd's memory and the store measured before and after, and nothing
//! outside the state directory touched.
//!
//! The corpus grows with each finding: the three confirmed attacks of the
//! issue exactly (drumsd's environment read from a session, a whiteout of
//! `..`, a 1.5 GiB PAX header in a 1.6 MB layer), then a 10 GiB PAX header,
//! a GNU long-name bomb, the same bombs in the outer tar of an image
//! archive and of a checkpoint archive, a whiteout through a symlinked
//! directory, and images whose layers sum past the store's room, imported
//! and pulled.
//!
//! Needs root, as every daemon test, and the images set-up builds.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::oci::{self, ImageSpec, Layer};
use common::{fails, ok, run, TestDaemon};
use drums_api::CreateSession;
use drums_testkit::Registry;

fn drumsd_pid(d: &TestDaemon) -> u32 {
    d.child.as_ref().expect("running").id()
}

/// A field of /proc/PID/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// drumsd's peak memory from now on: the kernel's high-water mark, reset.
fn reset_peak(d: &TestDaemon) {
    std::fs::write(format!("/proc/{}/clear_refs", drumsd_pid(d)), "5").unwrap();
}

/// drumsd's peak resident memory since [`reset_peak`], in MiB.
fn peak_mib(d: &TestDaemon) -> u64 {
    status_kib(drumsd_pid(d), "VmHWM:") / 1024
}

/// Bytes the store uses, once btrfs has cleaned the subvolumes removed
/// and synced.
fn store_used(d: &TestDaemon) -> u64 {
    let store = d.state.path().join("store");
    let st = std::process::Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(&store)
        .status()
        .unwrap();
    assert!(st.success(), "btrfs subvolume sync: {st}");
    let f = std::fs::File::open(&store).unwrap();
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
    let s = nix::sys::statvfs::statvfs(&store).unwrap();
    (s.blocks() - s.blocks_free()) * s.fragment_size()
}

fn oci_dir(d: &TestDaemon) -> PathBuf {
    d.state.path().join("store/oci")
}

fn entries(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// No layer, no image, and in the staging directory only `keep`.
fn assert_no_image_left(d: &TestDaemon, what: &str, keep: &[&str]) {
    let layers = entries(&oci_dir(d).join("layers"));
    assert!(layers.is_empty(), "{what}: layers left: {layers:?}");
    let tmp = entries(&oci_dir(d).join("tmp"));
    let mut keep: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    keep.sort();
    assert_eq!(tmp, keep, "{what}: the staging directory changed");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&d.drums(&["images", "--json"]), "images")).unwrap();
    let oci: Vec<_> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "oci")
        .collect();
    assert!(oci.is_empty(), "{what}: images left: {oci:?}");
}

/// Every byte of every file under `dir`.
fn holds(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        } else if md.is_file() {
            let b = std::fs::read(&p).unwrap();
            if b.windows(needle.len()).any(|w| w == needle) {
                hits.push(p);
            }
        }
    }
    hits
}

const SECRET: &str = "hunter2-drums-test-secret";

/// Confirmed attack 1: drumsd's environment was every session's, readable
/// by its root in /proc/1/environ and kept in checkpoints and archives. A
/// session, its checkpoint, its export and a restored sibling now hold
/// none of it: PID 1 has exactly drums' own variables.
#[test]
fn drumsd_environment_never_reaches_a_session_its_checkpoints_or_siblings() {
    let mut d = TestDaemon::start_with_env(
        &[],
        &[
            ("SECRET_TOKEN_FOR_TEST", SECRET),
            ("OPENAI_API_KEY", SECRET),
            ("ANTHROPIC_API_KEY", SECRET),
        ],
    );
    // The daemon does have it: the test plants what it claims.
    let own = std::fs::read(format!("/proc/{}/environ", drumsd_pid(&d))).unwrap();
    assert!(own.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
    let work = tempfile::tempdir().unwrap();
    let every_environ = "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done";
    run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let (rc, init_env, err) = d.sh(&s.id, "tr '\\0' '\\n' < /proc/1/environ");
        assert_eq!(rc, 0, "{err}");
        let names: Vec<&str> = init_env
            .lines()
            .map(|l| l.split('=').next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["PATH", "LD_LIBRARY_PATH"],
            "PID 1's environment: {init_env}"
        );
        let (rc, all, err) = d.sh(&s.id, every_environ);
        assert_eq!(rc, 0, "{err}");
        assert!(
            !all.contains(SECRET),
            "a session process has the secret:\n{all}"
        );
        assert!(!all.contains("SECRET_TOKEN_FOR_TEST"), "{all}");

        let ck = d.checkpoint(&s.id, false, true).await;
        let ck_dir = d.checkpoint_dir(&ck.id);
        assert!(ck_dir.join("images").is_dir(), "{}", ck_dir.display());
        let hits = holds(&ck_dir, SECRET.as_bytes());
        assert!(hits.is_empty(), "the checkpoint holds the secret: {hits:?}");
        let archive = work.path().join("ck.tar");
        ok(
            &d.drums(&["checkpoint", "export", &ck.id, archive.to_str().unwrap()]),
            "export",
        );
        let hits = holds(&archive, SECRET.as_bytes());
        assert!(hits.is_empty(), "the exported archive holds the secret");

        let sib = d.restore(&ck.id, 1).await.unwrap().sessions.remove(0);
        let (rc, all, err) = d.sh(&sib.id, every_environ);
        assert_eq!(rc, 0, "{err}");
        assert!(
            !all.contains(SECRET),
            "a sibling's process has the secret:\n{all}"
        );
        d.rm(&sib.id).await.unwrap();
        d.rm(&s.id).await.unwrap();
        ok(&d.drums(&["checkpoint", "rm", &ck.id]), "checkpoint rm");
    });
    d.stop_and_check_leaks();
}

/// A base layer and a top layer of these raw entries.
fn with_top(entries: &[(&[u8], tar::EntryType)]) -> ImageSpec {
    let base = Layer::builder()
        .dir("bin", 0o755, 0, 0)
        .file("bin/hello", b"hello\n", 0o644, 0, 0)
        .dir("etc", 0o755, 0, 0)
        .symlink("up", "/")
        .build(true);
    let mut top = Layer::builder();
    for (path, kind) in entries {
        top = top.raw_entry(oci::raw_header(path, *kind, 0o644, 0), b"");
    }
    ImageSpec::new(vec![base, top.build(false)])
}

/// Confirmed attack 2, and its kin: a whiteout whose target is `..` or `.`
/// removed what is outside its directory (for the layer's root, the
/// staging of every pull and import in progress). Each is refused naming
/// the entry, and what was placed beside the staging stays. A whiteout
/// through a symlinked directory (`up -> /`, as an image may hold) is
/// resolved inside the layer's tree and removes only what is there.
#[test]
fn a_whiteout_never_removes_outside_its_directory() {
    let mut d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let tmp = oci_dir(&d).join("tmp");
    // What another import's staging would be.
    std::fs::create_dir_all(tmp.join("canary-dir")).unwrap();
    std::fs::write(tmp.join("canary-dir/file"), "canary\n").unwrap();
    std::fs::write(tmp.join("canary"), "canary\n").unwrap();
    let keep = ["canary", "canary-dir"];
    use tar::EntryType as T;
    let cases: Vec<(&str, ImageSpec)> = vec![
        // Exactly the attack: one layer, the entry `.wh...`.
        (
            "dot-dot at the root, one layer",
            ImageSpec::new(vec![Layer::builder()
                .raw_entry(oci::raw_header(b".wh...", T::Regular, 0o644, 0), b"")
                .build(false)]),
        ),
        ("dot-dot at the root", with_top(&[(b".wh...", T::Regular)])),
        ("dot at the root", with_top(&[(b".wh..", T::Regular)])),
        (
            "dot-dot in a directory",
            with_top(&[(b"etc/.wh...", T::Regular)]),
        ),
        (
            "dot in a directory",
            with_top(&[(b"etc/.wh..", T::Regular)]),
        ),
        (
            "dot-dot through a symlinked directory",
            with_top(&[(b"up/.wh...", T::Regular)]),
        ),
    ];
    for (name, image) in &cases {
        let layout = work.path().join(name.replace(' ', "-"));
        oci::write_layout(&layout, image, "v1");
        let err = fails(
            &d.drums(&["image", "import", layout.to_str().unwrap()]),
            name,
        );
        assert!(
            err.contains("whiteout must name one entry"),
            "{name}: {err}"
        );
        assert_no_image_left(&d, name, &keep);
        assert_eq!(
            std::fs::read_to_string(tmp.join("canary-dir/file")).unwrap(),
            "canary\n"
        );
    }
    // Through the symlink, a whiteout of a real name removes it inside the
    // image's own tree: the image keeps its link, loses its /etc, and
    // nothing beside the staging changes.
    let layout = work.path().join("through-the-link");
    oci::write_layout(&layout, &with_top(&[(b"up/.wh.etc", T::Regular)]), "v1");
    let id = ok(
        &d.drums(&["image", "import", layout.to_str().unwrap()]),
        "import through the link",
    );
    // The layers' trees, as sessions get them: the base's has /etc, the
    // top's has not, and both keep the link and the base's file.
    let layers = oci_dir(&d).join("layers");
    let mut with_etc = Vec::new();
    for l in entries(&layers) {
        let t = layers.join(&l);
        assert!(t.join("up").is_symlink(), "{l}: the link is gone");
        assert_eq!(
            std::fs::read_to_string(t.join("bin/hello")).unwrap(),
            "hello\n"
        );
        with_etc.push(t.join("etc").is_dir());
    }
    with_etc.sort();
    assert_eq!(with_etc, [false, true], "one layer without /etc, one with");
    ok(
        &d.drums(&["image", "rm", id.lines().last().unwrap()]),
        "image rm",
    );
    assert_eq!(entries(&tmp), keep);
    for f in keep {
        let p = tmp.join(f);
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    d.stop_and_check_leaks();
}

/// A gzip stream of a tar header (one 512-byte block) followed by
/// `zeros` zero bytes. The zeros are one deflate block of 1 MiB repeated:
/// a full flush makes each block stand alone, so a 10 GiB stream costs
/// 16 MB and no time. The trailer's CRC is not computed (zeros): drums
/// must refuse the stream long before it gets there, and without the
/// guard it would have read the whole header into memory first.
fn gzip_bomb(header: &tar::Header, zeros: u64) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut c = Compress::new(Compression::best(), false);
    let mut block = |input: &[u8], flush| {
        let mut v = Vec::with_capacity(input.len() + (64 << 10));
        c.compress_vec(input, &mut v, flush).unwrap();
        v
    };
    out.extend(block(header.as_bytes(), FlushCompress::Full));
    let mib = block(&vec![0u8; 1 << 20], FlushCompress::Full);
    for _ in 0..zeros.div_ceil(1 << 20) {
        out.extend_from_slice(&mib);
    }
    out.extend(block(&[], FlushCompress::Finish));
    out.extend_from_slice(&[0u8; 8]);
    out
}

/// An extension header of `kind` claiming `size` bytes.
fn extension_header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    let name = b"././@PaxHeader";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    h
}

/// The bound every bomb is held to: drumsd's peak memory may grow by this
/// much while it refuses one (a bomb read whole grows it by its size).
const BOMB_PEAK_MIB: u64 = 96;

/// Confirmed attack 3, and the bombs of its kind: an extension header
/// that the tar crate would read whole (PAX `x` and `g`, GNU long names
/// and long links), in a layer of a few MB, and in the outer tar of an
/// image archive and of a checkpoint archive (the latter read before its
/// signature is checked). Each is refused before its data is read, with
/// drumsd's peak memory and the store's use measured around it.
#[test]
fn tar_extension_bombs_are_refused_before_they_are_read() {
    let mut d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    use tar::EntryType as T;
    let layers: Vec<(&str, T, u64)> = vec![
        // Exactly the attack: 1.5 GiB of PAX header, 1.6 MB of layer.
        ("pax 1.5 GiB", T::XHeader, 3 << 29),
        ("pax 10 GiB", T::XHeader, 10 << 30),
        ("gnu long name 10 GiB", T::GNULongName, 10 << 30),
        ("gnu long link 1.5 GiB", T::GNULongLink, 3 << 29),
        ("pax global 1.5 GiB", T::XGlobalHeader, 3 << 29),
    ];
    let used = store_used(&d);
    for (name, kind, size) in layers {
        let blob = gzip_bomb(&extension_header(kind, size), size);
        assert!(blob.len() < 20 << 20, "{name}: {} bytes", blob.len());
        let layer = Layer::from_blob(blob, true, oci::sha256_digest(b"never computed"));
        let layout = work.path().join(name.replace(' ', "-"));
        oci::write_layout(&layout, &ImageSpec::new(vec![layer]), "v1");
        reset_peak(&d);
        let before = peak_mib(&d);
        let err = fails(
            &d.drums(&["image", "import", layout.to_str().unwrap()]),
            name,
        );
        let peak = peak_mib(&d);
        assert!(err.contains("over the limit"), "{name}: {err}");
        assert!(
            peak < before + BOMB_PEAK_MIB,
            "{name}: drumsd's peak memory went from {before} to {peak} MiB"
        );
        assert_no_image_left(&d, name, &[]);
        std::fs::remove_dir_all(&layout).unwrap();
    }
    // The outer tars are not compressed, so their bombs are spooled whole:
    // sparse files of 256 MiB stand for them.
    let outer = |file: &Path, kind: T| {
        let mut f = std::fs::File::create(file).unwrap();
        f.write_all(extension_header(kind, 256 << 20).as_bytes())
            .unwrap();
        f.set_len(512 + (256 << 20) + 1024).unwrap();
    };
    for (name, kind, args) in [
        ("image archive, pax", T::XHeader, &["image", "import"][..]),
        (
            "image archive, long name",
            T::GNULongName,
            &["image", "import"][..],
        ),
        (
            "checkpoint archive, pax",
            T::XHeader,
            &["checkpoint", "import", "--trust-unsigned"][..],
        ),
        (
            "checkpoint archive, long name",
            T::GNULongName,
            &["checkpoint", "import", "--trust-unsigned"][..],
        ),
    ] {
        let file = work.path().join("outer.tar");
        outer(&file, kind);
        reset_peak(&d);
        let before = peak_mib(&d);
        let mut a: Vec<&str> = args.to_vec();
        a.push(file.to_str().unwrap());
        let err = fails(&d.drums(&a), name);
        let peak = peak_mib(&d);
        assert!(err.contains("over the limit"), "{name}: {err}");
        assert!(
            peak < before + BOMB_PEAK_MIB,
            "{name}: drumsd's peak memory went from {before} to {peak} MiB"
        );
        assert_no_image_left(&d, name, &[]);
        let cks = ok(&d.drums(&["checkpoints", "--json"]), "checkpoints");
        assert!(
            !cks.contains("\"id\""),
            "{name}: a checkpoint was kept: {cks}"
        );
        std::fs::remove_file(&file).unwrap();
    }
    // Nothing of any bomb stayed in the store (a few MiB of btrfs's own
    // bookkeeping may come and go). The last refusal's spool goes when its
    // request's task ends, which under load can be a moment after the CLI
    // had its answer: bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut after = store_used(&d);
    while after >= used + (16 << 20) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        after = store_used(&d);
    }
    assert!(
        after < used + (16 << 20),
        "the store grew from {used} to {after} bytes, and stayed so for 20 s"
    );
    d.stop_and_check_leaks();
}

/// A layer of `mib` MiB of one file of zeros: a few KB gzip'd.
fn zeros_layer(name: &str, mib: usize) -> Layer {
    Layer::builder()
        .file(name, &vec![0u8; mib << 20], 0o644, 0, 0)
        .build(true)
}

/// Pulls and imports are charged against the store's room (its free space
/// less drumsd's reserve), all of what they write: an import whose layers
/// unpack past it (from a few KB of archive), and a pull whose blobs sum
/// past it, are refused with nothing kept.
#[test]
fn an_image_past_the_stores_room_is_refused_and_keeps_nothing() {
    // The reserve leaves a room of 100 MiB: measured on a first start,
    // then drumsd starts again on the same store with it.
    let mut d = TestDaemon::start();
    let store = d.state.path().join("store");
    let free = nix::sys::statvfs::statvfs(&store)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap();
    let subnet = d.subnet();
    d.stop();
    d.extra_args = vec!["--store-reserve".into(), format!("{}M", (free >> 20) - 100)];
    d.restart(&subnet);
    let work = tempfile::tempdir().unwrap();
    let used = store_used(&d);
    // One layer of 48 MiB fits, and is stored: the room is real. (First:
    // btrfs gives back a removed subvolume's room only once its cleaner ran.)
    let fits = ImageSpec::new(vec![zeros_layer("a", 48)]);
    let layout = work.path().join("fits");
    oci::write_layout(&layout, &fits, "v1");
    let id = ok(
        &d.drums(&["image", "import", layout.to_str().unwrap()]),
        "an image that fits",
    );
    ok(
        &d.drums(&["image", "rm", id.lines().last().unwrap()]),
        "image rm",
    );
    assert_no_image_left(&d, "after rm", &[]);
    // Its room back before the cases that must not fit.
    store_used(&d);
    // 3 x 48 MiB unpacked, in KBs of archive: each layer alone fits.
    let import = ImageSpec::new(vec![
        zeros_layer("a", 48),
        zeros_layer("b", 48),
        zeros_layer("c", 48),
    ]);
    let layout = work.path().join("unpacks-past");
    oci::write_layout(&layout, &import, "v1");
    let archive = work.path().join("unpacks-past.tar");
    oci::tar_layout(&layout, &archive);
    for src in [&layout, &archive] {
        let err = fails(
            &d.drums(&["image", "import", src.to_str().unwrap()]),
            "unpacks past the room",
        );
        assert!(err.contains("room"), "{err}");
        assert_no_image_left(&d, "unpacks past the room", &[]);
    }
    // A pull of 2 x 60 MiB of blobs that do not compress: refused before
    // a byte of a blob is fetched.
    let reg = Registry::start().expect("start the test registry");
    let pull = ImageSpec::new(vec![
        oci::noise_layer("a", 60, 7),
        oci::noise_layer("b", 60, 11),
    ]);
    let layout = work.path().join("blobs-past");
    oci::write_layout(&layout, &pull, "v1");
    reg.push_layout(&layout, "hostile/big:v1")
        .expect("push the layout");
    let reference = format!("{}/hostile/big:v1", reg.addr());
    let err = fails(
        &d.drums(&["pull", "--insecure", "-q", &reference]),
        "blobs past the room",
    );
    assert!(err.contains("room"), "{err}");
    assert_no_image_left(&d, "blobs past the room", &[]);
    let after = store_used(&d);
    assert!(
        after < used + (16 << 20),
        "the store grew from {used} to {after} bytes"
    );
    d.stop_and_check_leaks();
}
