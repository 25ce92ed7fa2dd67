//! What a version takes: what a policy asks for at a turn's end, and when a
//! selective artifact may pair with the other kind from an earlier version
//! (docs/engine.md, "Pairing").

use drums_api::{Policy, TurnClass, TurnEffects};
use drums_checkpoint::{Manifest, Took};

/// What a policy asks for at a turn's end, before pairing; `None`: no
/// version, and the session's position does not move.
pub fn wanted(policy: Policy, class: TurnClass) -> Option<Took> {
    match policy {
        Policy::Off => None,
        Policy::Full => Some(Took::Full),
        Policy::Files => Some(Took::Files),
        Policy::Selective => match class {
            TurnClass::None => None,
            TurnClass::Files => Some(Took::Files),
            TurnClass::Processes => Some(Took::Process),
            TurnClass::Both => Some(Took::Full),
        },
    }
}

/// What changed in the turns a version covers, for the pairing check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Paths as the session sees them.
    pub paths: Vec<String>,
    /// The inspector could not name everything (`unknown` changes).
    pub unknown: bool,
}

impl Changed {
    pub fn of(effects: &TurnEffects) -> Changed {
        Changed {
            paths: effects.files.iter().map(|f| f.path.clone()).collect(),
            unknown: effects.files.iter().any(|f| f.change == "unknown"),
        }
    }

    pub(crate) fn extend(&mut self, other: Changed) {
        self.paths.extend(other.paths);
        self.unknown |= other.unknown;
    }

    /// The first held path this change touches: the path itself, or a
    /// directory above it (renamed or removed).
    fn touches<'a>(&self, held: &'a [String]) -> Option<&'a str> {
        held.iter().map(String::as_str).find(|h| {
            self.paths.iter().any(|p| {
                let p = p.trim_end_matches('/');
                *h == p || h.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
            })
        })
    }
}

/// What a version takes itself, and why, when that is more than `wanted`.
///
/// A files artifact pairs with the process artifact of the session's current
/// version (`head`) only when the processes of that artifact never saw the
/// files change under them: no turn since changed a file they held (open,
/// mapped, or as a directory), because CRIU refuses to restore an open file
/// whose size changed, and a process would read content it never wrote. A
/// turn in which a process also dirtied its memory is class `both`, so a
/// full version already. A process artifact pairs with the head's files
/// artifact: the files are as they were then, since every turn since was
/// covered by a version or changed nothing. When the session has no version
/// yet, its previous version failed, or turns went by without one
/// (`needs_full`), the version is full.
pub fn pair(
    wanted: Took,
    policy: Policy,
    head: Option<&Manifest>,
    changed: &Changed,
    needs_full: bool,
) -> (Took, Option<String>) {
    if wanted == Took::Full || policy == Policy::Files {
        return (wanted, None);
    }
    let full = |why: String| (Took::Full, Some(why));
    let Some(head) = head else {
        return full("the session has no version yet".into());
    };
    if needs_full {
        return full("a previous version failed or turns went by without one".into());
    }
    match wanted {
        Took::Files => {
            let Some(v) = &head.version else {
                return (Took::Files, None);
            };
            if v.process_of.is_none() {
                return full(format!(
                    "version {} has no process state to pair with",
                    v.number
                ));
            }
            if changed.unknown {
                return full("the turn changed files the inspector could not name".into());
            }
            match changed.touches(&v.held) {
                Some(h) => full(format!(
                    "the turn changed {h}, which a process held at version {}",
                    v.number
                )),
                None => (Took::Files, None),
            }
        }
        other => (other, None),
    }
}

/// The files the session's processes hold, as the session sees them: open
/// file descriptors, working directories and mapped files, read from /proc
/// while the tree is frozen. drums' own files (its binaries and /run/drums)
/// are not the session's.
pub(crate) fn held_paths(pids: &[i32]) -> Vec<String> {
    let mut out = Vec::new();
    let mut keep = |p: std::path::PathBuf| {
        let s = p.to_string_lossy().into_owned();
        if s.starts_with('/') && !s.starts_with("/run/drums/") && !s.starts_with("/dev/") {
            out.push(s.trim_end_matches(" (deleted)").to_owned());
        }
    };
    for pid in pids {
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        if let Ok(p) = std::fs::read_link(proc.join("cwd")) {
            keep(p);
        }
        if let Ok(rd) = std::fs::read_dir(proc.join("fd")) {
            for e in rd.flatten() {
                if let Ok(p) = std::fs::read_link(e.path()) {
                    keep(p);
                }
            }
        }
        if let Ok(maps) = std::fs::read_to_string(proc.join("maps")) {
            for line in maps.lines() {
                if let Some(path) = line.split_whitespace().nth(5) {
                    keep(path.into());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_checkpoint::VersionInfo;

    fn manifest(process_of: Option<&str>, held: &[&str]) -> Manifest {
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "format_version": 4, "id": "v1", "name": "v1", "created_at_ms": 1,
            "session": {"id": "s", "name": "s", "hostname": "s", "profile": "headless",
                "image": "default", "network": "none", "limits": {}, "generation": 0},
            "host": {"kernel": "k", "arch": "a", "cpu_vendor": "v", "cpu_family": "f",
                "cpu_flags": [], "criu_version": "c"},
            "clean": false, "leave_running": true, "images": [], "frozen_ms": 0.0, "dump_ms": 0.0
        }))
        .unwrap();
        m.version = Some(VersionInfo {
            number: 1,
            parent: None,
            turn: Some(1),
            class: "both".into(),
            policy: "selective".into(),
            took: Took::Full,
            reason: None,
            files_of: "v1".into(),
            process_of: process_of.map(str::to_owned),
            held: held.iter().map(|s| s.to_string()).collect(),
            files: None,
            process: None,
            last_pid: None,
        });
        m
    }

    fn changed(paths: &[&str]) -> Changed {
        Changed {
            paths: paths.iter().map(|s| s.to_string()).collect(),
            unknown: false,
        }
    }

    #[test]
    fn each_policy_wants_what_it_says() {
        use TurnClass::*;
        let all = [None, Files, Processes, Both];
        let got: Vec<_> = all.iter().map(|c| wanted(Policy::Selective, *c)).collect();
        assert_eq!(
            got,
            vec![
                Option::None,
                Some(Took::Files),
                Some(Took::Process),
                Some(Took::Full)
            ]
        );
        for c in all {
            assert_eq!(wanted(Policy::Full, c), Some(Took::Full));
            assert_eq!(wanted(Policy::Files, c), Some(Took::Files));
            assert_eq!(wanted(Policy::Off, c), Option::None);
        }
    }

    #[test]
    fn a_files_artifact_pairs_unless_it_changed_a_held_file() {
        let head = manifest(Some("v1"), &["/data/log", "/srv/app/state.db"]);
        let ok = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/data/other"]),
            false,
        );
        assert_eq!(ok, (Took::Files, None));
        let (took, why) = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/data/log"]),
            false,
        );
        assert_eq!(took, Took::Full);
        assert!(why.unwrap().contains("/data/log"));
        // A directory above a held file, renamed or removed.
        let (took, _) = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/srv/app"]),
            false,
        );
        assert_eq!(took, Took::Full);
        // A sibling whose name merely starts the same is not above it.
        let ok = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/srv/ap"]),
            false,
        );
        assert_eq!(ok.0, Took::Files);
        let unknown = Changed {
            paths: vec![],
            unknown: true,
        };
        assert_eq!(
            pair(Took::Files, Policy::Selective, Some(&head), &unknown, false).0,
            Took::Full
        );
    }

    #[test]
    fn without_a_valid_head_a_version_is_full() {
        let head = manifest(Some("v1"), &[]);
        let none = changed(&[]);
        assert_eq!(
            pair(Took::Files, Policy::Selective, None, &none, false).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, None, &none, false).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, Some(&head), &none, true).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, Some(&head), &none, false),
            (Took::Process, None)
        );
        // A head without processes (the files policy) has none to pair with.
        let files_only = manifest(None, &[]);
        assert_eq!(
            pair(
                Took::Files,
                Policy::Selective,
                Some(&files_only),
                &none,
                false
            )
            .0,
            Took::Full
        );
        // The files policy never takes processes.
        assert_eq!(
            pair(Took::Files, Policy::Files, None, &none, true),
            (Took::Files, None)
        );
    }
}
