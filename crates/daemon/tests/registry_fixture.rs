//! The OCI fixtures themselves: a layout written by `common::oci` is what
//! skopeo and a real registry take, the auth registry refuses anonymous
//! clients, the archive conversions work, and every registry is gone after
//! its test. The image tests of `drums pull` and `drums image import` stand
//! on these.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::oci::{self, ImageSpec, Layer, Tamper};
use drums_testkit::Registry;
use serde_json::Value;

fn skopeo_inspect(reg: &Registry, name_tag: &str, raw: bool) -> Value {
    let mut cmd = Command::new("/usr/bin/skopeo");
    cmd.args(["inspect", "--tls-verify=false"]);
    if raw {
        cmd.arg("--raw");
    }
    if let Some((u, p)) = reg.creds() {
        cmd.arg(format!("--creds={u}:{p}"));
    }
    let out = cmd
        .arg(format!("docker://{}/{name_tag}", reg.addr()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo inspect {name_tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The registry's process is reaped: no such pid any more.
fn assert_gone(pid: u32) {
    assert!(
        common::gone(|| !Path::new(&format!("/proc/{pid}")).exists()),
        "registry process {pid} left behind"
    );
}

fn small_image() -> ImageSpec {
    ImageSpec::new(vec![Layer::builder()
        .dir("etc", 0o755, 0, 0)
        .file("etc/hello", b"hello\n", 0o644, 0, 0)
        .build(true)])
}

#[test]
fn push_inspect_and_convert_a_two_layer_image() {
    common::require_root();
    let t = Instant::now();
    let image = oci::two_layer_image();
    let base = oci::base_layer();
    assert!(
        base.bytes().len() > 50 << 20,
        "the base rootfs tar is too small"
    );
    assert_eq!(base.diff_id(), base.digest(), "the base is uncompressed");
    let entries = tar_entries(base.bytes());
    let kind = |p: &str| entries.iter().find(|(n, _)| n == p).map(|(_, k)| *k);
    assert_eq!(kind("etc/passwd"), Some(tar::EntryType::Regular));
    assert_eq!(kind("etc"), Some(tar::EntryType::Directory));
    assert!(
        entries.iter().any(|(_, k)| *k == tar::EntryType::Symlink),
        "the base keeps symlinks"
    );
    assert_eq!(kind("dev/null"), None, "device nodes are skipped");

    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let (manifest, config) = oci::write_layout(&layout, &image, "latest");
    let t_layout = t.elapsed();

    let reg = Registry::start().expect("start the test registry");
    let pid = reg.pid();
    assert_eq!(reg.get_status("/v2/").unwrap(), 200);
    reg.push_layout(&layout, "drums/two:latest")
        .expect("push the layout");
    let t_push = t.elapsed();

    let info = skopeo_inspect(&reg, "drums/two:latest", false);
    assert_eq!(info["Digest"], manifest.as_str(), "{info}");
    let want: Vec<String> = image.layers.iter().map(|l| l.digest()).collect();
    let got: Vec<String> = info["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, want, "layer digests in the registry");
    assert_eq!(info["Architecture"], "amd64");
    let raw = skopeo_inspect(&reg, "drums/two:latest", true);
    assert_eq!(raw["mediaType"], oci::MEDIA_MANIFEST);
    assert_eq!(raw["config"]["digest"], config.as_str());
    assert_eq!(raw["layers"][0]["mediaType"], oci::MEDIA_LAYER_TAR);
    assert_eq!(raw["layers"][1]["mediaType"], oci::MEDIA_LAYER_GZIP);
    let (status, body) = reg
        .get(&format!("/v2/drums/two/blobs/{}", image.layers[1].digest()))
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body,
        image.layers[1].bytes(),
        "the registry serves the blob as written"
    );
    // What no client can push: a blob whose bytes do not match its digest.
    let mut bad = image.layers[1].bytes().to_vec();
    bad[10] ^= 0xff;
    reg.corrupt_blob(&image.layers[1].digest(), &bad)
        .expect("corrupt the blob");
    let (status, body) = reg
        .get(&format!("/v2/drums/two/blobs/{}", image.layers[1].digest()))
        .unwrap();
    assert_eq!(
        (status, body),
        (200, bad),
        "the registry serves the corrupted blob"
    );

    let docker = work.path().join("two.docker.tar");
    let ociar = work.path().join("two.oci.tar");
    oci::to_docker_archive(&layout, "latest", &docker);
    oci::to_oci_archive(&layout, "latest", &ociar);
    for f in [&docker, &ociar] {
        let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{} missing or empty", f.display());
    }
    let names = tar_names(&docker);
    assert!(names.iter().any(|n| n == "manifest.json"), "{names:?}");
    let names = tar_names(&ociar);
    assert!(names.iter().any(|n| n == "index.json"), "{names:?}");
    assert!(names.iter().any(|n| n == "oci-layout"), "{names:?}");

    // The user image's config and its passwd, read back from a layout.
    let user = oci::user_workdir_image();
    let ulayout = work.path().join("user");
    let (_, config) = oci::write_layout(&ulayout, &user, "latest");
    let blob = |d: &str| std::fs::read(ulayout.join("blobs/sha256").join(&d[7..])).unwrap();
    let c: Value = serde_json::from_slice(&blob(&config)).unwrap();
    assert_eq!(c["config"]["User"], "worker");
    assert_eq!(c["config"]["WorkingDir"], "/home/worker");
    assert_eq!(c["config"]["Cmd"], serde_json::json!(["sleep", "infinity"]));
    assert!(c["config"]["ExposedPorts"]["8080/tcp"].is_object(), "{c}");
    let env: Vec<&str> = c["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        env.contains(&"FOO=bar") && env.iter().any(|e| e.starts_with("PATH=")),
        "{env:?}"
    );
    let mut top = tar::Archive::new(flate2::read::GzDecoder::new(user.layers[1].bytes()));
    let mut passwd = String::new();
    let mut home = None;
    for e in top.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_owned();
        if p == "etc/passwd" {
            std::io::Read::read_to_string(&mut e, &mut passwd).unwrap();
        } else if p == "home/worker" {
            home = Some((e.header().uid().unwrap(), e.header().gid().unwrap()));
        }
    }
    assert!(
        passwd.starts_with("root:") && passwd.contains("\nworker:x:1000:1000:"),
        "{passwd}"
    );
    assert_eq!(home, Some((1000, 1000)));

    drop(reg);
    assert_gone(pid);
    eprintln!(
        "layout {:.1} s, push {:.1} s, all {:.1} s",
        t_layout.as_secs_f64(),
        (t_push - t_layout).as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

fn tar_entries(bytes: &[u8]) -> Vec<(String, tar::EntryType)> {
    let mut a = tar::Archive::new(bytes);
    a.entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let p = e
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_owned();
            (p, e.header().entry_type())
        })
        .collect()
}

fn tar_names(f: &Path) -> Vec<String> {
    let mut a = tar::Archive::new(std::fs::File::open(f).unwrap());
    a.entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn basic_auth_registry_refuses_anonymous_and_takes_creds() {
    common::require_root();
    let reg =
        Registry::start_with_basic_auth("drums", "s3cret-pass").expect("start the test registry");
    let pid = reg.pid();
    assert_eq!(reg.get_status("/v2/").unwrap(), 401, "anonymous GET /v2/");
    assert_eq!(reg.get("/v2/").unwrap().0, 200, "GET /v2/ with credentials");

    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let (manifest, _) = oci::write_layout(&layout, &small_image(), "v1");
    reg.push_layout(&layout, "drums/small:v1")
        .expect("push the layout");
    assert_eq!(reg.get_status("/v2/drums/small/manifests/v1").unwrap(), 401);
    let info = skopeo_inspect(&reg, "drums/small:v1", false);
    assert_eq!(info["Digest"], manifest.as_str());

    drop(reg);
    assert_gone(pid);
}

/// Each way of making a layout wrong does what it says, read back from the
/// files.
#[test]
fn tampered_layouts() {
    let work = tempfile::tempdir().unwrap();
    let image = small_image();
    let layer = &image.layers[0];
    let read = |d: &Path, digest: &str| -> Vec<u8> {
        std::fs::read(d.join("blobs/sha256").join(&digest[7..])).unwrap()
    };
    let json =
        |d: &Path, digest: &str| -> Value { serde_json::from_slice(&read(d, digest)).unwrap() };
    let top = |d: &Path| -> Value {
        let i: Value =
            serde_json::from_slice(&std::fs::read(d.join("index.json")).unwrap()).unwrap();
        i["manifests"][0].clone()
    };

    let d = work.path().join("ok");
    let (m, c) = oci::write_layout(&d, &image, "t");
    assert_eq!(top(&d)["annotations"][oci::REF_NAME], "t");
    assert_eq!(json(&d, &m)["config"]["digest"], c.as_str());
    assert_eq!(
        oci::sha256_digest(&read(&d, &layer.digest())),
        layer.digest()
    );

    let d = work.path().join("digest");
    oci::write_layout_with(&d, &image, "t", Tamper::LayerDigest);
    let blob = read(&d, &layer.digest());
    assert_eq!(blob.len(), layer.bytes().len());
    assert_ne!(oci::sha256_digest(&blob), layer.digest());

    let d = work.path().join("diffid");
    let (_, c) = oci::write_layout_with(&d, &image, "t", Tamper::DiffId);
    assert_ne!(
        json(&d, &c)["rootfs"]["diff_ids"][0],
        layer.diff_id().as_str()
    );

    let d = work.path().join("media");
    let (m, _) = oci::write_layout_with(
        &d,
        &image,
        "t",
        Tamper::LayerMediaType(oci::MEDIA_LAYER_ZSTD.into()),
    );
    assert_eq!(
        json(&d, &m)["layers"][0]["mediaType"],
        oci::MEDIA_LAYER_ZSTD
    );

    let d = work.path().join("platform");
    let (_, c) = oci::write_layout_with(&d, &image, "t", Tamper::Platform("arm64"));
    assert_eq!(json(&d, &c)["architecture"], "arm64");
    assert_eq!(top(&d)["platform"]["architecture"], "arm64");

    let d = work.path().join("index");
    let (i, _) = oci::write_layout_with(&d, &image, "t", Tamper::IndexOnlyArch("arm64"));
    assert_eq!(top(&d)["mediaType"], oci::MEDIA_INDEX);
    let index = json(&d, &i);
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(index["manifests"][0]["platform"]["architecture"], "arm64");

    // Skopeo refuses a blob that does not match its digest; a plain tar of
    // the layout keeps the flaw.
    let d = work.path().join("digest");
    let f = work.path().join("digest.oci.tar");
    oci::tar_layout(&d, &f);
    let names = tar_names(&f);
    assert!(names.contains(&"index.json".to_owned()), "{names:?}");
    assert!(
        names.contains(&format!("blobs/sha256/{}", &layer.digest()[7..])),
        "{names:?}"
    );

    // A second tag in the same layout keeps the first.
    let d = work.path().join("ok");
    oci::write_layout(&d, &image, "u");
    let i: Value = serde_json::from_slice(&std::fs::read(d.join("index.json")).unwrap()).unwrap();
    assert_eq!(i["manifests"].as_array().unwrap().len(), 2);
}
