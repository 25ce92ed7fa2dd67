//! Restoring a checkpoint as N hygienic siblings, concurrently. Each sibling
//! gets its own writable snapshot of the checkpoint's file-system artifact, its
//! own cgroups, network namespace, veth, address and MAC, hostname and
//! machine-id; then the guest agent runs the in-session hygiene (RNG reseed of
//! registered processes, the restore generation). Every step is recorded
//! before it is made, like a create, and fails through the same teardown.

use drums_api::{Egress, Network, SessionState};
use drums_api::{RestoreResult, Session};
use drums_catalog::SessionRecord;
use drums_checkpoint::Manifest;
use tracing::warn;

use crate::boot::{boot, Plan, Ready, Start, Upper};
use crate::create::random_hex;
use crate::manager::Manager;
use crate::spec::{hostname_for, parse_egress, parse_network};
use crate::SessionError;

/// Most siblings one restore call may start.
pub const MAX_SIBLINGS: usize = 64;

/// A restore's (or a fork's) sibling count and name, checked before anything
/// is made: a fork checks them before it checkpoints.
pub fn check_siblings(count: usize, name: Option<&str>) -> Result<(), SessionError> {
    if count == 0 || count > MAX_SIBLINGS {
        return Err(SessionError::Invalid(format!(
            "count {count}: restore 1 to {MAX_SIBLINGS} siblings at a time"
        )));
    }
    if let Some(n) = name {
        if count != 1 {
            return Err(SessionError::Invalid(format!(
                "a name is only accepted for a single sibling, not for count {count}"
            )));
        }
        crate::spec::validate_name(n)?;
    }
    Ok(())
}

impl Manager {
    /// Restore `count` siblings of a checkpoint; all or nothing. A single
    /// sibling may be given a `name` (as `vmrun revertToSnapshot` needs, to
    /// keep a VM's name across reverts); otherwise each is named by its id.
    pub async fn restore(
        &self,
        checkpoint: &str,
        count: usize,
        name: Option<&str>,
    ) -> Result<RestoreResult, SessionError> {
        self.restore_as(checkpoint, count, name, None).await
    }

    /// [`Manager::restore`] of siblings that are members of warm pool
    /// `pool` from their first row on (see crate::pools): a crash while they
    /// are made leaves pool members, which the sweep removes, never sessions
    /// of nobody's.
    pub async fn restore_into_pool(
        &self,
        checkpoint: &str,
        count: usize,
        pool: &str,
    ) -> Result<RestoreResult, SessionError> {
        self.restore_as(checkpoint, count, None, Some(pool)).await
    }

    async fn restore_as(
        &self,
        checkpoint: &str,
        count: usize,
        name: Option<&str>,
        pool: Option<&str>,
    ) -> Result<RestoreResult, SessionError> {
        check_siblings(count, name)?;
        // Shared with other restores, never with a remove of the checkpoint,
        // which would delete the images and snapshot this reads (see `busy`).
        // Read again under the lock: a remove that came first leaves nothing.
        let id = self.manifest(checkpoint)?.0.id;
        let _held = self.checkpoints.reading(&id).await;
        let (ck, m) = self.manifest(&id)?;
        // Refused before CRIU runs: another host's checkpoint, or damaged images.
        m.host.check_restorable_on(&self.host.fingerprint)?;
        // A light version's siblings start cold on its files: its
        // processes were only drums' own (crate::versions::light).
        if !m.is_light() {
            let process_of = process_artifact(&m)?;
            let images = self.host.checkpoint_dir(process_of).join("images");
            self.checkpoints
                .verify(process_of, &images, &m.images)
                .await?;
        }
        // Before anything is made: the siblings' limits, the checkpoint's own
        // with today's defaults where it names none.
        let limits = self.host.manifest_limits(&ck.id, &m)?;
        // Looked up once for all siblings: their overlay's lower layer.
        let lower = self.resolve_image(&m.session.image)?.rootfs;

        let results = futures::future::join_all(
            (0..count).map(|_| self.restore_one(&m, &limits, &lower, name, pool)),
        )
        .await;
        let mut sessions = Vec::new();
        let mut first_err = None;
        for r in results {
            match r {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            for s in &sessions {
                if let Err(t) = self.remove(&s.id).await {
                    warn!(
                        "remove sibling {} after a failed restore: {}",
                        s.id,
                        crate::error_chain(&t)
                    );
                }
            }
            return Err(e);
        }
        Ok(RestoreResult {
            checkpoint_kept: true,
            checkpoint: ck.id,
            sessions,
        })
    }

    async fn restore_one(
        &self,
        m: &Manifest,
        limits: &drums_api::Limits,
        lower: &std::path::Path,
        name: Option<&str>,
        pool: Option<&str>,
    ) -> Result<Session, SessionError> {
        // An imported manifest is untrusted: only a known value passes.
        let egress = parse_egress(&m.session.egress)?;
        let network = parse_network(&m.session.network)?;
        let profile = m
            .session
            .profile
            .parse::<drums_api::Profile>()
            .map_err(|e| SessionError::refused("the checkpoint's manifest", e))?;
        if egress == Egress::Nat && network != Network::Bridge {
            return Err(SessionError::Invalid(
                "checkpoint has egress nat without network bridge".into(),
            ));
        }
        let id = random_hex(6);
        let name = name.map_or_else(|| id.clone(), str::to_owned);
        let rec = SessionRecord {
            hostname: hostname_for(&name, &id),
            name,
            id,
            profile,
            image: m.session.image.clone(),
            state: SessionState::Creating,
            network,
            // A sibling keeps its checkpoint's egress.
            egress,
            ip: None,
            mac: None,
            limits: serde_json::to_value(limits).expect("limits serialize"),
            init_pid: None,
            created_at_ms: drums_catalog::now_ms(),
            generation: m.session.generation + 1,
            origin: Some(m.id.clone()),
            privileged: m.session.privileged,
            id_base: None,
            pool: pool.map(str::to_owned),
        };
        if m.session.privileged && m.session.user_namespace {
            return Err(SessionError::Invalid(
                "checkpoint is both privileged and in a user namespace".into(),
            ));
        }
        let pool = (rec.network == Network::Bridge).then(|| self.host.pool());
        // Each sibling of a checkpoint taken in a user namespace gets a range
        // of its own (see crate::ids).
        let ids = m.session.user_namespace.then_some(crate::ids::POOL);
        let rec = self
            .host
            .catalog
            .insert_session(rec, pool, ids, self.host.cfg.max_sessions)?;
        let cold = match m.is_light() {
            true => Some(crate::spec::Spec::of_version(&m.session, limits.clone())?),
            false => None,
        };
        let plan = Plan {
            limits,
            privileged: m.session.privileged,
            lower,
            // The sibling's own quota, set in the snapshot ioctl itself: the
            // same budget for new writes as its checkpoint's session had.
            upper: Upper::Snapshot(self.host.checkpoint_snapshot(m.files_of())),
            start: match &cold {
                None => Start::Restore {
                    manifest: m,
                    kept_port: false,
                },
                Some(_) => Start::Cold {
                    last_pid: m.last_pid(),
                },
            },
            // A cold start is a new session's: its own identity from the
            // start, no hygiene to run.
            ready: match &cold {
                None => Ready::Hygiene { clean: m.clean },
                Some(spec) => Ready::Fresh(spec.desktop.as_ref()),
            },
        };
        let built = boot(&self.host, &rec, plan).await;
        self.settle(&rec, built).await
    }
}

/// The version whose CRIU images a restore uses; a version without process
/// state (the `files` policy) has none to restore.
pub(crate) fn process_artifact(m: &Manifest) -> Result<&str, SessionError> {
    m.process_of().ok_or_else(|| {
        SessionError::Conflict(format!(
            "version {} holds files only (the files policy, or a light version): it has no processes to restore",
            m.id
        ))
    })
}
