//! `drumsd --ksm`: turn on the kernel's same-page merging while drumsd runs,
//! so that identical pages of restored siblings (every sibling of a desktop
//! carries the same Chromium heap) are stored once.
//!
//! KSM is host-wide, so this is opt-in, and drumsd puts back the settings it
//! found when it stops. Sessions mark their memory mergeable themselves
//! (drums-init's `PR_SET_MEMORY_MERGE`); KSM only scans what is marked. The
//! scan rate is left to the kernel's advisor with a CPU ceiling: ksmd
//! otherwise either scans too slowly to matter after a restore or takes a
//! core of this 2-core machine.

use std::path::Path;

use tracing::{info, warn};

const KSM: &str = "/sys/kernel/mm/ksm";

/// What drumsd sets, in order (run last, once the scan rate is bounded).
const SETTINGS: &[(&str, &str)] = &[
    // Let the kernel size each scan batch to finish a full pass in the
    // target time, within a CPU ceiling.
    ("advisor_mode", "scan-time"),
    ("advisor_target_scan_time", "10"),
    ("advisor_max_cpu", "25"),
    ("run", "1"),
];

/// The values found before drumsd changed them.
pub struct Ksm {
    saved: Vec<(&'static str, String)>,
}

impl Ksm {
    /// Applies [`SETTINGS`], remembering the old values. A setting this
    /// kernel lacks is skipped with a warning; KSM is an optimisation.
    pub fn enable() -> Ksm {
        let mut saved = Vec::new();
        for (name, value) in SETTINGS {
            let path = Path::new(KSM).join(name);
            // advisor_mode reads as "[none] scan-time": the bracketed one is current.
            let old = match std::fs::read_to_string(&path) {
                Ok(text) => current_choice(&text),
                Err(e) => {
                    warn!(setting = %path.display(), error = %e, "KSM setting not available");
                    continue;
                }
            };
            match std::fs::write(&path, value) {
                Ok(()) => saved.push((*name, old)),
                Err(e) => warn!(setting = %path.display(), error = %e, "cannot set KSM"),
            }
        }
        info!("KSM on (restored to the previous settings when drumsd stops)");
        Ksm { saved }
    }

    /// Puts back what [`Ksm::enable`] changed, in reverse order (run first).
    pub fn restore(&self) {
        for (name, value) in self.saved.iter().rev() {
            let path = Path::new(KSM).join(name);
            if let Err(e) = std::fs::write(&path, value) {
                warn!(setting = %path.display(), error = %e, "cannot restore KSM setting");
            }
        }
    }
}

/// The selected value of a sysfs choice list ("[none] scan-time" -> "none"),
/// or the trimmed value of a plain one.
fn current_choice(text: &str) -> String {
    let text = text.trim();
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_owned(),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices() {
        assert_eq!(current_choice("[none] scan-time\n"), "none");
        assert_eq!(current_choice("none [scan-time]"), "scan-time");
        assert_eq!(current_choice("0\n"), "0");
    }
}
