//! The program: parse the command line, connect to drumsd, run one
//! subcommand. Here rather than in main.rs so that the client's code is
//! compiled once, in this crate, not again in the binary's (a release build
//! shares no generic code between crates).

use clap::Parser;

use crate::{
    args, build, commands, connect, demo, exit, images, inspect, pools, sibling, versions, Cli,
};
use args::{Command, ImageCmd};

/// `drums`'s main.
pub fn main() {
    let cli = Cli::parse();
    // Programs of their own: drums becomes them, and is back only if it could not.
    let sibling = match &cli.command {
        Command::Bench(p) => Some(("drums-bench", &p.args)),
        Command::Eval(p) => Some(("drums-eval", &p.args)),
        _ => None,
    };
    if let Some((program, args)) = sibling {
        let f = sibling::exec(program, &cli.global, args);
        eprintln!("drums: {}", f.message);
        std::process::exit(f.code);
    }
    exit::run_main(false, run(cli))
}

async fn run(cli: Cli) -> Result<i32, exit::Failure> {
    if let Command::Create(a) = &cli.command {
        // Refuse bad input before a daemon is started for it.
        commands::create_request(a)?;
    }
    let c = connect::client(&cli.global).await?;
    match &cli.command {
        Command::Create(a) => commands::create(&c, a).await,
        Command::Exec(a) => commands::exec(&c, a).await,
        Command::Cp { src, dst } => commands::cp(&c, src, dst).await,
        Command::Ps { json } => commands::ps(&c, *json).await,
        Command::Rm { sessions } => commands::rm(&c, sessions).await,
        Command::Images { json } => images::list(&c, *json).await,
        Command::Pull {
            reference,
            insecure,
            quiet,
        } => images::pull(&c, reference, *insecure, *quiet).await,
        Command::Image(ImageCmd::Import { file, name, json }) => {
            images::import(&c, file, name.as_deref(), *json).await
        }
        Command::Image(ImageCmd::Tag { image, name }) => images::tag(&c, image, name).await,
        Command::Build(a) => build::build(&c, &cli.global, a).await,
        Command::Image(ImageCmd::Rm { images }) => images::rm(&c, images).await,
        Command::Image(ImageCmd::Ls { json }) => images::list(&c, *json).await,
        Command::Checkpoint(cmd) => commands::checkpoint(&c, cmd).await,
        Command::Pool(cmd) => pools::run(&c, cmd).await,
        Command::Key(args::KeyCmd::Show { json }) => commands::key_show(&c, *json).await,
        Command::Checkpoints { json } => commands::checkpoints(&c, *json).await,
        Command::Restore {
            checkpoint,
            count,
            json,
        } => {
            commands::restore(
                &c,
                &format!("/v1/checkpoints/{}/restore", commands::enc(checkpoint)),
                *count,
                *json,
            )
            .await
        }
        Command::Fork {
            session,
            count,
            at,
            keep,
            json,
        } => commands::fork(&c, session, *count, at.as_deref(), *keep, *json).await,
        Command::Recover { session, json } => versions::recover(&c, session, *json).await,
        Command::Audit { a, b, json } => commands::audit(&c, a, b, *json).await,
        Command::Inspect { session, json } => inspect::inspect(&c, session, *json).await,
        Command::Turn(cmd) => inspect::turn(&c, cmd).await,
        Command::Versions { session, json } => versions::list(&c, session, *json).await,
        Command::Turns { session, json } => versions::turns(&c, session, *json).await,
        Command::Rollback { session, to, json } => {
            versions::rollback(&c, session, to.as_deref(), *json).await
        }
        Command::Demo => demo::run(&c).await,
        Command::Bench(_) | Command::Eval(_) => unreachable!("run by their own programs"),
    }
}
