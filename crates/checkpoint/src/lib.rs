//! The checkpoint store's on-disk side: where a checkpoint's parts live, its
//! versioned manifest, and the checks that refuse a checkpoint before CRIU
//! ever sees it (another kernel or CPU, a truncated or corrupted image).
//!
//! A checkpoint is two artifacts taken while the session's tree was frozen:
//! - the process images CRIU wrote, in `STORE/checkpoint-images/ID/images/`
//!   (`STATE/checkpoints/ID/images/` before format 6), their pages shared
//!   with the parent version's where equal ([`share`]);
//! - a read-only btrfs snapshot of the session's subvolume (its overlay upper
//!   layer), at `STORE/checkpoints/ID`.
//!
//! `manifest.json` is written last and fsynced with its directory, and only
//! then does the catalog publish the checkpoint.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest format this build writes and reads. A change to [`Manifest`]
/// or anything it contains needs a bump (see docs/formats.md).
///
/// 2: archives carry a signature (see [`archive`]) and an imported checkpoint
/// gets a fresh id, the archive's id kept in `origin`; the source session's
/// `egress` and `privileged`. A version-1 manifest reads as one with no
/// origin, egress `none` and not privileged (what those sessions had).
///
/// 3: the source session's `user_namespace`; a manifest of format 1 or 2
/// reads as one without (none of those sessions had one).
///
/// 4: `version`, where the manifest sits in its session's history and which
/// versions' artifacts it uses; an older manifest reads as a full version
/// outside any history (what every checkpoint then was).
///
/// 5: a light version's `last_pid` (the version's `last_pid`); an older
/// manifest reads as one without (none of them was light).
///
/// 6: an artifact's `shared_bytes` (its process images' pages shared with
/// the parent version's, [`share`]); an older manifest reads as one that
/// shared none.
pub const FORMAT_VERSION: u32 = 6;

pub mod archive;
pub mod keys;
pub mod share;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read manifest {path}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint manifest format {found} is newer than this drums supports ({supported})")]
    TooNew { found: u32, supported: u32 },
    #[error("checkpoint was taken on {what} {theirs}, this host has {ours}: CRIU cannot restore it here")]
    Incompatible {
        what: &'static str,
        theirs: String,
        ours: String,
    },
    #[error("checkpoint image {file} is damaged: {detail}")]
    Damaged { file: String, detail: String },
    #[error("writing the images stopped: {0}")]
    Interrupted(String),
}

pub type Result<T> = std::result::Result<T, CheckpointError>;

fn io(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.into();
    move |source| CheckpointError::Io { op, path, source }
}

/// What a checkpoint needs from the host it is restored on. CRIU restores
/// registers and memory as they were: another kernel may change the ABI of
/// what it restores, and another CPU may lack instructions the processes
/// already chose to use (glibc picks by CPU flags at start-up).
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFingerprint {
    pub kernel: String,
    pub arch: String,
    pub cpu_vendor: String,
    pub cpu_family: String,
    /// The CPU's flags, sorted: a restore host must have all of them.
    pub cpu_flags: Vec<String>,
    pub criu_version: String,
}

impl HostFingerprint {
    pub fn of_this_host(criu_version: &str) -> HostFingerprint {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default()
        };
        let mut cpu_flags: Vec<String> = field("flags")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        cpu_flags.sort();
        cpu_flags.dedup();
        HostFingerprint {
            kernel,
            arch: std::env::consts::ARCH.to_owned(),
            cpu_vendor: field("vendor_id"),
            cpu_family: field("cpu family"),
            cpu_flags,
            criu_version: criu_version.to_owned(),
        }
    }

    /// Can a checkpoint taken on `self` be restored on `here`?
    pub fn check_restorable_on(&self, here: &HostFingerprint) -> Result<()> {
        let same = |what: &'static str, a: &str, b: &str| {
            if a == b {
                Ok(())
            } else {
                Err(CheckpointError::Incompatible {
                    what,
                    theirs: a.to_owned(),
                    ours: b.to_owned(),
                })
            }
        };
        same("kernel", &self.kernel, &here.kernel)?;
        same("architecture", &self.arch, &here.arch)?;
        same("CPU vendor", &self.cpu_vendor, &here.cpu_vendor)?;
        same("CPU family", &self.cpu_family, &here.cpu_family)?;
        let missing: Vec<&str> = self
            .cpu_flags
            .iter()
            .filter(|f| here.cpu_flags.binary_search(f).is_err())
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(CheckpointError::Incompatible {
                what: "CPU flags",
                theirs: missing.join(" "),
                ours: "none of those".into(),
            });
        }
        same("CRIU version", &self.criu_version, &here.criu_version)
    }
}

/// One image file and its checksum.
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFile {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// The session a checkpoint was taken of: what a restore recreates around it.
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceSession {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub profile: String,
    pub image: String,
    pub network: String,
    /// `none` or `nat`; a manifest of format 1 has none, which is what its
    /// session had (format 2 added the field).
    #[serde(default = "egress_none")]
    pub egress: String,
    pub limits: serde_json::Value,
    /// The restore generation the session itself was at (0 if cold).
    pub generation: u64,
    /// The session ran without its confinement; its siblings do too (the
    /// CRIU images hold its full capabilities and no seccomp filter, so a
    /// confined sibling could not be made of them). Absent in older
    /// manifests, which were all taken before confinement existed: false.
    #[serde(default)]
    pub privileged: bool,
    /// The session ran in a user namespace: its stored files are owned by
    /// `drums_session::ids::DISK_BASE + k`, and each sibling gets an id
    /// range of its own. Absent before format 3: false.
    #[serde(default)]
    pub user_namespace: bool,
}

fn egress_none() -> String {
    "none".into()
}

/// `manifest.json`.
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub id: String,
    pub name: String,
    pub created_at_ms: i64,
    pub session: SourceSession,
    pub host: HostFingerprint,
    /// Taken with `--clean`: a restore may reset browser state.
    pub clean: bool,
    pub leave_running: bool,
    pub images: Vec<ImageFile>,
    /// For an imported checkpoint, the id it had on the host that exported
    /// it (provenance only: never part of a path here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Time the tree was frozen for, and the dump as a whole.
    pub frozen_ms: f64,
    pub dump_ms: f64,
    /// Absent before format 4, and in an archive (which always carries a
    /// full version): the version took both artifacts itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<VersionInfo>,
}

/// What a version took itself.
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Took {
    /// Both artifacts, with the tree frozen once.
    Full,
    /// A read-only snapshot of the files, under the freezer.
    Files,
    /// A CRIU dump of the processes, left running.
    Process,
}

impl Took {
    pub fn as_str(self) -> &'static str {
        match self {
            Took::Full => "full",
            Took::Files => "files",
            Took::Process => "process",
        }
    }
}

/// One artifact's cost, as the benchmark and `drums versions` report it.
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ArtifactCost {
    /// Bytes written: the images' bytes not shared with the parent
    /// version's (`shared_bytes`), or the data the snapshot holds that the
    /// previous files artifact did not (btrfs' exclusive bytes).
    pub bytes: u64,
    /// A process artifact's pages that the parent version's images hold
    /// too, shared on disk rather than written (crate::share); 0 before
    /// format 6.
    #[serde(default)]
    pub shared_bytes: u64,
    /// Time the session's processes were frozen for.
    pub frozen_ms: f64,
    /// Time from start to durable.
    pub total_ms: f64,
}

/// A version's place in its session's history (see drums_catalog's
/// versions module for the lifecycle).
// A change here needs a FORMAT_VERSION bump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// 1, 2, … in its session's history.
    pub number: u64,
    /// The version the session was at when this one was taken.
    pub parent: Option<String>,
    /// The turn whose end took it (the newest, if several were merged);
    /// none for a version a person asked for.
    pub turn: Option<u64>,
    /// The inspector's class of what it covers (`none`, `files`,
    /// `processes`, `both`), or `manual`.
    pub class: String,
    pub policy: String,
    pub took: Took,
    /// Why it took more than the turn's class asked for, if it did.
    pub reason: Option<String>,
    /// The version whose files artifact it uses (its own id if it took one).
    pub files_of: String,
    /// The version whose process artifact it uses; none under the `files`
    /// policy, whose versions restore as a cold start on their files.
    pub process_of: Option<String>,
    /// The files its process artifact's processes held (open, mapped, cwd),
    /// as the session sees them: a later files artifact pairs with that
    /// process artifact only if it changed none of them (CRIU refuses to
    /// restore a file whose size changed, and a process would see content
    /// it never wrote).
    pub held: Vec<String>,
    /// What it took itself.
    pub files: Option<ArtifactCost>,
    pub process: Option<ArtifactCost>,
    /// A light version's: the last pid its session's pid namespace had
    /// handed out, which a cold start to it puts back (drums_session's
    /// versions::light). None for any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pid: Option<u32>,
}

impl Manifest {
    /// The version whose files artifact (snapshot) a restore uses.
    pub fn files_of(&self) -> &str {
        self.version.as_ref().map_or(&self.id, |v| &v.files_of)
    }

    /// The version whose process artifact (images) a restore uses.
    pub fn process_of(&self) -> Option<&str> {
        match &self.version {
            None => Some(&self.id),
            Some(v) => v.process_of.as_deref(),
        }
    }

    /// A light version: a selective one that took files alone while its
    /// session ran only drums' own processes, which a cold start on its
    /// files makes again (drums_session's versions::light). Unlike a
    /// `files`-policy version, it lost no process state.
    pub fn is_light(&self) -> bool {
        self.last_pid().is_some()
    }

    /// A light version's last pid: what a cold start to it puts back.
    pub fn last_pid(&self) -> Option<u32> {
        self.version.as_ref().and_then(|v| v.last_pid)
    }

    pub fn images_bytes(&self) -> u64 {
        self.images.iter().map(|i| i.size).sum()
    }

    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        let text = std::fs::read(&path).map_err(io("read", &path))?;
        Manifest::from_slice(&text, path)
    }

    /// Parse a manifest read from `path` (a file, or an archive's member).
    pub fn from_slice(text: &[u8], path: PathBuf) -> Result<Manifest> {
        let v: serde_json::Value =
            serde_json::from_slice(text).map_err(|source| CheckpointError::Manifest {
                path: path.clone(),
                source,
            })?;
        let found = v
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as u32;
        if found > FORMAT_VERSION {
            return Err(CheckpointError::TooNew {
                found,
                supported: FORMAT_VERSION,
            });
        }
        serde_json::from_value(v).map_err(|source| CheckpointError::Manifest { path, source })
    }

    /// Write `manifest.json` durably: temp file, fsync, rename, fsync the
    /// directory. Before this returns, a crash leaves no manifest at all.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(".manifest.json.tmp");
        let path = dir.join("manifest.json");
        let mut f = File::create(&tmp).map_err(io("create", &tmp))?;
        f.write_all(&serde_json::to_vec_pretty(self).expect("manifest serializes"))
            .map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("fsync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        fsync_dir(dir)
    }
}

/// Checksum every image file and fsync it and the directory: the images are on
/// disk before the manifest that names them is.
pub fn seal_images(images_dir: &Path) -> Result<Vec<ImageFile>> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(images_dir).map_err(io("list", images_dir))?;
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let p = images_dir.join(&name);
        let meta = std::fs::metadata(&p).map_err(io("stat", &p))?;
        if !meta.is_file() {
            continue;
        }
        let f = File::open(&p).map_err(io("open", &p))?;
        let sha256 = hash(&f, &p)?;
        f.sync_all().map_err(io("fsync", &p))?;
        out.push(ImageFile {
            name,
            size: meta.len(),
            sha256,
        });
    }
    fsync_dir(images_dir)?;
    Ok(out)
}

/// Cheap check, for every restore: every image is there with its size.
///
/// Returns the newest modification time (ns) among the images, so a caller
/// can tell whether anything changed since it last verified the checksums.
pub fn check_sizes(images_dir: &Path, images: &[ImageFile]) -> Result<i128> {
    let mut newest = 0i128;
    for i in images {
        let p = images_dir.join(&i.name);
        match std::fs::metadata(&p) {
            Ok(m) if m.len() == i.size => {
                use std::os::unix::fs::MetadataExt;
                newest = newest.max(m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128);
            }
            Ok(m) => {
                return Err(CheckpointError::Damaged {
                    file: i.name.clone(),
                    detail: format!("{} bytes, the manifest says {}", m.len(), i.size),
                })
            }
            Err(e) => {
                return Err(CheckpointError::Damaged {
                    file: i.name.clone(),
                    detail: e.to_string(),
                })
            }
        }
    }
    Ok(newest)
}

/// Full check: every image's checksum.
pub fn verify(images_dir: &Path, images: &[ImageFile]) -> Result<()> {
    check_sizes(images_dir, images)?;
    for i in images {
        let p = images_dir.join(&i.name);
        let f = File::open(&p).map_err(io("open", &p))?;
        let got = hash(&f, &p)?;
        if got != i.sha256 {
            return Err(CheckpointError::Damaged {
                file: i.name.clone(),
                detail: "checksum mismatch".into(),
            });
        }
    }
    Ok(())
}

fn hash(f: &File, p: &Path) -> Result<String> {
    hash_through(f, p, |_| Ok(()))
}

/// The SHA-256 of file `f` (at `p`), in hex; each block read is also handed
/// to `sink` (a copy's writer).
pub(crate) fn hash_through(
    mut f: &File,
    p: &Path,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io("read", p))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        sink(&buf[..n])?;
    }
    Ok(hex(&h.finalize()))
}

pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFingerprint {
        HostFingerprint::of_this_host("4.2.1")
    }

    #[test]
    fn this_host_restores_its_own_and_refuses_others() {
        let h = host();
        h.check_restorable_on(&host()).unwrap();
        let mut other = h.clone();
        other.kernel = "5.10.0".into();
        let e = other.check_restorable_on(&h).unwrap_err().to_string();
        assert!(
            e.starts_with("checkpoint was taken on kernel 5.10.0"),
            "{e}"
        );
        let mut other = h.clone();
        other.cpu_flags.push("zz_future_flag".into());
        other.cpu_flags.sort();
        assert!(other
            .check_restorable_on(&h)
            .unwrap_err()
            .to_string()
            .contains("zz_future_flag"));
    }

    #[test]
    fn sealed_images_detect_truncation_and_corruption() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pages-1.img"), vec![7u8; 10_000]).unwrap();
        std::fs::write(d.path().join("core-1.img"), b"core").unwrap();
        let imgs = seal_images(d.path()).unwrap();
        assert_eq!(imgs.len(), 2);
        verify(d.path(), &imgs).unwrap();
        std::fs::write(d.path().join("core-1.img"), b"cord").unwrap();
        assert!(verify(d.path(), &imgs)
            .unwrap_err()
            .to_string()
            .contains("checksum mismatch"));
        std::fs::write(d.path().join("pages-1.img"), vec![7u8; 10]).unwrap();
        let e = check_sizes(d.path(), &imgs).unwrap_err().to_string();
        assert_eq!(
            e,
            "checkpoint image pages-1.img is damaged: 10 bytes, the manifest says 10000"
        );
    }

    #[test]
    fn manifest_round_trips_and_refuses_newer_formats() {
        let d = tempfile::tempdir().unwrap();
        let m = Manifest {
            format_version: FORMAT_VERSION,
            id: "c".into(),
            name: "n".into(),
            created_at_ms: 1,
            session: SourceSession {
                id: "s".into(),
                name: "s".into(),
                hostname: "h".into(),
                profile: "headless".into(),
                image: "default".into(),
                network: "bridge".into(),
                egress: "none".into(),
                limits: serde_json::json!({}),
                generation: 0,
                privileged: false,
                user_namespace: true,
            },
            host: host(),
            clean: false,
            leave_running: true,
            images: vec![],
            origin: None,
            frozen_ms: 1.0,
            dump_ms: 2.0,
            version: None,
        };
        m.write(d.path()).unwrap();
        assert_eq!(Manifest::read(d.path()).unwrap(), m);
        let mut v = serde_json::to_value(&m).unwrap();
        v["format_version"] = 99.into();
        std::fs::write(d.path().join("manifest.json"), v.to_string()).unwrap();
        assert_eq!(
            Manifest::read(d.path()).unwrap_err().to_string(),
            format!("checkpoint manifest format 99 is newer than this drums supports ({FORMAT_VERSION})")
        );
        // A format 3 manifest (no version) is a full version outside any
        // history: both artifacts its own.
        assert_eq!(m.files_of(), "c");
        assert_eq!(m.process_of(), Some("c"));
        // A format 1 manifest (no egress) still reads, as egress none.
        let mut v1 = serde_json::to_value(&m).unwrap();
        v1["format_version"] = 1.into();
        v1["session"].as_object_mut().unwrap().remove("egress");
        std::fs::write(d.path().join("manifest.json"), v1.to_string()).unwrap();
        assert_eq!(Manifest::read(d.path()).unwrap().session.egress, "none");
    }
}
