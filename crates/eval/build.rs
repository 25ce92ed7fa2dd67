//! Compiles the trace corpus (`traces/*.toml`) into the crate, so that
//! `drums eval` needs no files beside the binary.

use std::fmt::Write;

fn main() {
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("traces");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_name().unwrap().to_string_lossy();
        writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            f.display().to_string()
        )
        .unwrap();
    }
    out.push(']');
    let dst = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("corpus.rs");
    std::fs::write(dst, out).expect("write corpus.rs");

    // The commit the evaluation's output names (none outside a checkout).
    if let Ok(o) = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
    {
        if o.status.success() {
            let c = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            println!("cargo:rustc-env=DRUMS_COMMIT={c}");
        }
    }
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs/heads");
}
