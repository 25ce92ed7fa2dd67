//! drums-init: a session's init. See the drums-init library for the stages.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--stage2") => {
            // Written by stage 1 of the same build: anything else is ignored.
            let port = match &args[1..] {
                [flag, port] if flag == "--session-api-port" => port.parse().ok(),
                _ => None,
            };
            drums_init::stage::stage2(port)
        }
        _ => drums_init::stage::stage0(),
    }
}
