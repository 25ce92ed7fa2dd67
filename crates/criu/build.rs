//! Builds the prlimit shim (`shim/prlimit.c`) as a shared library that the
//! crate embeds and preloads into `criu swrk`; see the C file for why.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "shim/prlimit.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("drums-criu-prlimit.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?} (build-essential): {e}"));
    assert!(status.success(), "{cc} failed to build {src}");
}
