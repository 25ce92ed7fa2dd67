//! `drums inspect` and `drums turn`: the inspector's view of a session's turns.

use drums_api::{AgentMarked, Client, MarkAgent, TurnBegun, TurnEffects};
use http_body_util::BodyExt;
use hyper::Method;

use crate::args::TurnCommand;
use crate::commands::enc;
use crate::exit::{self, Failure};

pub async fn turn(c: &Client, cmd: &TurnCommand) -> Result<i32, Failure> {
    match cmd {
        TurnCommand::Begin { session } => {
            let b: TurnBegun = c
                .json(Method::POST, &path(session, "turn/begin"), None::<&()>)
                .await?;
            println!("turn {} of {} begun", b.turn, b.session);
        }
        TurnCommand::End {
            session,
            json,
            checkpoint,
            policy,
            wait,
        } => {
            let body = drums_api::EndTurn {
                checkpoint: *checkpoint,
                policy: *policy,
                wait: *wait,
            };
            let e: TurnEffects = c
                .json(Method::POST, &path(session, "turn/end"), Some(&body))
                .await?;
            print_effects(&e, *json);
        }
        TurnCommand::Agent { session, pid } => {
            let a: AgentMarked = c
                .json(
                    Method::POST,
                    &path(session, "agent"),
                    Some(&MarkAgent { pid: *pid }),
                )
                .await?;
            println!(
                "excluded from process tracking in {}: {:?}",
                a.session, a.pids
            );
        }
        TurnCommand::Stop { session } => {
            c.call(Method::DELETE, &path(session, "turns"), None::<&()>)
                .await?;
        }
    }
    Ok(exit::OK)
}

/// Follow a session's turns until it is removed (or ^C).
pub async fn inspect(c: &Client, session: &str, json: bool) -> Result<i32, Failure> {
    let resp = c
        .call(Method::GET, &path(session, "turns"), None::<&()>)
        .await?;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Failure::new(exit::INTERNAL, format!("turns stream broke: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            #[derive(serde::Deserialize)]
            struct Coordinated {
                coordinated: drums_api::CoordinatedTurn,
            }
            if let Ok(c) = serde_json::from_slice::<Coordinated>(&line) {
                match json {
                    true => print!("{}", String::from_utf8_lossy(&line)),
                    false => println!("{}", crate::versions::one_line(&c.coordinated)),
                }
                continue;
            }
            match serde_json::from_slice::<TurnEffects>(&line) {
                Ok(e) => print_effects(&e, json),
                // {"lagged":N}: this reader fell behind and missed N turns.
                Err(_) => eprintln!("drums: {}", String::from_utf8_lossy(&line).trim()),
            }
        }
    }
    Ok(exit::OK)
}

fn path(session: &str, tail: &str) -> String {
    format!("/v1/sessions/{}/{tail}", enc(session))
}

fn print_effects(e: &TurnEffects, json: bool) {
    if json {
        println!("{}", serde_json::to_string(e).expect("serialize"));
        return;
    }
    if let Some(ck) = &e.checkpoint {
        let job = ck.job.as_deref().unwrap_or("-");
        match &ck.version {
            Some(v) => println!(
                "version {} ({}) took {}{}",
                v.number,
                v.id,
                v.took,
                v.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            None => println!("checkpoint: {} (job {job})", ck.decision),
        }
    }
    println!(
        "turn {}  {}  {} file(s), {} process(es), {} dirtied  ({:.2} ms)",
        e.turn,
        e.class.as_str(),
        e.files.len(),
        e.processes.len(),
        e.dirtied.len(),
        e.latency_us as f64 / 1000.0
    );
    for f in &e.files {
        println!(
            "  {:<9} {}  [{}] by {}",
            f.change,
            f.path,
            f.ops.join(","),
            f.by.join(",")
        );
    }
    for p in &e.processes {
        let exe = p
            .exe
            .as_deref()
            .map(|x| format!(" {x}"))
            .unwrap_or_default();
        println!("  {:<9} {} {}{exe}", p.change, p.pid, p.comm);
    }
    for d in &e.dirtied {
        println!(
            "  dirtied   {} {}  {} us cpu, {} faults ({})",
            d.pid, d.comm, d.cpu_us, d.faults, d.reason
        );
    }
}
