//! `drums eval`: options from the command line, then `drums_eval` does the
//! work (docs/eval.md).

use crate::args::{EvalArgs, Global};
use crate::exit::{self, Failure};

pub async fn run(g: &Global, a: &EvalArgs) -> Result<i32, Failure> {
    let bin_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(ToOwned::to_owned))
        .ok_or_else(|| Failure::new(exit::INTERNAL, "find the drums binary's directory"))?;
    let images = a
        .images_dir
        .clone()
        .unwrap_or_else(|| g.state_dir.join("images"));
    let mut o = drums_eval::Options::new(a.quick, a.out.clone(), bin_dir, images);
    o.seed = a.seed;
    if let Some(l) = a.latency {
        o.latency = match l {
            drums_eval::Latency::Sampled { .. } => drums_eval::Latency::Sampled { seed: a.seed },
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
    match drums_eval::eval(&o).await {
        Ok(s) => {
            println!("{}", s.markdown);
            Ok(exit::OK)
        }
        Err(e) => Err(Failure::new(exit::INTERNAL, drums_eval::chain(&e))),
    }
}
