//! What a session's events add up to between two turn boundaries.
//!
//! Files are judged by net effect: a path first created in the window and gone
//! at its end changed nothing; any other path that was touched did. Whether a
//! path was created is only taken from the kernel (an open that set
//! FMODE_CREATED, a successful mkdir, mknod, symlink or link), never guessed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use drums_api::FileEffect;

use crate::event::{Event, Op, F_CREATED};

#[derive(Debug, Default)]
struct PathLog {
    /// The path did not exist when the window began: its first operation in
    /// the window created it, or it lies below such a fresh directory.
    created: bool,
    /// A directory made by mkdir in this window and not removed, renamed or
    /// replaced since: nothing below it existed when the window began.
    fresh_dir: bool,
    ops: BTreeSet<&'static str>,
    by: BTreeSet<String>,
}

#[derive(Debug, Default)]
pub struct Window {
    files: BTreeMap<String, PathLog>,
    /// What could not be pinned to a path: always an effect.
    unknown: BTreeMap<String, PathLog>,
    /// File-system events of any kind, net effect or not.
    pub file_events: u64,
    /// Programs executed, by tgid.
    pub execs: HashMap<u32, String>,
    /// (target, writer): memory written into another process.
    pub memwrites: Vec<(u32, u32)>,
    /// Processes that used System V or POSIX IPC: shared memory, semaphores
    /// and queues outlive them, as state CRIU dumps with the IPC namespace.
    pub ipc: BTreeMap<u32, String>,
    /// The inspector lost track (a failed checkpoint): report everything.
    pub poisoned: bool,
}

impl Window {
    pub fn apply(&mut self, ev: &Event) {
        let by = format!("{}[{}]", ev.comm, ev.tgid);
        match ev.op {
            Op::Fork | Op::Exit => {}
            Op::Exec => {
                self.execs
                    .insert(ev.tgid, ev.path.clone().unwrap_or_default());
            }
            Op::MemWrite => self.memwrites.push((ev.ppid, ev.tgid)),
            Op::Ipc => {
                self.ipc.insert(ev.tgid, ev.comm.clone());
            }
            Op::Opaque => {
                self.file_events += 1;
                let what = ev.path.as_deref().unwrap_or("?").trim_start_matches('/');
                self.unknown(format!("({what} by {by})"), ev.op, &by);
            }
            _ => {
                self.file_events += 1;
                let path = ev.path.clone().unwrap_or_else(|| "?".into());
                if !ev.certain() {
                    self.unknown(format!("{path} (path not fully read)"), ev.op, &by);
                    if let Some(p2) = &ev.path2 {
                        self.unknown(format!("{p2} (path not fully read)"), ev.op, &by);
                    }
                    return;
                }
                match ev.op {
                    Op::Rename => {
                        self.touch(path, false, ev.op, &by);
                        if let Some(p2) = ev.path2.clone() {
                            self.touch(p2, false, ev.op, &by);
                        }
                    }
                    // The new name is new, but it is another name of an
                    // old file: writes through it change that file, so it
                    // is never taken for created (and its removal is an
                    // effect), whatever its directory.
                    Op::Link => {
                        let new = ev.path2.clone().unwrap_or(path);
                        self.touch(new, false, ev.op, &by);
                    }
                    Op::Mkdir | Op::Mknod | Op::Symlink => self.touch(path, true, ev.op, &by),
                    Op::OpenWrite => {
                        let created = ev.flags & F_CREATED != 0;
                        self.touch(path, created, ev.op, &by)
                    }
                    _ => self.touch(path, false, ev.op, &by),
                }
            }
        }
    }

    fn touch(&mut self, path: String, created: bool, op: Op, by: &str) {
        let below_fresh = op != Op::Link && self.below_fresh_dir(&path);
        let log = self.files.entry(path).or_insert_with(|| PathLog {
            created: created || below_fresh,
            fresh_dir: created && op == Op::Mkdir,
            ..Default::default()
        });
        if op != Op::Mkdir && !matches!(op, Op::Chmod | Op::Chown | Op::Utimes | Op::Xattr) {
            // Removed, renamed, or replaced by something else: what is below
            // it now may be old (a symlink to an old directory, say).
            log.fresh_dir = false;
        }
        log.ops.insert(op.name());
        if !log.by.contains(by) {
            log.by.insert(by.to_owned());
        }
    }

    /// Whether a directory above `path` was made in this window and is still
    /// that directory. Only for paths without "..", whose parent is lexical.
    fn below_fresh_dir(&self, path: &str) -> bool {
        if path.split('/').any(|c| c == "..") {
            return false;
        }
        let mut p = path;
        while let Some((parent, _)) = p.rsplit_once('/') {
            if parent.is_empty() {
                return false;
            }
            if self.files.get(parent).is_some_and(|l| l.fresh_dir) {
                return true;
            }
            p = parent;
        }
        false
    }

    /// Append a later window's events to this one, as if applied in order.
    pub fn absorb(&mut self, later: Window) {
        for (path, log) in later.files {
            match self.files.get_mut(&path) {
                Some(mine) => {
                    if !log.fresh_dir {
                        mine.fresh_dir = false;
                    }
                    mine.ops.extend(log.ops);
                    mine.by.extend(log.by);
                }
                None => {
                    self.files.insert(path, log);
                }
            }
        }
        for (what, log) in later.unknown {
            let mine = self.unknown.entry(what).or_default();
            mine.ops.extend(log.ops);
            mine.by.extend(log.by);
        }
        self.file_events += later.file_events;
        self.execs.extend(later.execs);
        self.memwrites.extend(later.memwrites);
        self.ipc.extend(later.ipc);
        self.poisoned |= later.poisoned;
    }

    /// Record something that is an effect whatever the file system says.
    pub fn unknown(&mut self, what: String, op: Op, by: &str) {
        let log = self.unknown.entry(what).or_default();
        log.ops.insert(op.name());
        log.by.insert(by.to_owned());
    }

    /// The net file effects, given whether each path exists now.
    pub fn effects(&self, mut exists: impl FnMut(&str) -> bool) -> Vec<FileEffect> {
        let mut out = Vec::new();
        for (path, log) in &self.files {
            let change = match (log.created, exists(path)) {
                (true, false) => continue,
                (true, true) => "created",
                (false, true) => "modified",
                (false, false) => "deleted",
            };
            out.push(effect(path, change, log));
        }
        out.extend(
            self.unknown
                .iter()
                .map(|(w, log)| effect(w, "unknown", log)),
        );
        out
    }
}

fn effect(path: &str, change: &str, log: &PathLog) -> FileEffect {
    FileEffect {
        path: path.to_owned(),
        change: change.to_owned(),
        ops: log.ops.iter().map(|s| s.to_string()).collect(),
        by: log.by.iter().cloned().collect(),
    }
}

/// Processes that can change files without a syscall the inspector sees: they
/// hold a shared writable mapping of a file, or an io_uring. Kept across turns,
/// inherited over fork, dropped at exit; whenever one runs in a turn, what it
/// holds counts as changed.
#[derive(Debug, Default)]
pub struct Holders {
    held: HashMap<u32, BTreeSet<String>>,
}

impl Holders {
    pub fn apply(&mut self, ev: &Event) {
        match ev.op {
            Op::MmapShared if ev.certain() => {
                let what = format!(
                    "{} (shared writable mapping)",
                    ev.path.as_deref().unwrap_or("?")
                );
                self.held.entry(ev.tgid).or_default().insert(what);
            }
            Op::MmapShared => {
                self.held
                    .entry(ev.tgid)
                    .or_default()
                    .insert("? (shared writable mapping of an unreadable path)".into());
            }
            Op::Opaque if ev.path.as_deref() == Some("/io_uring") => {
                self.held
                    .entry(ev.tgid)
                    .or_default()
                    .insert("(io_uring)".into());
            }
            Op::Fork if ev.flags & crate::event::F_THREAD == 0 => {
                if let Some(h) = self.held.get(&ev.ppid).cloned() {
                    self.held.insert(ev.tgid, h);
                }
            }
            Op::Exit => {
                self.held.remove(&ev.tgid);
            }
            _ => {}
        }
    }

    pub fn of(&self, tgid: u32) -> Option<&BTreeSet<String>> {
        self.held.get(&tgid)
    }

    /// Forget processes that are gone.
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.held.retain(|tgid, _| alive(*tgid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, flags: u32, path: &str, path2: Option<&str>) -> Event {
        Event {
            op,
            flags,
            cgroup: 1,
            epoch: 0,
            pid: 9,
            tgid: 9,
            ppid: 0,
            ret: 0,
            comm: "sh".into(),
            path: Some(path.into()),
            path2: path2.map(Into::into),
        }
    }

    fn changes(w: &Window, existing: &[&str]) -> Vec<(String, String)> {
        w.effects(|p| existing.contains(&p))
            .into_iter()
            .map(|e| (e.path, e.change))
            .collect()
    }

    #[test]
    fn created_then_removed_is_no_effect() {
        let mut w = Window::default();
        w.apply(&ev(Op::Mkdir, 0, "/tmp/d", None));
        w.apply(&ev(Op::OpenWrite, F_CREATED, "/tmp/d/f", None));
        w.apply(&ev(Op::Unlink, 0, "/tmp/d/f", None));
        w.apply(&ev(Op::Rmdir, 0, "/tmp/d", None));
        assert_eq!(changes(&w, &[]), vec![]);
        assert_eq!(w.file_events, 4);
    }

    #[test]
    fn a_pre_existing_file_is_an_effect_however_it_ends() {
        let mut w = Window::default();
        // Opened with O_CREAT but not created: it existed.
        w.apply(&ev(Op::OpenWrite, 0, "/a", None));
        w.apply(&ev(Op::Unlink, 0, "/a", None));
        w.apply(&ev(Op::Unlink, 0, "/b", None));
        w.apply(&ev(Op::Chmod, 0, "/c", None));
        assert_eq!(
            changes(&w, &["/c"]),
            vec![
                ("/a".into(), "deleted".into()),
                ("/b".into(), "deleted".into()),
                ("/c".into(), "modified".into())
            ]
        );
    }

    #[test]
    fn sed_in_place_modifies_the_target() {
        let mut w = Window::default();
        w.apply(&ev(Op::OpenWrite, F_CREATED, "/w/sedX1", None));
        w.apply(&ev(Op::Rename, 0, "/w/sedX1", Some("/w/f")));
        assert_eq!(
            changes(&w, &["/w/f"]),
            vec![("/w/f".into(), "modified".into())]
        );
    }

    #[test]
    fn what_lands_in_a_fresh_directory_is_new() {
        // py_compile in a temporary directory: the .pyc is renamed into place.
        let mut w = Window::default();
        w.apply(&ev(Op::Mkdir, 0, "/tmp/t", None));
        w.apply(&ev(Op::OpenWrite, F_CREATED, "/tmp/t/x.tmp", None));
        w.apply(&ev(Op::Rename, 0, "/tmp/t/x.tmp", Some("/tmp/t/x.pyc")));
        w.apply(&ev(Op::Unlink, 0, "/tmp/t/x.pyc", None));
        w.apply(&ev(Op::Rmdir, 0, "/tmp/t", None));
        assert_eq!(changes(&w, &[]), vec![]);
    }

    #[test]
    fn a_directory_replaced_in_the_window_is_not_fresh() {
        // mkdir d; rmdir d; ln -s /etc d; rm d/passwd: that removes /etc/passwd.
        let mut w = Window::default();
        w.apply(&ev(Op::Mkdir, 0, "/d", None));
        w.apply(&ev(Op::Rmdir, 0, "/d", None));
        w.apply(&ev(Op::Symlink, 0, "/d", None));
        w.apply(&ev(Op::Unlink, 0, "/d/passwd", None));
        assert!(changes(&w, &[]).contains(&("/d/passwd".into(), "deleted".into())));
        // A path with ".." is never judged by its lexical parent.
        let mut w = Window::default();
        w.apply(&ev(Op::Mkdir, 0, "/n", None));
        w.apply(&ev(Op::Unlink, 0, "/n/../etc/x", None));
        assert_eq!(
            changes(&w, &[]),
            vec![("/n/../etc/x".into(), "deleted".into())]
        );
    }

    #[test]
    fn a_hard_link_is_never_taken_for_a_new_file() {
        // ln /etc/passwd /tmp/p; echo x >> /tmp/p; rm /tmp/p changed /etc/passwd.
        let mut w = Window::default();
        w.apply(&ev(Op::Mkdir, 0, "/tmp/n", None));
        w.apply(&ev(Op::Link, 0, "/etc/passwd", Some("/tmp/n/p")));
        w.apply(&ev(Op::OpenWrite, 0, "/tmp/n/p", None));
        w.apply(&ev(Op::Unlink, 0, "/tmp/n/p", None));
        assert_eq!(
            changes(&w, &[]),
            vec![("/tmp/n/p".into(), "deleted".into())]
        );
    }

    #[test]
    fn a_later_window_absorbed_keeps_the_first_operation() {
        let mut w = Window::default();
        w.apply(&ev(Op::Unlink, 0, "/a", None));
        let mut later = Window::default();
        later.apply(&ev(Op::OpenWrite, F_CREATED, "/a", None));
        later.apply(&ev(Op::OpenWrite, F_CREATED, "/b", None));
        later.apply(&ev(Op::Unlink, 0, "/b", None));
        w.absorb(later);
        // /a existed before the first window: recreated, it is modified.
        assert_eq!(changes(&w, &["/a"]), vec![("/a".into(), "modified".into())]);
        assert_eq!(w.file_events, 4);
    }

    #[test]
    fn unreadable_paths_and_opaque_calls_are_always_effects() {
        let mut w = Window::default();
        w.apply(&ev(Op::Unlink, crate::event::F_UNREADABLE, "/x", None));
        w.apply(&ev(Op::Opaque, 0, "/io_uring", None));
        let c = changes(&w, &[]);
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|(_, ch)| ch == "unknown"), "{c:?}");
    }

    #[test]
    fn holders_are_inherited_and_forgotten() {
        let mut h = Holders::default();
        h.apply(&ev(Op::MmapShared, 0, "/db", None));
        let mut fork = ev(Op::Fork, 0, "", None);
        (fork.ppid, fork.tgid) = (9, 12);
        h.apply(&fork);
        assert!(h.of(12).unwrap().iter().any(|s| s.starts_with("/db")));
        let mut exit = ev(Op::Exit, 0, "", None);
        exit.tgid = 9;
        h.apply(&exit);
        assert!(h.of(9).is_none());
        h.retain(|t| t != 12);
        assert!(h.of(12).is_none());
    }
}
