//! drums' own programs inside a session run on the host's loader and
//! libraries, never on the image's.
//!
//! drums-init and drums-guest are built on the host and linked dynamically
//! against its glibc. Exec'd as built inside a session, the kernel would
//! start them on the *image's* program interpreter (`/lib64/ld-linux-x86-64.so.2`
//! of the session's root), and an image may have an older glibc (Ubuntu
//! 20.04's 2.31: "GLIBC_2.34 not found"), musl (Alpine: no such file), or no
//! libc at all (distroless, an image of one static binary). The session
//! would never become ready.
//!
//! So drumsd installs, in the directory every session binds read-only,
//! nosuid and nodev at [`BIN_DIR`](crate::BIN_DIR) ([`install`]):
//!
//! ```text
//! lib/ld.so                  the host's program interpreter
//! lib/libc.so.6, ...         every library the programs need, by the name they
//!                            ask for, copied from where the host's loader finds it
//! session/drums-init         the programs as a session runs them: byte for byte the
//! session/drums-guest        build's, but for their PT_INTERP, which names INTERPRETER
//! ```
//!
//! and a session execs `SESSION_DIR/NAME` with `LD_LIBRARY_PATH=LIB_DIR`
//! ([`exe`], [`LIBRARY_PATH`]). The kernel then maps the program as any
//! other and starts the host's loader, which finds every library in
//! [`LIB_DIR`] before it would look at the image's cache or directories.
//! Each program drops the variable first thing ([`forget_library_path`]),
//! so what it starts (the session's own work) runs on the image's loader.
//!
//! Why not run the loader as a command (`ld.so --library-path DIR PROGRAM`)?
//! The kernel maps such a loader, and the loader the program, in the mmap
//! area, so no mapping lies below what CRIU maps later. A dump that fails
//! because a task died under it (drums then dumps again, see
//! `drums_session::checkpoint`) leaves CRIU's parasite mapped in the other
//! tasks, a shared mapping; the next dump injects its system calls at the
//! lowest executable mapping, that leftover, and fails to write it (EIO)
//! every time after. A program exec'd as built has its text low, below
//! anything CRIU maps, as it always had.
//!
//! `/proc/PID/comm` is the program's name, as before: the inspector
//! (`drums_inspect`), `ps` and the tests find drums' processes by it.
//!
//! Copies in the binaries' directory rather than binds of the host's files:
//! that directory is already bound into every session and declared external
//! to CRIU, which binds it again at a restore (`drums-bin` in
//! `drums_session::checkpoint`). So there is no new mount per session and no
//! new key in a checkpoint, and a restore maps the libraries from the very
//! paths it dumped. As with the binaries, a file is replaced (renamed over)
//! only when its content changed, so running sessions keep the inodes they
//! mapped.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The drums programs exec'd inside a session: stage 2 of drums-init, and
/// the guest agent.
pub const PROGRAMS: [&str; 2] = ["drums-init", "drums-guest"];

/// Where the host's loader and libraries are, inside every session.
pub const LIB_DIR: &str = "/run/drums/bin/lib";
/// The loader, inside every session: the PT_INTERP of the programs in
/// [`SESSION_DIR`]. Short, since it takes the place of the build's own
/// (`/lib64/ld-linux-x86-64.so.2`) in the same bytes.
pub const INTERPRETER: &str = "/run/drums/bin/lib/ld.so";
/// Where a session execs the programs from.
pub const SESSION_DIR: &str = "/run/drums/bin/session";
/// The one variable a program exec'd from [`SESSION_DIR`] needs.
pub const LIBRARY_PATH: (&str, &str) = ("LD_LIBRARY_PATH", LIB_DIR);

const LIB_SUBDIR: &str = "lib";
const SESSION_SUBDIR: &str = "session";
const INTERPRETER_FILE: &str = "ld.so";

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse {path} as ELF")]
    Elf {
        path: PathBuf,
        #[source]
        source: goblin::error::Error,
    },
    #[error("{0} has no program interpreter: drums runs only dynamically linked programs in a session, on the host's loader")]
    NoInterpreter(PathBuf),
    #[error("{first} and {second} name different program interpreters")]
    TwoInterpreters { first: PathBuf, second: PathBuf },
    #[error("{path}: its program interpreter's {room} bytes cannot hold {INTERPRETER}")]
    InterpreterTooShort { path: PathBuf, room: usize },
    #[error("{loader} --list {program} exited with {status}: {stderr}")]
    List {
        loader: PathBuf,
        program: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{program} needs {library}, which the host's loader does not find")]
    NotFound { program: PathBuf, library: String },
    #[error("{program}: cannot read the host loader's line {line:?}")]
    Unparsed { program: PathBuf, line: String },
}

fn io(op: &'static str, path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> LoaderError {
    let path = path.as_ref().to_owned();
    move |source| LoaderError::Io { op, path, source }
}

/// The path a session execs `program` (one of [`PROGRAMS`]) from, with
/// [`LIBRARY_PATH`] in its environment.
pub fn exe(program: &str) -> String {
    format!("{SESSION_DIR}/{program}")
}

/// First thing in each program: drop [`LIBRARY_PATH`], which was for its
/// own loader only. What the program starts, the session's work, must run
/// on the image's libraries. Anything else in the variable was not set by
/// drums, and stays. Called while the process has one thread.
pub fn forget_library_path() {
    if std::env::var_os(LIBRARY_PATH.0).is_some_and(|v| v == LIBRARY_PATH.1) {
        std::env::remove_var(LIBRARY_PATH.0);
    }
}

/// What the programs need of the host: its program interpreter and every
/// library, by the name the loader looks for (DT_NEEDED), with the host file
/// it resolves that name to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLibs {
    pub interpreter: PathBuf,
    pub libraries: BTreeMap<String, PathBuf>,
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Resolve what `programs` need, the way the host runs them: each ELF names
/// its interpreter (PT_INTERP), and that interpreter's `--list` resolves
/// every library, transitively, as it would at an exec on the host (its
/// cache, its search path, glibc-hwcaps variants for this CPU). The
/// environment is cleared for it, so drumsd's own `LD_LIBRARY_PATH` cannot
/// pick the libraries. Each program's DT_NEEDED entries are checked against
/// what the loader listed.
pub fn resolve(programs: &[PathBuf]) -> Result<HostLibs, LoaderError> {
    let mut interpreter: Option<(PathBuf, PathBuf)> = None;
    let mut libraries = BTreeMap::new();
    for program in programs {
        let bytes = fs::read(program).map_err(io("read", program))?;
        let elf = goblin::elf::Elf::parse(&bytes).map_err(|source| LoaderError::Elf {
            path: program.clone(),
            source,
        })?;
        let interp = PathBuf::from(
            elf.interpreter
                .ok_or_else(|| LoaderError::NoInterpreter(program.clone()))?,
        );
        match &interpreter {
            None => interpreter = Some((interp.clone(), program.clone())),
            Some((i, _)) if *i == interp => {}
            Some((_, first)) => {
                return Err(LoaderError::TwoInterpreters {
                    first: first.clone(),
                    second: program.clone(),
                })
            }
        }
        let out = Command::new(&interp)
            .arg("--list")
            .arg(program)
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(io("run", &interp))?;
        let listed = parse_list(&String::from_utf8_lossy(&out.stdout), program)?;
        if !out.status.success() {
            return Err(LoaderError::List {
                loader: interp,
                program: program.clone(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        // The interpreter is itself a library some programs name (glibc's
        // TLS entry points); the loader lists it without an arrow.
        let interp_name = file_name(&interp);
        for needed in &elf.libraries {
            if !listed.contains_key(*needed) && *needed != interp_name {
                return Err(LoaderError::NotFound {
                    program: program.clone(),
                    library: (*needed).to_owned(),
                });
            }
        }
        libraries.extend(listed);
    }
    let interpreter = interpreter
        .map(|(i, _)| i)
        .ok_or_else(|| LoaderError::NoInterpreter(PathBuf::new()))?;
    Ok(HostLibs {
        interpreter,
        libraries,
    })
}

/// The libraries in a loader's `--list` output (what `ldd` prints):
/// `NAME => PATH (ADDRESS)` lines. The vDSO has no arrow, nor has the
/// interpreter when it runs from the path the program names; run from
/// elsewhere, it shows as `PT_INTERP => ITS PATH`. Either way it is not a
/// library to install here. `NAME => not found` is an error.
fn parse_list(out: &str, program: &Path) -> Result<BTreeMap<String, PathBuf>, LoaderError> {
    let mut libs = BTreeMap::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((name, rest)) = line.split_once(" => ") else {
            continue;
        };
        if name.starts_with('/') {
            continue;
        }
        if rest.trim() == "not found" {
            return Err(LoaderError::NotFound {
                program: program.to_owned(),
                library: name.to_owned(),
            });
        }
        let path = rest.rsplit_once(" (").map_or(rest, |(p, _)| p).trim();
        // A name is installed as a file of that name: one plain component.
        let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
        if !plain || !path.starts_with('/') {
            return Err(LoaderError::Unparsed {
                program: program.to_owned(),
                line: line.to_owned(),
            });
        }
        libs.insert(name.to_owned(), PathBuf::from(path));
    }
    Ok(libs)
}

/// Install in `dst` what a session needs to run the programs built in
/// `src` (the module documentation has the layout): the host's loader and
/// libraries ([`resolve`]), and the programs with [`INTERPRETER`] as their
/// PT_INTERP.
pub fn install(src: &Path, dst: &Path) -> Result<HostLibs, LoaderError> {
    let programs: Vec<PathBuf> = PROGRAMS.iter().map(|p| src.join(p)).collect();
    let libs = resolve(&programs)?;
    let lib = dst.join(LIB_SUBDIR);
    let session = dst.join(SESSION_SUBDIR);
    for d in [&lib, &session] {
        fs::create_dir_all(d).map_err(io("create", d))?;
        // Readable by every session's range; writable by host root only.
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).map_err(io("chmod", d))?;
    }
    let read = |p: &Path| fs::read(p).map_err(io("read", p));
    write_if_changed(&read(&libs.interpreter)?, &lib.join(INTERPRETER_FILE))?;
    for (name, from) in &libs.libraries {
        write_if_changed(&read(from)?, &lib.join(name))?;
    }
    for p in &programs {
        let patched = with_interpreter(&read(p)?, p)?;
        write_if_changed(&patched, &session.join(file_name(p)))?;
    }
    Ok(libs)
}

/// `elf` with its PT_INTERP naming [`INTERPRETER`], in the bytes the build's
/// interpreter took (NUL-padded: the kernel and the loader read it as a C
/// string). Nothing else changes, not even a length.
fn with_interpreter(elf: &[u8], path: &Path) -> Result<Vec<u8>, LoaderError> {
    let parsed = goblin::elf::Elf::parse(elf).map_err(|source| LoaderError::Elf {
        path: path.to_owned(),
        source,
    })?;
    let ph = parsed
        .program_headers
        .iter()
        .find(|ph| ph.p_type == goblin::elf::program_header::PT_INTERP)
        .ok_or_else(|| LoaderError::NoInterpreter(path.to_owned()))?;
    let (start, room) = (ph.p_offset as usize, ph.p_filesz as usize);
    let slot = start
        .checked_add(room)
        .filter(|end| *end <= elf.len())
        .map(|end| start..end);
    let Some(slot) = slot.filter(|_| INTERPRETER.len() < room) else {
        return Err(LoaderError::InterpreterTooShort {
            path: path.to_owned(),
            room,
        });
    };
    let mut out = elf.to_vec();
    out[slot.clone()].fill(0);
    out[slot.start..slot.start + INTERPRETER.len()].copy_from_slice(INTERPRETER.as_bytes());
    Ok(out)
}

/// Write `bytes` to `to` unless it already holds them: to a temporary name,
/// synced, renamed over, so a session never maps half a file and a running
/// one keeps its inode. Mode 0755: the loader and the programs are exec'd.
fn write_if_changed(bytes: &[u8], to: &Path) -> Result<(), LoaderError> {
    if fs::read(to).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = to.with_file_name(format!(".{}.tmp", file_name(to)));
    let mut f = fs::File::create(&tmp).map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.set_permissions(fs::Permissions::from_mode(0o755))
        .map_err(io("chmod", &tmp))?;
    f.sync_all().map_err(io("sync", &tmp))?;
    fs::rename(&tmp, to).map_err(io("rename", to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BIN_DIR;

    #[test]
    fn the_session_paths_lie_in_the_bound_binaries() {
        assert_eq!(LIB_DIR, format!("{BIN_DIR}/{LIB_SUBDIR}"));
        assert_eq!(INTERPRETER, format!("{LIB_DIR}/{INTERPRETER_FILE}"));
        assert_eq!(SESSION_DIR, format!("{BIN_DIR}/{SESSION_SUBDIR}"));
        assert_eq!(exe("drums-guest"), "/run/drums/bin/session/drums-guest");
        // It takes the place of x86-64's and arm64's own.
        assert!(INTERPRETER.len() < "/lib64/ld-linux-x86-64.so.2".len());
        assert!(INTERPRETER.len() < "/lib/ld-linux-aarch64.so.1".len());
    }

    #[test]
    fn list_output_is_read_as_ldd_prints_it() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd3a5f2000)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f15f6679000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f15f5e1e000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f15f66ae000)\n";
        let libs = parse_list(out, Path::new("p")).unwrap();
        let elsewhere = format!("{out}\t/lib64/ld-linux-x86-64.so.2 => /x/lib/ld.so (0x1)\n");
        assert_eq!(parse_list(&elsewhere, Path::new("p")).unwrap(), libs);
        assert_eq!(
            libs.into_iter().collect::<Vec<_>>(),
            [
                ("libc.so.6".into(), "/lib/x86_64-linux-gnu/libc.so.6".into()),
                (
                    "libgcc_s.so.1".into(),
                    "/lib/x86_64-linux-gnu/libgcc_s.so.1".into()
                ),
            ]
        );
        let missing = parse_list("\tlibfoo.so.1 => not found\n", Path::new("p")).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "p needs libfoo.so.1, which the host's loader does not find"
        );
        for bad in [
            "\t../x => /lib/x (0x1)\n",
            "\tlibx.so => relative/x (0x1)\n",
        ] {
            assert!(
                matches!(
                    parse_list(bad, Path::new("p")),
                    Err(LoaderError::Unparsed { .. })
                ),
                "{bad:?}"
            );
        }
    }

    /// PT_INTERP as the kernel reads it: up to the first NUL (goblin keeps
    /// the padding).
    fn interpreter<'a>(elf: &goblin::elf::Elf<'a>) -> &'a str {
        elf.interpreter.unwrap().trim_end_matches('\0')
    }

    /// `src` with both programs: copies of this test binary, which is
    /// linked dynamically as they are.
    fn built() -> tempfile::TempDir {
        let src = tempfile::tempdir().unwrap();
        let me = std::env::current_exe().unwrap();
        for p in PROGRAMS {
            fs::copy(&me, src.path().join(p)).unwrap();
        }
        src
    }

    #[test]
    fn only_the_interpreter_changes_in_a_session_copy() {
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        let patched = with_interpreter(&me, Path::new("me")).unwrap();
        let elf = goblin::elf::Elf::parse(&patched).unwrap();
        assert_eq!(interpreter(&elf), INTERPRETER);
        assert_eq!(patched.len(), me.len());
        let differ: Vec<usize> = (0..me.len()).filter(|&i| me[i] != patched[i]).collect();
        let ph = elf
            .program_headers
            .iter()
            .find(|ph| ph.p_type == goblin::elf::program_header::PT_INTERP)
            .unwrap();
        let slot = ph.p_offset as usize..(ph.p_offset + ph.p_filesz) as usize;
        assert!(!differ.is_empty());
        assert!(differ.iter().all(|i| slot.contains(i)), "{differ:?}");
    }

    /// Everything the programs need lands in `lib/`, and a second install
    /// replaces nothing (running sessions keep what they mapped). The
    /// installed loader resolves every library of a session copy from
    /// `lib/` alone.
    #[test]
    fn install_puts_the_loader_and_every_library_beside_the_session_copies() {
        let src = built();
        let dst = tempfile::tempdir().unwrap();
        let libs = install(src.path(), dst.path()).unwrap();
        assert!(libs.libraries.contains_key("libc.so.6"), "{libs:?}");
        let lib = dst.path().join(LIB_SUBDIR);
        assert!(lib.join(INTERPRETER_FILE).is_file());
        for name in libs.libraries.keys() {
            assert!(lib.join(name).is_file(), "{name}");
        }
        let guest = dst.path().join(SESSION_SUBDIR).join("drums-guest");
        let bytes = fs::read(&guest).unwrap();
        let elf = goblin::elf::Elf::parse(&bytes).unwrap();
        assert_eq!(interpreter(&elf), INTERPRETER);
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let before = (ino(&lib.join("libc.so.6")), ino(&guest));
        install(src.path(), dst.path()).unwrap();
        assert_eq!(before, (ino(&lib.join("libc.so.6")), ino(&guest)));
        let out = Command::new(lib.join(INTERPRETER_FILE))
            .args(["--inhibit-cache", "--library-path"])
            .arg(&lib)
            .arg("--list")
            .arg(&guest)
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let listed = parse_list(&String::from_utf8_lossy(&out.stdout), &guest).unwrap();
        assert!(!listed.is_empty());
        for (name, path) in listed {
            assert_eq!(path, lib.join(&name), "{name}");
        }
    }

    /// As a session runs it: the installed directory at BIN_DIR (in a mount
    /// namespace of the child's own), the session copy exec'd with
    /// LIBRARY_PATH under the session's seccomp filter. The kernel starts
    /// the installed loader, and the program (this test binary, `--list`)
    /// runs to a clean exit. Needs root, as the filter's own test does.
    #[test]
    fn a_session_copy_starts_on_the_installed_loader_under_the_filter() {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let src = built();
        let dst = tempfile::tempdir().unwrap();
        install(src.path(), dst.path()).unwrap();
        let c = |s: &[u8]| CString::new(s).unwrap();
        let exe = c(exe("drums-guest").as_bytes());
        let argv = [exe.clone(), c(b"--list")];
        let env = [c(
            format!("{}={}", LIBRARY_PATH.0, LIBRARY_PATH.1).as_bytes()
        )];
        let dst_path = dst.path().as_os_str().as_bytes().to_vec();
        let devnull = fs::File::options().write(true).open("/dev/null").unwrap();
        // SAFETY: between fork and exec the child makes system calls through
        // nix on paths that fit its stack buffers, installs the filter, and
        // exits; it returns to no test code.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                use nix::mount::{mount, MsFlags};
                let none: Option<&str> = None;
                let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).is_ok()
                    && mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).is_ok()
                    && mount(Some("tmpfs"), "/run", Some("tmpfs"), MsFlags::empty(), none).is_ok()
                    && nix::unistd::mkdir("/run/drums", nix::sys::stat::Mode::S_IRWXU).is_ok()
                    && nix::unistd::mkdir("/run/drums/bin", nix::sys::stat::Mode::S_IRWXU).is_ok()
                    && mount(
                        Some(dst_path.as_slice()),
                        BIN_DIR,
                        none,
                        MsFlags::MS_BIND,
                        none,
                    )
                    .is_ok()
                    && crate::seccomp::install().is_ok()
                    && nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&devnull), 1).is_ok();
                if ok {
                    let _ = nix::unistd::execve(&exe, &argv, &env);
                }
                // SAFETY: leaves the forked child without running destructors.
                unsafe { libc::_exit(2) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let st = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }

    #[test]
    fn what_is_not_an_elf_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("truncated");
        fs::write(&p, b"\x7fELF").unwrap();
        let e = resolve(std::slice::from_ref(&p)).unwrap_err();
        assert_eq!(e.to_string(), format!("parse {} as ELF", p.display()));
        assert!(matches!(
            with_interpreter(b"\x7fELF", &p),
            Err(LoaderError::Elf { .. })
        ));
    }
}
