//! A session's processes restored by CRIU from a version's images, into the
//! root, cgroup and network [`super::boot`] made for them.

use drums_api::SessionState;
use std::path::{Path, PathBuf};

use drums_catalog::{ResourceKind, SessionRecord};
use drums_checkpoint::Manifest;

use super::Made;
use crate::checkpoint::{external_mounts_restore, network_lock};
use crate::host::Host;
use crate::restore::process_artifact;
use crate::{io, process, SessionError};

/// Restore version `m`'s processes as session `rec`; its root's pid.
/// `net_fault`: the armed `restore.network` fault, failed inside CRIU's
/// notification as a real network error would be.
pub(super) async fn restore(
    host: &Host,
    rec: &SessionRecord,
    m: &Manifest,
    made: &Made,
    kept_port: bool,
    mut net_fault: Option<SessionError>,
) -> Result<i32, SessionError> {
    let id = &rec.id;
    let record = |kind, key: &str| host.catalog.record(id, kind, key);
    // The network namespace comes back empty and is built here, in CRIU's
    // setup-namespaces notification (the tree exists, nothing runs, no
    // socket is restored yet), by the same code as a cold session's: no
    // forked `ip`, and the sibling's own address and MAC from the start.
    // CRIU creates the veth pair; it is recorded first like every link.
    let veth = super::veth(host, rec, 0, kept_port)?;
    let images = host.checkpoint_dir(process_artifact(m)?).join("images");
    // A sibling's view of the images is made of hard links, which cannot
    // cross filesystems: beside the images, in the store, for a version's
    // (recorded, and removed once CRIU is done); in the session's directory
    // for one an older drums left in the state directory.
    let in_store = images.starts_with(&host.store_root);
    let view = match in_store {
        true => host.store_root.join(crate::host::RESTORE_VIEWS).join(id),
        false => made.dir.join("images"),
    };
    if in_store && rec.id_base.is_some() {
        record(ResourceKind::Dir, &view.display().to_string())?;
    }
    let images_dir = sibling_images(&images, &view, rec.id_base)?;
    let opts = drums_criu::RestoreOpts {
        images_dir: images_dir.clone(),
        work_dir: made.dir.clone(),
        root: made.root.clone(),
        external_mounts: external_mounts_restore(&host.bin_dir),
        veth_pairs: vec![],
        join_cgroups: made.cgroup.procs_files(),
        network_lock: network_lock(rec.network),
        // As the dump decided: its images have a stream per connection
        // it kept (crate::checkpoint, connections_within).
        tcp_established: drums_criu::kept_connections(&images_dir),
        empty_net: true,
    };
    let (criu, net, rt) = (
        host.criu.clone(),
        host.net.clone(),
        tokio::runtime::Handle::current(),
    );
    // The root's pid, as soon as it exists: recorded in the ledger even if
    // the restore then fails, so the teardown kills and reaps it (it is
    // drumsd's child, and nobody else would reap it).
    let root_pid = std::sync::Arc::new(std::sync::Mutex::new(None));
    let noted = root_pid.clone();
    let restored = tokio::task::spawn_blocking(move || {
        criu.restore(&opts, &mut |script, pid| {
            if script != drums_criu::script::SETUP_NAMESPACES {
                return Ok(());
            }
            *noted.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((pid, process::ledger_key(pid)));
            // CRIU asks no callback again after a failed one.
            if let Some(e) = net_fault.take() {
                return Err(e.into());
            }
            let r = match &veth {
                Some(v) => rt.block_on(net.create_session_veth(&drums_net::VethSpec {
                    netns_pid: pid,
                    ..v.clone()
                })),
                None => rt.block_on(drums_net::loopback_up(pid)),
            };
            Ok(r?)
        })
    })
    .await
    .expect("restore task does not panic");
    if in_store && images_dir == view {
        if let Err(e) = std::fs::remove_dir_all(&view) {
            tracing::warn!("remove {}: {e}", view.display());
        }
    }
    let noted = root_pid.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((_, Some(key))) = &noted {
        record(ResourceKind::Process, key)?;
    }
    let pid = restored?.pid;
    if noted.map(|(p, _)| p) != Some(pid) {
        if let Some(key) = process::ledger_key(pid) {
            record(ResourceKind::Process, &key)?;
        }
    }
    host.catalog
        .set_session_state(id, SessionState::Creating, Some(pid))?;
    Ok(pid)
}

/// The images a sibling restores from. Without a range, the checkpoint's own
/// (shared, read-only, by every concurrent restore). With one, the sibling's
/// directory `view` (on the images' filesystem) that hard-links every image
/// but the user namespace's, which is rewritten with the sibling's range:
/// CRIU would otherwise give every sibling the range of the session it was
/// dumped from.
fn sibling_images(images: &Path, view: &Path, base: Option<u32>) -> Result<PathBuf, SessionError> {
    use drums_criu::userns_image;
    let Some(base) = base else {
        return Ok(images.to_owned());
    };
    let Some(userns) = userns_image::find(images)? else {
        return Err(SessionError::Invalid(format!(
            "checkpoint images in {} have no user namespace, though its manifest says the session had one",
            images.display()
        )));
    };
    std::fs::create_dir(view).map_err(io("create", view))?;
    let list = std::fs::read_dir(images).map_err(io("list", images))?;
    for e in list {
        let name = e.map_err(io("list", images))?.file_name();
        if name.to_string_lossy() == userns {
            continue;
        }
        // A hard link, not a symlink: CRIU opens images from the restored
        // tasks too, as the sibling's range, which may not walk a symlink's
        // path through drumsd's state directory (0700). Both are in it.
        let link = view.join(&name);
        std::fs::hard_link(images.join(&name), &link).map_err(io("link", &link))?;
    }
    let maps = userns_image::read(&images.join(&userns))?;
    let from = maps.uid.first().map(|e| e.lower_first).unwrap_or(0);
    let moved = userns_image::rebase(&maps, from, base, crate::ids::RANGE).ok_or_else(|| {
        SessionError::Invalid(format!(
            "checkpoint's user namespace maps {maps:?} are not one drums range"
        ))
    })?;
    userns_image::write(&view.join(&userns), &moved)?;
    Ok(view.to_owned())
}
