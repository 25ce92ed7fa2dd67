//! From a root to a ready session: the one path a create, a restore of
//! siblings, a rollback and a recovery all take. Each step records what it
//! makes in the ledger before making it, and is a fault point; a failure
//! leaves the rows for [`crate::teardown`] to remove (the caller's
//! `Manager::settle`).
//!
//! The steps: the session's directory, its upper layer (an empty subvolume,
//! or a snapshot of a version's files), its cgroup, the overlay root, then its
//! processes, started cold by drums-init ([`init`]) or restored by CRIU
//! ([`criu`]), its network, and last its readiness ([`ready`]).

mod criu;
mod init;
pub use init::InitFailure;
mod ready;

use drums_api::{Egress, Network, Profile, SessionState};
use std::path::{Path, PathBuf};

use drums_api::Limits;
use drums_catalog::{ResourceKind, SessionRecord};
use drums_checkpoint::Manifest;
use drums_init::InitConfig;

use crate::create::{parse_mac, random_hex, veth_name};
use crate::host::Host;
use crate::spec::DesktopSpec;
use crate::{io, process, SessionError};

/// How a session comes to be, from its root to ready.
pub(crate) struct Plan<'a> {
    /// Its limits: the cgroup's now, the upper layer's quota.
    pub limits: &'a Limits,
    /// Host root, with the devices that go with it (see crate::spec::devices).
    pub privileged: bool,
    /// The image's root: the overlay's lower layer.
    pub lower: &'a Path,
    /// The overlay's upper layer.
    pub upper: Upper,
    pub start: Start<'a>,
    pub ready: Ready<'a>,
}

/// A session's upper layer.
pub(crate) enum Upper {
    /// Empty, owned by the session's id range.
    Empty,
    /// A snapshot of a version's files, owned as the session that took it
    /// owned them (the same identity, so the same ids).
    Snapshot(PathBuf),
}

/// How its processes start.
pub(crate) enum Start<'a> {
    /// drums-init starts the session's init cold; with a light version's
    /// `last_pid`, its pid namespace gets that last pid back once the
    /// session is ready, as a CRIU restore would (crate::versions::light).
    Cold { last_pid: Option<u32> },
    /// CRIU restores the processes a version dumped.
    Restore {
        manifest: &'a Manifest,
        /// Its firewall port stayed listed (a rollback's: see
        /// [`crate::teardown::remove_owned_keeping_port`]).
        kept_port: bool,
    },
}

/// When it is ready.
pub(crate) enum Ready<'a> {
    /// A new session: its guest answers, then its desktop, if it has one,
    /// starts.
    Fresh(Option<&'a DesktopSpec>),
    /// A sibling: the guest's hygiene gives it its own identity (and a
    /// `clean` checkpoint's browser its clean profile), then it answers.
    Hygiene { clean: bool },
    /// The same session back (rollback, recovery): no hygiene, since no
    /// clone of it is alive; its guest and desktop answer.
    Same,
}

/// A step of the path, for its fault point.
#[derive(Clone, Copy)]
enum Step {
    Dir,
    Upper,
    Cgroup,
    Mount,
    Processes,
    Network,
    Ready,
}

/// The fault point of `step` on a cold path (`create.*`) or a restore's
/// (`restore.*`); crate::faults lists both.
fn point(cold: bool, step: Step) -> Option<&'static str> {
    Some(match (step, cold) {
        (Step::Dir, true) => "create.dir",
        (Step::Dir, false) => return None,
        (Step::Upper, true) => "create.subvolume",
        (Step::Upper, false) => "restore.snapshot",
        (Step::Cgroup, true) => "create.cgroup",
        (Step::Cgroup, false) => "restore.cgroup",
        (Step::Mount, true) => "create.mount",
        (Step::Mount, false) => "restore.mount",
        (Step::Processes, true) => "create.spawn",
        (Step::Processes, false) => "restore.criu",
        (Step::Network, true) => "create.network",
        (Step::Network, false) => "restore.network",
        (Step::Ready, true) => "create.ready",
        (Step::Ready, false) => "restore.hygiene",
    })
}

/// Where a session's processes run, once they do: what the network step
/// and the ledger need.
struct Made {
    dir: PathBuf,
    root: PathBuf,
    cgroup: drums_cgroup::Cgroup,
}

/// Take session `rec` (its catalog row already holds its name, address and
/// id range) from nothing to ready, as `plan` says; its init's pid.
pub(crate) async fn boot(
    host: &Host,
    rec: &SessionRecord,
    plan: Plan<'_>,
) -> Result<i32, SessionError> {
    let id = &rec.id;
    let record = |kind, key: &str| host.catalog.record(id, kind, key);
    let is_cold = matches!(plan.start, Start::Cold { .. });
    let check = |step| match point(is_cold, step) {
        Some(p) => host.faults.check(p),
        None => Ok(()),
    };

    check(Step::Dir)?;
    let dir = host.session_dir(id);
    record(ResourceKind::Dir, &dir.display().to_string())?;
    let root = dir.join("root");
    std::fs::create_dir_all(&root).map_err(io("create", &root))?;

    check(Step::Upper)?;
    let sv = host.session_subvolume(id);
    record(ResourceKind::Subvolume, &sv.display().to_string())?;
    // Born in the sessions' qgroup with its own quota: never unlimited.
    let inherit = drums_store::QgroupInherit::session(plan.limits.disk_bytes);
    let sv2 = sv.clone();
    match &plan.upper {
        Upper::Snapshot(src) => {
            let src = src.clone();
            tokio::task::spawn_blocking(move || {
                drums_store::snapshot_with(&src, &sv2, false, &inherit)
            })
            .await
            .expect("no panic")?;
        }
        Upper::Empty => {
            tokio::task::spawn_blocking(move || drums_store::create_subvolume_with(&sv2, &inherit))
                .await
                .expect("no panic")?;
            for d in ["upper", "work"] {
                std::fs::create_dir(sv.join(d)).map_err(io("create", sv.join(d)))?;
            }
            crate::ids::own_upper(&sv.join("upper"), rec.id_base)?;
        }
    }

    check(Step::Cgroup)?;
    record(
        ResourceKind::Cgroup,
        &format!("{}/{}", host.cfg.cgroup_parent, id),
    )?;
    let limits = crate::limits::cgroup_limits(plan.limits);
    let (parent, name) = (host.cfg.cgroup_parent.clone(), id.clone());
    let devices = crate::spec::devices(plan.privileged);
    let cgroup = tokio::task::spawn_blocking(move || {
        drums_cgroup::Cgroup::create(&parent, &name, &limits, devices)
    })
    .await
    .expect("no panic")?;

    // Mounted on the host until the session's own mount namespace holds it
    // (stage 1's bind, or CRIU's restored namespace).
    check(Step::Mount)?;
    record(ResourceKind::Mount, &root.display().to_string())?;
    let (r, l, s, base) = (root.clone(), plan.lower.to_owned(), sv, rec.id_base);
    let sys = host.sys.clone();
    tokio::task::spawn_blocking(move || crate::ids::mount_root(&*sys, &r, &l, &s, base))
        .await
        .expect("no panic")?;

    let made = Made { dir, root, cgroup };
    check(Step::Processes)?;
    let pid = match &plan.start {
        Start::Cold { .. } => cold(host, rec, plan.privileged, &made, check).await?,
        Start::Restore {
            manifest,
            kept_port,
        } => {
            let net_fault = check(Step::Network).err();
            criu::restore(host, rec, manifest, &made, *kept_port, net_fault).await?
        }
    };
    // Its own mount namespace holds the root now.
    host.release_host_root(id, &made.root)?;

    check(Step::Ready)?;
    match plan.ready {
        Ready::Fresh(desktop) => {
            ready::wait_ready(id, pid, host.cfg.ready_timeout).await?;
            if let Some(desktop) = desktop {
                host.faults.check("create.desktop")?;
                ready::start_desktop(pid, desktop).await?;
            }
        }
        Ready::Hygiene { clean } => ready::hygiene(&host.faults, rec, pid, clean).await?,
        Ready::Same => {
            ready::wait_ready(id, pid, host.cfg.ready_timeout).await?;
            if rec.profile == Profile::Desktop {
                ready::desktop_ready(pid).await?;
            }
        }
    }
    // Once ready, so that init and the guest have taken their pids, and
    // before anyone else can start a process in it.
    if let Start::Cold {
        last_pid: Some(last),
    } = plan.start
    {
        tokio::task::spawn_blocking(move || drums_sys::set_last_pid_in(pid, last))
            .await
            .expect("no panic")?;
    }
    Ok(pid)
}

/// drums-init's stages 0 and 1, with the network configured while stage 1
/// builds the root.
async fn cold(
    host: &Host,
    rec: &SessionRecord,
    privileged: bool,
    made: &Made,
    check: impl Fn(Step) -> Result<(), SessionError>,
) -> Result<i32, SessionError> {
    let id = &rec.id;
    let nat = rec.egress == Egress::Nat;
    let cfg = InitConfig {
        session_id: id.clone(),
        hostname: rec.hostname.clone(),
        machine_id: random_hex(16),
        ip: rec.ip.clone(),
        cgroup_procs: made.cgroup.procs_files(),
        root: made.root.clone(),
        user_namespace: rec.id_base.is_some(),
        bin_dir: host.bin_dir.clone(),
        privileged,
        nameservers: if nat {
            host.cfg
                .nameservers
                .iter()
                .map(ToString::to_string)
                .collect()
        } else {
            Vec::new()
        },
        session_api_port: host.cfg.session_api_port.filter(|_| rec.ip.is_some()),
        fault: host.faults.for_init(),
    };
    let (mut pipe, pid) = init::InitPipe::spawn(
        &*host.sys,
        &host.bin_dir.join("drums-init"),
        &cfg,
        rec.id_base,
    )
    .await?;
    // The cgroup already holds the process; this row is for reaping it.
    if let Some(key) = process::ledger_key(pid) {
        host.catalog.record(id, ResourceKind::Process, &key)?;
    }
    host.catalog
        .set_session_state(id, SessionState::Creating, Some(pid))?;

    let network = async {
        check(Step::Network)?;
        network(host, rec, pid, false).await
    };
    if let Err(e) = network.await {
        // Stage 1 runs meanwhile: the network error may only be a
        // consequence of its exit.
        return Err(pipe.cause(e).await);
    }
    pipe.go().await?;
    Ok(pid)
}

/// Session `rec`'s network, in the network namespace of `pid`: its veth on
/// the bridge (recorded first, like every link), with its own address and
/// MAC, or only its loopback. `listed`: its firewall port is still there.
pub(super) async fn network(
    host: &Host,
    rec: &SessionRecord,
    pid: i32,
    listed: bool,
) -> Result<(), SessionError> {
    match veth(host, rec, pid, listed)? {
        Some(v) => host.net.create_session_veth(&v).await?,
        None => drums_net::loopback_up(pid).await?,
    }
    Ok(())
}

/// The veth of a bridge session, recorded in the ledger, with forwarding on
/// for egress `nat`; `None` for a session without a network.
fn veth(
    host: &Host,
    rec: &SessionRecord,
    pid: i32,
    listed: bool,
) -> Result<Option<drums_net::VethSpec>, SessionError> {
    if rec.network != Network::Bridge {
        return Ok(None);
    }
    let host_name = veth_name(&rec.id);
    host.catalog
        .record(&rec.id, ResourceKind::Link, &host_name)?;
    let egress = rec.egress == Egress::Nat;
    if egress {
        host.ip_forward
            .enable()
            .map_err(drums_net::NetError::from)?;
    }
    Ok(Some(drums_net::VethSpec {
        host_name,
        bridge: host.cfg.bridge.clone(),
        netns_pid: pid,
        mac: parse_mac(rec.mac.as_deref().unwrap_or_default()),
        ip: rec
            .ip
            .as_deref()
            .and_then(|s| s.parse().ok())
            .expect("bridge sessions have an address"),
        prefix: host.cfg.prefix,
        gateway: host.gateway(),
        egress,
        listed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{CREATE_POINTS, DESKTOP_POINTS, RESTORE_POINTS};

    const STEPS: [Step; 7] = [
        Step::Dir,
        Step::Upper,
        Step::Cgroup,
        Step::Mount,
        Step::Processes,
        Step::Network,
        Step::Ready,
    ];

    /// The one path keeps the fault points a create and a restore had, in
    /// their order: what `drums`' fault tests arm by name.
    #[test]
    fn each_path_passes_its_listed_fault_points_in_order() {
        let points =
            |cold: bool| -> Vec<&str> { STEPS.iter().filter_map(|s| point(cold, *s)).collect() };
        let drumsd_side = |all: &[&'static str]| -> Vec<&'static str> {
            all.iter()
                .copied()
                .filter(|p| !p.starts_with("init."))
                .collect()
        };
        assert_eq!(points(true), drumsd_side(CREATE_POINTS));
        assert_eq!(points(false), RESTORE_POINTS);
        // The desktop's own points are checked by the ready step itself.
        assert_eq!(DESKTOP_POINTS, ["create.desktop", "restore.desktop"]);
    }
}
