//! Test-only fault injection. drumsd arms one point at a time, and only when it
//! was started with `--enable-fault-injection`; the steps check it with
//! [`Faults::check`]. Points named `init.*` fire inside drums-init.

use std::sync::Mutex;

use crate::SessionError;

/// Every point a create can be failed at, in the order the steps run.
pub const CREATE_POINTS: &[&str] = &[
    "create.dir",
    "create.subvolume",
    "create.cgroup",
    "create.mount",
    "init.cgroup",
    "init.unshare",
    "create.spawn",
    "init.mount",
    "init.pivot",
    "create.network",
    "init.exec",
    "create.ready",
];

/// Every point a checkpoint can be failed at: `checkpoint.commit` after the
/// first of its images is copied from the staging tmpfs to the store.
pub const CHECKPOINT_POINTS: &[&str] = &[
    "checkpoint.dir",
    "checkpoint.criu",
    "checkpoint.snapshot",
    "checkpoint.commit",
    "version.manifest",
];

/// Points where a dump's shortcuts (drums_checkpoint::share) can be refused,
/// the dump then taken the slow way: `checkpoint.staging`, as if the staging
/// tmpfs had no room (CRIU dumps into the store); `checkpoint.share`, as if
/// the parent version's images could not be read (every page is written).
pub const SHARE_POINTS: &[&str] = &["checkpoint.staging", "checkpoint.share"];

/// Every point a restore can be failed at, per sibling.
pub const RESTORE_POINTS: &[&str] = &[
    "restore.snapshot",
    "restore.cgroup",
    "restore.mount",
    "restore.criu",
    "restore.network",
    "restore.hygiene",
];

/// Every point an export can be failed at: `export.tar` fails the stream
/// after its first members were sent, as a tar that dies part-way would.
pub const EXPORT_POINTS: &[&str] = &["export.tar"];

/// Every point an image pull or import can be failed at: before its first
/// blob is fetched or unpacked, after its first layer is stored, and
/// before the image is committed (which can also be held: drumsd killed
/// with layers stored and no image).
pub const IMAGE_POINTS: &[&str] = &["image.fetch", "image.layer", "image.commit"];

/// Points only a desktop session passes: its desktop's start, and the
/// browser's hygiene and readiness after a restore.
pub const DESKTOP_POINTS: &[&str] = &["create.desktop", "restore.desktop"];

/// Points a rollback in place can be failed at: half-way through putting
/// the version's files back (the rollback then restores with CRIU).
pub const ROLLBACK_POINTS: &[&str] = &["rollback.files"];

/// Points a light version (crate::versions::light) can be refused at, each
/// then taken whole: `version.light`, the check of the session's processes
/// once frozen, as if one were not drums' own; `version.light.after`, the
/// check once the files are snapshotted, as if a process had run meanwhile
/// (the snapshot is deleted first).
pub const LIGHT_POINTS: &[&str] = &["version.light", "version.light.after"];

/// Points a step can be held at (`hold`), one per state a version can be
/// in when drumsd dies: `dumping` before CRIU runs, `versioning` before the
/// manifest is written.
pub const HOLD_POINTS: &[&str] = &["checkpoint.criu", "version.manifest", "image.commit"];

#[derive(Default)]
pub struct Faults {
    armed: Mutex<Option<String>>,
    hold: std::sync::atomic::AtomicBool,
}

impl Faults {
    /// Arm `point` to fail, or with `hold`, to hold its step forever.
    pub fn arm_hold(&self, point: Option<String>, hold: bool) -> Result<(), SessionError> {
        // Without a point there is nothing to hold: it disarms.
        let hold = hold && point.is_some();
        if hold && !point.as_deref().is_some_and(|p| HOLD_POINTS.contains(&p)) {
            return Err(SessionError::Invalid(format!(
                "only {} can be held",
                HOLD_POINTS.join(", ")
            )));
        }
        self.arm(point)?;
        self.hold.store(hold, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Wait forever if `point` is armed to hold.
    pub async fn hold(&self, point: &str) {
        if self.hold.load(std::sync::atomic::Ordering::SeqCst)
            && self.armed().as_deref() == Some(point)
        {
            tracing::warn!(
                point,
                "fault injection: holding here until drumsd is killed"
            );
            std::future::pending::<()>().await;
        }
    }

    pub fn arm(&self, point: Option<String>) -> Result<(), SessionError> {
        if let Some(p) = &point {
            let all: Vec<&str> = CREATE_POINTS
                .iter()
                .chain(CHECKPOINT_POINTS)
                .chain(RESTORE_POINTS)
                .chain(DESKTOP_POINTS)
                .chain(EXPORT_POINTS)
                .chain(IMAGE_POINTS)
                .chain(ROLLBACK_POINTS)
                .chain(LIGHT_POINTS)
                .chain(SHARE_POINTS)
                .copied()
                .collect();
            if !all.contains(&p.as_str()) {
                return Err(SessionError::Invalid(format!(
                    "unknown fault point {p:?}; known: {}",
                    all.join(", ")
                )));
            }
        }
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = point;
        Ok(())
    }

    pub fn armed(&self) -> Option<String> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn check(&self, point: &str) -> Result<(), SessionError> {
        if self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        match self.armed() {
            Some(p) if p == point => Err(SessionError::Injected(p)),
            _ => Ok(()),
        }
    }

    /// Whether `point` is armed to hold (for steps on a blocking thread,
    /// which cannot await [`Faults::hold`]: they ask first, then park).
    pub fn holds(&self, point: &str) -> bool {
        self.hold.load(std::sync::atomic::Ordering::SeqCst)
            && self.armed().as_deref() == Some(point)
    }

    /// The point to hand to drums-init, if the armed one is an init step.
    pub fn for_init(&self) -> Option<String> {
        self.armed().filter(|p| p.starts_with("init."))
    }
}
