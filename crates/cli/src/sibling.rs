//! `drums bench` and `drums eval` are programs of their own, `drums-bench`
//! and `drums-eval`, so that what they need (cgroups, the store, the
//! evaluation's daemons) stays out of the client. `drums` becomes them.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use crate::args::Global;
use crate::exit::{self, Failure};

/// Replace this process by `program` (beside `drums`, else on PATH) with
/// `args` as given, after the connection options read here (its parser reads
/// them, and the same environment, as this one does). Exec, not spawn:
/// the program keeps this pid (the evaluation names its host resources by
/// it) and its exit code is the one the caller sees. Returns only on failure.
pub fn exec(program: &str, g: &Global, args: &[OsString]) -> Failure {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(program)))
        .filter(|p| p.exists());
    let path = beside.unwrap_or_else(|| PathBuf::from(program));
    let mut cmd = std::process::Command::new(&path);
    cmd.arg("--state-dir").arg(&g.state_dir);
    if let Some(s) = &g.socket {
        cmd.arg("--socket").arg(s);
    }
    if g.no_autostart {
        cmd.arg("--no-autostart");
    }
    cmd.args(args);
    let e = cmd.exec();
    let message = if e.kind() == std::io::ErrorKind::NotFound {
        // Each program is the one binary of the package of its name.
        format!(
            "{program} is neither beside drums nor on PATH ({e}); `make test` builds it, or `cargo build --release -p {program}`"
        )
    } else {
        format!("run {}: {e}", path.display())
    };
    Failure::new(exit::INTERNAL, message)
}
