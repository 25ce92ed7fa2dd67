//! `drums build -f Dockerfile -t NAME CONTEXT`: podman's idiom, with buildah
//! as the builder (docs/build.md). drums never reads a Dockerfile's
//! instructions; buildah builds, pushes the result as an oci-archive, and
//! drumsd imports that archive as it imports any (checked, never trusted).
//!
//! - **Cached by inputs.** The key is a SHA-256 over the Dockerfile, the
//!   context's every entry (path, kind, mode, contents or link target), the
//!   build arguments and the network flag. A build whose key names an image
//!   drumsd still holds is a tag of that image, not a build.
//! - **No network unless asked.** RUN steps get none (`--network none`)
//!   unless `--network` gives them the host's.
//! - **Its own buildah storage** under `STATE/build/`, so a build's base
//!   images and layers are drums' and never mix with the host's podman or
//!   buildah images; what a build made there (its image, any container of a
//!   failed step) is removed when it ends, however it ends.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use drums_api::{Client, ImageList, ImageRef};
use hyper::Method;
use sha2::{Digest, Sha256};

use crate::args::{BuildArgs, Global};
use crate::exit::{self, Failure};

/// The cache record's format (`STATE/build/cache/KEY.json`).
const CACHE_VERSION: u32 = 1;

/// What a build left in the cache: the image its inputs made.
#[derive(serde::Serialize, serde::Deserialize)]
struct CacheRecord {
    version: u32,
    image: String,
}

pub async fn build(c: &Client, g: &Global, a: &BuildArgs) -> Result<i32, Failure> {
    let context = std::fs::canonicalize(&a.context).map_err(|e| {
        Failure::new(
            exit::NOT_FOUND,
            format!("build context {}: {e}", a.context.display()),
        )
    })?;
    if !context.is_dir() {
        return Err(Failure::usage(format!(
            "build context {} is not a directory",
            context.display()
        )));
    }
    let dockerfile = a.file.clone().unwrap_or_else(|| context.join("Dockerfile"));
    let df = std::fs::read(&dockerfile).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::INTERNAL
        };
        Failure::new(
            code,
            format!("no Dockerfile at {}: {e}", dockerfile.display()),
        )
    })?;
    if drums_oci::normalize_reference(&a.tag).is_none() {
        return Err(Failure::usage(format!(
            "invalid image name {:?}: not an OCI reference (like base:1 or localhost/base:1)",
            a.tag
        )));
    }
    for arg in &a.build_args {
        if !arg.contains('=') || arg.starts_with('=') {
            return Err(Failure::usage(format!(
                "--build-arg {arg:?}: write KEY=VALUE"
            )));
        }
    }
    let buildah = which("buildah").ok_or_else(|| {
        Failure::new(
            exit::UNAVAILABLE,
            "drums build needs buildah, which is not installed (Debian: apt install buildah)",
        )
    })?;

    let key = cache_key(&df, &context, a)?;
    let dir = g.state_dir.join("build");
    let cache = dir.join("cache").join(format!("{key}.json"));
    let say = |line: &str| eprintln!("drums build: {line}");
    if !a.no_cache {
        if let Some(id) = cached(c, &cache).await? {
            let r = tag(c, &id, &a.tag).await?;
            say(&format!("cached: {} ({})", a.tag, short(&id)));
            return done(r, a.json, true);
        }
    }

    let storage = Storage::new(&buildah, &dir)?;
    let work = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(storage.tmp())
        .map_err(|e| Failure::new(exit::INTERNAL, format!("make a build directory: {e}")))?;
    // A name of this build's own, removed from buildah's storage at the end.
    let local = format!(
        "localhost/drums-build-{}:{}",
        &key[..16],
        std::process::id()
    );
    let built = storage.build(a, &dockerfile, &context, &local);
    let archive = work.path().join("image.tar");
    let pushed = built.and_then(|()| storage.push(&local, &archive, &a.tag));
    let removed = storage.remove_image(&local);
    pushed?;
    if let Err(e) = removed {
        // Not the build's failure: the image is built; say what is left.
        say(&format!("warning: {}", e.message));
    }
    say("importing into drumsd");
    let r = crate::images::import_archive(c, &archive, Some(&a.tag)).await?;
    if let Some(id) = &r.id {
        write_cache(&cache, id)?;
    }
    done(r, a.json, false)
}

fn done(r: ImageRef, json: bool, cached: bool) -> Result<i32, Failure> {
    if json {
        let v = serde_json::json!({"id": r.id, "names": r.names, "cached": cached});
        println!("{}", serde_json::to_string_pretty(&v).expect("serialize"));
    } else {
        println!("{}", r.id.unwrap_or_default());
    }
    Ok(exit::OK)
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

/// The image a previous build of the same inputs made, if drumsd still
/// holds it.
async fn cached(c: &Client, record: &Path) -> Result<Option<String>, Failure> {
    let Ok(text) = std::fs::read_to_string(record) else {
        return Ok(None);
    };
    // A record of another format, or damaged: a miss, rebuilt and rewritten.
    let Ok(r) = serde_json::from_str::<CacheRecord>(&text) else {
        return Ok(None);
    };
    if r.version != CACHE_VERSION {
        return Ok(None);
    }
    let l: ImageList = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    Ok(l.images
        .iter()
        .any(|i| i.id.as_deref() == Some(r.image.as_str()))
        .then_some(r.image))
}

async fn tag(c: &Client, id: &str, name: &str) -> Result<ImageRef, Failure> {
    Ok(c.json(
        Method::POST,
        &format!("/v1/images/{}/tag", crate::images::enc_segment(id)),
        Some(&drums_api::TagImage { name: name.into() }),
    )
    .await?)
}

fn write_cache(path: &Path, id: &str) -> Result<(), Failure> {
    let fail = |e: std::io::Error| {
        Failure::new(
            exit::INTERNAL,
            format!("write build cache {}: {e}", path.display()),
        )
    };
    let dir = path.parent().expect("a cache file has a directory");
    std::fs::create_dir_all(dir).map_err(fail)?;
    let record = CacheRecord {
        version: CACHE_VERSION,
        image: id.to_owned(),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    serde_json::to_writer(&tmp, &record).map_err(|e| fail(e.into()))?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// The key of a build's inputs: the Dockerfile, every entry of the context
/// in path order, the build arguments and the network flag.
fn cache_key(dockerfile: &[u8], context: &Path, a: &BuildArgs) -> Result<String, Failure> {
    let mut h = Sha256::new();
    let mut field = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field("drums-build-v1", b"");
    field("dockerfile", dockerfile);
    let mut args = a.build_args.clone();
    args.sort();
    for arg in &args {
        field("arg", arg.as_bytes());
    }
    field("network", if a.network { b"host" } else { b"none" });
    let mut entries = Vec::new();
    walk(context, context, &mut entries)?;
    entries.sort();
    for (rel, kind, mode, content) in entries {
        field("path", rel.as_bytes());
        field(kind, &mode.to_le_bytes());
        field("content", &content);
    }
    let digest = h.finalize();
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

type Entry = (String, &'static str, u32, Vec<u8>);

/// Every entry under `dir`, never following a symlink: a file's contents'
/// digest, a link's target.
fn walk(root: &Path, dir: &Path, out: &mut Vec<Entry>) -> Result<(), Failure> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let fail = |p: &Path, e: std::io::Error| {
        Failure::new(
            exit::INTERNAL,
            format!("read build context {}: {e}", p.display()),
        )
    };
    let rd = std::fs::read_dir(dir).map_err(|e| fail(dir, e))?;
    for e in rd {
        let e = e.map_err(|e| fail(dir, e))?;
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).map_err(|e| fail(&p, e))?;
        let rel = p
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        let mode = meta.permissions().mode();
        let ft = meta.file_type();
        if ft.is_dir() {
            out.push((rel, "dir", mode, Vec::new()));
            walk(root, &p, out)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&p).map_err(|e| fail(&p, e))?;
            out.push((
                rel,
                "symlink",
                mode,
                target.as_os_str().as_encoded_bytes().to_vec(),
            ));
        } else if ft.is_file() {
            let mut f = std::fs::File::open(&p).map_err(|e| fail(&p, e))?;
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = f.read(&mut buf).map_err(|e| fail(&p, e))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            out.push((rel, "file", mode, h.finalize().to_vec()));
        } else {
            // A fifo, socket or device: COPY cannot take it; its kind is enough.
            let kind = if ft.is_fifo() { "fifo" } else { "special" };
            out.push((rel, kind, mode, Vec::new()));
        }
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// buildah, over drums' own storage under `STATE/build`.
struct Storage {
    buildah: PathBuf,
    root: PathBuf,
    runroot: PathBuf,
}

impl Storage {
    fn new(buildah: &Path, dir: &Path) -> Result<Storage, Failure> {
        let s = Storage {
            buildah: buildah.to_owned(),
            root: dir.join("storage"),
            runroot: dir.join("run"),
        };
        for d in [&s.root, &s.runroot, &s.tmp()] {
            std::fs::create_dir_all(d).map_err(|e| {
                Failure::new(exit::INTERNAL, format!("create {}: {e}", d.display()))
            })?;
        }
        Ok(s)
    }

    fn tmp(&self) -> PathBuf {
        self.root.parent().expect("under STATE/build").join("tmp")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.buildah);
        c.arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(&self.runroot)
            // buildah's big files (layers being committed) go under drums'
            // state, not the host's /var/tmp.
            .env("TMPDIR", self.tmp());
        c
    }

    /// `buildah build`, its output streamed to our stderr as it comes.
    fn build(
        &self,
        a: &BuildArgs,
        dockerfile: &Path,
        context: &Path,
        local: &str,
    ) -> Result<(), Failure> {
        let mut c = self.cmd();
        c.arg("build")
            // runc, as podman here: crun refuses this host's hybrid cgroups.
            .args(["--isolation", "oci", "--runtime", "runc"])
            .args(["--network", if a.network { "host" } else { "none" }])
            // Intermediate containers go even when a step fails.
            .arg("--force-rm")
            .arg("--layers=false")
            .arg(format!("--tls-verify={}", !a.insecure))
            .arg("-f")
            .arg(dockerfile)
            .arg("-t")
            .arg(local);
        for arg in &a.build_args {
            c.arg("--build-arg").arg(arg);
        }
        c.arg(context);
        // Progress to the terminal (stderr), never into stdout, which is
        // the image id (or JSON).
        c.stdin(Stdio::null()).stdout(std::io::stderr());
        let st = c
            .status()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("run buildah: {e}")))?;
        if st.success() {
            return Ok(());
        }
        let mut msg = format!(
            "buildah build of {} failed ({st}); its output is above",
            dockerfile.display()
        );
        if !a.network {
            msg.push_str(
                "; RUN steps had no network: if one needs it (apt-get, pip install), give it the host's with --network",
            );
        }
        Err(Failure::usage(msg))
    }

    /// The built image as an oci-archive at `archive`, named `name`.
    fn push(&self, local: &str, archive: &Path, name: &str) -> Result<(), Failure> {
        let out = self
            .cmd()
            .args(["push", "--quiet", local])
            .arg(format!("oci-archive:{}:{name}", archive.display()))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("run buildah push: {e}")))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Failure::new(
            exit::INTERNAL,
            format!(
                "buildah push {local}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }

    /// The build's own image, out of buildah's storage (its FROM images
    /// stay, as a cache of bases).
    fn remove_image(&self, local: &str) -> Result<(), Failure> {
        let out = self
            .cmd()
            .args(["rmi", "--force", local])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("run buildah rmi: {e}")))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A failed build made no image: nothing to remove.
        if out.status.success() || stderr.contains("image not known") {
            return Ok(());
        }
        Err(Failure::new(
            exit::INTERNAL,
            format!("buildah rmi {local}: {}", stderr.trim()),
        ))
    }
}
