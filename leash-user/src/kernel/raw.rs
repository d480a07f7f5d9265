//! The programs aya 0.14 cannot load as they need (fmod_ret, and LSM programs relocated
//! against the maps aya made), loaded and attached with raw `bpf()` calls (sys/bpf.rs), and
//! whether the kernel runs BPF LSM programs at all. The ptrace guard and the marks share them.

use std::{
    collections::HashSet,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use anyhow::{Context, Result, bail};
use aya::{Ebpf, maps::Map};

use super::support::{self, LSM_LIST};
use crate::sys;

/// Whether the BPF LSM is active: only then does the kernel call its hooks. securityfs is
/// mounted first if it is not (systemd mounts it at boot).
pub(super) fn bpf_lsm_active() -> Result<bool> {
    let securityfs = std::path::Path::new("/sys/kernel/security");
    if !securityfs.join("lsm").exists() && securityfs.exists() {
        sys::mount_with(c"securityfs", securityfs, None)
            .with_context(|| format!("mounting securityfs at {}", securityfs.display()))?;
        tracing::info!(path = %securityfs.display(), "mounted securityfs");
    }
    let list = support::active_lsms().with_context(|| format!("reading {LSM_LIST}"))?;
    Ok(support::lists_bpf(&list))
}

/// Relocates the program `name` of `object` (the object `ebpf` was loaded from) against the
/// maps aya made for `ebpf` (the `.rodata` with the offsets among them), loads it as `kind` on
/// the kernel function `target`, and attaches it. Returns the link.
pub(super) fn attach_by_btf_id(
    ebpf: &Ebpf,
    object: &[u8],
    kernel_btf: &aya::Btf,
    name: &str,
    kind: sys::AttachKind,
    target: &str,
) -> Result<OwnedFd> {
    let mut parsed = aya_obj::Object::parse(object).context("parsing the programs' object")?;
    // Each map of the object, with the descriptor of the one aya made for it.
    let maps: Vec<(String, i32, aya_obj::Map)> = ebpf
        .maps()
        .filter_map(|(name, map)| {
            let definition = parsed.maps.get(name)?.clone();
            Some(map_fd(map).map(|fd| (name.to_owned(), fd, definition)))
        })
        .collect::<Result<_>>()?;
    let text_sections: HashSet<usize> = parsed
        .functions
        .keys()
        .map(|(section, _)| *section)
        .collect();
    parsed
        .relocate_maps(
            maps.iter().map(|(name, fd, map)| (name.as_str(), *fd, map)),
            &text_sections,
        )
        .with_context(|| format!("relocating the maps of {name}"))?;
    parsed
        .relocate_calls(&text_sections)
        .with_context(|| format!("relocating the calls of {name}"))?;
    let function = parsed
        .programs
        .get(name)
        .and_then(|p| parsed.functions.get(&p.function_key()))
        .with_context(|| format!("program {name} missing from the object"))?;
    let target_id = function_btf_id(kernel_btf, target)?;
    let loaded = sys::load_by_btf_id(
        kind,
        name,
        &function.instructions,
        &parsed.license,
        target_id,
    )
    .with_context(|| format!("loading {name} on {target}"))?;
    sys::attach_tracing(loaded.as_fd())
        .with_context(|| format!("attaching {name} to {target} (the kernel needs BPF trampolines)"))
}

/// The descriptor of a map of the programs' kinds. A task storage map (the marks') is one aya
/// hands back as unsupported: a map this does not know would leave a program unrelocated, so
/// it is an error, never skipped.
fn map_fd(map: &Map) -> Result<i32> {
    let data = match map {
        Map::HashMap(data)
        | Map::PerCpuArray(data)
        | Map::RingBuf(data)
        | Map::Array(data)
        | Map::Unsupported(data) => data,
        _ => bail!("a map of an unexpected type in the programs' object"),
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

/// The BTF id of the kernel function `name` in vmlinux (`kernel_btf`, parsed already).
pub(super) fn function_btf_id(kernel_btf: &aya::Btf, name: &str) -> Result<u32> {
    kernel_btf
        .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
        .with_context(|| {
            format!("no function {name} in the kernel's BTF (a kernel without CONFIG_SECURITY)")
        })
}
