//! Builds the BPF programs into a skeleton. `vmlinux.h` is generated here from
//! the running kernel's BTF with bpftool (installed by set-up), not committed:
//! CO-RE relocations then adapt the programs to whichever kernel loads them.

use std::path::PathBuf;
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/inspect.bpf.c";
const BTF: &str = "/sys/kernel/btf/vmlinux";

fn main() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    // The programs name syscalls by their x86_64 numbers.
    assert_eq!(arch, "x86_64", "drums-inspect: only x86_64 is supported");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());

    let vmlinux = out.join("vmlinux.h");
    let dump = Command::new("bpftool")
        .args(["btf", "dump", "file", BTF, "format", "c"])
        .output()
        .unwrap_or_else(|e| panic!("run bpftool (set-up installs it): {e}"));
    assert!(
        dump.status.success(),
        "bpftool btf dump file {BTF}: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    std::fs::write(&vmlinux, &dump.stdout).expect("write vmlinux.h");

    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            "-I".into(),
            out.clone().into_os_string(),
            "-Isrc/bpf".into(),
            "-Wall".into(),
            "-Wno-unused-function".into(),
        ])
        .build_and_generate(out.join("inspect.skel.rs"))
        .expect("build the BPF skeleton");
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-changed={BTF}");
}
