//! drums: parse the command line, connect to drumsd, run one subcommand.

use clap::Parser;
use drums_cli::args::{Command, ImageCmd};
use drums_cli::{commands, connect, demo, inspect, sibling, Cli};

fn main() {
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
    drums_cli::exit::run_main(false, run(cli))
}

async fn run(cli: Cli) -> Result<i32, drums_cli::exit::Failure> {
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
        Command::Images { json } => drums_cli::images::list(&c, *json).await,
        Command::Pull {
            reference,
            insecure,
            quiet,
        } => drums_cli::images::pull(&c, reference, *insecure, *quiet).await,
        Command::Image(ImageCmd::Import { file, name, json }) => {
            drums_cli::images::import(&c, file, name.as_deref(), *json).await
        }
        Command::Image(ImageCmd::Tag { image, name }) => {
            drums_cli::images::tag(&c, image, name).await
        }
        Command::Build(a) => drums_cli::build::build(&c, &cli.global, a).await,
        Command::Image(ImageCmd::Rm { images }) => drums_cli::images::rm(&c, images).await,
        Command::Image(ImageCmd::Ls { json }) => drums_cli::images::list(&c, *json).await,
        Command::Checkpoint(cmd) => commands::checkpoint(&c, cmd).await,
        Command::Pool(cmd) => drums_cli::pools::run(&c, cmd).await,
        Command::Key(drums_cli::args::KeyCmd::Show { json }) => commands::key_show(&c, *json).await,
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
        Command::Recover { session, json } => {
            drums_cli::versions::recover(&c, session, *json).await
        }
        Command::Audit { a, b, json } => commands::audit(&c, a, b, *json).await,
        Command::Inspect { session, json } => inspect::inspect(&c, session, *json).await,
        Command::Turn(cmd) => inspect::turn(&c, cmd).await,
        Command::Versions { session, json } => drums_cli::versions::list(&c, session, *json).await,
        Command::Turns { session, json } => drums_cli::versions::turns(&c, session, *json).await,
        Command::Rollback { session, to, json } => {
            drums_cli::versions::rollback(&c, session, to.as_deref(), *json).await
        }
        Command::Demo => demo::run(&c).await,
        Command::Bench(_) | Command::Eval(_) => unreachable!("run by their own programs"),
    }
}
