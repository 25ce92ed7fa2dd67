//! Which `.vmx` path names which drums session, and which checkpoint each
//! snapshot name stands for.
//!
//! `vmrun list` must print `.vmx` paths, and drumsd knows nothing of them, so
//! `start` and `revertToSnapshot` record them here. The registry is keyed by
//! session name, which drumsd keeps unique: one session is one VM, whatever
//! paths point at it. `list` shows an entry only while drumsd reports its
//! session running, so a session removed behind vmrun's back (`drums rm`, a
//! daemon restart) simply drops out of the list.
//!
//! Snapshots are recorded by checkpoint id because checkpoint names are unique
//! in the catalog: replacing a snapshot creates the new checkpoint under a
//! second name before the old one is deleted (see `ops::snapshot`).
//!
//! Writes are atomic (a temporary file, fsync, rename, fsync of the
//! directory) under an exclusive `flock` on `registry.lock`, so parallel
//! vmrun processes (OSWorld runs several environments at once) never lose an
//! update. Each VM also has its own lock file, held for a whole operation.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The registry format this build reads and writes.
///
/// A change to [`RegistryFile`] or [`VmEntry`] that an older vmrun would
/// misread needs a bump, and `read` a migration from the older version.
pub const VERSION: u32 = 1;

/// Environment variable naming the registry file.
pub const ENV: &str = "DRUMS_VMRUN_REGISTRY";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("create registry directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read registry {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decode registry {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("registry {path} has format version {found}: this vmrun reads version {VERSION}")]
    Version { path: PathBuf, found: String },
    #[error("write registry {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file's contents (format version 1: a change needs a version bump).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    pub version: u32,
    /// By drums session name (the `.vmx` file's `displayName`).
    pub vms: BTreeMap<String, VmEntry>,
}

impl Default for RegistryFile {
    fn default() -> RegistryFile {
        RegistryFile {
            version: VERSION,
            vms: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmEntry {
    /// The absolute, lexically normalized path `start` or `revertToSnapshot`
    /// was last given for this session.
    pub vmx: PathBuf,
    /// vmrun snapshot name → drums checkpoint id.
    #[serde(default)]
    pub snapshots: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct Registry {
    path: PathBuf,
}

/// Held for the length of one operation on one VM.
#[derive(Debug)]
pub struct VmLock {
    _lock: Flock<File>,
}

impl Registry {
    pub fn new(path: impl Into<PathBuf>) -> Registry {
        Registry { path: path.into() }
    }

    /// `$DRUMS_VMRUN_REGISTRY`, else `registry.json` in the state directory's
    /// neighbour `<state dir>-vmrun` (`/var/lib/drums-vmrun` for the default
    /// `/var/lib/drums`). A neighbour and not a subdirectory: the state
    /// directory is drumsd's alone.
    pub fn default_path(state_dir: &Path, env: Option<PathBuf>) -> PathBuf {
        if let Some(p) = env.filter(|p| !p.as_os_str().is_empty()) {
            return p;
        }
        let mut name = state_dir
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| "drums".into());
        name.push("-vmrun");
        state_dir.with_file_name(name).join("registry.json")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// The current contents; an absent file is an empty registry.
    pub fn read(&self) -> Result<RegistryFile, RegistryError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RegistryFile::default())
            }
            Err(source) => {
                return Err(RegistryError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let decode = |source| RegistryError::Decode {
            path: self.path.clone(),
            source,
        };
        // The version first, so a newer format is refused by its version and
        // not by whichever field it happens to add.
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(decode)?;
        if v.get("version").and_then(|v| v.as_u64()) != Some(u64::from(VERSION)) {
            return Err(RegistryError::Version {
                path: self.path.clone(),
                found: v.get("version").map_or("none".into(), |v| v.to_string()),
            });
        }
        serde_json::from_value(v).map_err(decode)
    }

    /// Read, change and write back under the registry lock.
    pub fn update<T>(&self, f: impl FnOnce(&mut RegistryFile) -> T) -> Result<T, RegistryError> {
        let _lock = self.lock_file(&self.dir().join("registry.lock"))?;
        let mut reg = self.read()?;
        let out = f(&mut reg);
        self.write(&reg)?;
        Ok(out)
    }

    /// Serialize operations on one VM across processes: `start` checks then
    /// creates, `revertToSnapshot` removes then restores, `snapshot` creates
    /// then deletes; none of these pairs may interleave with another's.
    pub fn lock_vm(&self, session: &str) -> Result<VmLock, RegistryError> {
        let path = self.dir().join("locks").join(format!("{session}.lock"));
        Ok(VmLock {
            _lock: self.lock_file(&path)?,
        })
    }

    fn lock_file(&self, path: &Path) -> Result<Flock<File>, RegistryError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|source| RegistryError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let lock_err = |source| RegistryError::Lock {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(lock_err)?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| lock_err(e.into()))
    }

    fn write(&self, reg: &RegistryFile) -> Result<(), RegistryError> {
        let werr = |source| RegistryError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.dir();
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp).map_err(werr)?;
        let mut text = serde_json::to_vec_pretty(reg).expect("registry always serializes");
        text.push(b'\n');
        f.write_all(&text).map_err(werr)?;
        // Durable before visible: after a crash the registry is the old one
        // or the new one, never a torn file.
        f.sync_all().map_err(werr)?;
        std::fs::rename(&tmp, &self.path).map_err(werr)?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(werr)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_is_the_state_dirs_neighbour() {
        assert_eq!(
            Registry::default_path(Path::new("/var/lib/drums"), None),
            Path::new("/var/lib/drums-vmrun/registry.json")
        );
        assert_eq!(
            Registry::default_path(Path::new("/var/lib/drums"), Some("/tmp/r.json".into())),
            Path::new("/tmp/r.json")
        );
        assert_eq!(
            Registry::default_path(Path::new("/var/lib/drums"), Some("".into())),
            Path::new("/var/lib/drums-vmrun/registry.json")
        );
    }

    #[test]
    fn update_round_trips_and_absent_is_empty() {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::new(d.path().join("sub/registry.json"));
        assert_eq!(r.read().unwrap(), RegistryFile::default());
        r.update(|f| {
            f.vms.insert(
                "vm".into(),
                VmEntry {
                    vmx: "/a/vm.vmx".into(),
                    snapshots: [("s".to_owned(), "ck1".to_owned())].into(),
                },
            );
        })
        .unwrap();
        let got = r.read().unwrap();
        assert_eq!(got.version, VERSION);
        assert_eq!(got.vms["vm"].vmx, Path::new("/a/vm.vmx"));
        assert_eq!(got.vms["vm"].snapshots["s"], "ck1");
        let _l = r.lock_vm("vm").unwrap();
    }

    #[test]
    fn other_versions_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("registry.json");
        std::fs::write(&p, r#"{"version": 2, "vms": {}, "more": 1}"#).unwrap();
        let e = Registry::new(&p).read().unwrap_err();
        assert!(
            matches!(&e, RegistryError::Version { found, .. } if found == "2"),
            "{e}"
        );
        std::fs::write(&p, r#"{"vms": {}}"#).unwrap();
        assert!(matches!(
            Registry::new(&p).read(),
            Err(RegistryError::Version { .. })
        ));
        std::fs::write(&p, "not json").unwrap();
        assert!(matches!(
            Registry::new(&p).read(),
            Err(RegistryError::Decode { .. })
        ));
    }
}
