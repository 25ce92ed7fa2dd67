//! Sessions from images whose libc is not the host's (issue 14): drums' own
//! programs (drums-init's stage 2, the guest agent) run on the host's loader
//! and libraries installed beside them (`drums_init::loader`), never on the
//! image's, so such a session comes up, runs commands, and checkpoints and
//! restores like any other.
//!
//! An image with an older glibc is not to be had offline, so the images are
//! made here as directories in an images dir of the test's own (image.json
//! as drums' own images have it, and a hand-made rootfs):
//! - no libc at all: busybox-static alone, as a distroless or scratch image;
//! - a broken one: the glibc paths the host's programs would load are empty
//!   files, and /etc/ld.so.cache is garbage. Had drums run on the image's
//!   loader there, nothing would start.
//!
//! Needs root, as every daemon test, and busybox-static (scripts/setup.sh).

mod common;

use std::path::{Path, PathBuf};

use common::{run, TestDaemon};
use drums_api::CreateSession;

const BUSYBOX: &str = "/bin/busybox";

/// The applets the tests call, as links to busybox in /bin.
const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "grep", "ls", "readlink", "sleep", "tr", "true", "wc",
];

/// An images dir holding one image `name` whose rootfs is busybox alone, in
/// /bin, with links for its applets: nothing else, since a session needs
/// nothing else of an image (docs/oci.md). /proc, /sys, /dev, /run, /tmp,
/// /etc and drums' own mount points drums makes. Returns the dir and the
/// rootfs, for a test to add to.
fn busybox_image(name: &str) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::{symlink, PermissionsExt};
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} missing: install busybox-static (scripts/setup.sh does). NOT SKIPPED"
    );
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join(name);
    let rootfs = image.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    // The rootfs is "/" in the session, whatever the test's umask.
    std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    for a in APPLETS {
        symlink("busybox", rootfs.join("bin").join(a)).unwrap();
    }
    // drums' own image metadata, renamed: the format is drums'.
    let mut info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::images_dir().join("default/image.json")).unwrap(),
    )
    .unwrap();
    info["name"] = name.into();
    info["packages"] = serde_json::json!([]);
    std::fs::write(image.join("image.json"), info.to_string()).unwrap();
    (dir, rootfs)
}

/// A session of `image` runs commands, drums' processes keep their names
/// and run on the host's libc from /run/drums/bin/lib; a checkpoint of it
/// restores as a sibling that does the same, with its files and processes.
fn session_comes_up_and_restores(d: &TestDaemon, image: &str) {
    run(async {
        let s = d
            .create(&CreateSession {
                image: Some(image.into()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create from {image}: {e}\n{}", d.log()));
        let (code, out, err) = d.sh(&s.id, "echo ok");
        assert_eq!((code, out.as_str()), (0, "ok"), "{err}");
        check_drums_processes(d, &s.id);

        // Something of the session's own to find in the sibling.
        let (code, _, err) = d.sh(
            &s.id,
            "echo kept > /root-file; sleep 1000 >/dev/null 2>&1 & echo $! > /sleep.pid",
        );
        assert_eq!(code, 0, "{err}");
        let alive = "kill -0 $(cat /sleep.pid) && tr '\\0' ' ' < /proc/$(cat /sleep.pid)/cmdline";
        let (code, out, err) = d.sh(&s.id, alive);
        assert_eq!((code, out.as_str()), (0, "sleep 1000"), "{err}");
        let ck = d.checkpoint(&s.id, false, true).await;
        let r = d
            .restore(&ck.id, 1)
            .await
            .unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()));
        let sib = &r.sessions[0];
        assert_eq!(sib.state, drums_api::SessionState::Running);
        let (code, out, err) = d.sh(&sib.id, &format!("echo ok; cat /root-file; {alive}"));
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["ok", "kept", "sleep 1000"]
        );
        check_drums_processes(d, &sib.id);
        // The origin still runs, next to its sibling.
        assert_eq!(d.sh(&s.id, "echo ok").1, "ok");

        for id in [&sib.id, &s.id] {
            d.rm(id)
                .await
                .unwrap_or_else(|e| panic!("rm {id}: {e}\n{}", d.log()));
        }
    });
}

/// PID 1 is drums-init and one drums-guest runs (by /proc/PID/comm, which
/// the inspector and `ps` go by), both the session's copies, and PID 1 maps
/// the host's loader and libc installed beside them. A command's
/// environment has nothing of theirs.
fn check_drums_processes(d: &TestDaemon, id: &str) {
    let (_, comm1, _) = d.sh(id, "cat /proc/1/comm");
    assert_eq!(comm1, "drums-init");
    let (_, guests, _) = d.sh(id, "grep -lx drums-guest /proc/[0-9]*/comm | wc -l");
    assert_eq!(guests, "1");
    let (_, exe, _) = d.sh(id, "readlink /proc/1/exe");
    assert_eq!(exe, "/run/drums/bin/session/drums-init");
    for f in ["/run/drums/bin/lib/ld.so", "/run/drums/bin/lib/libc.so.6"] {
        let (_, maps, _) = d.sh(id, &format!("grep -c ' {f}$' /proc/1/maps"));
        assert_ne!(maps, "0", "PID 1 does not map {f}");
    }
    let (_, env, _) = d.sh(id, "echo \"[$LD_LIBRARY_PATH]\"");
    assert_eq!(env, "[]");
}

/// No libc at all: a static busybox is the whole image.
#[test]
fn an_image_without_libc_runs_and_restores() {
    let (images, _rootfs) = busybox_image("nolibc");
    let mut d = TestDaemon::start_with(&["--images-dir", images.path().to_str().unwrap()]);
    session_comes_up_and_restores(&d, "nolibc");
    d.stop_and_check_leaks();
}

/// A libc the host's programs cannot use: every glibc path they would load
/// is an empty file, and the loader's cache is garbage. A dynamically linked
/// program of the image fails there, which proves the point: drums' own run
/// on the host's loader all the same.
#[test]
fn an_image_with_a_broken_libc_runs_and_restores() {
    let (images, rootfs) = busybox_image("brokenlibc");
    use std::os::unix::fs::PermissionsExt;
    for f in [
        "lib64/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libm.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
    ] {
        let p = rootfs.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc/ld.so.cache"), b"not a cache").unwrap();
    // The host's own dynamically linked `true`, for the image to fail on.
    let host_true = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    std::fs::create_dir_all(rootfs.join("usr/bin")).unwrap();
    std::fs::copy(host_true, rootfs.join("usr/bin/dyntrue")).unwrap();

    let mut d = TestDaemon::start_with(&["--images-dir", images.path().to_str().unwrap()]);
    run(async {
        let s = d
            .create(&CreateSession {
                image: Some("brokenlibc".into()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));
        let (code, _, _) = d.sh(&s.id, "/usr/bin/dyntrue");
        assert_ne!(code, 0, "the image's own loader was meant to be broken");
        d.rm(&s.id).await.unwrap();
    });
    session_comes_up_and_restores(&d, "brokenlibc");
    d.stop_and_check_leaks();
}
