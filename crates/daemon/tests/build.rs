//! `drums build` (buildah, then drumsd's import), `drums image tag` and
//! `drums image import --name`, as root against a real drumsd, buildah and
//! a loopback `docker-registry` serving the base image: a Dockerfile's
//! FROM, RUN, COPY, WORKDIR, ENV and USER end up in a session; a second
//! build of the same inputs is a cache hit; a failing RUN, a step that needs
//! the network without one, a FROM image that does not exist, and bad input
//! each say so clearly and leave nothing in drumsd, in the build's storage or
//! on the host.

mod common;

use std::path::Path;
use std::process::Command;

use common::oci::{self, ImageSpec, Layer};
use common::{fails, ok, run, TestDaemon};
use drums_testkit::Registry;
use hyper::Method;

const BUSYBOX: &str = "/bin/busybox";

/// A busybox-only root (`/bin/sh` and friends), users root and nobody.
fn busybox_layer() -> Layer {
    let mut b = Layer::builder()
        .dir("bin", 0o755, 0, 0)
        .dir("etc", 0o755, 0, 0)
        .dir("tmp", 0o1777, 0, 0)
        .file("bin/busybox", &std::fs::read(BUSYBOX).unwrap(), 0o755, 0, 0)
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
            0o644,
            0,
            0,
        )
        .file("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644, 0, 0);
    for applet in ["sh", "cat", "echo", "id", "wget", "nc", "pwd", "ls"] {
        b = b.symlink(&format!("bin/{applet}"), "busybox");
    }
    b.build(true)
}

/// The busybox base pushed to `reg` as `base:1`; its reference.
fn push_base(reg: &Registry) -> String {
    let layout = tempfile::tempdir().unwrap();
    oci::write_layout(layout.path(), &ImageSpec::new(vec![busybox_layer()]), "1");
    reg.push_layout(layout.path(), "base:1")
        .expect("push the layout");
    format!("{}/base:1", reg.addr())
}

fn context(dockerfile: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("Dockerfile"), dockerfile).unwrap();
    for (name, body) in files {
        std::fs::write(d.path().join(name), body).unwrap();
    }
    d
}

fn build(d: &TestDaemon, ctx: &Path, tag: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["build", "--insecure", "-t", tag];
    args.extend_from_slice(extra);
    args.push(ctx.to_str().unwrap());
    d.drums(&args)
}

fn buildah_storage(d: &TestDaemon, what: &str) -> String {
    let dir = d.state.path().join("build");
    let out = Command::new("buildah")
        .arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args([what, "--format", "{{.ID}} {{.Name}}"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a build may leave in its own buildah storage: no container, and no
/// image of its own (the pulled base stays, as the cache of bases).
fn assert_build_storage_clean(d: &TestDaemon) {
    let containers = buildah_storage(d, "containers");
    assert!(
        containers.trim().is_empty(),
        "buildah containers left: {containers}"
    );
    let images = buildah_storage(d, "images");
    assert!(
        !images.contains("drums-build"),
        "a build's image left: {images}"
    );
}

async fn oci_image_ids(d: &TestDaemon) -> Vec<String> {
    let l: drums_api::ImageList = d
        .client
        .json(Method::GET, "/v1/images", None::<&()>)
        .await
        .unwrap();
    l.images.into_iter().filter_map(|i| i.id).collect()
}

#[test]
fn a_dockerfile_becomes_a_session_image_and_the_same_inputs_hit_the_cache() {
    let reg = Registry::start().expect("start the test registry");
    let base = push_base(&reg);
    let mut d = TestDaemon::start();
    let ctx = context(
        &format!(
            "FROM {base}\nARG GREETING=hello\nENV A=1 GREETING=$GREETING\nWORKDIR /w\n\
             COPY f.txt /w/f.txt\nRUN echo built > /w/out && cat /w/f.txt\nUSER nobody\n"
        ),
        &[("f.txt", "from the context\n")],
    );
    let id = ok(&build(&d, ctx.path(), "localhost/app:1", &[]), "build");
    assert!(id.starts_with("sha256:"), "{id}");
    assert_build_storage_clean(&d);
    run(async {
        let s = d
            .create(&drums_api::CreateSession {
                image: Some("localhost/app:1".into()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create from the built image: {e}\n{}", d.log()));
        let (code, out, err) = d.sh(&s.id, "cat out f.txt; echo A=$A G=$GREETING; pwd; id -un");
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out, "built\nfrom the context\nA=1 G=hello\n/w\nnobody",
            "the image's RUN, COPY, ENV, ARG, WORKDIR and USER"
        );
        d.rm(&s.id).await.unwrap();
    });

    // The same inputs, another name: a tag of the same image, no build.
    let o = d.drums(&[
        "build",
        "--insecure",
        "--json",
        "-t",
        "localhost/app:2",
        ctx.path().to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "cached build")).unwrap();
    assert_eq!(v["cached"], true, "{v}");
    assert_eq!(v["id"], id.as_str());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cached"));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("STEP"),
        "no buildah run"
    );
    // Another argument, or a changed file: another build.
    let o = build(
        &d,
        ctx.path(),
        "localhost/app:3",
        &["--build-arg", "GREETING=bye"],
    );
    let other = ok(&o, "build with another argument");
    assert_ne!(other, id);
    std::fs::write(ctx.path().join("f.txt"), "changed\n").unwrap();
    let changed = ok(
        &build(&d, ctx.path(), "localhost/app:4", &[]),
        "build of a changed context",
    );
    assert_ne!(changed, id);
    assert_ne!(changed, other);
    // --no-cache builds again, to the same layers' content but a new image.
    let o = build(&d, ctx.path(), "localhost/app:4", &["--no-cache"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("STEP"),
        "--no-cache runs buildah"
    );
    ok(&o, "--no-cache");
    assert_build_storage_clean(&d);
    // Four images: app:1 and app:2 name one, app:3 another, and the
    // --no-cache build moved app:4 off the changed build's image, which is
    // left without a name (as podman leaves a dangling image).
    run(async {
        let ids = oci_image_ids(&d).await;
        assert_eq!(ids.len(), 4, "{ids:?}");
        for id in ids {
            ok(&d.drums(&["image", "rm", &id]), "image rm");
        }
    });
    d.stop_and_check_leaks();
}

#[test]
fn a_failing_step_a_step_that_needs_the_network_or_a_missing_base_says_so_and_leaves_nothing() {
    let reg = Registry::start().expect("start the test registry");
    let base = push_base(&reg);
    let mut d = TestDaemon::start();
    let ctx = context(&format!("FROM {base}\nRUN echo step one && exit 3\n"), &[]);
    let o = build(&d, ctx.path(), "localhost/bad:1", &[]);
    let err = fails(&o, "a failing RUN");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("buildah build") && err.contains("failed"),
        "{err}"
    );
    assert!(
        err.contains("exit 3") || err.contains("exit status 3"),
        "{err}"
    );
    assert_build_storage_clean(&d);
    assert!(
        !d.state.path().join("build/cache").exists()
            || std::fs::read_dir(d.state.path().join("build/cache"))
                .unwrap()
                .next()
                .is_none(),
        "no cache record of a failed build"
    );

    // A step that reaches out: refused without a network, and the error
    // says how to give it one. (The address is one of this test's bridge,
    // where nothing listens: with a network it would fail too, but it
    // fails here because there is none.)
    let ctx = context(
        &format!("FROM {base}\nRUN wget -q -T 3 -O /dev/null http://192.0.2.1/ \n"),
        &[],
    );
    let err = fails(
        &build(&d, ctx.path(), "localhost/net:1", &[]),
        "a RUN that needs the network",
    );
    assert!(
        err.contains("no network") && err.contains("--network"),
        "{err}"
    );
    assert_build_storage_clean(&d);
    // A FROM image that does not exist.
    let ctx = context(&format!("FROM {}/nope:1\nRUN true\n", reg.addr()), &[]);
    let err = fails(
        &build(&d, ctx.path(), "localhost/nope:1", &[]),
        "FROM a missing image",
    );
    assert!(
        err.contains("buildah build") && err.contains("failed"),
        "{err}"
    );
    assert_build_storage_clean(&d);
    run(async {
        assert!(
            oci_image_ids(&d).await.is_empty(),
            "a failed build imported nothing"
        );
    });
    d.stop_and_check_leaks();
}

#[test]
fn bad_build_and_tag_input_is_refused_and_changes_nothing() {
    let mut d = TestDaemon::start();
    let ctx = context("FROM scratch\n", &[]);
    let c = ctx.path().to_str().unwrap();
    let missing = ctx.path().join("nope");
    for (args, code, says) in [
        (
            vec!["build", "-t", "x:1", "-f", missing.to_str().unwrap(), c],
            3,
            "no Dockerfile at",
        ),
        (
            vec!["build", "-t", "x:1", "/nonexistent-context"],
            3,
            "build context /nonexistent-context",
        ),
        (
            vec!["build", "-t", "Not A Name", c],
            2,
            "invalid image name",
        ),
        (
            vec!["build", "-t", "x:1", "--build-arg", "NOEQUALS", c],
            2,
            "KEY=VALUE",
        ),
        (
            vec!["image", "tag", "sha256:0123456789abcdef", "x:1"],
            3,
            "no image",
        ),
        (
            vec!["image", "tag", "default", "x:1"],
            2,
            "is a drums image",
        ),
    ] {
        let o = d.drums(&args);
        let err = fails(&o, &format!("{args:?}"));
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.to_lowercase().contains(&says.to_lowercase()),
            "{args:?}: {err}"
        );
    }
    assert!(
        !d.state.path().join("build/storage").exists(),
        "bad input made no build storage"
    );
    run(async { assert!(oci_image_ids(&d).await.is_empty()) });
    d.stop_and_check_leaks();
}

/// `drums image import --name` names what it imports (`podman load`'s
/// tag); `drums image tag` adds a name and moves it off another image, as
/// `podman tag` does; a bad name is refused before anything is read.
#[test]
fn import_with_a_name_and_tag_as_podman_does() {
    let mut d = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let archive = |n: u8| {
        let layout = dir.path().join(format!("l{n}"));
        let layer = Layer::builder()
            .file("hello", format!("image {n}\n").as_bytes(), 0o644, 0, 0)
            .build(false);
        oci::write_layout(&layout, &ImageSpec::new(vec![busybox_layer(), layer]), "v1");
        let file = dir.path().join(format!("i{n}.tar"));
        oci::to_oci_archive(&layout, "v1", &file);
        file
    };
    let (a, b) = (archive(1), archive(2));
    // Far more than a socket buffer holds: refused by its name before a
    // byte is read, it is still being written when drumsd answers, and the
    // answer (not a broken pipe) must reach the client.
    let big = {
        let layout = dir.path().join("big");
        let layer = oci::noise_layer("noise", 24, 7);
        oci::write_layout(&layout, &ImageSpec::new(vec![busybox_layer(), layer]), "v1");
        let file = dir.path().join("big.tar");
        oci::to_oci_archive(&layout, "v1", &file);
        file
    };
    let a_id = ok(
        &d.drums(&[
            "image",
            "import",
            a.to_str().unwrap(),
            "--name",
            "localhost/mine:1",
        ]),
        "import --name",
    );
    let b_id = ok(
        &d.drums(&["image", "import", b.to_str().unwrap(), "--name", "other:2"]),
        "import --name",
    );
    // Several times: without the drain, 2 of 12 runs with one refusal of
    // each lost an answer to the race.
    for archive in [&a, &big, &a, &big, &a, &big] {
        let err = fails(
            &d.drums(&[
                "image",
                "import",
                archive.to_str().unwrap(),
                "--name",
                "Bad Name",
            ]),
            "import with a bad name",
        );
        assert!(err.contains("invalid image name"), "{err}");
    }
    run(async {
        let names = |id: String| {
            let c = d.client.clone();
            async move {
                let l: drums_api::ImageList = c
                    .json(Method::GET, "/v1/images", None::<&()>)
                    .await
                    .unwrap();
                l.images
                    .into_iter()
                    .find(|i| i.id.as_deref() == Some(id.as_str()))
                    .map(|i| i.names)
                    .unwrap_or_default()
            }
        };
        assert_eq!(names(a_id.clone()).await, ["localhost/mine:1"]);
        assert_eq!(names(b_id.clone()).await, ["docker.io/library/other:2"]);
        assert_eq!(
            oci_image_ids(&d).await.len(),
            2,
            "the bad name imported nothing"
        );
        ok(
            &d.drums(&["image", "tag", "localhost/mine:1", "localhost/mine:latest"]),
            "tag",
        );
        let mut n = names(a_id.clone()).await;
        n.sort();
        assert_eq!(n, ["localhost/mine:1", "localhost/mine:latest"]);
        // The name moves: `other:2` now names image a.
        ok(&d.drums(&["image", "tag", &a_id, "other:2"]), "tag by id");
        assert!(
            names(b_id.clone()).await.is_empty(),
            "the name left image b"
        );
        let s = d
            .create(&drums_api::CreateSession {
                image: Some("other:2".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(d.sh(&s.id, "cat /hello").1, "image 1");
        d.rm(&s.id).await.unwrap();
    });
    for r in [
        "localhost/mine:1",
        "localhost/mine:latest",
        "other:2",
        &b_id,
    ] {
        ok(&d.drums(&["image", "rm", r]), "image rm");
    }
    run(async { assert!(oci_image_ids(&d).await.is_empty()) });
    d.stop_and_check_leaks();
}
