//! `vmrun` (crates/vmrun) end to end against a real drumsd, in the argument
//! forms OSWorld's vmware provider uses: start, address, snapshot, revert,
//! list, stop, and the failures that must change nothing. As root; ends by
//! proving nothing is left on the host.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{run, TestDaemon};
use drums_api::{CheckpointList, Session, SessionList};
use hyper::Method;

/// vmrun is another package's binary, so Cargo gives this crate no
/// CARGO_BIN_EXE for it: it is found beside drumsd, as the other binaries are.
fn vmrun_bin() -> PathBuf {
    let p = common::bin_dir().join("drums-vmrun");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --release --workspace`; drums-vmrun's binary is vmrun)",
        p.display()
    );
    p
}

/// vmrun pointed at one test daemon, never at the system's: its socket and
/// state directory, autostart off, and a registry in a temporary directory.
struct Vmrun<'a> {
    d: &'a TestDaemon,
    dir: &'a Path,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Vmrun<'_> {
    fn registry(&self) -> PathBuf {
        self.dir.join("registry/registry.json")
    }

    fn run(&self, args: &[&str]) -> Out {
        let o = Command::new(vmrun_bin())
            .args(args)
            .current_dir(self.dir)
            .env("DRUMS_STATE_DIR", self.d.state.path())
            .env("DRUMS_SOCKET", self.d.client.socket())
            .env("DRUMS_NO_AUTOSTART", "true")
            .env("DRUMS_VMRUN_REGISTRY", self.registry())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Run, expecting success.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(
            o.code,
            0,
            "vmrun {args:?} failed:\nstdout: {}\nstderr: {}\n--- drumsd log ---\n{}",
            o.stdout,
            o.stderr,
            self.d.log()
        );
        o.stdout
    }

    /// Run, expecting vmrun's failure: exit 255 and `Error: ...` on stdout.
    fn fails(&self, args: &[&str], expect: &str) {
        let o = self.run(args);
        assert_eq!(
            o.code, 255,
            "vmrun {args:?} should fail with 255:\nstdout: {}\nstderr: {}",
            o.stdout, o.stderr
        );
        assert!(
            o.stdout.starts_with("Error: ") && o.stdout.contains(expect),
            "vmrun {args:?}: expected an error containing {expect:?}, got:\n{}",
            o.stdout
        );
    }
}

const NAME: &str = "vmrun-t1";

fn spec(name: &str) -> String {
    format!(
        "# a drums session spec in .vmx syntax\n\
         .encoding = \"UTF-8\"\n\
         drums.version = \"1\"\n\
         displayName = \"{name}\"\n\
         drums.profile = \"headless\"\n\
         drums.image = \"default\"\n\
         drums.network = \"bridge\"\n\
         memsize = \"4096\"\n"
    )
}

async fn session(d: &TestDaemon, name: &str) -> Option<Session> {
    match d
        .client
        .json::<Session>(Method::GET, &format!("/v1/sessions/{name}"), None::<&()>)
        .await
    {
        Ok(s) => Some(s),
        Err(drums_api::ClientError::Api { status: 404, .. }) => None,
        Err(e) => panic!("get session: {e}"),
    }
}

async fn sessions(d: &TestDaemon) -> Vec<Session> {
    let l: SessionList = d
        .client
        .json(Method::GET, "/v1/sessions", None::<&()>)
        .await
        .unwrap();
    l.sessions
}

/// (id, name) of every checkpoint.
async fn checkpoints(d: &TestDaemon) -> Vec<(String, String)> {
    let l: CheckpointList = d
        .client
        .json(Method::GET, "/v1/checkpoints", None::<&()>)
        .await
        .unwrap();
    l.checkpoints.into_iter().map(|c| (c.id, c.name)).collect()
}

#[test]
fn osworld_reset_cycle() {
    let mut d = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let vmx_path = dir.path().join("vm").join("osworld.vmx");
    std::fs::create_dir_all(vmx_path.parent().unwrap()).unwrap();
    std::fs::write(&vmx_path, spec(NAME)).unwrap();
    let vmx = vmx_path.to_str().unwrap();
    let v = Vmrun {
        d: &d,
        dir: dir.path(),
    };
    run(async {
        assert_eq!(v.ok(&["-T", "ws", "list"]), "Total running VMs: 0\n");

        // start: as OSWorld calls it, with a relative path (vmrun resolves
        // it against its working directory).
        v.ok(&["-T", "ws", "start", "./vm/../vm/osworld.vmx", "nogui"]);
        let s = session(&d, NAME).await.expect("start created the session");
        assert_eq!(s.state, drums_api::SessionState::Running);
        assert_eq!(s.profile, drums_api::Profile::Headless);
        // A second start of a running VM does nothing.
        v.ok(&["-T", "ws", "start", vmx, "nogui"]);
        assert_eq!(session(&d, NAME).await.unwrap().id, s.id);

        let ip = v.ok(&["-T", "ws", "getGuestIPAddress", vmx, "-wait"]);
        assert_eq!(ip.trim(), s.ip.as_deref().unwrap());

        // What OSWorld's start_emulator loop looks for: the absolute path.
        assert_eq!(
            v.ok(&["-T", "ws", "list"]),
            format!("Total running VMs: 1\n{vmx}\n")
        );

        assert_eq!(d.sh(NAME, "echo 1 > /root/marker").0, 0);
        v.ok(&["-T", "ws", "snapshot", vmx, "init_state"]);
        let cks = checkpoints(&d).await;
        assert_eq!(cks.len(), 1, "{cks:?}");
        assert_eq!(cks[0].1, format!("{NAME}.init_state"));
        let first = cks[0].0.clone();
        assert_eq!(
            session(&d, NAME).await.unwrap().id,
            s.id,
            "the snapshot left the VM running"
        );

        assert_eq!(d.sh(NAME, "echo 2 > /root/marker").0, 0);
        v.ok(&["-T", "ws", "revertToSnapshot", vmx, "init_state"]);
        let r = session(&d, NAME)
            .await
            .expect("the reverted VM keeps its name");
        assert_ne!(r.id, s.id, "a restore is a new session");
        assert_eq!(r.state, drums_api::SessionState::Running);
        assert_eq!(r.origin.as_deref(), Some(first.as_str()));
        assert!(r.ip.is_some());
        assert_eq!(d.sh(NAME, "cat /root/marker").1, "1");
        let ip = v.ok(&["-T", "ws", "getGuestIPAddress", vmx, "-wait"]);
        assert_eq!(ip.trim(), r.ip.as_deref().unwrap());
        assert_eq!(sessions(&d).await.len(), 1, "the old session is gone");

        // Taking the snapshot again replaces it: one checkpoint, a new one.
        assert_eq!(d.sh(NAME, "echo 3 > /root/marker").0, 0);
        v.ok(&["-T", "fusion", "snapshot", vmx, "init_state"]);
        let cks = checkpoints(&d).await;
        assert_eq!(cks.len(), 1, "the replaced checkpoint is deleted: {cks:?}");
        assert_ne!(cks[0].0, first);
        assert_eq!(d.sh(NAME, "echo 4 > /root/marker").0, 0);
        v.ok(&["revertToSnapshot", vmx, "init_state"]);
        assert_eq!(d.sh(NAME, "cat /root/marker").1, "3");

        assert_eq!(
            v.ok(&["-T", "ws", "list"]),
            format!("Total running VMs: 1\n{vmx}\n")
        );

        // A revert to a snapshot that does not exist changes nothing.
        let before = session(&d, NAME).await.unwrap();
        let registry = std::fs::read(v.registry()).unwrap();
        v.fails(
            &["-T", "ws", "revertToSnapshot", vmx, "no_such"],
            "snapshot with the name does not exist",
        );
        assert_eq!(session(&d, NAME).await.unwrap().id, before.id);
        assert_eq!(d.sh(NAME, "cat /root/marker").1, "3");
        assert_eq!(std::fs::read(v.registry()).unwrap(), registry);

        v.ok(&["-T", "ws", "stop", vmx, "hard"]);
        assert!(session(&d, NAME).await.is_none());
        assert_eq!(v.ok(&["-T", "ws", "list"]), "Total running VMs: 0\n");

        // A VM that is not running cannot be snapshotted, nor stopped; a
        // missing snapshot is still refused. Nothing changes.
        let cks = checkpoints(&d).await;
        v.fails(&["-T", "ws", "snapshot", vmx, "later"], "not powered on");
        v.fails(&["-T", "ws", "stop", vmx], "not powered on");
        v.fails(&["-T", "ws", "getGuestIPAddress", vmx], "not powered on");
        v.fails(
            &["-T", "ws", "revertToSnapshot", vmx, "no_such"],
            "snapshot with the name does not exist",
        );
        let other = dir.path().join("other.vmx");
        std::fs::write(&other, spec("vmrun-never")).unwrap();
        let other = other.to_str().unwrap();
        v.fails(
            &["-T", "ws", "snapshot", other, "init_state"],
            "not powered on",
        );
        v.fails(
            &["-T", "ws", "revertToSnapshot", other, "init_state"],
            "snapshot with the name does not exist",
        );
        assert_eq!(checkpoints(&d).await, cks);
        assert!(sessions(&d).await.is_empty());
        assert_eq!(std::fs::read(v.registry()).unwrap(), registry);

        // Bad input fails before any daemon call.
        let bad = dir.path().join("v2.vmx");
        std::fs::write(&bad, "drums.version = \"2\"\ndisplayName = \"x\"\n").unwrap();
        v.fails(&["-T", "ws", "start", bad.to_str().unwrap()], "version");
        v.fails(
            &[
                "-T",
                "ws",
                "start",
                dir.path().join("absent.vmx").to_str().unwrap(),
            ],
            "cannot open VM",
        );
        v.fails(&["-T", "ws", "suspend", vmx], "unrecognized command");
        assert!(sessions(&d).await.is_empty());

        // The snapshot survives a stop: a revert starts the VM from it.
        v.ok(&["-T", "ws", "revertToSnapshot", vmx, "init_state"]);
        assert_eq!(d.sh(NAME, "cat /root/marker").1, "3");
        assert_eq!(
            v.ok(&["-T", "ws", "list"]),
            format!("Total running VMs: 1\n{vmx}\n")
        );
        v.ok(&["-T", "ws", "stop", vmx]);

        for (id, _) in checkpoints(&d).await {
            d.client
                .call(
                    Method::DELETE,
                    &format!("/v1/checkpoints/{id}"),
                    None::<&()>,
                )
                .await
                .unwrap();
        }
        assert!(d.store_subvolumes().is_empty());
    });
    d.stop_and_check_leaks();
}
