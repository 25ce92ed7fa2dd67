//! Images are untrusted input, and so is a session's own writable layer. A
//! symlink where drums-init's stage 1 makes its mount points (`/proc`,
//! `/sys`, `/dev`, `/run`, `/run/drums`) would be followed from the host's
//! side before the pivot: `proc -> /etc` is the host's /etc, and a relative
//! `../../..` climbs out of the state directory. Stage 1 now walks every
//! mount point without following a link, and replaces a link or a file
//! there by a directory in the session's writable layer (docs/oci.md, "What
//! a session needs from an image").
//!
//! Each image here is busybox and one hostile entry; each starts a session
//! confined and one privileged (host root, no user namespace). Each must
//! come up with real /proc, /sys, /dev and /run, the image must keep its
//! link, and nothing may appear at the link's target on the host: no
//! directory, no mount.
//!
//! Needs root, as every daemon test, and busybox-static (scripts/setup.sh).

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::{run, TestDaemon};
use drums_api::CreateSession;

const BUSYBOX: &str = "/bin/busybox";

/// The applets the tests call, as links to busybox in /bin.
const APPLETS: &[&str] = &["sh", "cat", "echo", "test", "ls", "readlink", "true"];

/// A host path no one else uses, for a link to point at: it must still not
/// exist when the test ends.
fn fresh_target(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let p = PathBuf::from(format!(
        "/tmp/drums-hostile-{what}-{}-{nanos}",
        std::process::id()
    ));
    assert!(!p.exists());
    p
}

/// A busybox image `name` in `images`, as drums' own images have it
/// (image.json renamed from default's, a hand-made rootfs, as in
/// foreign_libc.rs). Returns its rootfs, for the hostile entry.
fn busybox_image(images: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} missing: install busybox-static (scripts/setup.sh does). NOT SKIPPED"
    );
    let image = images.join(name);
    let rootfs = image.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    for a in APPLETS {
        symlink("busybox", rootfs.join("bin").join(a)).unwrap();
    }
    let mut info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::images_dir().join("default/image.json")).unwrap(),
    )
    .unwrap();
    info["name"] = name.into();
    info["packages"] = serde_json::json!([]);
    std::fs::write(image.join("image.json"), info.to_string()).unwrap();
    rootfs
}

/// One hostile image: the entry at `entry` (relative to the rootfs) and the
/// host path it would have led to, if a fresh one.
struct Case {
    image: &'static str,
    entry: &'static str,
    /// Where the session reports a replaced entry (drumsd's log): the
    /// first-level mount point, or none when a tmpfs hides the entry.
    replaced: Option<&'static str>,
    host_target: Option<PathBuf>,
}

fn hostile_images(images: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    // An absolute link to a host directory that exists.
    let rootfs = busybox_image(images, "proc-to-etc");
    symlink("/etc", rootfs.join("proc")).unwrap();
    cases.push(Case {
        image: "proc-to-etc",
        entry: "proc",
        replaced: Some("/proc"),
        host_target: None,
    });
    // A relative link that climbs out of STATE/sessions/ID/root: more `..`
    // than there are levels, which stop at the host's /.
    let target = fresh_target("run");
    let rootfs = busybox_image(images, "run-climbs");
    symlink(
        format!(
            "{}{}",
            "../".repeat(16),
            target.strip_prefix("/").unwrap().display()
        ),
        rootfs.join("run"),
    )
    .unwrap();
    cases.push(Case {
        image: "run-climbs",
        entry: "run",
        replaced: Some("/run"),
        host_target: Some(target),
    });
    // An absolute link to a host path that does not exist yet.
    let target = fresh_target("dev");
    let rootfs = busybox_image(images, "dev-to-tmp");
    symlink(&target, rootfs.join("dev")).unwrap();
    cases.push(Case {
        image: "dev-to-tmp",
        entry: "dev",
        replaced: Some("/dev"),
        host_target: Some(target),
    });
    // A link one level down, under a real /run: the /run tmpfs hides it.
    let target = fresh_target("rundrums");
    let rootfs = busybox_image(images, "run-drums-link");
    std::fs::create_dir(rootfs.join("run")).unwrap();
    symlink(&target, rootfs.join("run/drums")).unwrap();
    cases.push(Case {
        image: "run-drums-link",
        entry: "run/drums",
        replaced: None,
        host_target: Some(target),
    });
    // Not a link but a file where a mount point belongs.
    let rootfs = busybox_image(images, "sys-is-a-file");
    std::fs::write(rootfs.join("sys"), "not a directory").unwrap();
    cases.push(Case {
        image: "sys-is-a-file",
        entry: "sys",
        replaced: Some("/sys"),
        host_target: None,
    });
    cases
}

/// Mount points on the host that a hostile link could have reached: /etc
/// and below, and the fresh targets.
fn host_mounts(targets: &[&Path]) -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| {
            m == "/etc"
                || m.starts_with("/etc/")
                || targets.iter().any(|t| Path::new(m).starts_with(t))
        })
        .collect()
}

/// Directories a followed link would have made on the host: a mount
/// point's name under /etc or /tmp.
fn host_dirs() -> Vec<(PathBuf, bool)> {
    ["/etc", "/tmp"]
        .iter()
        .flat_map(|d| ["proc", "sys", "dev", "run", "drums"].map(|n| Path::new(d).join(n)))
        .map(|p| {
            let there = p.symlink_metadata().is_ok();
            (p, there)
        })
        .collect()
}

/// What the session must see: the kernel's file systems and drums' own
/// directories at their places, none of them a link.
const REAL_ROOT: &str = "test -d /proc/self && test ! -L /proc \
    && test -d /sys/class && test ! -L /sys \
    && test -c /dev/null && test ! -L /dev \
    && test -d /run/drums/bin && test ! -L /run && test ! -L /run/drums \
    && echo ok";

#[test]
fn hostile_links_at_mount_points_are_replaced_and_never_followed() {
    let images = tempfile::tempdir().unwrap();
    let cases = hostile_images(images.path());
    let targets: Vec<&Path> = cases
        .iter()
        .filter_map(|c| c.host_target.as_deref())
        .collect();
    let mounts_before = host_mounts(&targets);
    let dirs_before = host_dirs();
    let etc_before = std::fs::symlink_metadata("/etc").unwrap();

    let mut d = TestDaemon::start_with(&["--images-dir", images.path().to_str().unwrap()]);
    let mut failures = Vec::new();
    run(async {
        for c in &cases {
            for privileged in [false, true] {
                let what = format!(
                    "{} ({})",
                    c.image,
                    if privileged { "privileged" } else { "confined" }
                );
                let s = match d
                    .create(&CreateSession {
                        image: Some(c.image.into()),
                        privileged,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        failures.push(format!("{what}: create: {e}"));
                        continue;
                    }
                };
                assert_eq!(s.privileged, privileged);
                let (code, out, err) = d.sh(&s.id, REAL_ROOT);
                if (code, out.as_str()) != (0, "ok") {
                    let (_, ls, _) = d.sh(&s.id, "ls -la / /run");
                    failures.push(format!("{what}: not a real root: {code} {out} {err}\n{ls}"));
                }
                // The confinement masks inside the session's own /proc: its
                // /proc/keys is the session's /dev/null.
                if !privileged && Path::new("/proc/keys").exists() {
                    let (code, _, err) = d.sh(&s.id, "test -c /proc/keys");
                    if code != 0 {
                        failures.push(format!("{what}: /proc/keys not masked: {err}"));
                    }
                }
                if let Err(e) = d.rm(&s.id).await {
                    failures.push(format!("{what}: rm: {e}"));
                }
            }
        }
    });

    // The image below is never written: its link is still there.
    for c in &cases {
        let entry = images.path().join(c.image).join("rootfs").join(c.entry);
        let meta = entry.symlink_metadata().unwrap();
        if c.entry == "sys" {
            assert!(meta.is_file(), "{}: the image's file changed", c.image);
        } else {
            assert!(
                meta.file_type().is_symlink(),
                "{}: the image's link changed",
                c.image
            );
        }
    }
    // drumsd's log names each replacement, once per session.
    let log = d.log();
    for c in &cases {
        if let Some(p) = c.replaced {
            let said = format!("{p} was not a directory");
            assert!(
                log.matches(&said).count() >= 2,
                "{}: no {said:?} in drumsd's log:\n{log}",
                c.image
            );
        }
    }

    // Nothing at the host targets: no directory, no mount. Anything found is
    // removed first, so a failure leaves the host clean.
    let mounts_after = host_mounts(&targets);
    for t in &targets {
        if t.symlink_metadata().is_ok() {
            failures.push(format!("{} appeared on the host", t.display()));
            let _ = std::fs::remove_dir_all(t);
        }
    }
    if mounts_after != mounts_before {
        failures.push(format!(
            "host mounts changed: before {mounts_before:?}, after {mounts_after:?}"
        ));
    }
    for ((p, before), (_, after)) in dirs_before.iter().zip(host_dirs()) {
        if !before && after {
            failures.push(format!("{} appeared on the host", p.display()));
        }
    }
    let etc_after = std::fs::symlink_metadata("/etc").unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (etc_before.mode(), etc_before.uid(), etc_before.gid()),
        (etc_after.mode(), etc_after.uid(), etc_after.gid()),
        "the host's /etc changed"
    );
    assert!(
        failures.is_empty(),
        "{}\n--- drumsd log ---\n{log}",
        failures.join("\n")
    );
    d.stop_and_check_leaks();
}

/// After the pivot stage 1 writes the session's identity files, where an
/// image's symlink resolves inside the session; but a /proc magic link
/// would lead to what stage 1 holds open, and its fd 2 is drumsd's stderr
/// (here drumsd's log). Such a link is refused, and the log is untouched.
#[test]
fn a_magic_link_among_the_identity_files_is_refused() {
    let images = tempfile::tempdir().unwrap();
    let rootfs = busybox_image(images.path(), "etc-magic");
    std::fs::create_dir(rootfs.join("etc")).unwrap();
    symlink("/proc/self/fd/2", rootfs.join("etc/machine-id")).unwrap();

    let mut d = TestDaemon::start_with(&["--images-dir", images.path().to_str().unwrap()]);
    let head = |d: &TestDaemon| -> Vec<u8> {
        let mut b = std::fs::read(d.log_path()).unwrap();
        b.truncate(256);
        b
    };
    let before = head(&d);
    run(async {
        for privileged in [false, true] {
            let e = d
                .create(&CreateSession {
                    image: Some("etc-magic".into()),
                    privileged,
                    ..Default::default()
                })
                .await
                .map(|s| s.id)
                .expect_err("a session through a magic link");
            assert!(
                e.to_string().contains("/etc/machine-id"),
                "privileged {privileged}: {e}"
            );
        }
    });
    assert_eq!(
        head(&d),
        before,
        "drumsd's log was written through the link"
    );
    d.stop_and_check_leaks();
}
