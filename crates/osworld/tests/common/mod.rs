//! The X harness of crates/screen's tests (a real Xvfb per test, the leak
//! check), shared rather than copied, plus a throwaway system user for the
//! protocol's run-as-user paths.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::process::{Command, Stdio};

#[path = "../../../screen/tests/common/mod.rs"]
mod x;
pub use x::*;

/// A throwaway system user with a home directory, removed with its home
/// (and its group) when dropped, also when the test panics.
pub struct TestUser {
    pub name: String,
    pub home: std::path::PathBuf,
}

impl TestUser {
    pub fn create() -> TestUser {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("drow{}x{n}", std::process::id());
        let home = std::path::PathBuf::from(format!("/tmp/{name}-home"));
        let status = Command::new("useradd")
            .args([
                "--system",
                "--create-home",
                "--shell",
                "/bin/bash",
                "--home-dir",
            ])
            .arg(&home)
            .arg(&name)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run useradd ({e}): these tests need root and the passwd package")
            });
        assert!(
            status.success(),
            "useradd {name} failed ({status}): these tests must run as root"
        );
        TestUser { name, home }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel")
            .args(["--remove", &self.name])
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}
