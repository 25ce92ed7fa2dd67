//! `drums bench image`: OCI images in drums against the tools people use
//! for them, all fed by one docker-registry that the bench starts on
//! loopback:
//! 1. pull and unpack, cold: `drums pull` vs `skopeo copy` + `umoci unpack`
//!    vs `podman pull`; and import of the same image as an oci-archive
//!    (written once by `skopeo copy`): `drums image import` vs `podman load`;
//! 2. create to ready from the pulled image: `drums create --image` vs
//!    `podman run -d`, and `exec true` in each;
//! 3. the disk that 10 images on one base take in each store.
//!
//! Each arm is the command a user would type, timed from spawn to exit, so
//! every CLI's own start-up is in its arm. Arms run interleaved round by
//! round (the first arm rotating, so none always follows the same other),
//! after one unmeasured round that warms caches. The image is drums' own
//! default rootfs as one gzip layer plus a small one, so that the numbers
//! are about a real distribution's ~15k files.

mod layout;
mod root;

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Instant;

use drums_api::{error_chain, Client, ClientError, ImageList, Version};
use hyper::Method;
use serde_json::{json, Map, Value};
use tokio::process::Command;

use self::layout::{Layer, Layout, LayoutError};
use self::root::RootError;
use super::{progress, Made};
use crate::exit::{self, Failure};
use crate::stats::p50_p95;
use crate::table;
use drums_testkit::registry::{Registry, RegistryError, REGISTRY_BIN, SKOPEO_BIN};

/// What ends `drums bench image` before its report.
#[derive(Debug, thiserror::Error)]
pub enum ImageBenchError {
    #[error("run {command}")]
    Run {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command}: {status}: {stderr}")]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("create the bench's directory")]
    Workdir(#[source] std::io::Error),
    /// `op` on `path`: "open", "remove".
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// "syncfs the store", "statvfs the store".
    #[error("{op} the store")]
    Store {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
    /// A tool's output that is not what it says on this host.
    #[error("{tool} said {output:?}")]
    Said {
        tool: String,
        output: String,
        #[source]
        source: Option<std::num::ParseIntError>,
    },
    #[error("podman load printed no image name: {0:?}")]
    NoImageName(String),
    #[error("drums image import printed no image id")]
    NoImageId,
    #[error("drums lists {listed} of the {pulled} images pulled")]
    Listed { listed: usize, pulled: usize },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("the root rounds")]
    RootTask(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Api(#[from] ClientError),
}

impl From<ImageBenchError> for Failure {
    fn from(e: ImageBenchError) -> Failure {
        Failure::internal(&e)
    }
}

type Result<T, E = ImageBenchError> = std::result::Result<T, E>;

/// Images in the disk phase, each the base plus a layer of its own.
const DISK_IMAGES: usize = 10;
/// Bytes of each such layer's one file: pseudo-random, so that gzip leaves
/// it its size.
const DISTINCT_BYTES: usize = 1 << 20;

/// `podman run` as it works on this host: crun refuses its hybrid cgroups,
/// and podman cannot raise the default ulimits without CAP_SYS_RESOURCE.
/// No network, as drums' first arm.
const PODMAN_RUN: &[&str] = &[
    "--runtime",
    "runc",
    "run",
    "-d",
    "--rm",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1000:1000",
];

pub async fn image(c: &Client, base: &Path, n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    for tool in [REGISTRY_BIN, SKOPEO_BIN, "umoci", "podman", "runc", "btrfs"] {
        if which(tool).is_none() {
            return Err(Failure::usage(format!(
                "{tool} is missing: run scripts/setup.sh"
            )));
        }
    }
    if !base.is_dir() {
        return Err(Failure::usage(format!(
            "{} is missing: scripts/setup.sh builds drums' default image",
            base.display()
        )));
    }
    let v: Version = c.json(Method::GET, "/v1/version", None::<&()>).await?;
    let tools = Tools {
        drums: drums_beside()?,
        socket: c.socket().to_owned(),
    };
    let m = Made::new(c);
    let mut stores = Stores::default();
    let result = run(
        &m,
        &tools,
        base,
        Path::new(&v.state_dir),
        n,
        as_json,
        &mut stores,
    )
    .await;
    // Sessions first: an image is not removed while a session uses it.
    let result = m.finish(result.map_err(Failure::from)).await;
    stores.remove_all(&tools).await;
    let report = result?;
    report.print(n, as_json);
    Ok(exit::OK)
}

/// Every measurement, in seconds and bytes.
struct Report {
    base_layers: [Layer; 2],
    pull: Arms,
    import: Arms,
    create: Arms,
    exec: Arms,
    /// A session's root, overlay against snapshot (root.rs).
    root: Arms,
    disk: Disk,
}

/// Arms' samples (seconds, in round order), by key.
#[derive(Default)]
struct Arms(Vec<(&'static str, Vec<f64>)>);

impl Arms {
    fn push(&mut self, key: &'static str, secs: f64) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(secs),
            None => self.0.push((key, vec![secs])),
        }
    }

    fn get(&self, key: &str) -> &[f64] {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
            .unwrap_or_default()
    }

    /// `PREFIX.KEY.{p50,p95,samples}` for every arm, and against `baseline`
    /// the ratio of the medians and the median of the per-round ratios
    /// (the noise of one moment hits both arms of a round alike).
    fn json(&self, prefix: &str, baseline: &str, out: &mut Map<String, Value>) {
        let base = self.get(baseline);
        for (key, v) in &self.0 {
            let (p50, p95) = p50_p95(v.iter().copied());
            out.insert(format!("{prefix}.{key}.p50"), json!(p50));
            out.insert(format!("{prefix}.{key}.p95"), json!(p95));
            out.insert(format!("{prefix}.{key}.samples"), json!(v));
            if *key != baseline && !base.is_empty() {
                let paired: Vec<f64> = v.iter().zip(base).map(|(a, b)| a / b).collect();
                out.insert(
                    format!("{prefix}.{key}.ratio"),
                    json!(p50 / p50_p95(base.iter().copied()).0),
                );
                out.insert(
                    format!("{prefix}.{key}.paired_ratio"),
                    json!(p50_p95(paired.iter().copied()).0),
                );
            }
        }
    }

    /// A table row: label, p50, p95, and p50 against `baseline`'s.
    fn row(&self, label: &str, key: &str, baseline: Option<&str>, unit: Unit) -> Vec<String> {
        let (p50, p95) = p50_p95(self.get(key).iter().copied());
        let ratio = baseline
            .map(|b| format!("{:.2}x", p50 / p50_p95(self.get(b).iter().copied()).0))
            .unwrap_or_default();
        vec![label.into(), unit.show(p50), unit.show(p95), ratio]
    }
}

#[derive(Clone, Copy)]
enum Unit {
    Ms,
    S,
}

impl Unit {
    fn show(self, secs: f64) -> String {
        match self {
            Unit::Ms => format!("{:.1} ms", secs * 1e3),
            Unit::S => format!("{secs:.2} s"),
        }
    }
}

/// The `drums` the pulls and imports are timed through: the one beside this
/// program, as `drums bench` runs it, else `drums` on PATH.
fn drums_beside() -> Result<PathBuf, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(exit::INTERNAL, format!("find this program's path: {e}")))?;
    Ok(exe
        .parent()
        .map(|d| d.join("drums"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("drums")))
}

/// The disk phase's measurements.
struct Disk {
    /// The 10 images' `size_bytes` summed, as `drums images` lists them.
    drums_listed: u64,
    /// Of that, their `shared_bytes`.
    drums_shared: u64,
    /// The store's used bytes (statvfs) before and after the pulls.
    drums_used: (u64, u64),
    /// `btrfs filesystem usage`'s "Used" (data and metadata) before and after.
    drums_btrfs_used: (u64, u64),
    /// `btrfs filesystem du -s` of the layers: total, exclusive, set shared.
    drums_du: (u64, u64, u64),
    drums_pull_all: f64,
    /// The 10 images' `Size` summed, as `podman image inspect` lists them.
    podman_listed: u64,
    /// `du -sb` of podman's graph root before and after the pulls: apparent
    /// bytes.
    podman_used: (u64, u64),
    /// `du -sB1` of it: allocated bytes, as the store's statvfs counts.
    podman_allocated: (u64, u64),
    podman_pull_all: f64,
}

/// How each tool is run.
struct Tools {
    /// This drums binary, pointed at the drumsd being measured.
    drums: PathBuf,
    socket: PathBuf,
}

impl Tools {
    fn drums<'a>(&self, args: impl IntoIterator<Item = &'a str>) -> Command {
        let mut c = Command::new(&self.drums);
        c.arg("--socket")
            .arg(&self.socket)
            .arg("--no-autostart")
            .args(args);
        c
    }
}

fn cmd<'a>(program: &str, args: impl IntoIterator<Item = &'a str>) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Run to its end: its stdout, and the seconds from spawn to exit. A
/// failure names the command and carries its stderr.
async fn timed(cmd: &mut Command) -> Result<(String, f64)> {
    let std = cmd.as_std();
    let what = std::iter::once(std.get_program())
        .chain(std.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let t = Instant::now();
    let out = match cmd.output().await {
        Ok(out) => out,
        Err(source) => {
            return Err(ImageBenchError::Run {
                command: what,
                source,
            })
        }
    };
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(ImageBenchError::Failed {
            command: what,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok((String::from_utf8_lossy(&out.stdout).trim().to_owned(), secs))
}

/// Remove what may not be there (the first round's cold start).
async fn absent(cmd: &mut Command) {
    let _ = timed(cmd).await;
}

/// What the bench made in the image stores, drums' and podman's, and in
/// podman: removed at the end whatever happened, and said so on stderr when
/// that fails. (Its drums sessions are recorded in the benches' [`Made`].)
#[derive(Default)]
struct Stores {
    containers: BTreeSet<String>,
    drums_images: BTreeSet<String>,
    podman_images: BTreeSet<String>,
}

impl Stores {
    async fn remove_all(&mut self, t: &Tools) {
        let mut failed = Vec::new();
        for c in std::mem::take(&mut self.containers) {
            if let Err(e) = timed(&mut cmd("podman", ["rm", "-f", "-t", "0", &c])).await {
                failed.push(e);
            }
        }
        let images = std::mem::take(&mut self.drums_images);
        if !images.is_empty() {
            let mut c = t.drums(["image", "rm"]);
            c.args(&images);
            if let Err(e) = timed(&mut c).await {
                failed.push(e);
            }
        }
        let images = std::mem::take(&mut self.podman_images);
        if !images.is_empty() {
            let mut c = cmd("podman", ["rmi", "-f"]);
            c.args(&images);
            if let Err(e) = timed(&mut c).await {
                failed.push(e);
            }
        }
        for e in failed {
            eprintln!("drums: bench image: clean-up: {}", error_chain(&e));
        }
    }
}

/// The images in the layout: the base (drums' rootfs and a small layer),
/// and the disk phase's, the same rootfs layer and one of their own each.
struct Images {
    layout: Layout,
    rootfs: Layer,
    small: Layer,
}

/// The base is tagged `v1`, the disk images `d0`, `d1`, ...
fn build(dir: &Path, base: &Path) -> Result<Images> {
    let mut layout = Layout::create(dir)?;
    let rootfs = layout.layer_from_dir(base)?;
    let small =
        layout.layer_from_files(&[("etc/drums-bench".into(), b"drums bench image\n".to_vec())])?;
    layout.add_image("v1", &[&rootfs, &small])?;
    for k in 0..DISK_IMAGES {
        let own = layout.layer_from_files(&[(format!("drums-bench-{k}"), noise(k as u64))])?;
        layout.add_image(&format!("d{k}"), &[&rootfs, &own])?;
    }
    Ok(Images {
        layout,
        rootfs,
        small,
    })
}

/// `DISTINCT_BYTES` bytes of xorshift64* from `seed`: each image's own.
fn noise(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(DISTINCT_BYTES);
    while out.len() < DISTINCT_BYTES {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out
}

async fn run(
    m: &Made<'_>,
    t: &Tools,
    base: &Path,
    state_dir: &Path,
    n: usize,
    as_json: bool,
    made: &mut Stores,
) -> Result<Report> {
    let say = |m: String| {
        if !as_json {
            eprintln!("{m}");
        }
    };
    let work = tempfile::Builder::new()
        .prefix("drums-bench-image")
        .tempdir()
        .map_err(ImageBenchError::Workdir)?;
    say(format!("writing the images from {} ...", base.display()));
    let t0 = Instant::now();
    let images = build(&work.path().join("layout"), base)?;
    let reg = Registry::start()?;
    say(format!(
        "written in {:.1} s; pushing them to a registry on {} ...",
        t0.elapsed().as_secs_f64(),
        reg.addr()
    ));
    reg.push_layout_tag(images.layout.dir(), "v1", "bench/base:v1")?;
    for k in 0..DISK_IMAGES {
        let tag = format!("d{k}");
        reg.push_layout_tag(images.layout.dir(), &tag, &format!("bench/disk:{tag}"))?;
    }
    let reference = format!("{}/bench/base:v1", reg.addr());

    let pull = pull_rounds(t, &reference, work.path(), n, as_json, made).await?;
    let (create, exec) = create_rounds(m, t, &reference, n, as_json, made).await?;
    say("a session's root: overlay against snapshot ...".into());
    let chains =
        drums_oci::chain_ids(&[images.rootfs.diff_id.clone(), images.small.diff_id.clone()]);
    let oci = state_dir.join("store/oci");
    let top = oci
        .join("layers")
        .join(chains[1].trim_start_matches("sha256:"));
    let scratch = oci.join("tmp");
    let root = tokio::task::spawn_blocking(move || root::rounds(&top, &scratch, n))
        .await
        .map_err(ImageBenchError::RootTask)??;

    // Last of the rounds on the pulled image: an import of the same image
    // would share its id (and its removal take the pulled one with it), so
    // the import rounds start by removing it, and leave nothing.
    // Nothing of the bench's is left in either store after them, so the
    // disk phase measures from there.
    let import = import_rounds(t, &reference, work.path(), n, as_json, made).await?;
    let refs: Vec<String> = (0..DISK_IMAGES)
        .map(|k| format!("{}/bench/disk:d{k}", reg.addr()))
        .collect();
    let disk = disk(m.client(), t, &refs, state_dir, as_json, made).await?;
    Ok(Report {
        base_layers: [images.rootfs, images.small],
        pull,
        import,
        create,
        exec,
        root,
        disk,
    })
}

/// Each arm cold every round: the image removed first, then pulled and
/// unpacked into a tree a container can run from.
async fn pull_rounds(
    t: &Tools,
    reference: &str,
    work: &Path,
    n: usize,
    as_json: bool,
    made: &mut Stores,
) -> Result<Arms> {
    let (oci, bundle) = (work.join("skopeo-oci"), work.join("umoci-bundle"));
    let oci_ref = format!("{}:bench", oci.display());
    let docker_ref = format!("docker://{reference}");
    let mut arms = Arms::default();
    for round in 0..=n {
        let mut keep = |key, secs| {
            if round > 0 {
                arms.push(key, secs);
            }
        };
        for k in 0..3 {
            match (round + k) % 3 {
                0 => {
                    absent(&mut t.drums(["image", "rm", reference])).await;
                    made.drums_images.insert(reference.to_owned());
                    let pull = ["pull", "--insecure", "-q", reference];
                    keep("drums", timed(&mut t.drums(pull)).await?.1);
                }
                1 => {
                    remove_tree(&oci)?;
                    remove_tree(&bundle)?;
                    let copy = [
                        "--insecure-policy",
                        "copy",
                        "--quiet",
                        "--src-tls-verify=false",
                        &docker_ref,
                    ];
                    let (_, s) = timed(cmd("skopeo", copy).arg(format!("oci:{oci_ref}"))).await?;
                    let unpack = ["unpack", "--image", &oci_ref];
                    let (_, u) = timed(cmd("umoci", unpack).arg(&bundle)).await?;
                    keep("skopeo", s);
                    keep("umoci", u);
                    keep("skopeo_umoci", s + u);
                    remove_tree(&oci)?;
                    remove_tree(&bundle)?;
                }
                _ => {
                    absent(&mut cmd("podman", ["rmi", "-f", reference])).await;
                    made.podman_images.insert(reference.to_owned());
                    let pull = ["pull", "-q", "--tls-verify=false", reference];
                    keep("podman", timed(&mut cmd("podman", pull)).await?.1);
                }
            }
        }
        let what = if round == 0 { "warm-up" } else { "round" };
        progress(as_json, format!("pull: {what} {round}/{n} done"));
    }
    if !as_json {
        eprintln!();
    }
    Ok(arms)
}

/// Each arm cold every round: the image removed first, then imported from
/// one oci-archive of it, which the registry's image was copied to once.
/// The pulled image is removed from both stores first (the imported one is
/// the same image, and its layers would be found there), and nothing
/// imported is left.
async fn import_rounds(
    t: &Tools,
    reference: &str,
    work: &Path,
    n: usize,
    as_json: bool,
    made: &mut Stores,
) -> Result<Arms> {
    let archive = work.join("image.oci.tar");
    let copy = [
        "--insecure-policy",
        "copy",
        "--quiet",
        "--src-tls-verify=false",
    ];
    timed(
        cmd("skopeo", copy)
            .arg(format!("docker://{reference}"))
            .arg(format!("oci-archive:{}:bench/import:v1", archive.display())),
    )
    .await?;
    // Cold in both stores: neither may find the layers there already.
    timed(&mut t.drums(["image", "rm", reference])).await?;
    made.drums_images.remove(reference);
    timed(&mut cmd("podman", ["rmi", reference])).await?;
    made.podman_images.remove(reference);
    let file = archive.to_string_lossy().into_owned();
    let mut arms = Arms::default();
    let (mut drums_id, mut podman_name): (Option<String>, Option<String>) = (None, None);
    for round in 0..=n {
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                if let Some(id) = drums_id.take() {
                    timed(&mut t.drums(["image", "rm", &id])).await?;
                    made.drums_images.remove(&id);
                }
                let (out, secs) = timed(&mut t.drums(["image", "import", &file])).await?;
                let id = out.lines().last().unwrap_or_default().trim().to_owned();
                if id.is_empty() {
                    return Err(ImageBenchError::NoImageId);
                }
                made.drums_images.insert(id.clone());
                drums_id = Some(id);
                if round > 0 {
                    arms.push("drums", secs);
                }
            } else {
                if let Some(name) = podman_name.take() {
                    timed(&mut cmd("podman", ["rmi", "-f", &name])).await?;
                    made.podman_images.remove(&name);
                }
                let (out, secs) = timed(&mut cmd("podman", ["load", "-q", "-i", &file])).await?;
                // "Loaded image: NAME", named from the archive's reference.
                let name = out
                    .lines()
                    .last()
                    .and_then(|l| l.split_once(": "))
                    .map(|(_, n)| n.trim().to_owned())
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| ImageBenchError::NoImageName(out.clone()))?;
                made.podman_images.insert(name.clone());
                podman_name = Some(name);
                if round > 0 {
                    arms.push("podman", secs);
                }
            }
        }
        let what = if round == 0 { "warm-up" } else { "round" };
        progress(as_json, format!("import: {what} {round}/{n} done"));
    }
    if !as_json {
        eprintln!();
    }
    if let Some(id) = drums_id {
        timed(&mut t.drums(["image", "rm", &id])).await?;
        made.drums_images.remove(&id);
    }
    if let Some(name) = podman_name {
        timed(&mut cmd("podman", ["rmi", "-f", &name])).await?;
        made.podman_images.remove(&name);
    }
    remove_file(&archive)?;
    Ok(arms)
}

fn remove_file(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", p)(e)),
        _ => Ok(()),
    }
}

fn remove_tree(p: &Path) -> Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", p)(e)),
        _ => Ok(()),
    }
}

/// `op` on `path` failed.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ImageBenchError {
    let path = path.to_owned();
    move |source| ImageBenchError::Io { op, path, source }
}

/// `tool`'s `output` is not what it says on this host.
fn said(tool: impl Into<String>, output: &str) -> ImageBenchError {
    ImageBenchError::Said {
        tool: tool.into(),
        output: output.to_owned(),
        source: None,
    }
}

/// drums' session (no network, as podman's arm; and on its default bridge)
/// against a podman container, each ready and then `exec true` in it.
async fn create_rounds(
    m: &Made<'_>,
    t: &Tools,
    reference: &str,
    n: usize,
    as_json: bool,
    made: &mut Stores,
) -> Result<(Arms, Arms)> {
    let name = format!("drums-bench-image-{}", std::process::id());
    let (mut create, mut exec) = (Arms::default(), Arms::default());
    for round in 0..=n {
        for k in 0..3 {
            let arm = (round + k) % 3;
            let (key, secs, e) = if arm < 2 {
                let mut args = vec!["create", "--image", reference];
                let key = if arm == 0 {
                    args.extend(["--network", "none"]);
                    "drums"
                } else {
                    "drums_bridge"
                };
                let (id, secs) = timed(&mut t.drums(args)).await?;
                m.adopt_session(&id);
                let (_, e) = timed(&mut t.drums(["exec", &id, "--", "true"])).await?;
                timed(&mut t.drums(["rm", &id])).await?;
                m.forget_session(&id);
                (key, secs, e)
            } else {
                made.containers.insert(name.clone());
                let mut run = cmd("podman", PODMAN_RUN.iter().copied());
                run.args(["--name", &name, reference, "sleep", "infinity"]);
                let (_, secs) = timed(&mut run).await?;
                let (_, e) = timed(&mut cmd("podman", ["exec", &name, "true"])).await?;
                // `sleep` as PID 1 ignores SIGTERM: kill at once.
                timed(&mut cmd("podman", ["rm", "-f", "-t", "0", &name])).await?;
                made.containers.remove(&name);
                ("podman", secs, e)
            };
            if round > 0 {
                create.push(key, secs);
                exec.push(key, e);
            }
        }
        let what = if round == 0 { "warm-up" } else { "round" };
        progress(as_json, format!("create: {what} {round}/{n} done"));
    }
    if !as_json {
        eprintln!();
    }
    Ok((create, exec))
}

/// Pull the images into both stores (one of each in turn), measuring the
/// disk before and after; then remove them.
async fn disk(
    c: &Client,
    t: &Tools,
    refs: &[String],
    state_dir: &Path,
    as_json: bool,
    made: &mut Stores,
) -> Result<Disk> {
    let store = state_dir.join("store");
    let graph = timed(&mut cmd(
        "podman",
        ["info", "--format", "{{.Store.GraphRoot}}"],
    ))
    .await?
    .0;
    let graph = Path::new(&graph);
    let before = (store_used(&store).await?, du(graph).await?);
    let (mut drums_pull_all, mut podman_pull_all) = (0.0, 0.0);
    for (i, r) in refs.iter().enumerate() {
        made.drums_images.insert(r.clone());
        drums_pull_all += timed(&mut t.drums(["pull", "--insecure", "-q", r]))
            .await?
            .1;
        made.podman_images.insert(r.clone());
        podman_pull_all += timed(&mut cmd("podman", ["pull", "-q", "--tls-verify=false", r]))
            .await?
            .1;
        progress(
            as_json,
            format!("disk: {}/{} images pulled", i + 1, refs.len()),
        );
    }
    if !as_json {
        eprintln!();
    }
    let after = (store_used(&store).await?, du(graph).await?);

    let layers = store.join("oci/layers");
    let (out, _) = timed(cmd("btrfs", ["filesystem", "du", "-s", "--raw"]).arg(&layers)).await?;
    let f: Vec<u64> = out
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    if f.len() != 3 {
        return Err(said("btrfs filesystem du", &out));
    }

    let list: ImageList = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    let ours: Vec<_> = list
        .images
        .iter()
        .filter(|i| i.names.iter().any(|n| refs.contains(n)))
        .collect();
    if ours.len() != refs.len() {
        return Err(ImageBenchError::Listed {
            listed: ours.len(),
            pulled: refs.len(),
        });
    }
    let mut inspect = cmd("podman", ["image", "inspect", "--format", "{{.Size}}"]);
    inspect.args(refs);
    let sizes = timed(&mut inspect).await?.0;
    let podman_listed = sizes
        .lines()
        .map(|l| l.trim().parse::<u64>())
        .sum::<Result<u64, _>>()
        .map_err(|e| ImageBenchError::Said {
            tool: "podman image inspect".into(),
            output: sizes.clone(),
            source: Some(e),
        })?;

    let mut rm = t.drums(["image", "rm"]);
    rm.args(refs);
    timed(&mut rm).await?;
    made.drums_images.clear();
    let mut rmi = cmd("podman", ["rmi"]);
    rmi.args(refs);
    timed(&mut rmi).await?;
    made.podman_images.clear();
    Ok(Disk {
        drums_listed: ours.iter().map(|i| i.size_bytes).sum(),
        drums_shared: ours.iter().map(|i| i.shared_bytes).sum(),
        drums_used: (before.0 .0, after.0 .0),
        drums_btrfs_used: (before.0 .1, after.0 .1),
        drums_du: (f[0], f[1], f[2]),
        drums_pull_all,
        podman_listed,
        podman_used: (before.1 .0, after.1 .0),
        podman_allocated: (before.1 .1, after.1 .1),
        podman_pull_all,
    })
}

/// The btrfs store's used bytes, by statvfs and by `btrfs filesystem
/// usage`, once what is deleted is gone and what is written is committed.
async fn store_used(store: &Path) -> Result<(u64, u64)> {
    // btrfs frees a deleted subvolume (an image or session removed in the
    // rounds before) in the background: wait for it, or it would come off
    // the "after" figure.
    timed(cmd("btrfs", ["subvolume", "sync"]).arg(store)).await?;
    let dir = std::fs::File::open(store).map_err(io("open", store))?;
    let failed = |op| move |source| ImageBenchError::Store { op, source };
    nix::unistd::syncfs(dir.as_raw_fd()).map_err(failed("syncfs"))?;
    let s = nix::sys::statvfs::statvfs(store).map_err(failed("statvfs"))?;
    let used = (s.blocks() - s.blocks_free()) * s.fragment_size();
    let (usage, _) = timed(cmd("btrfs", ["filesystem", "usage", "--raw"]).arg(store)).await?;
    // The "Overall:" section's first "Used:" line.
    let btrfs_used = usage
        .lines()
        .find_map(|l| l.trim().strip_prefix("Used:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| said("btrfs filesystem usage", &usage))?;
    Ok((used, btrfs_used))
}

/// `du -sb` and `du -sB1`: apparent and allocated bytes, each hard-linked
/// file once.
async fn du(p: &Path) -> Result<(u64, u64)> {
    let mut v = [0; 2];
    for (flag, v) in ["-sb", "-sB1"].into_iter().zip(&mut v) {
        let (out, _) = timed(cmd("du", [flag]).arg(p)).await?;
        *v = out
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| said(format!("du {flag} {}", p.display()), &out))?;
    }
    Ok((v[0], v[1]))
}

/// Where `PATH` finds a program (or the path itself, if absolute).
fn which(program: &str) -> Option<PathBuf> {
    if program.starts_with('/') {
        return Path::new(program).exists().then(|| program.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.exists())
}

impl Report {
    fn print(&self, n: usize, as_json: bool) {
        let d = &self.disk;
        let [rootfs, small] = &self.base_layers;
        if as_json {
            let mut out = Map::new();
            out.insert("n".into(), json!(n));
            out.insert("image.layers".into(), json!(2));
            out.insert(
                "image.entries".into(),
                json!(rootfs.entries + small.entries),
            );
            out.insert(
                "image.tar_bytes".into(),
                json!(rootfs.tar_size + small.tar_size),
            );
            out.insert("image.blob_bytes".into(), json!(rootfs.size + small.size));
            self.pull.json("pull", "drums", &mut out);
            self.import.json("import", "drums", &mut out);
            self.create.json("create", "drums", &mut out);
            self.exec.json("exec", "drums", &mut out);
            self.root.json("root", "overlay.mount", &mut out);
            let disk = json!({
                "disk.images": DISK_IMAGES,
                "disk.distinct_bytes": DISTINCT_BYTES,
                "disk.drums.listed_sum_bytes": d.drums_listed,
                "disk.drums.listed_shared_bytes": d.drums_shared,
                "disk.drums.statvfs_used_before_bytes": d.drums_used.0,
                "disk.drums.statvfs_used_after_bytes": d.drums_used.1,
                "disk.drums.used_bytes": d.drums_used.1 as i64 - d.drums_used.0 as i64,
                "disk.drums.btrfs_used_before_bytes": d.drums_btrfs_used.0,
                "disk.drums.btrfs_used_after_bytes": d.drums_btrfs_used.1,
                "disk.drums.btrfs_used_bytes":
                    d.drums_btrfs_used.1 as i64 - d.drums_btrfs_used.0 as i64,
                "disk.drums.btrfs_du.total_bytes": d.drums_du.0,
                "disk.drums.btrfs_du.exclusive_bytes": d.drums_du.1,
                "disk.drums.btrfs_du.set_shared_bytes": d.drums_du.2,
                "disk.drums.pull_all_secs": d.drums_pull_all,
                "disk.podman.listed_sum_bytes": d.podman_listed,
                "disk.podman.du_before_bytes": d.podman_used.0,
                "disk.podman.du_after_bytes": d.podman_used.1,
                "disk.podman.used_bytes": d.podman_used.1 as i64 - d.podman_used.0 as i64,
                "disk.podman.du_allocated_before_bytes": d.podman_allocated.0,
                "disk.podman.du_allocated_after_bytes": d.podman_allocated.1,
                "disk.podman.allocated_bytes":
                    d.podman_allocated.1 as i64 - d.podman_allocated.0 as i64,
                "disk.podman.pull_all_secs": d.podman_pull_all,
            });
            out.extend(disk.as_object().expect("an object").clone());
            println!(
                "{}",
                serde_json::to_string_pretty(&Value::Object(out)).expect("serialize")
            );
            return;
        }
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        let delta = |(a, b): (u64, u64)| mib(b.saturating_sub(a));
        println!(
            "drums bench image -n {n}: drums' default rootfs as 2 layers, {} entries, \
             {} of tar, {} gzip'd",
            rootfs.entries + small.entries,
            mib(rootfs.tar_size + small.tar_size),
            mib(rootfs.size + small.size)
        );
        let p = &self.pull;
        let rows = vec![
            p.row("drums pull", "drums", None, Unit::S),
            p.row(
                "skopeo copy + umoci unpack",
                "skopeo_umoci",
                Some("drums"),
                Unit::S,
            ),
            p.row("  skopeo copy", "skopeo", Some("drums"), Unit::S),
            p.row("  umoci unpack", "umoci", Some("drums"), Unit::S),
            p.row("podman pull", "podman", Some("drums"), Unit::S),
        ];
        let head = format!("image pull+unpack ({n} rounds, interleaved)");
        print!(
            "{}",
            table::render(&[&head, "p50", "p95", "vs drums"], &rows)
        );
        println!();
        let i = &self.import;
        let rows = vec![
            i.row("drums image import", "drums", None, Unit::S),
            i.row("podman load", "podman", Some("drums"), Unit::S),
        ];
        let head = format!("image import of an oci-archive ({n} rounds, interleaved)");
        print!(
            "{}",
            table::render(&[&head, "p50", "p95", "vs drums"], &rows)
        );
        println!();
        let (cr, ex) = (&self.create, &self.exec);
        let rows = vec![
            cr.row(
                "drums create --image, network none",
                "drums",
                None,
                Unit::Ms,
            ),
            cr.row(
                "drums create --image, bridge",
                "drums_bridge",
                Some("drums"),
                Unit::Ms,
            ),
            cr.row(
                "podman run -d (runc), network none",
                "podman",
                Some("drums"),
                Unit::Ms,
            ),
            ex.row("exec `true`: drums exec", "drums", None, Unit::Ms),
            ex.row(
                "exec `true`: podman exec",
                "podman",
                Some("drums"),
                Unit::Ms,
            ),
        ];
        let head = format!("create to ready ({n} rounds, interleaved)");
        print!(
            "{}",
            table::render(&[&head, "p50", "p95", "vs drums"], &rows)
        );
        println!();
        let r = &self.root;
        let mut rows = Vec::new();
        for (what, key) in [
            ("mount the root", "mount"),
            ("checkpoint: snapshot its changes", "checkpoint_snapshot"),
            ("files version: written_since", "written_since"),
        ] {
            let (o, sn) = (format!("overlay.{key}"), format!("snapshot.{key}"));
            rows.push(r.row(&format!("{what}, overlay (drums)"), &o, None, Unit::Ms));
            rows.push(r.row(&format!("{what}, snapshot"), &sn, Some(&o), Unit::Ms));
        }
        let head = format!("a session's root ({n} rounds, interleaved)");
        print!(
            "{}",
            table::render(&[&head, "p50", "p95", "vs overlay"], &rows)
        );
        println!();
        let rows = vec![
            vec![
                "drums (btrfs store)".into(),
                mib(d.drums_listed),
                format!("{} (statvfs, data and metadata)", delta(d.drums_used)),
                format!("{:.2} s", d.drums_pull_all),
            ],
            vec![
                "podman (overlay graph root)".into(),
                mib(d.podman_listed),
                format!(
                    "{} (du -sb), {} allocated",
                    delta(d.podman_used),
                    delta(d.podman_allocated)
                ),
                format!("{:.2} s", d.podman_pull_all),
            ],
        ];
        let head = format!("disk, {DISK_IMAGES} images on one base");
        print!(
            "{}",
            table::render(&[&head, "listed sum", "used on disk", "pull all"], &rows)
        );
        println!(
            "drums' layers, btrfs filesystem du: {} total, {} exclusive, {} set shared",
            mib(d.drums_du.0),
            mib(d.drums_du.1),
            mib(d.drums_du.2)
        );
    }
}
