//! One function per subcommand; each is a request or two to drumsd.

use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use drums_api::{Client, CreateSession, ExecRequest, Limits, Session, SessionList};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};

use crate::args::{parse_size, CreateArgs, ExecArgs};
// The streaming exec is the client's, shared with the benches.
pub use drums_client::exec::run_exec;

use crate::exit::{self, Failure};
use crate::table;

pub fn create_request(a: &CreateArgs) -> Result<CreateSession, Failure> {
    let memory_bytes = a
        .memory
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| Failure::usage(e.to_string()))?;
    let disk_bytes = a
        .disk
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(CreateSession {
        name: a.name.clone(),
        profile: Some(a.profile.clone()),
        // Sent whenever given, so a headless profile with desktop options is
        // refused by drumsd with a clear error rather than ignored here.
        desktop: (a.url.is_some() || a.screen.is_some()).then(|| drums_api::DesktopOptions {
            url: a.url.clone(),
            screen: a.screen.clone(),
        }),
        image: a.image.clone(),
        limits: Limits {
            memory_bytes,
            pids_max: a.pids,
            cpus: a.cpus,
            disk_bytes,
        },
        network: a.network.clone(),
        privileged: a.privileged,
        egress: a.egress.clone(),
        run: a.run,
    })
}

pub async fn create(c: &Client, a: &CreateArgs) -> Result<i32, Failure> {
    let req = create_request(a)?;
    let s: Session = c.json(Method::POST, "/v1/sessions", Some(&req)).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s).expect("serialize"));
    } else {
        println!("{}", s.id);
    }
    Ok(exit::OK)
}

/// Run a command and stream its output; returns the exit code to exit with.
pub async fn exec(c: &Client, a: &ExecArgs) -> Result<i32, Failure> {
    let mut env = std::collections::BTreeMap::new();
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| Failure::usage(format!("--env {kv:?}: use KEY=VALUE")))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    let timeout_ms = match a.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            return Err(Failure::usage(format!("--timeout {t}: must be positive")))
        }
        t => t.map(|t| (t * 1000.0) as u64),
    };
    let req = ExecRequest {
        argv: a.cmd.clone(),
        env,
        cwd: a.cwd.clone(),
        user: a.user.clone(),
        timeout_ms,
        detach: a.detach,
        log: a.log.clone(),
    };
    if a.detach {
        let v: serde_json::Value = c
            .json(
                Method::POST,
                &format!("/v1/sessions/{}/exec", enc(&a.session)),
                Some(&req),
            )
            .await?;
        println!("{}", v["pid"]);
        return Ok(exit::OK);
    }
    run_exec(
        c,
        &a.session,
        &req,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
    .await
}

/// `SESSION:PATH` → Some((session, path)); a local path → None.
pub fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (sess, path) = s.split_once(':')?;
    // A local path may contain ':' too; a session name never contains '/'.
    if sess.is_empty() || sess.contains('/') {
        return None;
    }
    Some((sess, path))
}

pub async fn cp(c: &Client, src: &str, dst: &str) -> Result<i32, Failure> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((sess, path))) => {
            let data = read_local_file(src)?;
            let mode = std::fs::metadata(src)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                .unwrap_or(0o644);
            let mut path = path.to_owned();
            if path.ends_with('/') {
                path.push_str(&basename(src));
            }
            let uri = format!(
                "/v1/sessions/{}/files?path={}&mode={:o}",
                enc(sess),
                enc(&path),
                mode
            );
            let req = Request::builder()
                .method(Method::PUT)
                .uri(uri)
                .header("host", "drums")
                .header("content-type", "application/octet-stream")
                .body(Full::new(Bytes::from(data)))
                .expect("valid request");
            let resp = c.send(req).await?;
            c.check(resp).await?;
            Ok(exit::OK)
        }
        (Some((sess, path)), None) => {
            let uri = format!("/v1/sessions/{}/files?path={}", enc(sess), enc(path));
            let resp = c.call(Method::GET, &uri, None::<&()>).await?;
            let bytes = c.read_body(resp).await?;
            let mut target = std::path::PathBuf::from(dst);
            if target.is_dir() {
                target.push(basename(path));
            }
            std::fs::write(&target, &bytes)
                .map_err(|e| cp_local_err("write", &target.display().to_string(), e))?;
            Ok(exit::OK)
        }
        (Some(_), Some(_)) => Err(Failure::usage(
            "cp between two sessions is not supported; copy through the host",
        )),
        (None, None) => Err(Failure::usage("cp needs one side as SESSION:PATH")),
    }
}

/// A host file's bytes; a directory is bad input (2), as a session's
/// directory is when copied the other way, not an internal error.
fn read_local_file(path: &str) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::IsADirectory {
            Failure::usage(format!("not a regular file: {path} is a directory"))
        } else {
            cp_local_err("read", path, e)
        }
    })
}

fn cp_local_err(op: &str, path: &str, e: std::io::Error) -> Failure {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        exit::NOT_FOUND
    } else {
        exit::INTERNAL
    };
    Failure::new(code, format!("{op} {path}: {e}"))
}

fn basename(p: &str) -> String {
    Path::new(p)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into())
}

/// Percent-encode a query or path component.
pub use drums_api::exec::enc;

pub async fn ps(c: &Client, json: bool) -> Result<i32, Failure> {
    let l: SessionList = c.json(Method::GET, "/v1/sessions", None::<&()>).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
        return Ok(exit::OK);
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = l
        .sessions
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone(),
                s.profile.to_string(),
                crate::images::short_image(&s.image),
                s.state.to_string(),
                s.ip.clone().unwrap_or_else(|| "-".into()),
                s.hostname.clone(),
                limits_cell(&s.limits),
                if s.ports.is_empty() {
                    "-".into()
                } else {
                    s.ports.join(",")
                },
                format!("{}s", (now - s.created_at_ms).max(0) / 1000),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "ID", "NAME", "PROFILE", "IMAGE", "STATE", "IP", "HOSTNAME", "LIMITS", "PORTS",
                "AGE"
            ],
            &rows
        )
    );
    Ok(exit::OK)
}

/// The effective limits as `mem=4G pids=2048 cpus=2 disk=10G`; "-" for none.
fn limits_cell(l: &Limits) -> String {
    let size = |b: u64| {
        for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
            if b >= 1 << shift && b.is_multiple_of(1 << shift) {
                return format!("{}{unit}", b >> shift);
            }
        }
        b.to_string()
    };
    let mut parts = Vec::new();
    if let Some(b) = l.memory_bytes {
        parts.push(format!("mem={}", size(b)));
    }
    if let Some(p) = l.pids_max {
        parts.push(format!("pids={p}"));
    }
    if let Some(c) = l.cpus {
        parts.push(format!("cpus={c}"));
    }
    if let Some(b) = l.disk_bytes {
        parts.push(format!("disk={}", size(b)));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

pub async fn rm(c: &Client, sessions: &[String]) -> Result<i32, Failure> {
    let mut code = exit::OK;
    for s in sessions {
        match c
            .call(
                Method::DELETE,
                &format!("/v1/sessions/{}", enc(s)),
                None::<&()>,
            )
            .await
        {
            Ok(_) => println!("{s}"),
            Err(e) => {
                let f = Failure::from(e);
                eprintln!("drums: rm {s}: {}", f.message);
                code = f.code;
            }
        }
    }
    Ok(code)
}

pub async fn checkpoint(c: &Client, cmd: &crate::args::CheckpointCmd) -> Result<i32, Failure> {
    if let Some(crate::args::CheckpointSub::Rm { checkpoints }) = &cmd.sub {
        let mut code = exit::OK;
        for ck in checkpoints {
            match c
                .call(
                    Method::DELETE,
                    &format!("/v1/checkpoints/{}", enc(ck)),
                    None::<&()>,
                )
                .await
            {
                Ok(_) => println!("{ck}"),
                Err(e) => {
                    let f = Failure::from(e);
                    eprintln!("drums: checkpoint rm {ck}: {}", f.message);
                    code = f.code;
                }
            }
        }
        return Ok(code);
    }
    if let Some(crate::args::CheckpointSub::Export {
        checkpoint,
        file,
        force,
    }) = &cmd.sub
    {
        return export(c, checkpoint, file, *force).await;
    }
    if let Some(crate::args::CheckpointSub::Import {
        file,
        json,
        trust_unsigned,
    }) = &cmd.sub
    {
        let data = read_local_file(&file.display().to_string())?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(if *trust_unsigned {
                "/v1/checkpoints/import?trust_unsigned=true"
            } else {
                "/v1/checkpoints/import"
            })
            .header("host", "drums")
            .header("content-type", "application/x-tar")
            .body(Full::new(Bytes::from(data)))
            .expect("valid request");
        let resp = c.check(c.send(req).await?).await?;
        let ck: drums_api::Checkpoint = serde_json::from_slice(&c.read_body(resp).await?)
            .map_err(|e| Failure::new(exit::INTERNAL, format!("decode import answer: {e}")))?;
        if *json {
            println!("{}", serde_json::to_string_pretty(&ck).expect("serialize"));
        } else {
            println!("{}", ck.id);
        }
        return Ok(exit::OK);
    }
    let a = &cmd.args;
    let session = a
        .session
        .clone()
        .ok_or_else(|| Failure::usage("checkpoint needs a SESSION (or `checkpoint rm ID`)"))?;
    let req = drums_api::CreateCheckpoint {
        session,
        name: a.name.clone(),
        clean: a.clean,
        leave_running: a.leave_running,
    };
    let ck: drums_api::Checkpoint = c.json(Method::POST, "/v1/checkpoints", Some(&req)).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ck).expect("serialize"));
    } else {
        println!("{}", ck.id);
    }
    Ok(exit::OK)
}

/// Whether `export` may replace what is at `file`: nothing, or a regular
/// file, as `cp` and `tar -f` would; a device node, fifo, socket or symlink
/// only with `force` (the rename would replace the node itself, so
/// `export CK /dev/null` would delete /dev/null); a directory never.
fn export_target_ok(file: &Path, force: bool) -> Result<(), Failure> {
    let meta = match std::fs::symlink_metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(cp_local_err("inspect", &file.display().to_string(), e)),
    };
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    if t.is_dir() {
        return Err(Failure::usage(format!(
            "export target {} is a directory: name the archive file",
            file.display()
        )));
    }
    if force {
        return Ok(());
    }
    Err(Failure::usage(format!(
        "export target {} exists and is not a regular file: it would be replaced, not written into (use --force to replace it)",
        file.display()
    )))
}

/// Stream the archive to a fresh temporary file next to the target, renamed
/// into place only when the daemon ended the body cleanly: a failed or
/// interrupted export exits non-zero and leaves neither archive nor temporary
/// file behind (the temporary file is removed when dropped).
async fn export(c: &Client, checkpoint: &str, file: &Path, force: bool) -> Result<i32, Failure> {
    // Checked before the transfer, so a refused target costs nothing, and
    // again before the rename, in case something appeared there meanwhile.
    export_target_ok(file, force)?;
    let resp = c
        .call(
            Method::GET,
            &format!("/v1/checkpoints/{}/export", enc(checkpoint)),
            None::<&()>,
        )
        .await?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut out = tempfile::Builder::new()
        .prefix(".drums-export-")
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(|e| cp_local_err("create a temporary file in", &dir.display().to_string(), e))?;
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Failure::new(
                exit::INTERNAL,
                format!("export of {checkpoint} failed part-way, no archive written: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            out.write_all(&data)
                .map_err(|e| cp_local_err("write", &out.path().display().to_string(), e))?;
        }
    }
    out.as_file()
        .sync_all()
        .map_err(|e| cp_local_err("fsync", &out.path().display().to_string(), e))?;
    export_target_ok(file, force)?;
    out.persist(file)
        .map_err(|e| cp_local_err("rename into", &file.display().to_string(), e.error))?;
    Ok(exit::OK)
}

/// `drums key show`: the line another host adds to its trusted-keys.
pub async fn key_show(c: &Client, json: bool) -> Result<i32, Failure> {
    let k: drums_api::HostKey = c.json(Method::GET, "/v1/keys/host", None::<&()>).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&k).expect("serialize"));
    } else {
        println!("{}", k.trusted_keys_line);
    }
    Ok(exit::OK)
}

pub async fn checkpoints(c: &Client, json: bool) -> Result<i32, Failure> {
    let l: drums_api::CheckpointList = c.json(Method::GET, "/v1/checkpoints", None::<&()>).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
        return Ok(exit::OK);
    }
    let rows: Vec<Vec<String>> = l
        .checkpoints
        .iter()
        .map(|k| {
            vec![
                k.id.clone(),
                k.name.clone(),
                k.session_id.clone(),
                k.profile.clone(),
                format!("{:.1} MiB", k.images_bytes as f64 / (1 << 20) as f64),
                format!("{:.0} ms", k.dump_ms),
                if k.clean { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["ID", "NAME", "SESSION", "PROFILE", "IMAGES", "DUMP", "CLEAN"],
            &rows
        )
    );
    Ok(exit::OK)
}

/// `drums restore` and `drums fork`: the same answer, all siblings ready.
pub async fn restore(c: &Client, uri: &str, count: usize, json: bool) -> Result<i32, Failure> {
    let r: drums_api::RestoreResult = c
        .json(
            Method::POST,
            uri,
            Some(&drums_api::RestoreRequest { count, name: None }),
        )
        .await?;
    print_restored(&r, json)
}

/// `drums fork`: siblings of the session now, or of one of its versions.
///
/// A fork without `--at` makes a checkpoint (150 MiB for a desktop), which
/// it says on stderr (stdout stays the siblings' ids, for scripts): removed
/// when the last sibling goes, or kept with `--keep`.
pub async fn fork(
    c: &Client,
    session: &str,
    count: usize,
    at: Option<&str>,
    keep: bool,
    json: bool,
) -> Result<i32, Failure> {
    let r: drums_api::RestoreResult = c
        .json(
            Method::POST,
            &format!("/v1/sessions/{}/fork", enc(session)),
            Some(&drums_api::ForkRequest {
                count,
                name: None,
                at: at.map(str::to_owned),
                keep,
            }),
        )
        .await?;
    if at.is_none() && !json {
        if r.checkpoint_kept {
            eprintln!(
                "checkpoint {} kept (`drums checkpoint rm {}` removes it)",
                r.checkpoint, r.checkpoint
            );
        } else {
            eprintln!(
                "checkpoint {} made for the fork: removed when its last sibling goes (`--keep` keeps it)",
                r.checkpoint
            );
        }
    }
    print_restored(&r, json)
}

fn print_restored(r: &drums_api::RestoreResult, json: bool) -> Result<i32, Failure> {
    if json {
        println!("{}", serde_json::to_string_pretty(&r).expect("serialize"));
    } else {
        for s in &r.sessions {
            println!("{}", s.id);
        }
    }
    Ok(exit::OK)
}

/// `drums audit`: exits 0 when the audit passes, 1 when it does not.
pub async fn audit(c: &Client, a: &str, b: &str, json: bool) -> Result<i32, Failure> {
    let r: drums_api::AuditReport = c
        .json(
            Method::GET,
            &format!("/v1/audit?a={}&b={}", enc(a), enc(b)),
            None::<&()>,
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).expect("serialize"));
    } else {
        let rows = |checks: &[drums_api::AuditCheck]| -> Vec<Vec<String>> {
            checks
                .iter()
                .map(|k| {
                    vec![
                        if k.ok { "ok" } else { "FAIL" }.into(),
                        k.what.clone(),
                        k.a.clone(),
                        k.b.clone(),
                        k.note.clone(),
                    ]
                })
                .collect()
        };
        println!("isolation between {} and {}", r.a, r.b);
        print!(
            "{}",
            table::render(&["", "CHECK", "A", "B", "NOTE"], &rows(&r.isolation))
        );
        println!("\nclone check");
        print!(
            "{}",
            table::render(&["", "CHECK", "A", "B", "NOTE"], &rows(&r.clone))
        );
        println!("\nidentical by design:");
        for i in &r.identical_by_design {
            println!("  - {i}");
        }
        println!("\naudit {}", if r.passed { "passed" } else { "FAILED" });
    }
    Ok(if r.passed { exit::OK } else { exit::INTERNAL })
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths() {
        assert_eq!(split_remote("s1:/etc/hosts"), Some(("s1", "/etc/hosts")));
        assert_eq!(split_remote("./a:b"), None);
        assert_eq!(split_remote("/tmp/x"), None);
        assert_eq!(split_remote(":x"), None);
        assert_eq!(enc("/a b&c"), "/a%20b%26c");
    }
}
