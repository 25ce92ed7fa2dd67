//! `drums eval`'s command line: options, then [`crate::eval`] does the work.

use std::path::PathBuf;

use clap::{Args, Parser};
use drums_client::exit::{self, Failure};
use drums_client::Global;

#[derive(Debug, Parser)]
#[command(
    name = "drums-eval",
    bin_name = "drums eval",
    version,
    about = "The evaluation of selective checkpointing (docs/eval.md)"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(flatten)]
    pub args: EvalArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Minutes, not an hour: 8 traces for the strategies, a short fixed
    /// model latency, 2 faults per run, densities 1 and 4.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, summary.md and the figures go.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Seeds the fault plans (and a sampled latency).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The model's time per turn: `trace` (the traces' own), `trace*F`,
    /// `fixed:MS` or `sampled` (from the corpus, by the seed).
    #[arg(long)]
    pub latency: Option<crate::Latency>,
    /// Traces run at once (each worker runs its own drumsd).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Runs of each trace per strategy, each with its own fault plan.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Faults per run.
    #[arg(long)]
    pub faults: Option<usize>,
    /// Only this strategy (repeatable): chat-only, chat+files, full,
    /// selective, restart.
    #[arg(long = "strategy")]
    pub strategies: Vec<crate::Strategy>,
    /// Only this trace (repeatable).
    #[arg(long = "trace")]
    pub traces: Vec<String>,
    /// Densities, comma-separated; 0 probes the host's highest; empty
    /// (`--density ''`) skips density.
    #[arg(long = "density", value_delimiter = ',')]
    pub densities: Option<Vec<String>>,
    /// Skip the agent that lives in its session (it needs the `agent`
    /// image that scripts/setup.sh builds).
    #[arg(long)]
    pub no_inside: bool,
    /// The images drumsd runs sessions from; default STATE_DIR/images.
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
}

pub async fn run(g: &Global, a: &EvalArgs) -> Result<i32, Failure> {
    let bin_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(ToOwned::to_owned))
        .ok_or_else(|| Failure::new(exit::INTERNAL, "find the drums binary's directory"))?;
    let images = a
        .images_dir
        .clone()
        .unwrap_or_else(|| g.state_dir.join("images"));
    let mut o = crate::Options::new(a.quick, a.out.clone(), bin_dir, images);
    o.seed = a.seed;
    if let Some(l) = a.latency {
        o.latency = match l {
            crate::Latency::Sampled { .. } => crate::Latency::Sampled { seed: a.seed },
            l => l,
        };
    }
    o.workers = a.workers.unwrap_or(o.workers);
    o.runs = a.runs.unwrap_or(o.runs);
    o.faults = a.faults.unwrap_or(o.faults);
    if !a.strategies.is_empty() {
        o.strategies = a.strategies.clone();
    }
    o.traces = a.traces.clone();
    o.inside = !a.no_inside;
    if let Some(d) = &a.densities {
        o.densities = d
            .iter()
            .filter(|x| !x.is_empty())
            .map(|x| {
                x.parse()
                    .map_err(|_| Failure::usage(format!("--density {x:?} is no number")))
            })
            .collect::<Result<_, _>>()?;
    }
    if o.workers == 0 || o.workers > 32 {
        return Err(Failure::usage("--workers must be 1 to 32"));
    }
    match crate::eval(&o).await {
        Ok(s) => {
            println!("{}", s.markdown);
            Ok(exit::OK)
        }
        Err(e) => Err(Failure::new(exit::INTERNAL, drums_api::error_chain(&e))),
    }
}
