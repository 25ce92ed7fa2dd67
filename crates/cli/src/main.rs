//! drums (the program is `drums_cli::program::main`).

fn main() {
    drums_cli::program::main()
}
