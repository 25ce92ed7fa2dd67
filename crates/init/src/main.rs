//! drums-init: a session's init. See the drums-init library for the stages.

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("--stage2") => drums_init::stage::stage2(),
        _ => drums_init::stage::stage0(),
    }
}
