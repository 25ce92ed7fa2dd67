//! `drums pool`: warm pools of a checkpoint's siblings, kept ready by
//! drumsd (docs/pools.md).

use drums_api::{Client, CreatePool, Pool, PoolList, Session, TakeRequest};
use hyper::Method;

use crate::args::PoolCmd;
use crate::commands::enc;
use crate::exit::{self, Failure};
use crate::table;

pub async fn run(c: &Client, cmd: &PoolCmd) -> Result<i32, Failure> {
    match cmd {
        PoolCmd::Create {
            checkpoint,
            size,
            name,
            json,
        } => {
            let req = CreatePool {
                checkpoint: checkpoint.clone(),
                size: *size,
                name: name.clone(),
            };
            let p: Pool = c.json(Method::POST, "/v1/pools", Some(&req)).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&p).expect("serialize"));
            } else {
                println!("{}", p.name);
            }
            Ok(exit::OK)
        }
        PoolCmd::Ls { json } => {
            let l: PoolList = c.json(Method::GET, "/v1/pools", None::<&()>).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
                return Ok(exit::OK);
            }
            let rows: Vec<Vec<String>> = l
                .pools
                .iter()
                .map(|p| {
                    vec![
                        p.id.clone(),
                        p.name.clone(),
                        p.checkpoint.clone(),
                        format!("{}/{}", p.ready, p.size),
                        p.restoring.to_string(),
                        p.taken.to_string(),
                        p.waiting_on.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(
                    &[
                        "ID",
                        "NAME",
                        "CHECKPOINT",
                        "READY",
                        "RESTORING",
                        "TAKEN",
                        "WAITING ON"
                    ],
                    &rows
                )
            );
            Ok(exit::OK)
        }
        PoolCmd::Take {
            pool,
            timeout,
            json,
        } => {
            let req = TakeRequest {
                timeout_ms: timeout.map(|s| (s * 1000.0) as u64),
            };
            let s: Session = c
                .json(
                    Method::POST,
                    &format!("/v1/pools/{}/take", enc(pool)),
                    Some(&req),
                )
                .await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&s).expect("serialize"));
            } else {
                println!("{}", s.id);
            }
            Ok(exit::OK)
        }
        PoolCmd::Rm { pools } => {
            let mut code = exit::OK;
            for p in pools {
                match c
                    .call(
                        Method::DELETE,
                        &format!("/v1/pools/{}", enc(p)),
                        None::<&()>,
                    )
                    .await
                {
                    Ok(_) => println!("{p}"),
                    Err(e) => {
                        let f = Failure::from(e);
                        eprintln!("drums: pool rm {p}: {}", f.message);
                        code = f.code;
                    }
                }
            }
            Ok(code)
        }
    }
}
