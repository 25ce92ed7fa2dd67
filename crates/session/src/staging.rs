//! The tmpfs CRIU dumps a version's images into (`STATE/dump-staging`),
//! before drums_checkpoint::share copies them to the store sharing the
//! parent version's pages. In memory, so the dump itself writes nothing to
//! disk. A dump gets a directory there only if the session's memory (more
//! than CRIU will write: it counts the page cache too) fits in what the
//! tmpfs has free after the dumps already under way; otherwise it dumps into
//! the store, every page written, as before staging existed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::faults::Faults;
use crate::SessionError;

pub(crate) struct Staging {
    root: PathBuf,
    /// Bytes promised to the dumps under way.
    reserved: Arc<Mutex<u64>>,
}

/// One dump's directory in the staging tmpfs, and its share of the room:
/// both given back when it is dropped.
pub(crate) struct Staged {
    dir: PathBuf,
    bytes: u64,
    reserved: Arc<Mutex<u64>>,
}

impl Staging {
    pub(crate) fn new(root: PathBuf) -> Staging {
        Staging {
            root,
            reserved: Arc::default(),
        }
    }

    /// A directory for version `id`'s dump, if `need` bytes (the session's
    /// memory; unknown: no) fit; `None` when the dump goes to the store.
    /// The fault `checkpoint.staging` refuses it as if there were no room.
    pub(crate) fn reserve(
        &self,
        faults: &Faults,
        id: &str,
        need: Option<u64>,
    ) -> Result<Option<Staged>, SessionError> {
        let Some(need) = need.filter(|_| faults.check("checkpoint.staging").is_ok()) else {
            return Ok(None);
        };
        let free = nix::sys::statvfs::statvfs(&self.root)
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(0);
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        if reserved.saturating_add(need) > free {
            tracing::info!(
                version = id,
                need,
                free,
                reserved = *reserved,
                "the dump goes to the store: the staging tmpfs has no room for it"
            );
            return Ok(None);
        }
        let dir = self.root.join(id);
        std::fs::create_dir(&dir).map_err(|source| SessionError::Io {
            op: "create",
            path: dir.clone(),
            source,
        })?;
        *reserved += need;
        Ok(Some(Staged {
            dir,
            bytes: need,
            reserved: self.reserved.clone(),
        }))
    }
}

impl Staged {
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("remove {}: {e}", self.dir.display());
        }
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        *reserved = reserved.saturating_sub(self.bytes);
    }
}
