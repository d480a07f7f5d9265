//! Builds the eBPF programs (leash-ebpf) with the nightly toolchain and bpf-linker, so the
//! `leash` binary embeds them. `AYA_BUILD_SKIP=1` skips this (for clippy without the toolchain).
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let ebpf = Package {
        name: "leash-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-ebpf"),
        ..Default::default()
    };
    // aya-build watches leash-ebpf; the programs also embed the ABI from leash-common.
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-common/src")
    );
    aya_build::build_ebpf([ebpf], Toolchain::default())
}
