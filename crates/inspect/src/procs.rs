//! The processes of a session at one instant, from the task iterator's records.

use std::collections::BTreeMap;

use crate::bpf::types::task_rec;

/// A process's identity: its tgid and its leader's start time, so a reused
/// pid is a different process.
pub type Key = (u32, u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub tgid: u32,
    /// Its pid inside the session, as the session's own tools show it.
    pub ns_pid: i32,
    pub ppid: u32,
    pub comm: String,
    /// Summed over the process's threads.
    pub runtime_ns: u64,
    pub switches: u64,
    pub faults: u64,
    pub threads: u64,
}

impl Proc {
    /// Whether it ran between two snapshots: any CPU time, context switch or
    /// page fault. Run time is exact (ns, from the scheduler); the switch count
    /// also catches a wake-up too short to be charged.
    pub fn ran_since(&self, before: &Proc) -> bool {
        self.runtime_ns != before.runtime_ns
            || self.switches != before.switches
            || self.faults != before.faults
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub procs: BTreeMap<Key, Proc>,
}

impl Snapshot {
    /// Its processes' tgids.
    pub fn tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().map(|k| k.0)
    }

    /// The processes of `cgroup`, from per-thread records.
    pub fn from_tasks(recs: &[task_rec], cgroup: u64) -> Snapshot {
        let mut procs: BTreeMap<Key, Proc> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.cgroup == cgroup) {
            let comm = comm(&r.comm);
            let p = procs.entry((r.tgid, r.start_time)).or_insert_with(|| Proc {
                tgid: r.tgid,
                ns_pid: r.ns_tgid,
                ppid: r.ppid,
                comm: comm.clone(),
                runtime_ns: 0,
                switches: 0,
                faults: 0,
                threads: 0,
            });
            if r.pid == r.tgid {
                p.comm = comm;
                p.ppid = r.ppid;
            }
            p.runtime_ns += r.runtime_ns;
            p.switches += r.switches;
            p.faults += r.faults;
            p.threads += 1;
        }
        Snapshot { procs }
    }

    pub fn key_of(&self, tgid: u32) -> Option<Key> {
        self.procs.keys().find(|k| k.0 == tgid).copied()
    }

    /// `root` and every process below it, by parent links.
    pub fn tree(&self, root: Key) -> Vec<Key> {
        let mut out = vec![root];
        let mut i = 0;
        while i < out.len() {
            let parent = out[i].0;
            out.extend(
                self.procs
                    .iter()
                    .filter(|(k, p)| p.ppid == parent && k.0 != parent && !out.contains(k))
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>(),
            );
            i += 1;
        }
        out
    }
}

fn comm(c: &[i8; 16]) -> String {
    let b: Vec<u8> = c
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&b).into_owned()
}

/// The processes of `s` with a thread running or runnable now (state `R`
/// in /proc): one may be in its own code, where no event shows what it does.
/// A process /proc cannot read counts as running.
pub fn running(s: &Snapshot) -> std::collections::BTreeSet<Key> {
    s.procs
        .keys()
        .filter(|k| {
            let Ok(threads) = std::fs::read_dir(format!("/proc/{}/task", k.0)) else {
                return true;
            };
            threads.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|stat| {
                        let after = stat.rsplit_once(')')?.1;
                        after.split_whitespace().next().map(|st| st == "R")
                    })
                    .unwrap_or(true)
            })
        })
        .copied()
        .collect()
}

/// The context switches of process `tgid`, summed over its threads, from
/// /proc (what the task iterator reads as `nvcsw + nivcsw`); none if it is
/// gone.
pub fn switches(tgid: u32) -> Option<u64> {
    let threads = std::fs::read_dir(format!("/proc/{tgid}/task")).ok()?;
    let mut n = 0;
    for t in threads.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).ok()?;
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().ok()?;
            }
        }
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        cgroup: u64,
        pid: u32,
        tgid: u32,
        ppid: u32,
        start: u64,
        rt: u64,
        comm: &str,
    ) -> task_rec {
        let mut r = task_rec {
            cgroup,
            pid,
            tgid,
            ppid,
            start_time: start,
            runtime_ns: rt,
            ..Default::default()
        };
        for (d, s) in r.comm.iter_mut().zip(comm.bytes()) {
            *d = s as i8;
        }
        r
    }

    #[test]
    fn aggregates_threads_and_finds_trees() {
        let recs = [
            rec(5, 10, 10, 1, 100, 7, "agent"),
            rec(5, 11, 10, 1, 100, 3, "worker"),
            rec(5, 20, 20, 10, 200, 1, "sh"),
            rec(5, 30, 30, 20, 300, 1, "sleep"),
            rec(5, 40, 40, 1, 400, 1, "other"),
            rec(6, 50, 50, 1, 500, 1, "elsewhere"),
        ];
        let s = Snapshot::from_tasks(&recs, 5);
        assert_eq!(s.procs.len(), 4);
        let agent = &s.procs[&(10, 100)];
        assert_eq!((agent.comm.as_str(), agent.runtime_ns), ("agent", 10));
        assert_eq!(s.tree((10, 100)), vec![(10, 100), (20, 200), (30, 300)]);
        assert_eq!(s.key_of(40), Some((40, 400)));
        let mut later = agent.clone();
        assert!(!later.ran_since(agent));
        later.switches += 1;
        assert!(later.ran_since(agent));
    }
}
