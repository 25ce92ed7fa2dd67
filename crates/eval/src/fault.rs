//! The faults `drums eval` injects, at seeded turns, the same for every
//! strategy: each fires while the model thinks about a turn, once.

use crate::trace::Trace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// The session's init is killed, and with it every process of the
    /// session (its pid namespace).
    Processes,
    /// drumsd is killed with SIGKILL and started again.
    Drumsd,
    /// drumsd is killed with SIGKILL in the middle of the turn's
    /// checkpoint (held before CRIU's dump or before the version's
    /// manifest by drumsd's fault injection), and started again.
    Checkpoint,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Processes => "processes",
            Kind::Drumsd => "drumsd",
            Kind::Checkpoint => "checkpoint",
        }
    }
}

/// A fault during the model's answer to request `request` (1-based: the
/// request that ends turn `request` of the trace, after its commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Fault {
    pub request: usize,
    pub kind: Kind,
}

/// `count` faults at distinct requests of `trace`, from `seed`: the same
/// plan for every strategy. A checkpoint fault goes only where the ending
/// turn changed something (so that a selective version is being taken);
/// kinds otherwise take turns.
pub fn plan(trace: &Trace, seed: u64, count: usize) -> Vec<Fault> {
    let n = trace.turns.len();
    let mut rng = SplitMix(seed ^ crate::upstream::fnv_str(&trace.name));
    let mut requests: Vec<usize> = (1..=n).collect();
    // Fisher-Yates, then the first `count`, in order.
    for i in (1..requests.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        requests.swap(i, j);
    }
    let mut picked: Vec<usize> = requests.into_iter().take(count.min(n)).collect();
    picked.sort_unstable();
    let kinds = [Kind::Processes, Kind::Drumsd, Kind::Checkpoint];
    let first = rng.next() as usize;
    picked
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            let mut kind = kinds[(first + i) % kinds.len()];
            if kind == Kind::Checkpoint
                && trace.turns[request - 1].class == drums_api::TurnClass::None
            {
                kind = Kind::Processes;
            }
            Fault { request, kind }
        })
        .collect()
}

/// SplitMix64: a small, stable generator (the plan must not change with a
/// dependency's version).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
}
