//! The desktop layer, applied after debootstrap to images whose recipe has
//! `desktop` set: what OSWorld-style tasks expect of their VM besides
//! packages.
//!
//! - a user `user` (uid 1000, password `password`, in `sudo`) with
//!   `~/Desktop`, because OSWorld's tasks run `echo password | sudo -S` and
//!   write to `~/Desktop`;
//! - `google-chrome`: Debian's Chromium under the name tasks and checkers
//!   look for (they match process names containing "chrome"), with the flags
//!   this closed network and CRIU need;
//! - the pinned pip packages of the recipe (pyautogui), installed with
//!   Debian's pip and setuptools.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::error::IoContext;
use crate::fsutil::replace_file;
use crate::ImageError;

/// Bump when [`apply`] changes what it writes (the wrapper text is hashed
/// on its own).
const LAYER_REVISION: u32 = 2;

/// The desktop user, as OSWorld's VMs have it.
pub const DESKTOP_USER: &str = "user";
pub const DESKTOP_UID: u32 = 1000;
const DESKTOP_PASSWORD: &str = "password";

/// Chromium's real binary in Debian, and a hard link to it named `chrome`.
/// The kernel names a process after the file it executed, and Chromium
/// re-executes itself through `/proc/self/exe`, which resolves symlinks but
/// keeps a hard link's own name: so only a hard link makes the browser and
/// its children "chrome" (a wrapper or a symlink leaves them "chromium").
/// In the same directory, Chromium finds its resources next to it.
const CHROMIUM: &str = "/usr/lib/chromium/chromium";
const CHROME_LINK: &str = "usr/lib/chromium/chrome";

/// `/usr/bin/google-chrome`. Flags, and why each is always on:
/// - `--no-sandbox`: Chromium's sandbox nests user and PID namespaces, which
///   CRIU cannot checkpoint; the session itself is the sandbox.
/// - `--disable-gpu`: there is no GPU under Xvfb.
/// - `--no-first-run`, `--no-default-browser-check`, `--password-store=basic`:
///   no dialogs and no keyring prompt on a fresh profile.
/// - `--disable-background-networking`, `--disable-component-update`,
///   `--disable-sync`, `--disable-breakpad`: the sandbox has no internet;
///   without these Chromium keeps retrying Google's hosts.
/// - `--remote-allow-origins=*`: CDP clients (OSWorld's, Playwright) send an
///   Origin header, which Chromium otherwise rejects.
/// - `--user-data-dir`: Google Chrome's usual profile path, which is where
///   OSWorld's tasks look; a caller's own `--user-data-dir` comes later in
///   "$@" and wins.
pub const GOOGLE_CHROME: &str = r#"#!/bin/sh
# drums: Debian's Chromium as google-chrome (see crates/image/src/desktop.rs).
exec /usr/lib/chromium/chrome \
  --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \
  --password-store=basic --disable-background-networking \
  --disable-component-update --disable-sync --disable-breakpad \
  --remote-allow-origins='*' \
  --user-data-dir="$HOME/.config/google-chrome" "$@"
"#;

/// Identifies what [`apply`] writes, for the recipe hash.
pub fn layer_hash() -> String {
    let mut h = Sha256::new();
    h.update(LAYER_REVISION.to_le_bytes());
    h.update(GOOGLE_CHROME.as_bytes());
    format!("{:x}", h.finalize())
}

/// Applies the desktop layer to a debootstrapped tree, then installs `pip`.
/// Runs programs of the tree under `chroot` (useradd, chpasswd, pip), with
/// their output appended to `log`.
pub fn apply(rootfs: &Path, pip: &[String], log: &Path) -> Result<(), ImageError> {
    if !rootfs.join(CHROMIUM.trim_start_matches('/')).exists() {
        return Err(ImageError::InvalidRecipe {
            field: "desktop",
            value: CHROMIUM.into(),
            reason: "the desktop layer needs Debian's chromium in the recipe",
        });
    }
    let home = format!("home/{DESKTOP_USER}");
    if !rootfs.join(&home).exists() {
        chroot(
            rootfs,
            &[
                "useradd",
                "--create-home",
                "--shell",
                "/bin/bash",
                "--uid",
                &DESKTOP_UID.to_string(),
                "--groups",
                "sudo",
                DESKTOP_USER,
            ],
            None,
            log,
        )?;
    }
    chroot(
        rootfs,
        &["chpasswd"],
        Some(format!("{DESKTOP_USER}:{DESKTOP_PASSWORD}\n").as_bytes()),
        log,
    )?;

    let link = rootfs.join(CHROME_LINK);
    if fs::symlink_metadata(&link).is_err() {
        let target = rootfs.join(CHROMIUM.trim_start_matches('/'));
        fs::hard_link(&target, &link).ctx("hard-link chrome to", &target)?;
    }
    replace_file(
        &rootfs.join("usr/bin/google-chrome"),
        GOOGLE_CHROME.as_bytes(),
        0o755,
    )?;

    // Owned by the user: Chromium and the tasks write there. "First Run"
    // marks the profile as set up, which skips the welcome tab.
    for d in ["Desktop", ".config/google-chrome"] {
        let path = rootfs.join(&home).join(d);
        fs::create_dir_all(&path).ctx("create directory", &path)?;
    }
    replace_file(
        &rootfs.join(&home).join(".config/google-chrome/First Run"),
        b"",
        0o644,
    )?;
    for d in ["Desktop", ".config", ".config/google-chrome"] {
        let path = rootfs.join(&home).join(d);
        chown(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .ctx("set permissions of", &path)?;
    }
    chown(&rootfs.join(&home).join(".config/google-chrome/First Run"))?;

    if !pip.is_empty() {
        install_pip(rootfs, pip, log)?;
    }
    Ok(())
}

/// The build log, appended to, as a child's stdout and stderr.
fn log_to(log: &Path) -> Result<(fs::File, fs::File), ImageError> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .ctx("open", log)?;
    let err = out.try_clone().ctx("open", log)?;
    Ok((out, err))
}

/// Downloads the pinned packages with the host's pip, which is configured
/// for this machine's package index (proxy, certificate authority), then
/// installs them inside the tree from that directory alone. The image gets
/// the packages and none of the host's pip configuration.
pub(crate) fn install_pip(rootfs: &Path, pip: &[String], log: &Path) -> Result<(), ImageError> {
    let dir_in_tree = "tmp/drums-pip";
    let dir = rootfs.join(dir_in_tree);
    fs::create_dir_all(&dir).ctx("create directory", &dir)?;
    let result = (|| {
        let (out, err) = log_to(log)?;
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .arg("--dest")
            .arg(&dir)
            .args(pip)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .ctx("run the host's pip (python3 -m pip) for", &dir)?;
        if !status.success() {
            return Err(ImageError::Step {
                step: format!("pip download {}", pip.join(" ")),
                detail: format!("{status}; see {}", log.display()),
            });
        }
        // --no-deps: the recipe pins every package, so pip installs exactly
        // those; what they need from Debian is in the package list.
        // --no-build-isolation: build the sdists with Debian's setuptools.
        // --break-system-packages: this tree is the system being built.
        let find_links = format!("/{dir_in_tree}");
        let mut args = vec![
            "python3",
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            &find_links,
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "--break-system-packages",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
        ];
        args.extend(pip.iter().map(String::as_str));
        chroot(rootfs, &args, None, log)
    })();
    fs::remove_dir_all(&dir).ctx("remove", &dir)?;
    result
}

fn chown(path: &Path) -> Result<(), ImageError> {
    std::os::unix::fs::lchown(path, Some(DESKTOP_UID), Some(DESKTOP_UID)).ctx("chown", path)
}

/// Runs `argv` inside `rootfs` with a clean environment (nothing of the
/// daemon's environment reaches the image), output appended to `log`.
fn chroot(
    rootfs: &Path,
    argv: &[&str],
    stdin: Option<&[u8]>,
    log: &Path,
) -> Result<(), ImageError> {
    use std::io::Write;
    let (out, err) = log_to(log)?;
    let mut child = Command::new("chroot")
        .arg(rootfs)
        .args(argv)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(out)
        .stderr(err)
        .spawn()
        .ctx("run chroot for", Path::new(argv[0]))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data).ctx("write to", Path::new(argv[0]))?;
    }
    let status = child.wait().ctx("wait for", Path::new(argv[0]))?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::Step {
            step: format!("{} in the image", argv.join(" ")),
            detail: format!("{status}; see {}", log.display()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper is shell run in every desktop session; a syntax error
    /// would only show there.
    #[test]
    fn wrapper_is_valid_sh_and_names_the_chrome_link() {
        let out = Command::new("sh")
            .args(["-n", "-c", GOOGLE_CHROME])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(GOOGLE_CHROME.contains(&format!("exec /{CHROME_LINK} ")));
        assert!(GOOGLE_CHROME.contains("--no-sandbox"));
    }

    #[test]
    fn layer_hash_is_stable_hex() {
        assert_eq!(layer_hash(), layer_hash());
        assert_eq!(layer_hash().len(), 64);
    }

    #[test]
    fn refuses_a_tree_without_chromium() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let err = apply(tmp.path(), &[], &log).unwrap_err().to_string();
        assert!(err.contains("chromium"), "{err}");
    }
}
