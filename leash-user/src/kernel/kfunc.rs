//! The kernel functions (kfuncs) the programs call: `bpf_send_signal_task`, for the kernel kill
//! (leash-ebpf's kill.rs). aya 0.14 cannot resolve a kfunc: the object holds each call as a
//! call to an undefined symbol, which aya would take for a call to a function of the object.
//! So the calls are patched in a copy of the object before aya reads it: where the kernel has
//! the function, the call names it by its BTF id in vmlinux (`src_reg` 2,
//! BPF_PSEUDO_KFUNC_CALL), which aya leaves as it is (it links only `src_reg` 1); elsewhere the
//! call becomes `r0 = 0`, and the program that holds it is never attached.

use anyhow::{Context, Result, bail};
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind};

use super::raw::function_btf_id;

/// The kfunc the kernel kill calls (Linux 6.13).
pub(super) const SEND_SIGNAL_TASK: &str = "bpf_send_signal_task";

/// `BPF_JMP | BPF_CALL`: the opcode of a call.
pub(super) const CALL: u8 = 0x85;
/// `BPF_PSEUDO_KFUNC_CALL`: a call's `src_reg` for a kernel function, its BTF id in `imm`.
pub(super) const PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_ALU64 | BPF_MOV | BPF_K`, with `r0` and 0: `r0 = 0`.
pub(super) const R0_IS_0: [u8; 8] = [0xb7, 0, 0, 0, 0, 0, 0, 0];

/// A copy of `object` with its calls to [`SEND_SIGNAL_TASK`] patched for this kernel (see the
/// module doc), and whether the kernel has the function.
pub(super) fn patched(object: &[u8], kernel_btf: &aya::Btf) -> Result<(Vec<u8>, bool)> {
    let calls = calls_to(object, SEND_SIGNAL_TASK)?;
    let id = function_btf_id(kernel_btf, SEND_SIGNAL_TASK).ok();
    let mut patched = object.to_vec();
    for at in calls {
        let call = patched
            .get_mut(at..at + 8)
            .context("a kfunc call outside the object")?;
        if call[0] != CALL {
            bail!("the relocation of {SEND_SIGNAL_TASK} at {at} is not on a call");
        }
        match id {
            Some(id) => {
                call[1] = (call[1] & 0x0f) | (PSEUDO_KFUNC_CALL << 4);
                call[2..4].copy_from_slice(&0u16.to_le_bytes());
                call[4..8].copy_from_slice(&id.to_le_bytes());
            }
            None => call.copy_from_slice(&R0_IS_0),
        }
    }
    Ok((patched, id.is_some()))
}

/// Where in `object` (file offsets) an instruction calls the undefined symbol `name`.
pub(super) fn calls_to(object: &[u8], name: &str) -> Result<Vec<usize>> {
    let file = object::File::parse(object).context("reading the programs' object")?;
    let mut calls = Vec::new();
    // The programs' sections alone: the debug sections name the symbol too.
    for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
        let Some((start, _)) = section.file_range() else {
            continue;
        };
        for (offset, relocation) in section.relocations() {
            let RelocationTarget::Symbol(index) = relocation.target() else {
                continue;
            };
            let symbol = file.symbol_by_index(index)?;
            if symbol.is_undefined() && symbol.name() == Ok(name) {
                calls.push(usize::try_from(start + offset)?);
            }
        }
    }
    Ok(calls)
}
