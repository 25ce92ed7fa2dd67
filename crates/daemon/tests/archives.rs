//! Untrusted checkpoint archives (issue 10, "Untrusted input"): a corpus of
//! malicious archives, each built here from a real export, is refused with a
//! clear error and the right exit code, and keeps nothing: no staging
//! directory, no ledger row, no checkpoint row, nothing under the state dir's
//! checkpoints or the store, and a canary file the archive aims at is
//! untouched. Trust is by key; an export that fails leaves no file.
//!
//! Needs root (real daemon, btrfs store, CRIU), like every daemon test.

mod common;
#[path = "common/tamper.rs"]
mod tamper;

use std::path::{Path, PathBuf};

use common::{run, TestDaemon};
use drums_api::CreateSession;
use drums_checkpoint::archive;
use drums_checkpoint::keys::{self, HostKey};
use tamper::{pack, read_members, with_manifest, Member};

fn plus(members: &[Member], extra: Vec<Member>) -> Vec<Member> {
    let mut out = members.to_vec();
    out.extend(extra);
    out
}

/// The offset of the first content byte of the first member whose path
/// starts with `prefix`, in a packed archive.
fn content_offset(bytes: &[u8], prefix: &str) -> usize {
    let mut a = tar::Archive::new(bytes);
    for e in a.entries().unwrap() {
        let e = e.unwrap();
        if e.path_bytes().starts_with(prefix.as_bytes())
            && e.header().entry_type().is_file()
            && e.size() > 0
        {
            return e.raw_file_position() as usize;
        }
    }
    panic!("no member under {prefix}");
}

fn ok(o: std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// Nothing of a refused import is left anywhere.
fn assert_nothing_kept(d: &TestDaemon, what: &str, canary: &Path) {
    let state = d.state.path();
    let list = |p: PathBuf| -> Vec<String> {
        match std::fs::read_dir(&p) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => vec![],
        }
    };
    for place in d.checkpoint_places() {
        assert_eq!(
            list(place.clone()),
            Vec::<String>::new(),
            "{what}: left in {}",
            place.display()
        );
    }
    assert!(
        d.store_subvolumes().is_empty(),
        "{what}: {:?}",
        d.store_subvolumes()
    );
    let c = drums_catalog::Catalog::open(&state.join("catalog.db")).unwrap();
    assert!(
        c.versions().unwrap().is_empty(),
        "{what}: checkpoint row left"
    );
    let rows: Vec<_> = c
        .all_resources()
        .unwrap()
        .into_iter()
        .filter(|r| r.owner.starts_with("import:") || r.owner.starts_with("ckpt:"))
        .collect();
    assert!(rows.is_empty(), "{what}: ledger rows left {rows:?}");
    assert_eq!(
        std::fs::read_to_string(canary).unwrap(),
        "canary\n",
        "{what}: the canary was changed"
    );
    assert_eq!(
        list(canary.parent().unwrap().to_owned()),
        vec!["canary".to_owned()],
        "{what}: something was written next to the canary"
    );
}

/// The malicious-archive corpus. Every archive but the unsigned one and the
/// foreign-signed one is signed with this host's own (trusted) key, so each
/// is refused for what it holds, not for its signature.
#[test]
fn malicious_archives_are_refused_and_keep_nothing() {
    let mut d = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.tar");
    let ck = run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(d.sh(&s.id, "echo kept > /root/state").0, 0);
        d.checkpoint(&s.id, false, false).await
    });
    ok(d.drums(&["checkpoint", "export", &ck.id, good.to_str().unwrap()]));
    ok(d.drums(&["checkpoint", "rm", &ck.id]));
    let signed = std::fs::read(&good).unwrap();
    let key = HostKey::load_or_create(&d.state.path().join("keys")).unwrap();
    let members = read_members(&signed);
    let seal = |m: &[Member]| archive::seal(&pack(m), &key);

    let canary_dir = tempfile::tempdir().unwrap();
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, "canary\n").unwrap();
    // From the staging directory (or the checkpoints directory) up to / and
    // down to the canary.
    let aim = format!(
        "{}{}",
        "../".repeat(16),
        canary.display().to_string().trim_start_matches('/')
    );
    let aim_b = aim.as_bytes();
    let first_image = members
        .iter()
        .find(|m| m.path.starts_with(b"images/") && m.path.len() > 7)
        .map(|m| String::from_utf8(m.path.clone()).unwrap())
        .unwrap();
    let pwned = |kind, path: &[u8], mode| Member::new(kind, path, mode, b"pwned\n");
    use tar::EntryType as T;

    let mut flipped_image = signed.clone();
    flipped_image[content_offset(&signed, "images/") + 7] ^= 1;
    let mut flipped_fs = signed.clone();
    flipped_fs[content_offset(&signed, "fs/") + 2] ^= 0x20;
    // The image flipped and the recorded checksum made to match: now the
    // signature itself must fail.
    let resigned_sha = {
        let mut bad = pack(&members);
        let off = content_offset(&bad, "images/") + 7;
        bad[off] ^= 1;
        let mut s: serde_json::Value = serde_json::from_slice(&read_sig(&signed)).unwrap();
        use sha2::Digest;
        s["sha256"] = sha2::Sha256::digest(&bad)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into();
        let sig = Member::new(
            T::Regular,
            archive::SIGNATURE_MEMBER.as_bytes(),
            0o644,
            &serde_json::to_vec(&s).unwrap(),
        );
        let mut out = bad;
        let mut tail = pack(&[sig]);
        tail.extend_from_slice(&[0u8; 1024]);
        out.extend(tail);
        out
    };
    let foreign = HostKey::load_or_create(&dir.path().join("foreign-keys")).unwrap();
    let mut unsigned = pack(&members);
    unsigned.extend_from_slice(&[0u8; 1024]);

    let mut symlink = Member::new(T::Symlink, b"fs/esc", 0o777, b"");
    symlink.link = Some(canary_dir.path().as_os_str().as_encoded_bytes().to_vec());
    let mut block = pwned(T::Block, b"fs/sda", 0o600);
    block.header.set_device_major(8).unwrap();
    block.header.set_device_minor(0).unwrap();
    let mut chr = pwned(T::Char, b"fs/mem", 0o600);
    chr.header.set_device_major(1).unwrap();
    chr.header.set_device_minor(1).unwrap();
    let mut xattr = pwned(T::Regular, b"fs/cap", 0o755);
    xattr.pax = vec![(
        "SCHILY.xattr.security.capability".into(),
        vec![
            1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
    )];
    let mut hardlink = Member::new(T::Link, b"fs/h", 0o644, b"");
    hardlink.link = Some(first_image.as_bytes().to_vec());
    let mut hardlink_out = Member::new(T::Link, b"fs/h2", 0o644, b"");
    hardlink_out.link = Some(format!("fs/{aim}").into_bytes());
    // A CRIU image name with a space, in the manifest and the member alike.
    let renamed_image = {
        let old = format!("images/{}", members_image0(&members));
        let mut ms = with_manifest(&members, |m| m["images"][0]["name"] = "core 1.img".into());
        for m in ms.iter_mut().filter(|m| m.path == old.as_bytes()) {
            m.path = b"images/core 1.img".to_vec();
        }
        ms
    };

    let corpus: Vec<(&str, Vec<u8>, i32, &str)> = vec![
        (
            "id-traversal",
            seal(&with_manifest(&members, |m| m["id"] = aim.clone().into())),
            2,
            "invalid checkpoint id",
        ),
        (
            "name-traversal",
            seal(&with_manifest(&members, |m| m["name"] = aim.clone().into())),
            2,
            "invalid checkpoint name",
        ),
        (
            "session-image-traversal",
            seal(&with_manifest(&members, |m| {
                m["session"]["image"] = "../../../../etc".into()
            })),
            2,
            "invalid image",
        ),
        (
            "session-id-traversal",
            seal(&with_manifest(&members, |m| {
                m["session"]["id"] = aim.clone().into()
            })),
            2,
            "invalid session id",
        ),
        (
            "criu-image-name",
            seal(&renamed_image),
            2,
            "invalid CRIU image name \"core 1.img\"",
        ),
        (
            "criu-image-traversal",
            seal(&plus(
                &members,
                vec![pwned(T::Regular, &[b"images/", aim_b].concat(), 0o644)],
            )),
            2,
            "a \"..\" component",
        ),
        (
            "absolute-path",
            seal(&plus(
                &members,
                vec![pwned(
                    T::Regular,
                    canary.as_os_str().as_encoded_bytes(),
                    0o644,
                )],
            )),
            2,
            "absolute path",
        ),
        (
            "dotdot-path",
            seal(&plus(
                &members,
                vec![pwned(T::Regular, &[b"fs/", aim_b].concat(), 0o644)],
            )),
            2,
            "a \"..\" component",
        ),
        (
            "symlink-escape",
            seal(&plus(
                &members,
                vec![symlink, pwned(T::Regular, b"fs/esc/canary", 0o644)],
            )),
            2,
            "goes through the symlink member fs/esc",
        ),
        (
            "block-device",
            seal(&plus(&members, vec![block])),
            2,
            "a block device node",
        ),
        (
            "char-device",
            seal(&plus(&members, vec![chr])),
            2,
            "only 0:0 overlay whiteouts are accepted",
        ),
        (
            "fifo",
            seal(&plus(&members, vec![pwned(T::Fifo, b"fs/p", 0o644)])),
            2,
            "a fifo",
        ),
        (
            "setuid",
            seal(&plus(&members, vec![pwned(T::Regular, b"fs/suid", 0o4755)])),
            2,
            "setuid or setgid bit",
        ),
        (
            "setgid",
            seal(&plus(&members, vec![pwned(T::Regular, b"fs/sgid", 0o2755)])),
            2,
            "setuid or setgid bit",
        ),
        (
            "foreign-xattr",
            seal(&plus(&members, vec![xattr])),
            2,
            "extended attribute \"security.capability\"",
        ),
        (
            "hardlink-to-an-image",
            seal(&plus(&members, vec![hardlink])),
            2,
            "which is not an earlier regular file under fs/",
        ),
        (
            "hardlink-outside",
            seal(&plus(&members, vec![hardlink_out])),
            2,
            "a \"..\" component",
        ),
        (
            "member-outside-the-layout",
            seal(&plus(
                &members,
                vec![pwned(T::Regular, b"etc/passwd", 0o644)],
            )),
            2,
            "not a member of a drums checkpoint archive",
        ),
        (
            "truncated",
            signed[..signed.len() / 2 + 100].to_vec(),
            2,
            "not a readable checkpoint archive",
        ),
        (
            "flipped-image-byte",
            flipped_image,
            2,
            "archive checksum mismatch",
        ),
        (
            "flipped-fs-byte",
            flipped_fs,
            2,
            "archive checksum mismatch",
        ),
        ("bad-signature", resigned_sha, 2, "bad archive signature"),
        (
            "untrusted-signer",
            archive::seal(&pack(&members), &foreign),
            6,
            "which this host does not trust",
        ),
        ("unsigned", unsigned.clone(), 6, "the archive is not signed"),
    ];
    assert_nothing_kept(&d, "before", &canary);
    for (what, bytes, code, msg) in &corpus {
        let f = dir.path().join(format!("{what}.tar"));
        std::fs::write(&f, bytes).unwrap();
        let o = d.drums(&["checkpoint", "import", f.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(*code), "{what}: {err}");
        assert!(err.contains(msg), "{what}: expected {msg:?} in: {err}");
        assert_nothing_kept(&d, what, &canary);
    }

    // Accepted only when asked for by name: unsigned, and an untrusted signer.
    let f = dir.path().join("unsigned.tar");
    let id = ok(d.drums(&[
        "checkpoint",
        "import",
        "--trust-unsigned",
        f.to_str().unwrap(),
    ]));
    ok(d.drums(&["checkpoint", "rm", &id]));
    // A signature that does not verify is refused even then.
    let f = dir.path().join("bad-signature.tar");
    let o = d.drums(&[
        "checkpoint",
        "import",
        "--trust-unsigned",
        f.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_nothing_kept(&d, "bad signature with --trust-unsigned", &canary);

    // Trusting the foreign key by its line in trusted-keys.
    std::fs::write(
        d.state.path().join("trusted-keys"),
        format!(
            "{}\n# the test's second host\n{} drums@elsewhere\n",
            keys::TRUSTED_KEYS_HEADER,
            keys::public_key_text(&foreign.public())
        ),
    )
    .unwrap();
    let f = dir.path().join("untrusted-signer.tar");
    let id = ok(d.drums(&["checkpoint", "import", f.to_str().unwrap()]));
    assert_ne!(id, ck.id, "an import gets a fresh id");
    // The same name again: a conflict, and nothing more kept.
    let o = d.drums(&["checkpoint", "import", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("already exists"), "{err}");
    let l: drums_api::CheckpointList =
        serde_json::from_slice(&d.drums(&["checkpoints", "--json"]).stdout).unwrap();
    assert_eq!(l.checkpoints.len(), 1);

    // `drums key show` prints the line another host trusts this one by.
    let line = ok(d.drums(&["key", "show"]));
    let ours = keys::public_key_text(&key.public());
    assert!(line.starts_with(&format!("{ours} drums@")), "{line}");

    ok(d.drums(&["checkpoint", "rm", &id]));
    assert_nothing_kept(&d, "after", &canary);
    d.stop_and_check_leaks();
}

fn members_image0(members: &[Member]) -> String {
    let m: serde_json::Value = serde_json::from_slice(&members[0].data).unwrap();
    m["images"][0]["name"].as_str().unwrap().to_owned()
}

/// The content of an archive's signature member.
fn read_sig(archive_bytes: &[u8]) -> Vec<u8> {
    let mut a = tar::Archive::new(archive_bytes);
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        if &*e.path_bytes() == archive::SIGNATURE_MEMBER.as_bytes() {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            return v;
        }
    }
    panic!("no signature member");
}
/// An export whose tar fails part-way: the CLI exits non-zero and leaves
/// neither the archive nor a temporary file; the same export then works.
#[test]
fn a_failed_export_leaves_no_file() {
    let mut d = TestDaemon::start();
    let ck = run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        d.checkpoint(&s.id, false, false).await
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ck.tar");
    run(d.arm(Some("export.tar")));
    let o = d.drums(&["checkpoint", "export", &ck.id, out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("failed part-way"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "a failed export left {left:?}");
    run(d.arm(None));
    ok(d.drums(&["checkpoint", "export", &ck.id, out.to_str().unwrap()]));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("ck.tar")]);
    // The archive is whole: signed, and it imports (under its name, free
    // again once the original is gone).
    ok(d.drums(&["checkpoint", "rm", &ck.id]));
    let id = ok(d.drums(&["checkpoint", "import", out.to_str().unwrap()]));
    ok(d.drums(&["checkpoint", "rm", &id]));
    d.stop_and_check_leaks();
}

/// An archive larger than the store has room for (its free space less
/// drumsd's reserve) is refused as it arrives, with nothing kept: a huge
/// import cannot fill the store under the sessions. The daemon's reserve is
/// set so that room is about 100 MiB; the archive is 200 MiB.
#[test]
fn an_archive_larger_than_the_store_has_room_for_is_refused() {
    let mut d = TestDaemon::start_with(&["--store-reserve", "3900M"]);
    let dir = tempfile::tempdir().unwrap();
    let canary_dir = tempfile::tempdir().unwrap();
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, "canary\n").unwrap();
    let big = dir.path().join("big.tar");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(200 << 20).unwrap();
    let o = d.drums(&[
        "checkpoint",
        "import",
        "--trust-unsigned",
        big.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("room for"), "{err}");
    assert_nothing_kept(&d, "an archive over the store's room", &canary);
    d.stop_and_check_leaks();
}

/// A remove of a checkpoint waits for an export of it in flight (the
/// version is held, as a restore holds it), so the archive comes out whole;
/// before, retention or `checkpoint rm` deleted the files under tar and the
/// transfer broke off (seen by the API fuzz).
#[test]
fn a_remove_waits_for_an_export_in_flight() {
    let mut d = TestDaemon::start();
    let s = run(d.create(&CreateSession {
        network: Some("none".into()),
        ..Default::default()
    }))
    .unwrap();
    let (code, _, err) = d.sh(&s.id, "head -c 48000000 /dev/urandom > /root/big");
    assert_eq!(code, 0, "{err}");
    let ck = run(d.checkpoint(&s.id, false, false));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ck.tar");
    // A slow reader: 1 MiB every 50 ms, about 2.5 s for the archive.
    let reader = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import http.client, socket, sys, time\n\
             c = http.client.HTTPConnection('drumsd')\n\
             s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); c.sock = s\n\
             c.request('GET', '/v1/checkpoints/' + sys.argv[2] + '/export')\n\
             r = c.getresponse(); assert r.status == 200, r.status\n\
             f = open(sys.argv[3], 'wb')\n\
             while True:\n\
             \x20   b = r.read(1 << 20)\n\
             \x20   if not b: break\n\
             \x20   f.write(b); time.sleep(0.05)\n\
             f.close(); print(time.time())\n",
        )
        .arg(d.client.socket())
        .arg(&ck.id)
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    ok(d.drums(&["checkpoint", "rm", &ck.id]));
    let removed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let o = reader.wait_with_output().unwrap();
    assert!(o.status.success(), "the export broke off");
    let read_all: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(
        removed >= read_all - 0.2,
        "the remove ended at {removed}, before the export's last byte at {read_all}"
    );
    // The archive is whole: it imports (its name is free again).
    let id = ok(d.drums(&["checkpoint", "import", out.to_str().unwrap()]));
    ok(d.drums(&["checkpoint", "rm", &id]));
    d.stop_and_check_leaks();
}

/// Exports of a checkpoint while restores of it run: each restore
/// hard-links the images tar is reading (their ctime changes, never their
/// bytes), which GNU tar reports as "file changed as we read it", exiting
/// with status 1. The export took that for a failure and broke off (seen by
/// the API fuzz, whose pools refill while it exports); now every archive is
/// whole.
#[test]
fn exports_during_restores_of_the_same_checkpoint_are_whole() {
    let mut d = TestDaemon::start();
    let s = run(d.create(&CreateSession {
        network: Some("none".into()),
        ..Default::default()
    }))
    .unwrap();
    let (code, _, err) = d.sh(&s.id, "head -c 16000000 /dev/urandom > /root/big");
    assert_eq!(code, 0, "{err}");
    let ck = run(d.checkpoint(&s.id, false, false));
    let state = d.state.path().to_owned();
    let drums = move |args: &[&str]| {
        common::bounded(
            std::process::Command::new(common::bin_dir().join("drums"))
                .arg("--state-dir")
                .arg(&state)
                .arg("--no-autostart")
                .args(args),
        )
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let restorer = {
        let (stop, drums, id) = (stop.clone(), drums.clone(), ck.id.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ids = ok(drums(&["restore", &id, "--count", "2"]));
                let ids: Vec<&str> = ids.split_whitespace().collect();
                let mut args = vec!["rm"];
                args.extend(ids);
                ok(drums(&args));
                n += 1;
            }
            n
        })
    };
    let dir = tempfile::tempdir().unwrap();
    for i in 0..8 {
        let out = dir.path().join(format!("ck{i}.tar"));
        let o = drums(&["checkpoint", "export", &ck.id, out.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "export {i} during restores: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        restorer.join().unwrap() > 0,
        "no restore ran beside the exports"
    );
    // Whole: the last one imports under a name of its own.
    ok(d.drums(&["checkpoint", "rm", &ck.id]));
    let id = ok(d.drums(&[
        "checkpoint",
        "import",
        dir.path().join("ck7.tar").to_str().unwrap(),
    ]));
    ok(d.drums(&["checkpoint", "rm", &id]));
    d.stop_and_check_leaks();
}
