//! `drums audit A B`: are two sessions isolated from each other, and are they
//! clones? The isolation half is the seed report's sibling audit (C3): no
//! shared PID, pipe, socket or eventfd, writable regular file or lock, and
//! distinct namespaces. The clone half compares what hygiene changes:
//! hostname, machine-id, MAC, address, and the next draw of each registered
//! Python process's `random`. What stays identical by design is listed, not
//! hidden, and so is what a pair of cold sessions shares too.

use drums_api::{Profile, SessionState};
use std::collections::{BTreeMap, BTreeSet};

use drums_api::{AuditCheck, AuditReport, ExecRequest};
use serde::Serialize;

use crate::manager::{guest_client, Manager};
use crate::SessionError;

/// Namespaces a session has, and whether drums gives it its own.
const NAMESPACES: &[(&str, bool)] = &[
    ("pid", true),
    ("mnt", true),
    ("net", true),
    ("uts", true),
    ("ipc", true),
    ("cgroup", false),
    ("user", false),
    ("time", false),
];

/// What one session holds, as seen from the host.
#[derive(Debug, Default, Serialize)]
struct Holdings {
    pids: BTreeSet<i32>,
    namespaces: BTreeMap<String, String>,
    /// kind -> identities (pipe/socket inode, eventfd id, dev:ino of a
    /// regular file open for writing, dev:ino of a locked file).
    objects: BTreeMap<&'static str, BTreeSet<String>>,
}

fn holdings(pids: Vec<i32>, init: i32) -> Holdings {
    let mut h = Holdings {
        pids: pids.iter().copied().collect(),
        ..Default::default()
    };
    for (ns, _) in NAMESPACES {
        if let Ok(l) = std::fs::read_link(format!("/proc/{init}/ns/{ns}")) {
            h.namespaces
                .insert(ns.to_string(), l.to_string_lossy().into_owned());
        }
    }
    for pid in &pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            let fdinfo = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            if let Some(ino) = t.strip_prefix("pipe:") {
                h.objects.entry("pipe").or_default().insert(ino.to_owned());
            } else if let Some(ino) = t.strip_prefix("socket:") {
                h.objects
                    .entry("socket")
                    .or_default()
                    .insert(ino.to_owned());
            } else if t == "anon_inode:[eventfd]" {
                // Every eventfd shares one anonymous inode; its id tells them apart.
                if let Some(id) = fdinfo.lines().find_map(|l| l.strip_prefix("eventfd-id:")) {
                    h.objects
                        .entry("eventfd")
                        .or_default()
                        .insert(id.trim().to_owned());
                }
            } else if t.starts_with('/') {
                let flags = fdinfo
                    .lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                    .unwrap_or(0);
                let writable = flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
                if let Ok(m) = std::fs::metadata(fd.path()) {
                    use std::os::unix::fs::MetadataExt;
                    if writable && m.is_file() {
                        h.objects
                            .entry("writable file")
                            .or_default()
                            .insert(format!("{}:{} ({t})", m.dev(), m.ino()));
                    }
                }
            }
        }
    }
    // File locks held by the session's processes: /proc/locks names the pid
    // and the locked file as MAJ:MIN:INODE.
    for l in std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (pid, file) = match f.as_slice() {
            [_, _, _, _, pid, file, ..] => (pid.parse::<i32>().ok(), *file),
            _ => continue,
        };
        if pid.is_some_and(|p| h.pids.contains(&p)) {
            h.objects.entry("lock").or_default().insert(file.to_owned());
        }
    }
    h
}

/// What two holdings share.
fn shared(a: &Holdings, b: &Holdings) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let pids: Vec<String> = a
        .pids
        .intersection(&b.pids)
        .map(|p| p.to_string())
        .collect();
    if !pids.is_empty() {
        out.insert("pid".to_owned(), pids);
    }
    for (kind, set) in &a.objects {
        if let Some(other) = b.objects.get(kind) {
            let both: Vec<String> = set.intersection(other).cloned().collect();
            if !both.is_empty() {
                out.insert(kind.to_string(), both);
            }
        }
    }
    for (ns, own) in NAMESPACES {
        if a.namespaces.contains_key(*ns) && a.namespaces.get(*ns) == b.namespaces.get(*ns) && *own
        {
            out.insert(format!("{ns} namespace"), vec![a.namespaces[*ns].clone()]);
        }
    }
    out
}

impl Manager {
    async fn sh(&self, pid: i32, script: &str) -> String {
        let req = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        };
        let client = guest_client(pid);
        let Ok(resp) = client
            .call(hyper::Method::POST, "/v1/exec", Some(&req))
            .await
        else {
            return String::new();
        };
        let Ok(body) = client.read_body(resp).await else {
            return String::new();
        };
        let mut out = Vec::new();
        for line in body.split(|b| *b == b'\n') {
            if let Ok(drums_api::ExecFrame::Output { stream, data }) = serde_json::from_slice(line)
            {
                if stream == "stdout" {
                    use base64::Engine;
                    out.extend(
                        base64::engine::general_purpose::STANDARD
                            .decode(data)
                            .unwrap_or_default(),
                    );
                }
            }
        }
        String::from_utf8_lossy(&out).trim().to_owned()
    }

    async fn holdings_of(
        &self,
        id: &str,
    ) -> Result<(drums_catalog::SessionRecord, Holdings), SessionError> {
        let rec = self.host.record(id)?;
        let init = rec
            .init_pid
            .filter(|_| rec.state == SessionState::Running)
            .ok_or_else(|| SessionError::NotRunning {
                name: rec.name.clone(),
                state: rec.state,
            })?;
        let pids = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id).pids()?;
        let h = tokio::task::spawn_blocking(move || holdings(pids, init))
            .await
            .expect("no panic");
        Ok((rec, h))
    }

    /// Identity as seen from inside: hostname, machine-id, MAC, address and
    /// the registered Python processes' next draws (from their reseed acks).
    async fn identity(&self, pid: i32) -> BTreeMap<&'static str, String> {
        let mut m = BTreeMap::new();
        m.insert("hostname", self.sh(pid, "hostname").await);
        m.insert("machine-id", self.sh(pid, "cat /etc/machine-id").await);
        m.insert(
            "mac",
            self.sh(pid, "cat /sys/class/net/eth0/address 2>/dev/null")
                .await,
        );
        m.insert(
            "ip",
            self.sh(
                pid,
                "ip -o -4 addr show eth0 2>/dev/null | awk '{print $4}'",
            )
            .await,
        );
        m.insert(
            "python random",
            self.sh(pid, "cat /run/drums/reseed/*.ack 2>/dev/null | awk 'NF>1 {print $2}' | sort | tr '\\n' ' '").await,
        );
        m
    }

    pub async fn audit(&self, a: &str, b: &str) -> Result<AuditReport, SessionError> {
        let (ra, ha) = self.holdings_of(a).await?;
        let (rb, hb) = self.holdings_of(b).await?;
        if ra.id == rb.id {
            return Err(SessionError::Invalid(
                "audit needs two different sessions".into(),
            ));
        }
        let shared_ab = shared(&ha, &hb);

        // The baseline: what two cold sessions of the same kind share.
        let req = drums_api::CreateSession {
            image: Some(ra.image.clone()),
            network: Some(ra.network.as_str().into()),
            ..Default::default()
        };
        let c1 = self.create(&req).await?;
        let c2 = self.create(&req).await;
        let baseline = match &c2 {
            Ok(c2) => {
                let (_, h1) = self.holdings_of(&c1.id).await?;
                let (_, h2) = self.holdings_of(&c2.id).await?;
                shared(&h1, &h2)
            }
            Err(_) => BTreeMap::new(),
        };
        self.remove(&c1.id).await?;
        if let Ok(c2) = &c2 {
            self.remove(&c2.id).await?;
        }
        c2?;

        let mut isolation = Vec::new();
        for (kind, items) in &shared_ab {
            let also_cold = baseline
                .get(kind)
                .is_some_and(|v| items.iter().all(|i| v.contains(i)));
            isolation.push(AuditCheck {
                what: kind.clone(),
                a: items.join(", "),
                b: items.join(", "),
                ok: also_cold,
                note: if also_cold {
                    "shared by two cold sessions too".into()
                } else {
                    "shared between A and B".into()
                },
            });
        }
        for (ns, own) in NAMESPACES {
            let (x, y) = (
                ha.namespaces.get(*ns).cloned().unwrap_or_default(),
                hb.namespaces.get(*ns).cloned().unwrap_or_default(),
            );
            if !own {
                isolation.push(AuditCheck {
                    what: format!("{ns} namespace"),
                    ok: true,
                    note: if x == y {
                        "the host's, as for every session (drums does not unshare it)".into()
                    } else {
                        "differs".into()
                    },
                    a: x,
                    b: y,
                });
            } else if x != y {
                isolation.push(AuditCheck {
                    what: format!("{ns} namespace"),
                    a: x,
                    b: y,
                    ok: true,
                    note: "distinct".into(),
                });
            }
        }

        let (ia, ib) = (
            self.identity(ra.init_pid.unwrap_or(0)).await,
            self.identity(rb.init_pid.unwrap_or(0)).await,
        );
        let mut clone = Vec::new();
        for (what, x) in &ia {
            let y = ib.get(what).cloned().unwrap_or_default();
            let (ok, note) = if x.is_empty() && y.is_empty() {
                (true, "not present in either session".to_owned())
            } else if *what == "python random" {
                let xs: BTreeSet<&str> = x.split_whitespace().collect();
                let ys: BTreeSet<&str> = y.split_whitespace().collect();
                let same: Vec<&&str> = xs.intersection(&ys).collect();
                (
                    same.is_empty(),
                    if same.is_empty() {
                        "differ".into()
                    } else {
                        format!("{} draw(s) repeat", same.len())
                    },
                )
            } else if x == &y {
                (false, "identical: a clone".into())
            } else {
                (true, "differ".into())
            };
            clone.push(AuditCheck {
                what: what.to_string(),
                a: x.clone(),
                b: y,
                ok,
                note,
            });
        }

        let (ra_pid, rb_pid) = (ra.init_pid.unwrap_or(0), rb.init_pid.unwrap_or(0));
        clone.extend(reseed_checks(
            &reseed_report(ra_pid).await,
            &reseed_report(rb_pid).await,
        ));

        let identical_by_design = vec![
            "address-space layout of restored processes (CRIU restores mappings where they were)"
                .to_owned(),
            "Python's hash seed (PYTHONHASHSEED is fixed when the interpreter starts)".to_owned(),
            "process ids inside the session's PID namespace".to_owned(),
            "in-memory state that is not a registered RNG (caches, tokens, counters)".to_owned(),
        ];
        let mut identical_by_design = identical_by_design;
        if ra.profile == Profile::Desktop || rb.profile == Profile::Desktop {
            identical_by_design.push(self.browser_by_design(&ra, &rb));
        }
        let passed = isolation.iter().all(|c| c.ok) && clone.iter().all(|c| c.ok);
        Ok(AuditReport {
            a: ra.id,
            b: rb.id,
            passed,
            isolation,
            clone,
            identical_by_design,
        })
    }

    /// What the browsers of two desktops share by design, which depends on
    /// whether they were restored from a checkpoint taken with `--clean`.
    fn browser_by_design(
        &self,
        a: &drums_catalog::SessionRecord,
        b: &drums_catalog::SessionRecord,
    ) -> String {
        let clean = |r: &drums_catalog::SessionRecord| {
            r.origin
                .as_deref()
                .and_then(|o| self.manifest(o).ok())
                .is_some_and(|(_, m)| m.clean)
        };
        if clean(a) && clean(b) {
            "Chromium's profile on disk (history, bookmarks, preferences): a clean checkpoint \
             resets cookies, site storage and renderers, not the profile"
                .to_owned()
        } else {
            "the browser's state: tabs, cookies, site storage and each renderer's \
             Math.random sequence (not restored from a checkpoint taken with --clean)"
                .to_owned()
        }
    }
}

/// What the guest's `GET /v1/hygiene` says of the last reseed (mirrors
/// `drums_guest::hygiene::HygieneReport`'s lists; unknown fields ignored).
#[derive(Debug, Default, Clone, serde::Deserialize)]
struct ReseedReport {
    signalled: BTreeSet<u32>,
    acked: BTreeSet<u32>,
    stale_removed: BTreeSet<u32>,
    #[serde(default)]
    unverified: BTreeSet<u32>,
}

#[derive(Debug, serde::Deserialize)]
struct HygieneStatus {
    generation: u64,
    last: Option<ReseedReport>,
}

/// Why a session's reseed report is unknown; the audit shows the chain.
#[derive(Debug, thiserror::Error)]
enum Unreported {
    #[error("its agent did not answer")]
    NoAnswer(#[source] drums_api::ClientError),
    #[error("restored, but its agent has no reseed report")]
    NoReport,
}

type Reseed = Result<Option<ReseedReport>, Unreported>;

/// The session's last reseed: `Ok(None)` if it was never restored, `Err`
/// with why if its agent does not say.
async fn reseed_report(pid: i32) -> Reseed {
    let status: HygieneStatus = guest_client(pid)
        .json(hyper::Method::GET, "/v1/hygiene", None::<&()>)
        .await
        .map_err(Unreported::NoAnswer)?;
    match (status.generation, status.last) {
        (0, _) => Ok(None),
        (_, Some(r)) => Ok(Some(r)),
        (_, None) => Err(Unreported::NoReport),
    }
}

/// One check per process registered for a reseed in either session: what
/// the reseed after its restore did to it. Only an ack says the process
/// has its own RNG state now; a registration found stale names a process
/// that is gone. A process signalled without an ack, or one the agent could
/// not tie to its registration (so did not signal), may still draw as its
/// sibling does.
fn reseed_checks(a: &Reseed, b: &Reseed) -> Vec<AuditCheck> {
    let outcome = |r: &Reseed, pid: u32| -> (String, bool) {
        match r {
            Err(why) => (crate::error_chain(why), false),
            Ok(None) => ("never restored".into(), true),
            Ok(Some(r)) if r.acked.contains(&pid) => ("acked".into(), true),
            Ok(Some(r)) if r.signalled.contains(&pid) => ("signalled, no ack".into(), false),
            Ok(Some(r)) if r.stale_removed.contains(&pid) => ("stale, removed".into(), true),
            Ok(Some(r)) if r.unverified.contains(&pid) => {
                ("unverified, not signalled".into(), false)
            }
            Ok(Some(_)) => ("not registered".into(), true),
        }
    };
    let pids = |r: &Reseed| -> BTreeSet<u32> {
        match r {
            Ok(Some(r)) => r
                .signalled
                .iter()
                .chain(&r.stale_removed)
                .chain(&r.unverified)
                .copied()
                .collect(),
            _ => BTreeSet::new(),
        }
    };
    let mut out = Vec::new();
    for pid in pids(a).union(&pids(b)) {
        let ((x, xok), (y, yok)) = (outcome(a, *pid), outcome(b, *pid));
        out.push(AuditCheck {
            what: format!("reseed of pid {pid}"),
            ok: xok && yok,
            note: if xok && yok {
                "reseeded, or gone".into()
            } else {
                "not reseeded: its RNG may draw as its sibling's does".into()
            },
            a: x,
            b: y,
        });
    }
    // A session whose agent does not answer says nothing per process.
    for (r, which) in [(a, "A"), (b, "B")] {
        if let Err(why) = r {
            let why = crate::error_chain(why);
            out.push(AuditCheck {
                what: format!("reseed report of {which}"),
                a: if which == "A" {
                    why.clone()
                } else {
                    String::new()
                },
                b: if which == "B" {
                    why.clone()
                } else {
                    String::new()
                },
                ok: false,
                note: "the reseed's outcome is unknown".into(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_registered_process_has_its_reseed_outcome() {
        let r = |signalled: &[u32], acked: &[u32], stale: &[u32], unverified: &[u32]| {
            Ok(Some(ReseedReport {
                signalled: signalled.iter().copied().collect(),
                acked: acked.iter().copied().collect(),
                stale_removed: stale.iter().copied().collect(),
                unverified: unverified.iter().copied().collect(),
            }))
        };
        let a = r(&[5, 6], &[5], &[7], &[]);
        let b = r(&[5], &[5], &[], &[6]);
        let checks = reseed_checks(&a, &b);
        let row = |pid: u32| {
            checks
                .iter()
                .find(|c| c.what == format!("reseed of pid {pid}"))
                .unwrap()
        };
        assert!(row(5).ok);
        assert_eq!((row(5).a.as_str(), row(5).b.as_str()), ("acked", "acked"));
        assert!(!row(6).ok);
        assert_eq!(row(6).a, "signalled, no ack");
        assert_eq!(row(6).b, "unverified, not signalled");
        assert!(
            row(7).ok,
            "a stale registration names a process that is gone"
        );
        assert_eq!(checks.len(), 3);
        // Two cold sessions: nothing to say. An agent that does not say: a failed check.
        assert!(reseed_checks(&Ok(None), &Ok(None)).is_empty());
        let unknown = reseed_checks(&Err(Unreported::NoReport), &Ok(None));
        assert_eq!(unknown.len(), 1);
        assert!(!unknown[0].ok);
        assert_eq!(unknown[0].a, "restored, but its agent has no reseed report");
    }

    #[test]
    fn shared_objects_and_own_namespaces_are_found() {
        let mut a = Holdings::default();
        let mut b = Holdings::default();
        a.objects.entry("pipe").or_default().insert("[1]".into());
        a.objects.entry("socket").or_default().insert("[2]".into());
        b.objects.entry("pipe").or_default().insert("[1]".into());
        b.objects.entry("socket").or_default().insert("[3]".into());
        for h in [&mut a, &mut b] {
            h.namespaces.insert("user".into(), "user:[9]".into());
            h.namespaces.insert("net".into(), "net:[7]".into());
        }
        let s = shared(&a, &b);
        assert_eq!(s.get("pipe"), Some(&vec!["[1]".to_owned()]));
        assert!(!s.contains_key("socket"));
        assert!(
            s.contains_key("net namespace"),
            "a shared net namespace is a finding"
        );
        assert!(
            !s.contains_key("user namespace"),
            "drums does not unshare user: not a finding"
        );
    }
}
