use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::IoContext;
use crate::fsutil::{remove_if_exists, replace_file};
use crate::ImageError;

/// `/etc/hosts` for every image. `localhost` must resolve without DNS (the
/// sandbox may have no network at all), and the hostname "drums" is mapped
/// too because sudo looks it up on every call and prints "unable to resolve
/// host drums" (after a DNS timeout, without network) if it cannot.
const HOSTS: &str = "\
127.0.0.1\tlocalhost
127.0.1.1\tdrums
::1\tlocalhost ip6-localhost ip6-loopback
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
";

/// Where the Python hook goes: Debian's directory for distribution-installed
/// modules, which every Debian `python3` has on `sys.path` (and whose `.pth`
/// files `site` processes) whatever its minor version.
pub const PYTHON_HOOK_DIR: &str = "usr/lib/python3/dist-packages";

/// The reseed hook: registers each Python process for the guest agent's
/// reseed signal and reseeds `random` (and numpy) when it comes. See
/// `docs/hygiene.md`.
pub const RESEED_MODULE: &str = include_str!("drums_reseed.py");

/// `site` executes `import` lines of `.pth` files at start-up, so this makes
/// every Python process (that runs `site`: not `python3 -S`, not a venv
/// without system site-packages) import the hook.
pub const RESEED_PTH: &str = "import drums_reseed\n";

/// What drums needs in every image, applied to a fresh debootstrap tree.
///
/// Kept deliberately small: anything that varies per session (machine id,
/// network, users) is set up by the session at start, not baked in here.
/// Bump [`crate::RECIPE_REVISION`] whenever this changes, so cached images
/// are rebuilt.
pub fn customize(rootfs: &Path) -> Result<(), ImageError> {
    let etc = rootfs.join("etc");
    fs::create_dir_all(&etc).ctx("create directory", &etc)?;

    // Empty machine-id: every session started from this image would otherwise
    // share the id written at build time (systemd and dbus use it as a unique
    // host identity). An empty file means "not set"; drums writes a fresh one
    // per session. The file must exist so it can be bind-mounted over.
    replace_file(&etc.join("machine-id"), b"", 0o444)?;
    // dbus keeps its own copy when it is a regular file rather than the usual
    // symlink to /etc/machine-id; drop it so dbus falls back to /etc.
    let dbus_id = rootfs.join("var/lib/dbus/machine-id");
    if fs::symlink_metadata(&dbus_id).is_ok_and(|m| m.is_file()) {
        remove_if_exists(&dbus_id)?;
    }

    // debootstrap copies the build host's hostname into the tree; sessions
    // get a fixed, neutral one instead (matched in /etc/hosts below).
    replace_file(&etc.join("hostname"), b"drums\n", 0o644)?;

    // netbase normally provides /etc/hosts, but minbase does not install it.
    replace_file(&etc.join("hosts"), HOSTS.as_bytes(), 0o644)?;

    // debootstrap also copies the build host's resolv.conf, which describes the
    // host's network, not the sandbox's, and would leak it into every session.
    // Left empty (but present, as a bind-mount target) for the session's
    // network setup to fill.
    replace_file(&etc.join("resolv.conf"), b"", 0o644)?;

    // /run is where a tmpfs is mounted at session start; the mount point has
    // to exist in the lower layer because the image is read-only.
    let run = rootfs.join("run");
    fs::create_dir_all(&run).ctx("create directory", &run)?;
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).ctx("set permissions of", &run)?;

    // Clone hygiene for Python: restored siblings must not continue with the
    // same `random` state. Written even if python3 is not in the recipe, so
    // that a python3 installed later in a session has the hook too.
    let hook_dir = rootfs.join(PYTHON_HOOK_DIR);
    fs::create_dir_all(&hook_dir).ctx("create directory", &hook_dir)?;
    replace_file(
        &hook_dir.join("drums_reseed.py"),
        RESEED_MODULE.as_bytes(),
        0o644,
    )?;
    replace_file(
        &hook_dir.join("drums_reseed.pth"),
        RESEED_PTH.as_bytes(),
        0o644,
    )?;
    compile_hook(rootfs)?;

    // Size: package lists and downloaded .debs are only needed while
    // installing. Lists go stale anyway (a session runs `apt-get update`,
    // which recreates them in its own upper layer), and the .debs are kept in
    // drums' debootstrap cache directory, not in every image.
    clear_dir(&rootfs.join("var/lib/apt/lists"), |_| true)?;
    clear_dir(&rootfs.join("var/cache/apt/archives"), |name| {
        name.ends_with(".deb")
    })?;
    // apt's binary caches are derived from the lists just removed.
    clear_dir(&rootfs.join("var/cache/apt"), |name| name.ends_with(".bin"))?;
    Ok(())
}

/// Byte-compile the reseed hook with the image's own interpreter. Otherwise the
/// first Python process of every session writes its `.pyc` into the session's
/// upper layer: a real change, which the inspector reports, for nothing.
/// Skipped in a tree without an executable python3 (installed later, it
/// compiles the hook at its first run, in that session only).
fn compile_hook(rootfs: &Path) -> Result<(), ImageError> {
    let executable = fs::metadata(rootfs.join("usr/bin/python3"))
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if !executable {
        return Ok(());
    }
    let module = format!("/{PYTHON_HOOK_DIR}/drums_reseed.py");
    let out = std::process::Command::new("chroot")
        .arg(rootfs)
        .args(["python3", "-m", "py_compile", &module])
        .output()
        .map_err(|source| ImageError::Spawn {
            program: "chroot".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(ImageError::Step {
            step: format!("chroot python3 -m py_compile {module}"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Removes the entries of `dir` whose names pass `pick` (files and whole
/// subdirectories, never following symlinks). A missing directory is fine.
fn clear_dir(dir: &Path, pick: impl Fn(&str) -> bool) -> Result<(), ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("read directory", dir, e)),
    };
    for entry in entries {
        let entry = entry.ctx("read directory", dir)?;
        if !pick(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        let is_dir = entry.file_type().ctx("stat", &path)?.is_dir();
        if is_dir {
            fs::remove_dir_all(&path).ctx("remove", &path)?;
        } else {
            remove_if_exists(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn customize_fresh_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for d in [
            "etc",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/lib/dbus",
        ] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::write(root.join("etc/machine-id"), "0123456789abcdef\n").unwrap();
        fs::write(root.join("etc/hostname"), "buildhost\n").unwrap();
        fs::write(root.join("etc/resolv.conf"), "nameserver 10.0.0.1\n").unwrap();
        fs::write(root.join("var/lib/dbus/machine-id"), "0123\n").unwrap();
        fs::write(root.join("var/lib/apt/lists/x_Packages"), "p").unwrap();
        fs::write(root.join("var/lib/apt/lists/lock"), "").unwrap();
        fs::write(root.join("var/cache/apt/archives/a_1_amd64.deb"), "d").unwrap();
        fs::write(root.join("var/cache/apt/archives/lock"), "").unwrap();
        fs::write(root.join("var/cache/apt/pkgcache.bin"), "c").unwrap();

        customize(root).unwrap();

        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("etc/machine-id"), "");
        assert_eq!(read("etc/hostname"), "drums\n");
        assert_eq!(read("etc/resolv.conf"), "");
        assert!(read("etc/hosts").contains("127.0.0.1\tlocalhost"));
        assert!(read("etc/hosts").contains("::1\tlocalhost"));
        assert!(read("etc/hosts").contains("drums"));
        assert!(root.join("run").is_dir());
        assert!(!root.join("var/lib/dbus/machine-id").exists());
        assert_eq!(
            fs::read_dir(root.join("var/lib/apt/lists"))
                .unwrap()
                .count(),
            0
        );
        assert!(!root.join("var/cache/apt/archives/a_1_amd64.deb").exists());
        assert!(root.join("var/cache/apt/archives/lock").exists());
        assert!(root.join("var/cache/apt/archives/partial").is_dir());
        assert!(!root.join("var/cache/apt/pkgcache.bin").exists());
        assert_eq!(
            read("usr/lib/python3/dist-packages/drums_reseed.py"),
            RESEED_MODULE
        );
        assert_eq!(
            read("usr/lib/python3/dist-packages/drums_reseed.pth"),
            "import drums_reseed\n"
        );
        let mode = fs::metadata(root.join("etc/hosts"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);

        // Idempotent.
        customize(root).unwrap();
    }

    /// The hook is Python source compiled only inside the image; a syntax
    /// error there would break nothing in the build and every Python process
    /// in every session (site prints the error for each one), so compile it
    /// here.
    #[test]
    fn reseed_hook_compiles_and_is_inert_outside_drums() {
        let tmp = tempfile::tempdir().unwrap();
        customize(tmp.path()).unwrap();
        let dir = tmp.path().join(PYTHON_HOOK_DIR);
        let python = python3();
        let out = std::process::Command::new(&python)
            .args(["-m", "py_compile"])
            .arg(dir.join("drums_reseed.py"))
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run {python} (python3 is needed by this test): {e}")
            });
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The .pth line works as site would run it, and outside a drums
        // session (no reseed directory) the hook leaves SIGUSR2 and the run
        // directory alone.
        let run = tmp.path().join("no-run");
        let out = std::process::Command::new(&python)
            .args(["-S", "-c"])
            .arg(format!(
                "import sys, signal; sys.path.insert(0, {dir:?}); {line}; \
                 print(signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)",
                line = RESEED_PTH.trim()
            ))
            .env("DRUMS_RUN_DIR", &run)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "True\n");
        assert!(!run.exists());
    }

    /// Debian's interpreter, as in the images; any python3 otherwise.
    fn python3() -> String {
        if Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3".into()
        } else {
            "python3".into()
        }
    }

    #[test]
    fn dbus_machine_id_symlink_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("var/lib/dbus")).unwrap();
        std::os::unix::fs::symlink("/etc/machine-id", root.join("var/lib/dbus/machine-id"))
            .unwrap();
        customize(root).unwrap();
        assert!(fs::symlink_metadata(root.join("var/lib/dbus/machine-id"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
