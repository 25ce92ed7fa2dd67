//! drumsd (the program is `drums_daemon::main`).
fn main() -> std::process::ExitCode {
    drums_daemon::main()
}
