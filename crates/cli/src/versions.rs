//! `drums versions` and `drums rollback`: a session's history, and going
//! back in it (see docs/engine.md).

use drums_api::{Client, CoordinatedTurns, Rollback, Session, SessionVersions};
use hyper::Method;

use crate::commands::enc;
use crate::exit::{self, Failure};
use crate::table;

pub async fn list(c: &Client, session: &str, json: bool) -> Result<i32, Failure> {
    let l: SessionVersions = c
        .json(
            Method::GET,
            &format!("/v1/sessions/{}/versions", enc(session)),
            None::<&()>,
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
        return Ok(exit::OK);
    }
    let ms = |c: Option<drums_api::ArtifactCost>| {
        c.map_or_else(|| "-".into(), |c| format!("{:.1} ms", c.frozen_ms))
    };
    let rows: Vec<Vec<String>> = l
        .versions
        .iter()
        .map(|v| {
            vec![
                v.number.to_string(),
                v.id.clone(),
                v.state.to_string(),
                v.turn.map_or_else(|| "-".into(), |t| t.to_string()),
                v.class.clone(),
                v.took.clone(),
                ms(v.files),
                ms(v.process),
                if v.pinned {
                    v.name.clone()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "#",
                "ID",
                "STATE",
                "TURN",
                "CLASS",
                "TOOK",
                "FILES FROZEN",
                "PROCS FROZEN",
                "PINNED AS"
            ],
            &rows
        )
    );
    Ok(exit::OK)
}

pub async fn recover(c: &Client, session: &str, json: bool) -> Result<i32, Failure> {
    let s: Session = c
        .json(
            Method::POST,
            &format!("/v1/sessions/{}/recover", enc(session)),
            None::<&()>,
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s).expect("serialize"));
    } else {
        println!("{} recovered", s.name);
    }
    Ok(exit::OK)
}

pub async fn rollback(
    c: &Client,
    session: &str,
    to: Option<&str>,
    json: bool,
) -> Result<i32, Failure> {
    let s: Session = c
        .json(
            Method::POST,
            &format!("/v1/sessions/{}/rollback", enc(session)),
            Some(&Rollback {
                to: to.map(str::to_owned),
            }),
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s).expect("serialize"));
    } else {
        println!("{} rolled back", s.name);
    }
    Ok(exit::OK)
}

/// `drums turns`: the LLM proxy's record of a session (docs/coordinator.md).
pub async fn turns(c: &Client, session: &str, json: bool) -> Result<i32, Failure> {
    let l: CoordinatedTurns = c
        .json(
            Method::GET,
            &format!("/v1/sessions/{}/coordinator", enc(session)),
            None::<&()>,
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
        return Ok(exit::OK);
    }
    let dash = || "-".to_owned();
    let rows: Vec<Vec<String>> = l
        .turns
        .iter()
        .map(|t| {
            vec![
                t.turn.map_or_else(dash, |n| n.to_string()),
                t.seq.map_or_else(dash, |n| n.to_string()),
                t.log.clone(),
                format!("{} {}", t.style, t.path),
                t.status.to_string(),
                t.decision.clone(),
                t.version.clone().unwrap_or_else(dash),
                t.version_bytes.map_or_else(dash, |b| b.to_string()),
                format!("{:.1} ms", t.upstream_ms),
                format!("{:.1} ms", t.held_ms),
                t.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "TURN", "SEQ", "LOG", "REQUEST", "STATUS", "DECISION", "VERSION", "BYTES",
                "UPSTREAM", "HELD", "ERROR"
            ],
            &rows
        )
    );
    Ok(exit::OK)
}

/// One record on one line, for `drums inspect`'s live stream.
pub fn one_line(t: &drums_api::CoordinatedTurn) -> String {
    format!(
        "request {} {} {}: {} ({}), turn {}, {}{}, upstream {:.1} ms, held {:.1} ms{}",
        t.seq.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        t.style,
        t.path,
        t.status,
        t.log,
        t.turn.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        t.decision,
        t.version
            .as_deref()
            .map(|v| format!(" -> {v}"))
            .unwrap_or_default(),
        t.upstream_ms,
        t.held_ms,
        t.error
            .as_deref()
            .map(|e| format!(", error: {e}"))
            .unwrap_or_default()
    )
}
