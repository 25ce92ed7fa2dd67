//! `drums demo`: what drums does, shown on this machine in about a minute.
//! Each later capability (checkpoint and fork, the desktop, the coordinator)
//! adds a step here.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use drums_api::{Client, CreateSession, ExecRequest, Session};
use hyper::Method;

use crate::commands::{enc, run_exec};
use crate::exit::{self, Failure};
use crate::table;

fn step(n: usize, total: usize, what: &str) {
    eprintln!("\x1b[1m[{n}/{total}]\x1b[0m {what}");
}

/// Run a command in a session and capture its stdout.
async fn sh(c: &Client, s: &Session, script: &str) -> Result<(i32, String), Failure> {
    let req = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_exec(c, &s.id, &req, &mut out, &mut err).await?;
    Ok((code, String::from_utf8_lossy(&out).trim().to_owned()))
}

pub async fn run(c: &Client) -> Result<i32, Failure> {
    const STEPS: usize = 6;
    let v: drums_api::Version = c.json(Method::GET, "/v1/version", None::<&()>).await?;
    step(
        1,
        STEPS,
        &format!("drumsd {} (pid {}) owns {}", v.version, v.pid, v.state_dir),
    );

    step(
        2,
        STEPS,
        "creating 3 isolated sessions at once (namespaces, btrfs CoW root, cgroups, veth)",
    );
    let t = Instant::now();
    let creates = (0..3).map(|_| async {
        let t = Instant::now();
        let req = CreateSession {
            limits: drums_api::Limits {
                memory_bytes: Some(512 << 20),
                pids_max: Some(512),
                cpus: Some(1.0),
                disk_bytes: None,
            },
            ..Default::default()
        };
        let s: Result<Session, _> = c.json(Method::POST, "/v1/sessions", Some(&req)).await;
        s.map(|s| (s, t.elapsed()))
    });
    let results = futures::future::join_all(creates).await;
    let mut sessions = Vec::new();
    let mut first_err = None;
    for r in results {
        match r {
            Ok(x) => sessions.push(x),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let outcome = match first_err {
        Some(e) => Err(Failure::from(e)),
        None => {
            eprintln!(
                "      all 3 ready in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            show(c, &sessions).await
        }
    };
    step(
        6,
        STEPS,
        "removing the sessions: processes, mounts, links, cgroups and subvolumes go with them",
    );
    for (s, _) in &sessions {
        c.call(
            Method::DELETE,
            &format!("/v1/sessions/{}", enc(&s.id)),
            None::<&()>,
        )
        .await?;
    }
    let left: drums_api::SessionList = c.json(Method::GET, "/v1/sessions", None::<&()>).await?;
    eprintln!("      sessions left: {}", left.sessions.len());
    outcome
}

async fn show(c: &Client, sessions: &[(Session, Duration)]) -> Result<i32, Failure> {
    step(3, 6, "what each session sees from the inside");
    let mut rows = Vec::new();
    for (s, ready) in sessions {
        let (_, host) = sh(c, s, "hostname").await?;
        let (_, procs) = sh(c, s, "ps -e --no-headers | wc -l").await?;
        let (_, addr) = sh(c, s, "ip -br -4 addr show eth0 | awk '{print $3}'").await?;
        let (_, mid) = sh(c, s, "cut -c1-8 /etc/machine-id").await?;
        rows.push(vec![
            s.id.clone(),
            host,
            addr,
            mid,
            procs,
            format!("{:.0} ms", ready.as_secs_f64() * 1e3),
        ]);
    }
    print!(
        "{}",
        table::render(
            &[
                "SESSION",
                "HOSTNAME",
                "ADDRESS",
                "MACHINE-ID",
                "PROCESSES",
                "READY IN"
            ],
            &rows
        )
    );

    step(
        4,
        6,
        "isolation: files, processes and network stay inside each session",
    );
    let (a, b) = (&sessions[0].0, &sessions[1].0);
    sh(c, a, "echo only-in-a > /root/note").await?;
    let (code, _) = sh(c, b, "cat /root/note").await?;
    eprintln!(
        "      a file written in {} is {} in {}",
        a.id,
        if code == 0 { "VISIBLE (bad)" } else { "absent" },
        b.id
    );
    // A server inside session a, reached from the host through the bridge.
    sh(c, a, "nohup python3 -m http.server 8080 >/dev/null 2>&1 &").await?;
    let ip = a.ip.clone().unwrap_or_default();
    let mut answer = String::from("no answer");
    for _ in 0..100 {
        if let Ok(mut conn) = std::net::TcpStream::connect_timeout(
            &format!("{ip}:8080").parse().expect("ip"),
            Duration::from_millis(200),
        ) {
            let _ = conn.write_all(b"GET / HTTP/1.0\r\n\r\n");
            let mut buf = [0u8; 64];
            let n = conn.read(&mut buf).unwrap_or(0);
            answer = String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("      host -> {}:8080 (python in {}): {answer}", ip, a.id);
    let probe = format!(
        "python3 -c \"import socket; s=socket.socket(); s.settimeout(1); s.connect(('{ip}', 8080))\" 2>/dev/null && echo reachable || echo unreachable"
    );
    let (_, r) = sh(c, b, &probe).await?;
    eprintln!(
        "      {} -> {}:8080: {r} (bridge ports are isolated)",
        b.id, ip
    );
    // cp both ways.
    let tmp = std::env::temp_dir().join(format!("drums-demo-{}", std::process::id()));
    std::fs::write(&tmp, b"hello from the host\n")
        .map_err(|e| Failure::new(exit::INTERNAL, format!("write {}: {e}", tmp.display())))?;
    crate::commands::cp(
        c,
        &tmp.display().to_string(),
        &format!("{}:/root/hello.txt", a.id),
    )
    .await?;
    let (_, got) = sh(c, a, "cat /root/hello.txt").await?;
    let _ = std::fs::remove_file(&tmp);
    eprintln!(
        "      drums cp host -> {}:/root/hello.txt, read inside: {got:?}",
        a.id
    );
    fork(c, a).await
}

/// Checkpoint the session with the running server and fork hygienic siblings.
async fn fork(c: &Client, a: &Session) -> Result<i32, Failure> {
    step(
        5,
        6,
        &format!(
            "checkpoint {} with its Python server running, and fork 3 hygienic siblings",
            a.id
        ),
    );
    let req = drums_api::CreateCheckpoint {
        session: a.id.clone(),
        name: None,
        clean: false,
        leave_running: true,
    };
    let ck: drums_api::Checkpoint = c.json(Method::POST, "/v1/checkpoints", Some(&req)).await?;
    eprintln!(
        "      checkpoint {}: {:.1} MiB of images, {:.0} ms (frozen {:.0} ms)",
        ck.id,
        ck.images_bytes as f64 / (1 << 20) as f64,
        ck.dump_ms,
        ck.frozen_ms
    );
    let t = Instant::now();
    let r: drums_api::RestoreResult = c
        .json(
            Method::POST,
            &format!("/v1/checkpoints/{}/restore", enc(&ck.id)),
            Some(&drums_api::RestoreRequest {
                count: 3,
                name: None,
            }),
        )
        .await?;
    eprintln!(
        "      3 siblings restored and ready in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut rows = Vec::new();
    for s in &r.sessions {
        let (_, gen) = sh(c, s, "cat /run/drums/generation").await?;
        let (_, mid) = sh(c, s, "cut -c1-8 /etc/machine-id").await?;
        let (_, serving) = sh(c, s, "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/').status)\" 2>&1 | tail -1").await?;
        rows.push(vec![
            s.id.clone(),
            s.hostname.clone(),
            s.ip.clone().unwrap_or_default(),
            mid,
            gen,
            serving,
        ]);
    }
    print!(
        "{}",
        table::render(
            &[
                "SIBLING",
                "HOSTNAME",
                "ADDRESS",
                "MACHINE-ID",
                "GENERATION",
                "SERVER"
            ],
            &rows
        )
    );
    let audit: drums_api::AuditReport = c
        .json(
            Method::GET,
            &format!(
                "/v1/audit?a={}&b={}",
                enc(&r.sessions[0].id),
                enc(&r.sessions[1].id)
            ),
            None::<&()>,
        )
        .await?;
    eprintln!(
        "      drums audit {} {}: {} (isolation and clone checks; `drums audit` shows each)",
        r.sessions[0].id,
        r.sessions[1].id,
        if audit.passed { "passed" } else { "FAILED" }
    );
    for s in &r.sessions {
        c.call(
            Method::DELETE,
            &format!("/v1/sessions/{}", enc(&s.id)),
            None::<&()>,
        )
        .await?;
    }
    c.call(
        Method::DELETE,
        &format!("/v1/checkpoints/{}", enc(&ck.id)),
        None::<&()>,
    )
    .await?;
    Ok(exit::OK)
}
