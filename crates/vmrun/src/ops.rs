//! Each vmrun command as drumsd API calls. See docs/vmrun.md for the mapping.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use drums_api::exec::enc;
use drums_api::{
    Checkpoint, CheckpointList, Client, ClientError, CreateCheckpoint, RestoreRequest,
    RestoreResult, Session, SessionList, SessionState,
};
use hyper::Method;

use crate::registry::{Registry, RegistryError, RegistryFile, VmEntry};
use crate::vmx::{self, Spec};

/// How long `getGuestIPAddress -wait`, and any command meeting a session
/// still being created or removed by someone else, waits.
pub const WAIT: Duration = Duration::from_secs(60);

/// Where an error happened: the vmrun command and its `.vmx` path.
#[derive(Debug, Clone)]
pub struct At {
    pub verb: &'static str,
    pub vmx: Option<PathBuf>,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.vmx {
            Some(p) => write!(f, "{} {}", self.verb, p.display()),
            None => f.write_str(self.verb),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{at}: the virtual machine is not powered on (no running drums session {session:?})")]
    NotRunning { at: At, session: String },
    #[error("{at}: a snapshot with the name does not exist: {name:?} (no drums checkpoint {checkpoint:?})")]
    NoSnapshot {
        at: At,
        name: String,
        checkpoint: String,
    },
    #[error("{at}: snapshot name {name:?} gives the checkpoint name {checkpoint:?}, which drums refuses: use letters, digits, '_', '.' or '-', 63 characters in all")]
    BadSnapshotName {
        at: At,
        name: String,
        checkpoint: String,
    },
    #[error("{at}: session {session:?} is running as the VM of {other}; stop it there first")]
    InUse {
        at: At,
        session: String,
        other: String,
    },
    #[error("{at}: unable to get the IP address: session {session:?} has network {network:?}")]
    NoAddress {
        at: At,
        session: String,
        network: String,
    },
    #[error("{at}: timed out after {}s waiting for {what}", WAIT.as_secs())]
    Timeout { at: At, what: String },
    #[error("{at}: {what}")]
    Api {
        at: At,
        what: String,
        #[source]
        source: ClientError,
    },
    #[error("{at}")]
    Registry {
        at: At,
        #[source]
        source: RegistryError,
    },
}

/// What a command prints: stdout, and warnings for stderr.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub warnings: Vec<String>,
}

impl Outcome {
    fn empty() -> Outcome {
        Outcome::default()
    }
}

pub struct Ctx {
    pub client: Client,
    pub registry: Registry,
}

/// One `.vmx` a command acts on.
pub struct Vm<'a> {
    pub at: At,
    /// Absolute and lexically normalized, as it is recorded and listed.
    pub vmx: PathBuf,
    pub spec: &'a Spec,
}

impl Ctx {
    fn api(&self, at: &At, what: impl Into<String>) -> impl FnOnce(ClientError) -> OpError {
        let at = at.clone();
        let what = what.into();
        move |source| OpError::Api { at, what, source }
    }

    fn reg(&self, at: &At) -> impl FnOnce(RegistryError) -> OpError {
        let at = at.clone();
        move |source| OpError::Registry { at, source }
    }

    async fn session(&self, at: &At, name: &str) -> Result<Option<Session>, OpError> {
        match self
            .client
            .json::<Session>(
                Method::GET,
                &format!("/v1/sessions/{}", enc(name)),
                None::<&()>,
            )
            .await
        {
            Ok(s) => Ok(Some(s)),
            Err(ClientError::Api { status: 404, .. }) => Ok(None),
            Err(e) => Err(self.api(at, format!("get session {name:?}"))(e)),
        }
    }

    /// The session once it is neither being created nor removed (by a
    /// concurrent create, or a removal in progress): running, or gone.
    async fn settled(&self, at: &At, name: &str) -> Result<Option<Session>, OpError> {
        let mut p = Poll::new();
        loop {
            match self.session(at, name).await? {
                Some(s) if s.state != SessionState::Running => {
                    p.sleep(at, || {
                        format!("session {name:?} to leave state {:?}", s.state)
                    })
                    .await?
                }
                s => return Ok(s),
            }
        }
    }

    async fn checkpoints(&self, at: &At) -> Result<Vec<Checkpoint>, OpError> {
        let l: CheckpointList = self
            .client
            .json(Method::GET, "/v1/checkpoints", None::<&()>)
            .await
            .map_err(self.api(at, "list checkpoints"))?;
        Ok(l.checkpoints)
    }

    /// Refuse to take over a session another `.vmx` runs: two paths with one
    /// `displayName` would otherwise reset each other's VM.
    fn check_owner(&self, vm: &Vm<'_>, reg: &RegistryFile, running: bool) -> Result<(), OpError> {
        match reg.vms.get(&vm.spec.name) {
            Some(e) if running && e.vmx != vm.vmx => Err(OpError::InUse {
                at: vm.at.clone(),
                session: vm.spec.name.clone(),
                other: e.vmx.display().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Record that `vm.vmx` is the VM of its session.
    fn claim(&self, vm: &Vm<'_>) -> Result<(), OpError> {
        self.registry
            .update(|f| {
                f.vms.entry(vm.spec.name.clone()).or_default().vmx = vm.vmx.clone();
            })
            .map_err(self.reg(&vm.at))
    }
}

/// `list`: every registered `.vmx` whose session drumsd reports running.
pub async fn list(ctx: &Ctx) -> Result<Outcome, OpError> {
    let at = At {
        verb: "list",
        vmx: None,
    };
    let reg = ctx.registry.read().map_err(ctx.reg(&at))?;
    let l: SessionList = ctx
        .client
        .json(Method::GET, "/v1/sessions", None::<&()>)
        .await
        .map_err(ctx.api(&at, "list sessions"))?;
    let running: BTreeSet<&str> = l
        .sessions
        .iter()
        .filter(|s| s.state == SessionState::Running)
        .map(|s| s.name.as_str())
        .collect();
    let paths: Vec<&Path> = reg
        .vms
        .iter()
        .filter(|(name, _)| running.contains(name.as_str()))
        .map(|(_, e)| e.vmx.as_path())
        .collect();
    let mut out = format!("Total running VMs: {}\n", paths.len());
    for p in paths {
        out.push_str(&format!("{}\n", p.display()));
    }
    Ok(Outcome {
        stdout: out,
        warnings: vec![],
    })
}

/// `start`: create the session unless it runs already.
pub async fn start(ctx: &Ctx, vm: &Vm<'_>) -> Result<Outcome, OpError> {
    let name = &vm.spec.name;
    let _lock = ctx.registry.lock_vm(name).map_err(ctx.reg(&vm.at))?;
    let running = ctx.settled(&vm.at, name).await?.is_some();
    let reg = ctx.registry.read().map_err(ctx.reg(&vm.at))?;
    ctx.check_owner(vm, &reg, running)?;
    if !running {
        let _: Session = ctx
            .client
            .json(
                Method::POST,
                "/v1/sessions",
                Some(&vm.spec.create_request()),
            )
            .await
            .map_err(ctx.api(&vm.at, format!("create session {name:?}")))?;
    }
    ctx.claim(vm)?;
    Ok(Outcome::empty())
}

/// `getGuestIPAddress`: the session's address; with `-wait`, once it has one.
pub async fn guest_ip(ctx: &Ctx, vm: &Vm<'_>, wait: bool) -> Result<Outcome, OpError> {
    let name = &vm.spec.name;
    let mut p = Poll::new();
    loop {
        let s = ctx
            .session(&vm.at, name)
            .await?
            .ok_or_else(|| OpError::NotRunning {
                at: vm.at.clone(),
                session: name.clone(),
            })?;
        if s.network == drums_api::Network::None {
            return Err(OpError::NoAddress {
                at: vm.at.clone(),
                session: name.clone(),
                network: s.network.to_string(),
            });
        }
        if let (true, Some(ip)) = (s.state == SessionState::Running, &s.ip) {
            return Ok(Outcome {
                stdout: format!("{ip}\n"),
                warnings: vec![],
            });
        }
        if !wait {
            return Err(OpError::NotRunning {
                at: vm.at.clone(),
                session: name.clone(),
            });
        }
        p.sleep(&vm.at, || format!("session {name:?} to get an address"))
            .await?;
    }
}

/// The checkpoint name of snapshot `snap` of session `vm`.
pub fn checkpoint_name(vm: &str, snap: &str) -> String {
    format!("{vm}.{snap}")
}

/// The checkpoint a snapshot name stands for: the one the registry recorded,
/// else (a registry lost, or a checkpoint made with `drums checkpoint --name`)
/// the checkpoint with the snapshot's own name that no other snapshot claims.
pub fn resolve<'c>(
    reg: &RegistryFile,
    cks: &'c [Checkpoint],
    vm: &str,
    snap: &str,
) -> Option<&'c Checkpoint> {
    let recorded = reg.vms.get(vm).and_then(|e| e.snapshots.get(snap));
    if let Some(c) = recorded.and_then(|id| cks.iter().find(|c| &c.id == id)) {
        return Some(c);
    }
    let claimed: BTreeSet<&str> = reg
        .vms
        .values()
        .flat_map(|e| e.snapshots.values().map(String::as_str))
        .collect();
    let base = checkpoint_name(vm, snap);
    cks.iter()
        .find(|c| c.name == base && !claimed.contains(c.id.as_str()))
}

/// A free checkpoint name for a new snapshot: its own name if free (the usual
/// case), else `NAME.2`, `NAME.3`, ... Checkpoint names are unique in the
/// catalog, and a replaced snapshot's old checkpoint is deleted only once the
/// new one exists, so a replacement needs a second name for a moment.
pub fn free_name(cks: &[Checkpoint], base: &str) -> Option<String> {
    let taken: BTreeSet<&str> = cks.iter().map(|c| c.name.as_str()).collect();
    std::iter::once(base.to_owned())
        .chain((2..).map(|k| format!("{base}.{k}")))
        .take(1000)
        .find(|n| !taken.contains(n.as_str()))
        .filter(|n| vmx::is_valid_name(n))
}

/// `snapshot`: checkpoint the running session (it keeps running); a snapshot
/// of the same name is replaced, the old checkpoint deleted only after the
/// new one is published and recorded, so a failure keeps the old snapshot.
pub async fn snapshot(ctx: &Ctx, vm: &Vm<'_>, snap: &str) -> Result<Outcome, OpError> {
    let name = &vm.spec.name;
    let base = checkpoint_name(name, snap);
    let bad_name = || OpError::BadSnapshotName {
        at: vm.at.clone(),
        name: snap.to_owned(),
        checkpoint: base.clone(),
    };
    if !vmx::is_valid_name(&base) {
        return Err(bad_name());
    }
    let _lock = ctx.registry.lock_vm(name).map_err(ctx.reg(&vm.at))?;
    let s = ctx
        .settled(&vm.at, name)
        .await?
        .ok_or_else(|| OpError::NotRunning {
            at: vm.at.clone(),
            session: name.clone(),
        })?;
    let cks = ctx.checkpoints(&vm.at).await?;
    let reg = ctx.registry.read().map_err(ctx.reg(&vm.at))?;
    let old = resolve(&reg, &cks, name, snap).cloned();
    let new_name = free_name(&cks, &base).ok_or_else(bad_name)?;
    let req = CreateCheckpoint {
        session: s.id.clone(),
        name: Some(new_name.clone()),
        clean: true,
        leave_running: true,
    };
    let new: Checkpoint = ctx
        .client
        .json(Method::POST, "/v1/checkpoints", Some(&req))
        .await
        .map_err(ctx.api(
            &vm.at,
            format!("checkpoint session {name:?} as {new_name:?}"),
        ))?;
    ctx.registry
        .update(|f| {
            let e = f.vms.entry(name.clone()).or_insert_with(|| VmEntry {
                vmx: vm.vmx.clone(),
                ..VmEntry::default()
            });
            e.snapshots.insert(snap.to_owned(), new.id.clone());
        })
        .map_err(ctx.reg(&vm.at))?;
    let mut warnings = vec![];
    if let Some(old) = old.filter(|o| o.id != new.id) {
        if let Err(e) = ctx
            .client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", enc(&old.id)),
                None::<&()>,
            )
            .await
        {
            // The new snapshot is in place; only disk space is at stake.
            warnings.push(format!(
                "{}: delete the replaced checkpoint {} ({:?}): {e}",
                vm.at, old.id, old.name
            ));
        }
    }
    Ok(Outcome {
        stdout: String::new(),
        warnings,
    })
}

/// `revertToSnapshot`: remove the session, then restore the snapshot's
/// checkpoint under the session's name. An unknown snapshot changes nothing.
pub async fn revert(ctx: &Ctx, vm: &Vm<'_>, snap: &str) -> Result<Outcome, OpError> {
    let name = &vm.spec.name;
    let _lock = ctx.registry.lock_vm(name).map_err(ctx.reg(&vm.at))?;
    let cks = ctx.checkpoints(&vm.at).await?;
    let reg = ctx.registry.read().map_err(ctx.reg(&vm.at))?;
    let ck = resolve(&reg, &cks, name, snap).ok_or_else(|| OpError::NoSnapshot {
        at: vm.at.clone(),
        name: snap.to_owned(),
        checkpoint: checkpoint_name(name, snap),
    })?;
    let running = ctx.settled(&vm.at, name).await?.is_some();
    ctx.check_owner(vm, &reg, running)?;
    if running {
        // Gone meanwhile is as good as removed.
        remove_session(ctx, vm).await?;
    }
    let req = RestoreRequest {
        count: 1,
        name: Some(name.clone()),
    };
    let _: RestoreResult = ctx
        .client
        .json(
            Method::POST,
            &format!("/v1/checkpoints/{}/restore", enc(&ck.id)),
            Some(&req),
        )
        .await
        .map_err(ctx.api(
            &vm.at,
            format!(
                "restore checkpoint {} ({:?}) as session {name:?}",
                ck.id, ck.name
            ),
        ))?;
    ctx.claim(vm)?;
    Ok(Outcome::empty())
}

/// `stop`: remove the session. Its snapshots stay.
pub async fn stop(ctx: &Ctx, vm: &Vm<'_>) -> Result<Outcome, OpError> {
    let name = &vm.spec.name;
    let _lock = ctx.registry.lock_vm(name).map_err(ctx.reg(&vm.at))?;
    if remove_session(ctx, vm).await? {
        Ok(Outcome::empty())
    } else {
        Err(OpError::NotRunning {
            at: vm.at.clone(),
            session: name.clone(),
        })
    }
}

/// Remove the VM's session: whether there was one to remove.
async fn remove_session(ctx: &Ctx, vm: &Vm<'_>) -> Result<bool, OpError> {
    let name = &vm.spec.name;
    match ctx
        .client
        .call(
            Method::DELETE,
            &format!("/v1/sessions/{}", enc(name)),
            None::<&()>,
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(ClientError::Api { status: 404, .. }) => Ok(false),
        Err(e) => Err(ctx.api(&vm.at, format!("remove session {name:?}"))(e)),
    }
}

/// Absolute and lexically normalized, as Python's
/// `os.path.abspath(os.path.normpath(p))`, which is how OSWorld compares the
/// paths `list` prints with its own. Symlinks are deliberately not resolved:
/// a resolved path would never equal the one OSWorld was given.
pub fn normalize(p: &Path) -> std::io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Sleeps between polls, growing from 50 ms to 1 s, until [`WAIT`] is spent.
struct Poll {
    deadline: Instant,
    delay: Duration,
}

impl Poll {
    fn new() -> Poll {
        Poll {
            deadline: Instant::now() + WAIT,
            delay: Duration::from_millis(50),
        }
    }

    async fn sleep(&mut self, at: &At, what: impl FnOnce() -> String) -> Result<(), OpError> {
        if Instant::now() >= self.deadline {
            return Err(OpError::Timeout {
                at: at.clone(),
                what: what(),
            });
        }
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(id: &str, name: &str) -> Checkpoint {
        Checkpoint {
            id: id.into(),
            name: name.into(),
            session_id: "s".into(),
            created_at_ms: 0,
            clean: true,
            profile: "headless".into(),
            image: "default".into(),
            format_version: 1,
            images_bytes: 0,
            dump_ms: 0.0,
            frozen_ms: 0.0,
        }
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(
            normalize(Path::new("/a/./b/../c.vmx")).unwrap(),
            Path::new("/a/c.vmx")
        );
        let rel = normalize(Path::new("x.vmx")).unwrap();
        assert!(rel.is_absolute());
        assert_eq!(rel, std::env::current_dir().unwrap().join("x.vmx"));
    }

    #[test]
    fn free_names_alternate() {
        assert_eq!(free_name(&[], "vm.s").unwrap(), "vm.s");
        assert_eq!(free_name(&[ck("1", "vm.s")], "vm.s").unwrap(), "vm.s.2");
        assert_eq!(
            free_name(&[ck("1", "vm.s"), ck("2", "vm.s.2")], "vm.s").unwrap(),
            "vm.s.3"
        );
        assert_eq!(free_name(&[ck("2", "vm.s.2")], "vm.s").unwrap(), "vm.s");
        let long = "x".repeat(63);
        assert_eq!(free_name(&[ck("1", &long)], &long), None);
    }

    #[test]
    fn resolve_prefers_the_registry_and_skips_claimed_names() {
        let cks = [ck("a", "vm.s"), ck("b", "vm.s.2"), ck("c", "vm.t")];
        let mut reg = RegistryFile::default();
        // No record: the checkpoint named like the snapshot.
        assert_eq!(resolve(&reg, &cks, "vm", "s").unwrap().id, "a");
        assert_eq!(resolve(&reg, &cks, "vm", "t").unwrap().id, "c");
        assert!(resolve(&reg, &cks, "vm", "u").is_none());
        assert!(resolve(&reg, &cks, "other", "s").is_none());
        // Snapshot s was replaced: it is now b, under the second name.
        reg.vms.insert(
            "vm".into(),
            VmEntry {
                vmx: "/vm.vmx".into(),
                snapshots: [("s".to_owned(), "b".to_owned())].into(),
            },
        );
        assert_eq!(resolve(&reg, &cks, "vm", "s").unwrap().id, "b");
        // "s.2" is not a snapshot: its would-be checkpoint belongs to s.
        assert!(resolve(&reg, &cks, "vm", "s.2").is_none());
        // A recorded checkpoint deleted behind vmrun's back: fall back.
        reg.vms
            .get_mut("vm")
            .unwrap()
            .snapshots
            .insert("t".into(), "gone".into());
        assert_eq!(resolve(&reg, &cks, "vm", "t").unwrap().id, "c");
    }
}
