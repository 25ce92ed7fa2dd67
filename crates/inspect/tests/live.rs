//! The inspector on its own, against the real kernel: a cgroup of our own in
//! the unified hierarchy stands in for a session (the daemon's tests drive it
//! through real sessions, with the labelled corpus). Needs root, BTF and the
//! unified cgroup hierarchy, as CI has; elsewhere it fails loudly, never passes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use drums_api::TurnClass;
use drums_inspect::{InspectError, Inspector, Target};

const UNIFIED: &str = "/sys/fs/cgroup/unified";

struct Cg {
    dir: PathBuf,
    id: u64,
    keeper: Child,
}

impl Cg {
    fn new(name: &str) -> Cg {
        assert!(
            nix::unistd::geteuid().is_root(),
            "SKIPPED FOR REAL: the inspector tests need root (CI runs them as root)"
        );
        let dir =
            Path::new(UNIFIED).join(format!("drums-inspect-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("create a test cgroup in the unified hierarchy");
        let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dir).unwrap());
        let mut cg = Cg {
            dir,
            id,
            keeper: Command::new("true").spawn().unwrap(),
        };
        let _ = cg.keeper.wait();
        // A process that lives through every turn without running: the
        // session's "init".
        cg.keeper = cg.spawn("exec sleep 1000");
        cg
    }

    /// Run `script` in the cgroup. The shell is moved in from outside before it
    /// starts the script, so the move itself is not one of its events.
    fn sh(&self, script: &str) {
        let mut child = self.spawn(script);
        let st = child.wait().unwrap();
        assert!(st.success(), "{script}: {st}");
    }

    fn spawn(&self, script: &str) -> Child {
        let mut child = Command::new("sh")
            .args(["-c", "read _ && eval \"$0\"", script])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::fs::write(self.dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        child
    }

    fn target(&self) -> Target {
        Target {
            session: self.dir.file_name().unwrap().to_string_lossy().into_owned(),
            cgroup_id: self.id,
            cgroup_dir: self.dir.clone(),
            root_pid: std::process::id() as i32,
            subvolume: None,
            ignore: Vec::new(),
        }
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        let _ = self.keeper.kill();
        let _ = self.keeper.wait();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("test cgroup {} left behind", self.dir.display());
    }
}

fn turn(i: &Inspector, cg: &Cg, script: &str) -> drums_api::TurnEffects {
    i.turn_begin(&cg.target()).unwrap();
    cg.sh(script);
    i.turn_end(&cg.target().session).unwrap()
}

#[test]
fn classifies_files_and_processes_and_unloads_at_the_end() {
    let cg = Cg::new("basic");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display().to_string();
    std::fs::write(tmp.path().join("keep"), "1").unwrap();
    let i = Inspector::new(1);

    let t = turn(
        &i,
        &cg,
        &format!("cat {d}/keep >/dev/null; ls {d} >/dev/null"),
    );
    assert_eq!(t.class, TurnClass::None, "{t:#?}");
    assert_eq!(t.turn, 1);

    let t = turn(
        &i,
        &cg,
        &format!("echo x > {d}/tmpf; rm {d}/tmpf; mkdir {d}/dd; rmdir {d}/dd"),
    );
    assert_eq!(t.class, TurnClass::None, "{t:#?}");

    let t = turn(&i, &cg, &format!("cd {d} && echo 2 >> keep"));
    assert_eq!(t.class, TurnClass::Files, "{t:#?}");
    assert_eq!(t.files[0].path, format!("{d}/keep"));
    assert_eq!(t.files[0].change, "modified");

    let t = turn(&i, &cg, &format!("cd {d} && touch new && mv new new2"));
    assert_eq!(t.class, TurnClass::Files, "{t:#?}");
    let paths: Vec<_> = t
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.change.as_str()))
        .collect();
    assert!(
        paths.contains(&(&*format!("{d}/new2"), "modified")),
        "{paths:?}"
    );

    // The pause lets the new process finish starting inside the turn.
    let t = turn(&i, &cg, "sleep 999 & sleep 0.2");
    assert_eq!(t.class, TurnClass::Processes, "{t:#?}");
    assert_eq!(t.processes[0].change, "spawned");
    assert_eq!(t.processes[0].comm, "sleep");

    let t = turn(&i, &cg, "sh -c 'true' ; /bin/true");
    assert_eq!(t.class, TurnClass::None, "{t:#?}");

    let t = turn(&i, &cg, "pkill -f '^sleep 999$'; sleep 0.1");
    assert_eq!(t.class, TurnClass::Processes, "{t:#?}");
    assert!(t.processes.iter().any(|p| p.change == "exited"), "{t:#?}");

    // A process in a cgroup below the session's is the session's: its
    // tasks are walked with the session's own (pre-order, from its cgroup).
    let child = cg.dir.join("child");
    std::fs::create_dir(&child).unwrap();
    let t = turn(
        &i,
        &cg,
        &format!(
            "sh -c 'echo $$ > {}/cgroup.procs && exec sleep 998' & sleep 0.2",
            child.display()
        ),
    );
    let in_child = std::fs::read_to_string(child.join("cgroup.procs")).unwrap();
    std::fs::write(child.join("cgroup.kill"), "1").unwrap();
    while !std::fs::read_to_string(child.join("cgroup.procs"))
        .unwrap()
        .is_empty()
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::fs::remove_dir(&child).unwrap();
    assert!(
        !in_child.trim().is_empty(),
        "the sleeper moved to the child"
    );
    // Both: the move wrote the child's cgroup.procs.
    assert_eq!(t.class, TurnClass::Both, "{t:#?}");
    assert!(
        t.processes
            .iter()
            .any(|p| p.change == "spawned" && p.comm == "sleep"),
        "{t:#?}"
    );

    // Bad input.
    assert!(matches!(
        i.turn_end(&cg.target().session),
        Err(InspectError::NoTurn(_))
    ));
    i.turn_begin(&cg.target()).unwrap();
    assert!(matches!(
        i.turn_begin(&cg.target()),
        Err(InspectError::TurnOpen { .. })
    ));
    i.turn_end(&cg.target().session).unwrap();

    // A watched session's turns, begun and ended by its name and cgroup
    // alone: only while the watch is of that cgroup (the name of a session
    // gone passes to the next one that takes it).
    let (name, other) = (
        cg.target().session,
        Path::new("/sys/fs/cgroup/unified/another"),
    );
    assert!(i.turn_begin_watched(&name, other).is_none());
    assert!(i.turn_begin_watched("unwatched", &cg.dir).is_none());
    let begun = i.turn_begin_watched(&name, &cg.dir).unwrap().unwrap();
    assert!(matches!(
        i.turn_begin_watched(&name, &cg.dir),
        Some(Err(InspectError::TurnOpen { turn, .. })) if turn == begun
    ));
    assert!(i.turn_end_watched(&name, other).is_none());
    assert!(i.turn_end_watched("unwatched", &cg.dir).is_none());
    cg.sh("sleep 100 >/dev/null 2>&1 &");
    let t = i.turn_end_watched(&name, &cg.dir).unwrap().unwrap();
    assert_eq!((t.turn, t.class), (begun, TurnClass::Processes), "{t:#?}");
    assert!(matches!(
        i.turn_end_watched(&name, &cg.dir),
        Some(Err(InspectError::NoTurn(_)))
    ));

    assert!(i.loaded());
    i.unwatch(&cg.target().session);
    assert!(i.turn_begin_watched(&name, &cg.dir).is_none());
    assert!(
        !i.loaded(),
        "the programs unload with the last watched session"
    );
}
