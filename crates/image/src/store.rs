use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::fsutil::{
    disk_usage, fsync_dir, remove_build_tree, remove_if_exists, remove_tree, sync_filesystem,
};
use crate::{customize, ImageError, Recipe};

/// Where images live unless configured otherwise.
pub const DEFAULT_IMAGES_DIR: &str = "/var/lib/drums/images";

/// Where debootstrap keeps downloaded .debs between builds (`--cache-dir`),
/// so rebuilding an image does not download everything again.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/drums/cache/debootstrap";

/// Version of the `image.json` format written by this crate. See [`ImageInfo`].
pub const FORMAT_VERSION: u32 = 2;

const METADATA_FILE: &str = "image.json";
const ROOTFS_DIR: &str = "rootfs";
/// Prefix of everything in the images dir that is not a finished image. Image
/// names cannot start with '.', so these never collide with an image.
const BUILD_PREFIX: &str = ".build-";
const LOCK_FILE: &str = ".lock";
/// How many lines of the log go into a debootstrap error message.
const TAIL_LINES: usize = 25;

/// An image as described by its `image.json`, plus where its tree is.
///
/// NOTE: this struct *is* the on-disk format. Any change to its serialized
/// fields (adding, removing, renaming, changing a meaning) needs a
/// [`FORMAT_VERSION`] bump, so an older drums refuses the new format instead
/// of misreading it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// Always [`FORMAT_VERSION`] when written by this crate.
    pub format_version: u32,
    pub name: String,
    pub suite: String,
    pub variant: String,
    /// Debian architecture, e.g. `amd64`.
    pub arch: String,
    /// Packages passed to `--include`, as given in the recipe.
    pub packages: Vec<String>,
    /// Pinned pip packages installed after debootstrap (format 2; absent in 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    /// The desktop layer was applied (format 2; absent in 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub desktop: bool,
    /// [`Recipe::hash`] of the recipe the image was built from.
    pub recipe_hash: String,
    /// Unix time (seconds) the build finished.
    pub created_at: u64,
    /// Disk usage of the rootfs in bytes, measured at build time.
    pub size_bytes: u64,
    /// `<images_dir>/<name>/rootfs`; derived from the location, not stored.
    #[serde(skip)]
    pub rootfs: PathBuf,
}

impl ImageInfo {
    /// The recipe this image was built from.
    pub fn recipe(&self) -> Recipe {
        Recipe {
            suite: self.suite.clone(),
            variant: self.variant.clone(),
            packages: self.packages.clone(),
            pip: self.pip.clone(),
            desktop: self.desktop,
        }
    }
}

/// Checks an image name: `[a-z0-9][a-z0-9._-]{0,62}`.
///
/// Names become directory names and show up in commands, so they are kept to
/// characters that need no quoting, cannot be a path (`..`, `/`) and cannot
/// be hidden or collide with build directories (no leading '.').
pub fn validate_name(name: &str) -> Result<(), ImageError> {
    let bytes = name.as_bytes();
    let ok = matches!(bytes.first(), Some(b) if b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.len() <= 63
        && bytes.iter().all(|&b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(ImageError::InvalidName(name.to_string()))
    }
}

/// Debian architecture name of the machine drums runs on. Passed to
/// debootstrap explicitly so `image.json` records what was actually built.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "i386",
        "aarch64" => "arm64",
        "arm" => "armhf",
        "powerpc64" => "ppc64el",
        "loongarch64" => "loong64",
        // riscv64, s390x, mips64el: same name in Rust and Debian.
        other => other,
    }
}

/// The images directory: lists, builds and removes images.
#[derive(Debug, Clone)]
pub struct ImageStore {
    dir: PathBuf,
    /// Program (and leading arguments) run as debootstrap. Only tests change
    /// it, to exercise builds without network or root.
    debootstrap: Vec<OsString>,
}

impl ImageStore {
    /// A store rooted at `dir` (e.g. [`DEFAULT_IMAGES_DIR`]). Nothing is
    /// created until the first build.
    pub fn new(dir: impl Into<PathBuf>) -> ImageStore {
        ImageStore {
            dir: dir.into(),
            debootstrap: vec!["debootstrap".into()],
        }
    }

    /// The images directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/.build-<name>.log`: output of the last debootstrap run for `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{BUILD_PREFIX}{name}.log"))
    }

    /// All finished images, sorted by name.
    ///
    /// Directories without a readable `image.json` (a partial or foreign
    /// directory) and `.build-*` directories are skipped, as are images in a
    /// newer format (with a warning, since they are not usable by this drums).
    /// A missing images directory means no images.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io("read directory", &self.dir, e)),
        };
        let mut images = Vec::new();
        for entry in entries {
            let entry = entry.ctx("read directory", &self.dir)?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // Also skips `.build-*`, `.lock` and anything else hidden.
            if validate_name(&name).is_err() || !entry.path().is_dir() {
                continue;
            }
            match self.get(&name) {
                Ok(info) => images.push(info),
                Err(ImageError::NotFound(_)) => {
                    tracing::debug!(image = %name, "skipping directory without image.json");
                }
                Err(e) => tracing::warn!(image = %name, error = %e, "skipping unreadable image"),
            }
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// The image called `name`; [`ImageError::NotFound`] if there is no
    /// finished image (no `image.json`) by that name.
    pub fn get(&self, name: &str) -> Result<ImageInfo, ImageError> {
        validate_name(name)?;
        let image_dir = self.dir.join(name);
        let path = image_dir.join(METADATA_FILE);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                return Err(ImageError::NotFound(name.to_string()))
            }
            Err(e) => return Err(ImageError::io("read", &path, e)),
        };
        let mut info = parse_metadata(&text, &path)?;
        info.rootfs = image_dir.join(ROOTFS_DIR);
        Ok(info)
    }

    /// Builds image `name` from `recipe`, or returns the existing image if it
    /// was built from the same recipe (same [`Recipe::hash`]) for this arch.
    ///
    /// Steps: `debootstrap --variant=<variant> --arch=<arch>
    /// --include=<packages> --cache-dir=<cache_dir> <suite> <tmp>/rootfs
    /// <mirror>` into `<dir>/.build-<name>-<pid>`, then [`customize`], then
    /// `image.json` (after syncing the filesystem; file and directory
    /// fsynced), then the directory is renamed to `<dir>/<name>`. An older
    /// image of that name is renamed aside first and deleted afterwards. On
    /// failure the build directory is removed and any older image is left as
    /// it was.
    ///
    /// debootstrap's output goes to [`ImageStore::log_path`]; its last lines
    /// are included in [`ImageError::Debootstrap`]. `progress` is called with
    /// a short message at each phase (including debootstrap's own phases).
    ///
    /// Builds and removals in one images dir are serialized by a lock file:
    /// debootstrap's cache dir is not safe for concurrent use, and two
    /// debootstraps on a small machine are slower than one after the other.
    /// This call blocks (saying so through `progress`) while another build
    /// runs.
    ///
    /// Replacing an image does not stop sessions using the old one; callers
    /// should not rebuild an image that running sessions have mounted, as its
    /// tree is deleted under them.
    pub fn build(
        &self,
        name: &str,
        recipe: &Recipe,
        mirror: &str,
        cache_dir: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ImageInfo, ImageError> {
        validate_name(name)?;
        recipe.validate()?;
        validate_mirror(mirror)?;
        let started = Instant::now();
        let hash = recipe.hash();
        let arch = host_arch();

        if let Some(info) = self.cached(name, &hash, arch)? {
            progress(&format!("image {name} is up to date"));
            return Ok(info);
        }

        fs::create_dir_all(&self.dir).ctx("create directory", &self.dir)?;
        let _lock = self.lock(progress)?;
        // Whoever held the lock may just have built this very recipe.
        if let Some(info) = self.cached(name, &hash, arch)? {
            progress(&format!("image {name} is up to date"));
            return Ok(info);
        }
        self.remove_stale_build_dirs();

        let cache_dir = std::path::absolute(cache_dir).ctx("resolve", cache_dir)?;
        fs::create_dir_all(&cache_dir).ctx("create directory", &cache_dir)?;

        let tmp = self
            .dir
            .join(format!("{BUILD_PREFIX}{name}-{}", std::process::id()));
        let guard = BuildDirGuard(Some(tmp.clone()));
        let rootfs = tmp.join(ROOTFS_DIR);
        for d in [&tmp, &rootfs] {
            fs::create_dir(d).ctx("create directory", d)?;
            // The rootfs directory becomes "/" in every session: it must be
            // 0755 whatever the daemon's umask is.
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))
                .ctx("set permissions of", d)?;
        }

        let log = self.log_path(name);
        progress(&format!(
            "running debootstrap {} ({}, {arch}) from {mirror}; log: {}",
            recipe.suite,
            recipe.variant,
            log.display()
        ));
        self.run_debootstrap(recipe, arch, mirror, &cache_dir, &rootfs, &log, progress)?;

        if recipe.desktop {
            progress("applying the desktop layer (user, google-chrome, pip packages)");
            crate::desktop::apply(&rootfs, &recipe.pip, &log)?;
        } else if !recipe.pip.is_empty() {
            progress("installing the pinned pip packages");
            crate::desktop::install_pip(&rootfs, &recipe.pip, &log)?;
        }

        progress("customizing rootfs");
        customize(&rootfs)?;

        progress("measuring rootfs size");
        let size_bytes = disk_usage(&rootfs)?;

        progress("writing image.json");
        let final_dir = self.dir.join(name);
        let info = ImageInfo {
            format_version: FORMAT_VERSION,
            name: name.to_string(),
            suite: recipe.suite.clone(),
            variant: recipe.variant.clone(),
            arch: arch.to_string(),
            packages: recipe.packages.clone(),
            pip: recipe.pip.clone(),
            desktop: recipe.desktop,
            recipe_hash: hash,
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            size_bytes,
            rootfs: final_dir.join(ROOTFS_DIR),
        };
        // Everything debootstrap wrote must be on disk before image.json says
        // the tree is complete.
        sync_filesystem(&tmp)?;
        write_metadata(&tmp, &info)?;

        progress(&format!("installing image {name}"));
        let aside = self
            .dir
            .join(format!("{BUILD_PREFIX}{name}-{}.old", std::process::id()));
        let had_old = match fs::symlink_metadata(&final_dir) {
            Ok(_) => {
                fs::rename(&final_dir, &aside).ctx("move aside", &final_dir)?;
                true
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(ImageError::io("stat", &final_dir, e)),
        };
        if let Err(e) = fs::rename(&tmp, &final_dir) {
            if had_old {
                // Put the previous image back rather than leave no image.
                if let Err(e) = fs::rename(&aside, &final_dir) {
                    tracing::error!(path = %aside.display(), error = %e, "cannot restore previous image");
                }
            }
            return Err(ImageError::io("rename into place", &tmp, e));
        }
        guard.disarm();
        fsync_dir(&self.dir)?;

        if had_old {
            progress(&format!("removing previous image {name}"));
            // The new image is in place; a leftover is removed by the next build.
            if let Err(e) = remove_tree(&aside) {
                tracing::warn!(path = %aside.display(), error = %e, "cannot remove previous image");
            }
        }
        progress(&format!(
            "image {name} built in {}s ({} MiB)",
            started.elapsed().as_secs(),
            info.size_bytes / (1024 * 1024)
        ));
        Ok(info)
    }

    /// Deletes image `name`. The directory is first renamed to a `.build-*`
    /// name, so it disappears from [`ImageStore::list`] at once and a removal
    /// interrupted halfway is finished by the next build.
    ///
    /// Refuses ([`ImageError::Busy`]) if anything is mounted inside the image
    /// directory. Sessions use the rootfs as an overlay lower layer, which is
    /// not a mount inside it, so callers must check that no session uses the
    /// image. Blocks while a build is running in this images dir.
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        validate_name(name)?;
        let image_dir = self.dir.join(name);
        if !self.dir.is_dir() || fs::symlink_metadata(&image_dir).is_err() {
            return Err(ImageError::NotFound(name.to_string()));
        }
        let _lock = self.lock(&mut |_| {})?;
        // Removes whatever is under the name, with or without image.json:
        // that is also how a foreign or broken directory is cleaned up.
        match fs::symlink_metadata(&image_dir) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ImageError::NotFound(name.to_string()))
            }
            Err(e) => return Err(ImageError::io("stat", &image_dir, e)),
        }
        if !crate::fsutil::mounts_under(&image_dir)?.is_empty() {
            return Err(ImageError::Busy { path: image_dir });
        }
        let doomed = self.dir.join(format!(
            "{BUILD_PREFIX}{name}-{}.removing",
            std::process::id()
        ));
        fs::rename(&image_dir, &doomed).ctx("move aside", &image_dir)?;
        fsync_dir(&self.dir)?;
        remove_tree(&doomed)?;
        remove_if_exists(&self.log_path(name))?;
        Ok(())
    }

    /// The existing image if it is current for `hash` and `arch`.
    /// A newer-format image is an error rather than something to overwrite:
    /// it belongs to a newer drums sharing this directory.
    fn cached(&self, name: &str, hash: &str, arch: &str) -> Result<Option<ImageInfo>, ImageError> {
        match self.get(name) {
            Ok(info) if info.recipe_hash == hash && info.arch == arch && info.rootfs.is_dir() => {
                Ok(Some(info))
            }
            Ok(_) | Err(ImageError::NotFound(_)) => Ok(None),
            Err(e @ ImageError::UnsupportedFormat { .. }) => Err(e),
            Err(e) => {
                tracing::warn!(image = %name, error = %e, "existing image unreadable; rebuilding");
                Ok(None)
            }
        }
    }

    /// Takes the images dir lock, telling `progress` if it has to wait.
    fn lock(&self, progress: &mut dyn FnMut(&str)) -> Result<Flock<File>, ImageError> {
        let path = self.dir.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx("open lock file", &path)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(lock),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
                progress("waiting for another image build or removal to finish");
                Flock::lock(file, FlockArg::LockExclusive)
                    .map_err(|(_, e)| ImageError::io("lock", &path, e.into()))
            }
            Err((_, e)) => Err(ImageError::io("lock", &path, e.into())),
        }
    }

    /// Removes `.build-*` directories left by crashed builds or removals.
    /// Only called with the lock held, so none of them is in use. Failures
    /// are logged, not fatal: the new build does not depend on them.
    fn remove_stale_build_dirs(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let is_build = entry
                .file_name()
                .to_string_lossy()
                .starts_with(BUILD_PREFIX);
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_build && is_dir {
                let path = entry.path();
                tracing::info!(path = %path.display(), "removing leftover build directory");
                if let Err(e) = remove_build_tree(&drums_sys::LinuxSyscall, &path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove leftover build directory");
                }
            }
        }
    }

    /// Runs debootstrap into `target`, streaming its output (stdout and
    /// stderr through one pipe, so they stay in order) to `log` and its phase
    /// messages to `progress`.
    #[allow(clippy::too_many_arguments)]
    fn run_debootstrap(
        &self,
        recipe: &Recipe,
        arch: &str,
        mirror: &str,
        cache_dir: &Path,
        target: &Path,
        log_path: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), ImageError> {
        let mut args: Vec<OsString> = vec![
            format!("--variant={}", recipe.variant).into(),
            format!("--arch={arch}").into(),
        ];
        if !recipe.packages.is_empty() {
            args.push(format!("--include={}", recipe.packages.join(",")).into());
        }
        let mut cache_arg = OsString::from("--cache-dir=");
        cache_arg.push(cache_dir);
        args.push(cache_arg);
        args.push(recipe.suite.clone().into());
        args.push(target.into());
        args.push(mirror.into());

        // Resolved here rather than by `sh`, to get a clear error when it is
        // missing instead of sh's "not found" in the log.
        let program =
            resolve_program(&self.debootstrap[0]).map_err(|source| ImageError::Spawn {
                program: self.debootstrap[0].to_string_lossy().into_owned(),
                source,
            })?;

        let mut log = File::create(log_path).ctx("create", log_path)?;
        let command_line: Vec<String> = self
            .debootstrap
            .iter()
            .chain(&args)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        writeln!(log, "+ {}", command_line.join(" ")).ctx("write", log_path)?;

        let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| ImageError::io("create pipe for", log_path, e.into()))?;
        let write_end2 = write_end.try_clone().ctx("duplicate pipe for", log_path)?;
        let mut child = {
            // Through sh to set umask 022: files and directories debootstrap
            // creates itself must be readable by users in the sandbox, not
            // follow the daemon's umask.
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg("umask 022 && exec \"$@\"")
                .arg("sh")
                .arg(&program)
                .args(&self.debootstrap[1..])
                .args(&args)
                .env("LC_ALL", "C")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .stdout(Stdio::from(write_end))
                .stderr(Stdio::from(write_end2));
            let spawned = cmd.spawn();
            // `cmd` holds the pipe's write ends; it must be dropped before
            // reading, or the read below never sees end-of-file.
            drop(cmd);
            spawned.map_err(|e| ImageError::Spawn {
                program: "debootstrap".into(),
                source: e,
            })?
        };

        let mut reader = BufReader::new(File::from(read_end));
        let mut line = Vec::new();
        let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
        let mut last_phase = String::new();
        let mut log_error: Option<io::Error> = None;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Keep the child from blocking on a full pipe, then report.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ImageError::io("read debootstrap output for", log_path, e));
                }
            }
            if log_error.is_none() {
                if let Err(e) = log.write_all(&line) {
                    // Keep draining the pipe so debootstrap does not stall.
                    tracing::warn!(log = %log_path.display(), error = %e, "cannot write build log");
                    log_error = Some(e);
                }
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(text.to_string());
            if let Some((phase, message)) = debootstrap_phase(text) {
                if phase != last_phase {
                    progress(&format!("debootstrap: {message}"));
                    last_phase = phase.to_string();
                }
            }
        }
        let status = child.wait().ctx("wait for debootstrap writing", log_path)?;
        if status.success() {
            return Ok(());
        }

        // debootstrap's own detailed log is inside the target, which is about
        // to be deleted; keep it in the build log, where the error points, and
        // its end in the error (that is where dpkg's complaints are).
        let inner = target.join("debootstrap/debootstrap.log");
        if let Ok(text) = fs::read(&inner) {
            let _ = writeln!(log, "\n--- {} ---", inner.display());
            let _ = log.write_all(&text);
            let text = String::from_utf8_lossy(&text);
            let lines: Vec<&str> = text.lines().collect();
            tail.push_back("--- end of debootstrap/debootstrap.log ---".into());
            let from = lines.len().saturating_sub(TAIL_LINES / 2);
            tail.extend(lines[from..].iter().map(|l| l.to_string()));
        }
        Err(ImageError::Debootstrap {
            status,
            log: log_path.to_path_buf(),
            tail: Vec::from(tail).join("\n"),
        })
    }
}

/// Finds `program` like a shell would, but also in the sbin directories:
/// debootstrap lives in /usr/sbin, which is not always in the daemon's PATH.
fn resolve_program(program: &std::ffi::OsStr) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let is_executable = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let program = Path::new(program);
    if program.components().count() > 1 {
        return if is_executable(program) {
            Ok(program.to_path_buf())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not an executable file", program.display()),
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} not found in PATH or the sbin directories",
                    program.display()
                ),
            )
        })
}

/// Turns a debootstrap info line into (phase, message) for `progress`, or
/// `None` for other lines. A message is only passed on when the phase
/// changes, so the per-package lines ("I: Retrieving libc6 2.36-9",
/// "I: Validating libc6 2.36-9", "I: Extracting libc6...") become one
/// message per phase rather than hundreds.
fn debootstrap_phase(line: &str) -> Option<(&str, &str)> {
    let message = line.strip_prefix("I: ")?.trim();
    let mut words = message.split_whitespace();
    let first = words.next()?;
    let per_package = words.nth(1).is_some();
    Some(match first {
        // "Retrieving InRelease", "Validating Packages": the indexes.
        "Retrieving" | "Validating" if !per_package => ("indexes", message),
        "Retrieving" | "Validating" => ("download", "retrieving packages"),
        "Extracting" => ("extract", "extracting packages"),
        // "Installing core packages...", "Configuring the base system...":
        // already one line per phase; the first word is enough to collapse
        // repeats like the two "Resolving dependencies of ..." lines.
        _ => (first, message),
    })
}

fn validate_mirror(mirror: &str) -> Result<(), ImageError> {
    let lower = mirror.to_ascii_lowercase();
    let scheme_ok = ["http://", "https://", "ftp://", "file:/"]
        .iter()
        .any(|s| lower.starts_with(s));
    if scheme_ok && !mirror.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Ok(())
    } else {
        Err(ImageError::InvalidMirror(mirror.to_string()))
    }
}

/// Parses `image.json`, refusing formats newer than [`FORMAT_VERSION`]. The
/// version is read on its own first: a newer format may have changed any
/// other field, and "unsupported format" is a clearer error than a missing
/// field.
fn parse_metadata(text: &[u8], path: &Path) -> Result<ImageInfo, ImageError> {
    #[derive(Deserialize)]
    struct Version {
        format_version: u32,
    }
    let metadata_err = |source| ImageError::Metadata {
        path: path.to_path_buf(),
        source,
    };
    let version: Version = serde_json::from_slice(text).map_err(metadata_err)?;
    if version.format_version > FORMAT_VERSION {
        return Err(ImageError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: version.format_version,
            supported: FORMAT_VERSION,
        });
    }
    if version.format_version == 0 {
        return Err(metadata_err(serde::de::Error::custom(
            "format_version 0 does not exist",
        )));
    }
    serde_json::from_slice(text).map_err(metadata_err)
}

/// Writes `<dir>/image.json` durably: file fsynced, then the directory.
fn write_metadata(dir: &Path, info: &ImageInfo) -> Result<(), ImageError> {
    let path = dir.join(METADATA_FILE);
    let mut json = serde_json::to_vec_pretty(info).map_err(|source| ImageError::Metadata {
        path: path.clone(),
        source,
    })?;
    json.push(b'\n');
    let mut f = File::create(&path).ctx("create", &path)?;
    f.write_all(&json).ctx("write", &path)?;
    f.set_permissions(fs::Permissions::from_mode(0o644))
        .ctx("set permissions of", &path)?;
    f.sync_all().ctx("sync", &path)?;
    fsync_dir(dir)
}

/// Removes a build directory when dropped, unless disarmed: covers every
/// early return (and panic) between creating it and renaming it into place.
struct BuildDirGuard(Option<PathBuf>);

impl BuildDirGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for BuildDirGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            if let Err(e) = remove_build_tree(&drums_sys::LinuxSyscall, &path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove failed build directory");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_info(name: &str) -> ImageInfo {
        let r = Recipe::headless();
        ImageInfo {
            format_version: FORMAT_VERSION,
            name: name.into(),
            suite: r.suite.clone(),
            variant: r.variant.clone(),
            arch: host_arch().into(),
            packages: r.packages.clone(),
            pip: r.pip.clone(),
            desktop: r.desktop,
            recipe_hash: r.hash(),
            created_at: 1_700_000_000,
            size_bytes: 4096,
            rootfs: PathBuf::new(),
        }
    }

    /// Writes a finished-looking image directly, without building.
    fn put_image(dir: &Path, name: &str) {
        let d = dir.join(name);
        fs::create_dir_all(d.join(ROOTFS_DIR)).unwrap();
        write_metadata(&d, &sample_info(name)).unwrap();
    }

    #[test]
    fn name_validation() {
        for ok in ["a", "0", "bookworm", "headless-1.2_x", &"a".repeat(63)] {
            validate_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "_x",
            "A",
            "a/b",
            "a b",
            "ü",
            "a\n",
            &"a".repeat(64),
            "a:b",
        ] {
            assert!(
                matches!(validate_name(bad), Err(ImageError::InvalidName(_))),
                "{bad:?} accepted"
            );
        }
        let msg = validate_name("Bad/Name").unwrap_err().to_string();
        assert!(
            msg.starts_with(
                "invalid image name \"Bad/Name\": use lowercase letters, digits, '.', '_' or '-'"
            ),
            "{msg}"
        );
    }

    #[test]
    fn metadata_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let info = sample_info("x");
        write_metadata(tmp.path(), &info).unwrap();
        let text = fs::read(tmp.path().join(METADATA_FILE)).unwrap();
        let back = parse_metadata(&text, Path::new("image.json")).unwrap();
        assert_eq!(back, info);
        // rootfs is derived, not stored.
        let value: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert!(value.get("rootfs").is_none());
        assert_eq!(value["format_version"], 2);
        assert_eq!(value["suite"], "bookworm");
        assert_eq!(value["variant"], "minbase");
        // A headless image writes no desktop fields.
        assert!(value.get("pip").is_none() && value.get("desktop").is_none());
    }

    /// Images built before format 2 are read as what they are: headless.
    #[test]
    fn format_1_is_read_as_headless() {
        let mut value = serde_json::to_value(sample_info("x")).unwrap();
        value["format_version"] = 1.into();
        let text = serde_json::to_vec(&value).unwrap();
        let info = parse_metadata(&text, Path::new("image.json")).unwrap();
        assert_eq!(info.recipe(), Recipe::headless());
    }

    #[test]
    fn future_format_version_is_refused() {
        let mut value = serde_json::to_value(sample_info("x")).unwrap();
        value["format_version"] = (FORMAT_VERSION + 1).into();
        // A newer format may have changed other fields too.
        value.as_object_mut().unwrap().remove("suite");
        let text = serde_json::to_vec(&value).unwrap();
        let err = parse_metadata(&text, Path::new("/i/x/image.json")).unwrap_err();
        assert!(
            matches!(
                err,
                ImageError::UnsupportedFormat {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("newer"), "{err}");

        value["format_version"] = 0.into();
        let text = serde_json::to_vec(&value).unwrap();
        assert!(matches!(
            parse_metadata(&text, Path::new("image.json")),
            Err(ImageError::Metadata { .. })
        ));
        assert!(matches!(
            parse_metadata(b"{not json", Path::new("image.json")),
            Err(ImageError::Metadata { .. })
        ));
    }

    #[test]
    fn list_sorts_and_skips_partial_and_build_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let store = ImageStore::new(dir);
        assert!(store.list().unwrap().is_empty());
        assert!(ImageStore::new(dir.join("missing"))
            .list()
            .unwrap()
            .is_empty());

        put_image(dir, "zeta");
        put_image(dir, "alpha");
        put_image(dir, "mid");
        // Partial: no image.json.
        fs::create_dir_all(dir.join("partial/rootfs")).unwrap();
        // A build in progress, even one that already wrote its image.json.
        put_image(dir, ".build-alpha-123");
        fs::write(dir.join(".build-alpha.log"), "log").unwrap();
        fs::write(dir.join(".lock"), "").unwrap();
        // Invalid name, regular file, corrupt and future-format metadata.
        put_image(dir, "Upper");
        fs::write(dir.join("file"), "x").unwrap();
        fs::create_dir(dir.join("corrupt")).unwrap();
        fs::write(dir.join("corrupt/image.json"), "{").unwrap();
        fs::create_dir(dir.join("future")).unwrap();
        fs::write(dir.join("future/image.json"), r#"{"format_version": 99}"#).unwrap();

        let names: Vec<String> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["alpha", "mid", "zeta"]);
        let alpha = &store.list().unwrap()[0];
        assert_eq!(alpha.rootfs, dir.join("alpha/rootfs"));
    }

    #[test]
    fn debootstrap_output_becomes_few_progress_messages() {
        // Shape of real debootstrap output (bookworm minbase).
        let output = "\
I: Retrieving InRelease
I: Checking Release signature
I: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)
I: Retrieving Packages
I: Validating Packages
I: Resolving dependencies of required packages...
I: Resolving dependencies of base packages...
I: Checking component main on http://mirror.invalid/debian...
I: Retrieving adduser 3.134
I: Validating adduser 3.134
I: Retrieving apt 2.6.1
I: Validating apt 2.6.1
I: Chosen extractor for .deb packages: dpkg-deb
I: Extracting adduser...
I: Extracting apt...
I: Installing core packages...
I: Unpacking required packages...
I: Configuring required packages...
I: Unpacking the base system...
I: Configuring the base system...
I: Base system installed successfully.
W: not an info line";
        let mut last = "";
        let mut messages = Vec::new();
        for line in output.lines() {
            if let Some((phase, message)) = debootstrap_phase(line) {
                if phase != last {
                    messages.push(message);
                    last = phase;
                }
            }
        }
        assert_eq!(
            messages,
            [
                "Retrieving InRelease",
                "Checking Release signature",
                "Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)",
                "Retrieving Packages",
                "Resolving dependencies of required packages...",
                "Checking component main on http://mirror.invalid/debian...",
                "retrieving packages",
                "Chosen extractor for .deb packages: dpkg-deb",
                "extracting packages",
                "Installing core packages...",
                "Unpacking required packages...",
                "Configuring required packages...",
                "Unpacking the base system...",
                "Configuring the base system...",
                "Base system installed successfully.",
            ]
        );
    }

    #[test]
    fn get_missing_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        assert!(matches!(store.get("nope"), Err(ImageError::NotFound(n)) if n == "nope"));
        fs::create_dir(tmp.path().join("partial")).unwrap();
        assert!(matches!(store.get("partial"), Err(ImageError::NotFound(_))));
        fs::write(tmp.path().join("file"), "").unwrap();
        assert!(matches!(store.get("file"), Err(ImageError::NotFound(_))));
        assert!(matches!(
            store.get("../etc"),
            Err(ImageError::InvalidName(_))
        ));
        put_image(tmp.path(), "there");
        assert_eq!(store.get("there").unwrap().name, "there");
    }

    #[test]
    fn remove_image() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        assert!(matches!(store.remove("x"), Err(ImageError::NotFound(_))));
        put_image(tmp.path(), "x");
        store.remove("x").unwrap();
        assert!(matches!(store.get("x"), Err(ImageError::NotFound(_))));
        assert!(matches!(store.remove("x"), Err(ImageError::NotFound(_))));
        assert_eq!(leftover_dirs(tmp.path()), Vec::<String>::new());
    }

    /// Every directory in the images dir that is not a finished image.
    fn leftover_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        v.sort();
        v
    }

    /// A store whose "debootstrap" is a shell script; the target dir is the
    /// second-to-last argument, as with the real one.
    fn fake_store(dir: &Path, script: &str) -> ImageStore {
        let mut store = ImageStore::new(dir);
        store.debootstrap = vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("for a; do prev=$target; target=$a; done; target=$prev; {script}").into(),
            "fake-debootstrap".into(),
        ];
        store
    }

    const FAKE_OK: &str = r#"
        echo "I: Retrieving InRelease"
        echo "I: Retrieving Packages"
        echo "I: Extracting base-files..."
        echo "I: Extracting bash..."
        echo "W: something on stderr" >&2
        mkdir -p "$target/usr/bin" "$target/etc" "$target/var/lib/apt/lists"
        touch "$target/usr/bin/python3" "$target/var/lib/apt/lists/junk"
        echo "args: $*" > "$target/args"
        echo "umask: $(umask)" >> "$target/args"
        echo "I: Base system installed successfully."
    "#;

    #[test]
    fn build_installs_caches_and_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("images");
        let cache = tmp.path().join("cache");
        let store = fake_store(&dir, FAKE_OK);
        let mut messages = Vec::new();
        let recipe = Recipe::headless();
        let info = store
            .build(
                "h",
                &recipe,
                "http://mirror.invalid/debian",
                &cache,
                &mut |m| messages.push(m.to_string()),
            )
            .unwrap();
        assert_eq!(info.rootfs, dir.join("h/rootfs"));
        assert!(info.rootfs.join("usr/bin/python3").exists());
        assert!(!info.rootfs.join("var/lib/apt/lists/junk").exists());
        assert_eq!(
            fs::read_to_string(info.rootfs.join("etc/hostname")).unwrap(),
            "drums\n"
        );
        assert_eq!(store.get("h").unwrap(), info);
        assert!(info.size_bytes > 0);
        assert!(cache.is_dir());
        let args = fs::read_to_string(info.rootfs.join("args")).unwrap();
        assert!(args.contains("--variant=minbase"), "{args}");
        assert!(args.contains(&format!("--arch={}", host_arch())), "{args}");
        assert!(
            args.contains(
                "--include=python3,python3-pip,procps,iproute2,git,sudo,ca-certificates,less"
            ),
            "{args}"
        );
        assert!(
            args.contains(&format!("--cache-dir={}", cache.display())),
            "{args}"
        );
        assert!(args.contains("bookworm"), "{args}");
        assert!(args.contains("http://mirror.invalid/debian"), "{args}");
        assert!(args.contains("umask: 0022"), "{args}");
        let mode = fs::metadata(&info.rootfs).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        // Phases, one message per run of same-word info lines.
        assert!(
            messages
                .iter()
                .any(|m| m == "debootstrap: Retrieving InRelease"),
            "{messages:?}"
        );
        assert!(
            !messages.iter().any(|m| m.contains("Retrieving Packages")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m == "debootstrap: extracting packages"),
            "{messages:?}"
        );
        assert!(
            messages.iter().any(|m| m == "customizing rootfs"),
            "{messages:?}"
        );
        // stdout and stderr both reach the log.
        let log = fs::read_to_string(store.log_path("h")).unwrap();
        assert!(log.contains("W: something on stderr"), "{log}");
        assert!(
            log.contains("I: Base system installed successfully."),
            "{log}"
        );
        assert_eq!(leftover_dirs(&dir), Vec::<String>::new());

        // Same recipe: cached, debootstrap not run (this one would fail).
        let failing = fake_store(&dir, "exit 1");
        let mut messages = Vec::new();
        let again = failing
            .build(
                "h",
                &recipe,
                "http://mirror.invalid/debian",
                &cache,
                &mut |m| messages.push(m.to_string()),
            )
            .unwrap();
        assert_eq!(again, info);
        assert_eq!(messages, ["image h is up to date"]);

        // Different recipe: rebuilt and replaced, old tree gone.
        fs::write(info.rootfs.join("old-marker"), "").unwrap();
        let mut bigger = recipe.clone();
        bigger.packages.push("vim".into());
        let new = store
            .build(
                "h",
                &bigger,
                "http://mirror.invalid/debian",
                &cache,
                &mut |_| {},
            )
            .unwrap();
        assert_ne!(new.recipe_hash, info.recipe_hash);
        assert!(!new.rootfs.join("old-marker").exists());
        assert!(new.rootfs.join("usr/bin/python3").exists());
        assert_eq!(store.list().unwrap(), vec![new]);
        assert_eq!(leftover_dirs(&dir), Vec::<String>::new());
    }

    #[test]
    fn failed_build_cleans_up_and_keeps_old_image() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("images");
        let cache = tmp.path().join("cache");
        fs::create_dir(&dir).unwrap();
        put_image(&dir, "h");
        let old = ImageStore::new(&dir).get("h").unwrap();
        // A leftover from a crashed build is cleaned up too.
        fs::create_dir_all(dir.join(".build-h-999999/rootfs/etc")).unwrap();

        let store = fake_store(
            &dir,
            r#"
            mkdir -p "$target/debootstrap"
            echo "inner detail" > "$target/debootstrap/debootstrap.log"
            echo "I: Retrieving InRelease"
            echo "E: Couldn't find these debs: nosuchpkg" >&2
            exit 1
            "#,
        );
        let mut recipe = Recipe::headless();
        recipe.packages.push("nosuchpkg".into());
        let err = store
            .build(
                "h",
                &recipe,
                "http://mirror.invalid/debian",
                &cache,
                &mut |_| {},
            )
            .unwrap_err();
        match &err {
            ImageError::Debootstrap { log, tail, status } => {
                assert_eq!(log, &store.log_path("h"));
                assert!(
                    tail.contains("E: Couldn't find these debs: nosuchpkg"),
                    "{tail}"
                );
                assert!(tail.contains("inner detail"), "{tail}");
                assert_eq!(status.code(), Some(1));
                let log = fs::read_to_string(log).unwrap();
                assert!(log.contains("inner detail"), "{log}");
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(err.to_string().contains("nosuchpkg"));
        assert_eq!(leftover_dirs(&dir), Vec::<String>::new());
        assert_eq!(store.get("h").unwrap(), old);
    }

    #[test]
    fn build_rejects_bad_input_before_running_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let store = fake_store(tmp.path(), "exit 1");
        let cache = tmp.path().join("cache");
        let r = Recipe::headless();
        assert!(matches!(
            store.build(
                "Bad",
                &r,
                "http://mirror.invalid/debian",
                &cache,
                &mut |_| {}
            ),
            Err(ImageError::InvalidName(_))
        ));
        assert!(matches!(
            store.build("ok", &r, "--keyring=/x", &cache, &mut |_| {}),
            Err(ImageError::InvalidMirror(_))
        ));
        let mut bad = r.clone();
        bad.packages.push("a,b".into());
        assert!(matches!(
            store.build(
                "ok",
                &bad,
                "http://mirror.invalid/debian",
                &cache,
                &mut |_| {}
            ),
            Err(ImageError::InvalidRecipe { .. })
        ));
        assert!(!cache.exists());
    }

    #[test]
    fn missing_debootstrap_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = ImageStore::new(tmp.path());
        store.debootstrap = vec!["/nonexistent/debootstrap".into()];
        let err = store
            .build(
                "x",
                &Recipe::headless(),
                "http://mirror.invalid/debian",
                &tmp.path().join("cache"),
                &mut |_| {},
            )
            .unwrap_err();
        assert!(matches!(err, ImageError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("debootstrap"), "{err}");
        assert_eq!(leftover_dirs(tmp.path()), Vec::<String>::new());
    }

    /// One real build: needs root, network access to the host's Debian
    /// mirror and a few minutes. Run by hand:
    /// `cargo test -p drums-image -- --ignored real_debootstrap_build --nocapture`
    #[test]
    #[ignore]
    fn real_debootstrap_build() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path().join("images"));
        let recipe = Recipe::headless();
        let mirror = crate::mirror_from_apt_sources(&recipe.suite).unwrap();
        let cache = Path::new(DEFAULT_CACHE_DIR);
        fs::create_dir_all(cache).unwrap();
        let started = Instant::now();
        let info = store
            .build("headless", &recipe, &mirror, cache, &mut |m| {
                eprintln!("[{:>4}s] {m}", started.elapsed().as_secs())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let elapsed = started.elapsed();
        assert!(info.rootfs.join("usr/bin/python3").exists());
        let text = fs::read(tmp.path().join("images/headless/image.json")).unwrap();
        let parsed = parse_metadata(&text, Path::new("image.json")).unwrap();
        assert_eq!(parsed.recipe_hash, recipe.hash());
        assert_eq!(parsed.format_version, FORMAT_VERSION);
        assert_eq!(store.list().unwrap().len(), 1);
        eprintln!(
            "built in {:.1}s, rootfs {} bytes ({} MiB)\n{}",
            elapsed.as_secs_f64(),
            info.size_bytes,
            info.size_bytes / (1024 * 1024),
            String::from_utf8_lossy(&text)
        );
        if std::env::var_os("DRUMS_KEEP_IMAGE").is_some() {
            eprintln!("keeping {}", tmp.keep().display());
        }
    }
}
