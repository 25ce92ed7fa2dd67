//! OCI images end to end (issue 14, docs/oci.md), against a real registry
//! (Debian's docker-registry on loopback) and real archives made by skopeo:
//! pull, create, exec with the image's config, checkpoint, restore siblings,
//! shared layers measured on btrfs, import of the same image as a docker
//! archive, an oci-archive and a layout directory, removal refused while in
//! use; every kind of bad input refused, leaving no subvolume, staging
//! file or catalog row; and a layer with device nodes (a debootstrap root's
//! `/dev/console`) stored and run without them.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::oci::{self, ImageSpec, Layer, Tamper};
use common::{fails, ok, require_root, TestDaemon};
use drums_testkit::Registry;

fn oci_dir(d: &TestDaemon) -> PathBuf {
    d.state.path().join("store/oci")
}

fn entries(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn oci_images(d: &TestDaemon) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&ok(&d.drums(&["images", "--json"]), "images")).unwrap();
    v["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "oci")
        .cloned()
        .collect()
}

/// Nothing of any image is in the store: no layer subvolume, no staging,
/// no image row.
fn assert_no_image_left(d: &TestDaemon, what: &str) {
    let layers = entries(&oci_dir(d).join("layers"));
    let tmp = entries(&oci_dir(d).join("tmp"));
    assert!(
        layers.is_empty(),
        "{what}: layer subvolumes left: {layers:?}"
    );
    assert!(tmp.is_empty(), "{what}: staging left: {tmp:?}");
    assert!(
        oci_images(d).is_empty(),
        "{what}: images left: {:?}",
        oci_images(d)
    );
}

/// Bytes the store's btrfs uses, after a sync.
fn store_used(d: &TestDaemon) -> u64 {
    let store = d.state.path().join("store");
    let f = std::fs::File::open(&store).unwrap();
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
    let s = nix::sys::statvfs::statvfs(&store).unwrap();
    (s.blocks() - s.blocks_free()) * s.fragment_size()
}

#[test]
fn a_pulled_image_runs_with_its_config_checkpoints_restores_and_shares_its_base() {
    require_root();
    let reg = Registry::start().expect("start the test registry");
    let work = tempfile::tempdir().unwrap();
    let two = work.path().join("two");
    oci::write_layout(&two, &oci::two_layer_image(), "latest");
    reg.push_layout(&two, "drums/two:latest")
        .expect("push the layout");
    let user = work.path().join("user");
    oci::write_layout(&user, &oci::user_workdir_image(), "latest");
    reg.push_layout(&user, "drums/user:latest")
        .expect("push the layout");
    let mut d = TestDaemon::start();
    let two_ref = format!("{}/drums/two:latest", reg.addr());
    let user_ref = format!("{}/drums/user:latest", reg.addr());

    let before = store_used(&d);
    let o = d.drums(&["pull", "--insecure", &two_ref]);
    if !o.status.success() {
        eprintln!("{}", d.log());
    }
    let two_id = ok(&o, "pull two");
    let after_first = store_used(&d);
    let user_id = ok(
        &d.drums(&["pull", "--insecure", "-q", &user_ref]),
        "pull user",
    );
    let after_second = store_used(&d);
    assert!(two_id.starts_with("sha256:") && user_id.starts_with("sha256:"));
    // The base is stored once: the second image costs its own layer, not
    // the ~300 MiB base again.
    let base = oci::base_layer().bytes().len() as u64;
    let (first, second) = (after_first - before, after_second - after_first);
    eprintln!(
        "store: first image +{} MiB, second +{} MiB, base tar {} MiB",
        first >> 20,
        second >> 20,
        base >> 20
    );
    assert!(
        first > base / 2,
        "the first pull stored {first} bytes for a {base}-byte base"
    );
    assert!(
        second < 32 << 20,
        "the second image on the same base took {second} bytes"
    );
    let images = oci_images(&d);
    assert_eq!(images.len(), 2, "{images:?}");
    for i in &images {
        assert!(i["shared_bytes"].as_u64().unwrap() >= base / 2, "{i}");
        assert_eq!(i["layers"], 2);
    }
    // Pulled again: nothing fetched, same id.
    assert_eq!(
        ok(
            &d.drums(&["pull", "--insecure", "-q", &two_ref]),
            "pull again"
        ),
        two_id
    );

    // The two-layer image: its top layer's file, and the base's file it deleted.
    common::run(async {
        let s = d
            .create(&drums_api::CreateSession {
                image: Some(two_ref.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(s.image, two_id);
        let (code, out, _) = d.sh(
            &s.id,
            "cat /etc/drums-layer2; test -e /etc/debian_version; echo $?",
        );
        assert_eq!((code, out.as_str()), (0, "layer 2\n1"));

        // The user image: User, WorkingDir, Env, and ExposedPorts in ps.
        let u = d
            .create(&drums_api::CreateSession {
                image: Some(user_ref.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        let (code, out, err) = d.sh(&u.id, "id -un; id -u; pwd; echo $FOO");
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "worker\n1000\n/home/worker\nbar");
        let (_, out, _) = d.sh(&u.id, "touch mine && stat -c %u mine");
        assert_eq!(out, "1000");
        // A request's own user wins over the image's.
        let o = d.drums(&["exec", "--user", "root", &u.id, "--", "id", "-u"]);
        assert_eq!(ok(&o, "exec as root"), "0");
        let ps = ok(&d.drums(&["ps"]), "ps");
        assert!(ps.contains("8080/tcp"), "{ps}");

        // The image's default process, on request: Cmd as User in WorkingDir;
        // and a detached exec, whose output goes to its log.
        let r = d
            .create(&drums_api::CreateSession {
                image: Some(user_ref.clone()),
                run: true,
                ..Default::default()
            })
            .await
            .unwrap();
        let find = "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
                    [ \"$c\" = 'sleep infinity ' ] && echo \"$(stat -c %u $p) $(readlink $p/cwd)\"; done";
        let (_, out, _) = d.sh(&r.id, find);
        assert_eq!(out, "1000 /home/worker", "the default process");
        let pid = ok(
            &d.drums(&[
                "exec",
                "-d",
                "--log",
                "/tmp/d.log",
                &r.id,
                "--",
                "sh",
                "-c",
                "echo detached",
            ]),
            "exec -d",
        );
        assert!(pid.parse::<u32>().is_ok(), "{pid}");
        let (_, out, _) = d.sh(&r.id, "sleep 0.5; cat /tmp/d.log");
        assert_eq!(out, "detached");
        d.rm(&r.id).await.unwrap();
        // A drums image has no default process to run.
        let err = d
            .create(&drums_api::CreateSession {
                run: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("run needs an OCI image"), "{err}");

        // Checkpoint, then two siblings that keep the image's files and config.
        d.sh(&u.id, "echo warm > /home/worker/state");
        let ck: drums_api::Checkpoint = d
            .client
            .json(
                hyper::Method::POST,
                "/v1/checkpoints",
                Some(&drums_api::CreateCheckpoint {
                    session: u.id.clone(),
                    name: Some("warm-oci".into()),
                    clean: false,
                    leave_running: true,
                }),
            )
            .await
            .unwrap();
        let ck = ck.id;
        let sibs = d.restore(&ck, 2).await.unwrap().sessions;
        assert_eq!(sibs.len(), 2);
        for sib in &sibs {
            assert_eq!(sib.image, user_id);
            let (code, out, _) = d.sh(&sib.id, "cat /home/worker/state; id -un; pwd");
            assert_eq!((code, out.as_str()), (0, "warm\nworker\n/home/worker"));
        }

        // In use by sessions and a checkpoint: refused, by reference or id.
        let err = fails(&d.drums(&["image", "rm", &user_ref]), "rm in use");
        assert!(err.contains("in use") && err.contains("session"), "{err}");
        for sib in &sibs {
            d.rm(&sib.id).await.unwrap();
        }
        d.rm(&u.id).await.unwrap();
        let err = fails(
            &d.drums(&["image", "rm", &user_id]),
            "rm used by a checkpoint",
        );
        assert!(err.contains("checkpoint warm-oci"), "{err}");
        ok(&d.drums(&["checkpoint", "rm", &ck]), "checkpoint rm");
        ok(&d.drums(&["image", "rm", &user_ref]), "rm user");
        assert_eq!(oci_images(&d).len(), 1);
        d.rm(&s.id).await.unwrap();
        ok(&d.drums(&["image", "rm", &two_ref]), "rm two");
    });
    assert_no_image_left(&d, "after removing both");
    d.stop_and_check_leaks();
}

/// Paths, types, modes, owners, sizes, link targets and file contents of a
/// tree, for comparing two stores of one image.
fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    use sha2::{Digest, Sha256};
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let what = if m.file_type().is_symlink() {
                format!("l {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                "d".into()
            } else if m.is_file() {
                format!("f {:x}", Sha256::digest(std::fs::read(&p).unwrap()))
            } else {
                "o".into()
            };
            out.insert(
                rel,
                format!("{what} {:o} {}:{} {}", m.mode(), m.uid(), m.gid(), m.size()),
            );
        }
    }
    out
}

#[test]
fn docker_archive_oci_archive_and_layout_import_as_the_same_image() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    oci::write_layout(&layout, &oci::two_layer_image(), "drums/two:v1");
    let docker = work.path().join("docker.tar");
    let ociar = work.path().join("oci.tar");
    oci::to_docker_archive(&layout, "drums/two:v1", &docker);
    oci::to_oci_archive(&layout, "drums/two:v1", &ociar);
    let mut d = TestDaemon::start();
    let mut seen = Vec::new();
    for src in [&docker, &ociar, &layout] {
        let id = ok(
            &d.drums(&["image", "import", src.to_str().unwrap()]),
            "import",
        );
        let images = oci_images(&d);
        assert_eq!(images.len(), 1, "{images:?}");
        let layers = entries(&oci_dir(&d).join("layers"));
        assert_eq!(layers.len(), 2, "{layers:?}");
        // The top layer's subvolume holds the whole image.
        let tops: Vec<_> = layers
            .iter()
            .map(|l| oci_dir(&d).join("layers").join(l))
            .filter(|p| p.join("etc/drums-layer2").exists())
            .collect();
        assert_eq!(tops.len(), 1);
        assert!(!tops[0].join("etc/debian_version").exists());
        seen.push((
            src.display().to_string(),
            id.clone(),
            layers.clone(),
            tree_digest(&tops[0]),
        ));
        // A session from it, by id.
        common::run(async {
            let s = d
                .create(&drums_api::CreateSession {
                    image: Some(id.clone()),
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(d.sh(&s.id, "cat /etc/drums-layer2").1, "layer 2");
            d.rm(&s.id).await.unwrap();
        });
        ok(&d.drums(&["image", "rm", &id]), "rm");
        assert_no_image_left(&d, "after rm");
    }
    for w in seen.windows(2) {
        assert_eq!(w[0].1, w[1].1, "ids of {} and {}", w[0].0, w[1].0);
        let mut a = w[0].2.clone();
        let mut b = w[1].2.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b, "layers of {} and {}", w[0].0, w[1].0);
        assert!(
            w[0].3 == w[1].3,
            "trees of {} and {} differ",
            w[0].0,
            w[1].0
        );
    }
    d.stop_and_check_leaks();
}

/// A small image: a good base layer, then `top`.
fn small(top: Layer) -> ImageSpec {
    let base = Layer::builder()
        .dir("bin", 0o755, 0, 0)
        .file("bin/hello", b"hello\n", 0o755, 0, 0)
        .dir("etc", 0o755, 0, 0)
        .build(true);
    ImageSpec::new(vec![base, top])
}

fn raw(path: &[u8], kind: tar::EntryType, data: &[u8]) -> Layer {
    Layer::builder()
        .raw_entry(oci::raw_header(path, kind, 0o644, data.len() as u64), data)
        .build(false)
}

#[test]
fn bad_images_are_refused_and_leave_nothing() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    // A layer limit the big-layer case passes.
    let mut d = TestDaemon::start_with(&["--image-layer-max", "1M"]);
    let good_top = || {
        Layer::builder()
            .file("etc/ok", b"ok\n", 0o644, 0, 0)
            .build(true)
    };
    let mut hard_escape = oci::raw_header(b"etc/h", tar::EntryType::Link, 0o644, 0);
    oci::set_raw_link(&mut hard_escape, b"../../etc/passwd");
    let cases: Vec<(&str, ImageSpec, Tamper, &str)> = vec![
        ("digest", small(good_top()), Tamper::LayerDigest, "digest"),
        ("diff-id", small(good_top()), Tamper::DiffId, "diff-id"),
        (
            "zstd",
            small(good_top()),
            Tamper::LayerMediaType(oci::MEDIA_LAYER_ZSTD.into()),
            "media type",
        ),
        (
            "media type",
            small(good_top()),
            Tamper::LayerMediaType("application/x-garbage".into()),
            "media type",
        ),
        (
            "arm64",
            small(good_top()),
            Tamper::Platform("arm64"),
            "arm64",
        ),
        (
            "index arm64",
            small(good_top()),
            Tamper::IndexOnlyArch("arm64"),
            "linux/amd64",
        ),
        (
            "dotdot above the root",
            small(raw(b"etc/../../x", tar::EntryType::Regular, b"x")),
            Tamper::None,
            "refused",
        ),
        (
            "hard link escape",
            small(
                Layer::builder()
                    .raw_entry(hard_escape.clone(), b"")
                    .build(false),
            ),
            Tamper::None,
            "refused",
        ),
        (
            "too big",
            small(
                Layer::builder()
                    .file("big", &vec![7u8; 2 << 20], 0o644, 0, 0)
                    .build(true),
            ),
            Tamper::None,
            "limit",
        ),
    ];
    for (name, image, tamper, says) in cases {
        let dir = work.path().join(name.replace(' ', "-"));
        oci::write_layout_with(&dir, &image, "v1", tamper);
        let archive = work.path().join(format!("{}.tar", name.replace(' ', "-")));
        oci::tar_layout(&dir, &archive);
        for src in [&dir, &archive] {
            let err = fails(&d.drums(&["image", "import", src.to_str().unwrap()]), name);
            assert!(
                err.to_lowercase().contains(says),
                "{name}: the error does not say {says:?}: {err}"
            );
            assert_no_image_left(&d, name);
        }
    }
    // A truncated archive: cut inside the last blob.
    let good = work.path().join("good");
    oci::write_layout(&good, &small(good_top()), "v1");
    let full = work.path().join("good.tar");
    oci::tar_layout(&good, &full);
    let bytes = std::fs::read(&full).unwrap();
    let cut = work.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = fails(
        &d.drums(&["image", "import", cut.to_str().unwrap()]),
        "truncated",
    );
    assert!(err.contains("truncated") || err.contains("lacks"), "{err}");
    assert_no_image_left(&d, "truncated");
    // Not an archive at all.
    let junk = work.path().join("junk");
    std::fs::write(&junk, b"not a tar").unwrap();
    fails(
        &d.drums(&["image", "import", junk.to_str().unwrap()]),
        "junk",
    );
    assert_no_image_left(&d, "junk");

    // Registries: down, 401, 404, and a blob that does not match its digest.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = fails(
        &d.drums(&["pull", "--insecure", &format!("{closed}/x/y:1")]),
        "down",
    );
    assert!(err.contains("down") || err.contains("refused"), "{err}");
    let auth = Registry::start_with_basic_auth("u", "p").expect("start the test registry");
    auth.push_layout(&good, "drums/small:v1")
        .expect("push the layout");
    let err = fails(
        &d.drums(&[
            "pull",
            "--insecure",
            &format!("{}/drums/small:v1", auth.addr()),
        ]),
        "401",
    );
    assert!(err.contains("not authorised"), "{err}");
    let reg = Registry::start().expect("start the test registry");
    let err = fails(
        &d.drums(&[
            "pull",
            "--insecure",
            &format!("{}/drums/none:v1", reg.addr()),
        ]),
        "404",
    );
    assert!(err.contains("no image"), "{err}");
    let image = small(good_top());
    let top_digest = image.layers[1].digest();
    let good2 = work.path().join("good2");
    oci::write_layout(&good2, &image, "v2");
    reg.push_layout(&good2, "drums/small:v2")
        .expect("push the layout");
    reg.corrupt_blob(&top_digest, b"something else entirely")
        .expect("corrupt the blob");
    let err = fails(
        &d.drums(&[
            "pull",
            "--insecure",
            &format!("{}/drums/small:v2", reg.addr()),
        ]),
        "corrupt",
    );
    assert!(err.contains("digest") || err.contains("bytes"), "{err}");
    assert_no_image_left(&d, "registries");
    d.stop_and_check_leaks();
}

/// Arm (or hold) a fault point of drumsd's.
fn fault(d: &TestDaemon, point: Option<&str>, hold: bool) {
    common::run(async {
        d.client
            .call(
                hyper::Method::POST,
                "/v1/debug/faults",
                Some(&drums_api::Fault {
                    point: point.map(str::to_owned),
                    hold,
                }),
            )
            .await
            .unwrap();
    });
}

#[test]
fn a_fault_at_every_step_of_a_pull_or_import_leaves_nothing_and_a_crash_is_swept() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("small");
    let top = Layer::builder()
        .file("etc/two", b"2\n", 0o644, 0, 0)
        .build(true);
    oci::write_layout(&layout, &small(top), "v1");
    let reg = Registry::start().expect("start the test registry");
    reg.push_layout(&layout, "drums/small:v1")
        .expect("push the layout");
    let reference = format!("{}/drums/small:v1", reg.addr());
    let mut d = TestDaemon::start();
    for point in ["image.fetch", "image.layer", "image.commit"] {
        fault(&d, Some(point), false);
        let err = fails(
            &d.drums(&["image", "import", layout.to_str().unwrap()]),
            point,
        );
        assert!(
            err.contains(&format!("injected fault at {point}")),
            "{point}: {err}"
        );
        assert_no_image_left(&d, point);
        let err = fails(&d.drums(&["pull", "--insecure", "-q", &reference]), point);
        assert!(
            err.contains(&format!("injected fault at {point}")),
            "{point}: {err}"
        );
        assert_no_image_left(&d, point);
    }
    fault(&d, None, false);
    let id = ok(
        &d.drums(&["pull", "--insecure", "-q", &reference]),
        "pull, disarmed",
    );
    ok(&d.drums(&["image", "rm", &id]), "rm");

    // drumsd killed with the layers stored and the image not committed:
    // the next drumsd's sweep removes them and the staging.
    fault(&d, Some("image.commit"), true);
    let mut import = std::process::Command::new(common::bin_dir().join("drums"))
        .arg("--state-dir")
        .arg(d.state.path())
        .args(["--no-autostart", "image", "import"])
        .arg(&layout)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let held = common::gone(|| d.log().contains("holding image.commit"));
    assert!(held, "the import never reached its commit:\n{}", d.log());
    assert_eq!(
        entries(&oci_dir(&d).join("layers")).len(),
        2,
        "both layers stored before the commit"
    );
    assert!(
        !entries(&oci_dir(&d).join("tmp")).is_empty(),
        "its staging is there"
    );
    let subnet = d.subnet();
    d.kill9();
    let _ = import.wait();
    d.restart(&subnet);
    assert_no_image_left(&d, "after a crash and the sweep");
    assert!(
        d.log()
            .contains("removed what an image pull or import left"),
        "{}",
        d.log()
    );
    d.stop_and_check_leaks();
}

#[test]
fn an_oci_session_forks_is_inspected_and_audited_as_drums_own() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("user");
    oci::write_layout(&layout, &oci::user_workdir_image(), "drums/user:v1");
    let mut d = TestDaemon::start();
    let id = ok(
        &d.drums(&["image", "import", layout.to_str().unwrap()]),
        "import",
    );
    common::run(async {
        let s = d
            .create(&drums_api::CreateSession {
                image: Some("drums/user:v1".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(s.image, id);
        // The inspector: a turn that writes a file in the image's WorkingDir.
        let c = &d.client;
        c.call(
            hyper::Method::POST,
            &format!("/v1/sessions/{}/turn/begin", s.id),
            None::<&()>,
        )
        .await
        .unwrap();
        assert_eq!(d.sh(&s.id, "echo turn > notes && cat notes").1, "turn");
        let e: drums_api::TurnEffects = c
            .json(
                hyper::Method::POST,
                &format!("/v1/sessions/{}/turn/end", s.id),
                None::<&()>,
            )
            .await
            .unwrap();
        assert_eq!(e.class, drums_api::TurnClass::Files, "{e:?}");
        assert!(
            e.files
                .iter()
                .any(|f| f.path.ends_with("home/worker/notes")),
            "{e:?}"
        );
        // A fork of two siblings, which the audit finds isolated and not clones.
        let r: drums_api::RestoreResult = c
            .json(
                hyper::Method::POST,
                &format!("/v1/sessions/{}/fork", s.id),
                Some(&drums_api::ForkRequest {
                    keep: true,
                    count: 2,
                    name: None,
                    at: None,
                }),
            )
            .await
            .unwrap();
        let (a, b) = (&r.sessions[0], &r.sessions[1]);
        for sib in [a, b] {
            assert_eq!(sib.image, id);
            assert_eq!(d.sh(&sib.id, "cat notes; id -un").1, "turn\nworker");
        }
        let rep: serde_json::Value = d.audit(&a.id, &b.id).await;
        assert_eq!(rep["passed"], true, "{rep:#}");
        for sib in [a, b, &s] {
            d.rm(&sib.id).await.unwrap();
        }
        ok(
            &d.drums(&["checkpoint", "rm", &r.checkpoint]),
            "checkpoint rm",
        );
    });
    // Nothing uses it any more: it goes, with its layers.
    ok(&d.drums(&["image", "rm", &id]), "image rm");
    assert_no_image_left(&d, "after the fork");
    d.stop_and_check_leaks();
}

/// Every character or block device below `dir`, not following links.
fn device_nodes(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_char_device() || t.is_block_device() {
                out.push(e.path());
            } else if t.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// busybox and a few applets: an image that starts and runs `sh`.
fn busybox_layer() -> Layer {
    let busybox = std::fs::read("/bin/busybox").expect(
        "/bin/busybox missing: install busybox-static (scripts/setup.sh does). NOT SKIPPED",
    );
    let mut l = Layer::builder()
        .dir("bin", 0o755, 0, 0)
        .file("bin/busybox", &busybox, 0o755, 0, 0);
    for a in ["sh", "test", "cat", "stat", "readlink"] {
        l = l.symlink(&format!("bin/{a}"), "busybox");
    }
    l.build(true)
}

/// A layer from a debootstrap root carries `/dev/console` (char 5:1); others
/// carry block devices and fifos. Such an image imports and pulls (as with
/// rootless podman), the store never holds the nodes (the layer subvolumes
/// are walked on the host), drumsd's log names each one skipped with its
/// layer, and a session starts from it with drums' own /dev: no console. A
/// fifo is made, an absolute path lands in the image, and a symlink that
/// climbs above the root is kept as written.
#[test]
fn a_layer_with_device_nodes_is_stored_without_them_and_runs() {
    require_root();
    use tar::EntryType as T;
    let work = tempfile::tempdir().unwrap();
    let dev = |path: &[u8], kind, (major, minor): (u32, u32)| {
        let mut h = oci::raw_header(path, kind, 0o600, 0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        h
    };
    let mut climbs = oci::raw_header(b"etc/up", T::Symlink, 0o777, 0);
    oci::set_raw_link(&mut climbs, b"../../../../etc");
    let top = Layer::builder()
        .dir("dev", 0o755, 0, 0)
        .raw_entry(dev(b"dev/console", T::Char, (5, 1)), b"")
        .raw_entry(dev(b"dev/sda", T::Block, (8, 0)), b"")
        .hardlink("dev/console-link", "dev/console")
        .raw_entry(oci::raw_header(b"srv/fifo", T::Fifo, 0o644, 0), b"")
        .raw_entry(oci::raw_header(b"/etc/abs", T::Regular, 0o644, 4), b"abs\n")
        .raw_entry(climbs, b"")
        .build(false);
    let top_diff_id = top.diff_id();
    let image = ImageSpec::new(vec![busybox_layer(), top]);
    let layout = work.path().join("layout");
    oci::write_layout(&layout, &image, "v1");
    let mut d = TestDaemon::start();
    let reg = Registry::start().expect("start the test registry");
    reg.push_layout(&layout, "drums/devices:v1")
        .expect("push the layout");
    let pulled = format!("{}/drums/devices:v1", reg.addr());
    let imported = ok(
        &d.drums(&["image", "import", layout.to_str().unwrap()]),
        "import",
    );
    for how in ["import", "pull"] {
        let id = if how == "pull" {
            ok(&d.drums(&["image", "rm", &imported]), "rm");
            assert_no_image_left(&d, "before the pull");
            ok(&d.drums(&["pull", "--insecure", "-q", &pulled]), "pull")
        } else {
            imported.clone()
        };
        assert_eq!(id, imported, "{how}: the same image either way");
        let layers: Vec<PathBuf> = entries(&oci_dir(&d).join("layers"))
            .into_iter()
            .map(|l| oci_dir(&d).join("layers").join(l))
            .collect();
        assert_eq!(layers.len(), 2, "{how}: {layers:?}");
        for l in &layers {
            assert!(
                device_nodes(l).is_empty(),
                "{how}: device nodes in the store: {:?}",
                device_nodes(l)
            );
        }
        let top = layers
            .iter()
            .find(|l| l.join("srv").exists())
            .expect("the top layer's subvolume");
        assert!(!top.join("dev/console").exists() && !top.join("dev/sda").exists());
        assert!(!top.join("dev/console-link").exists());
        assert_eq!(
            std::fs::read_to_string(top.join("etc/abs")).unwrap(),
            "abs\n"
        );
        assert_eq!(
            std::fs::read_link(top.join("etc/up")).unwrap(),
            Path::new("../../../../etc")
        );
        {
            use std::os::unix::fs::FileTypeExt;
            assert!(std::fs::symlink_metadata(top.join("srv/fifo"))
                .unwrap()
                .file_type()
                .is_fifo());
        }
        // Said, with the layer, once per layer stored.
        let said: Vec<String> = d
            .log()
            .lines()
            .filter(|l| l.contains(&format!("layer {top_diff_id}: entry ")))
            .map(str::to_owned)
            .collect();
        let times = if how == "import" { 1 } else { 2 };
        for path in ["dev/console", "dev/sda", "dev/console-link"] {
            let n = said
                .iter()
                .filter(|l| l.contains(&format!("entry {path} not written")))
                .count();
            assert_eq!(n, times, "{how}: {path} in {said:#?}");
        }
        common::run(async {
            let s = d
                .create(&drums_api::CreateSession {
                    image: Some(id.clone()),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("{how}: create: {e}\n{}", d.log()));
            // drums' own /dev (a tmpfs with its binds): no console, and
            // /dev/null is the host's 1:3.
            let (code, out, err) = d.sh(
                &s.id,
                "test -e /dev/console && echo console; test -e /dev/sda && echo sda; \
                 stat -c %t:%T /dev/null; test -p /srv/fifo && echo fifo; cat /etc/abs; \
                 readlink /etc/up",
            );
            assert_eq!(code, 0, "{how}: {err}");
            assert_eq!(out, "1:3\nfifo\nabs\n../../../../etc", "{how}");
            d.rm(&s.id).await.unwrap();
        });
    }
    ok(&d.drums(&["image", "rm", &imported]), "rm");
    assert_no_image_left(&d, "after rm");
    d.stop_and_check_leaks();
}
