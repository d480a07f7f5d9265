//! Offsets of the kernel structure fields the programs read, from the running kernel's BTF.
//! They change with every kernel build (and with structure layout randomization), so they are
//! looked up at load time and passed to the programs as globals: one binary for every kernel,
//! and no offset written into it.

use std::path::Path;

use anyhow::{Context, Result, bail};
use btf_rs::{Btf, Type};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offsets into `struct task_struct`, into the `struct signal_struct` it points to, and
/// into a signal's `struct k_sigaction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `pid_t tgid`
    pub tgid: u32,
    /// `u64 start_boottime`
    pub start_boottime: u32,
    /// `struct task_struct *group_leader`
    pub group_leader: u32,
    /// `struct task_struct *real_parent`
    pub real_parent: u32,
    /// `struct signal_struct *signal`: shared by the thread group.
    pub signal: u32,
    /// `atomic_t live` in `struct signal_struct`: the group's threads not yet exiting.
    pub signal_live: u32,
    /// `unsigned int flags` in `struct signal_struct`: `SIGNAL_GROUP_EXIT` and the like.
    pub signal_flags: u32,
    /// The handler in `struct k_sigaction` (`sa.sa_handler`): what the host programs read of
    /// the action a signal is delivered with.
    pub sigaction_handler: u32,
}

/// The running kernel's BTF, parsed: read it once and take every offset from it (a parse of
/// vmlinux's is the slowest step of loading the programs).
///
/// Read whole, then parsed from memory: parsed from the file, the parser asks the kernel for
/// its position (an lseek) at every type, tens of thousands of system calls, which cost most
/// of the parse under emulation.
pub fn kernel() -> Result<Btf> {
    let context = || {
        format!("reading kernel BTF from {VMLINUX_BTF} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")
    };
    let bytes = std::fs::read(Path::new(VMLINUX_BTF)).with_context(context)?;
    Btf::from_bytes(&bytes).with_context(context)
}

impl TaskOffsets {
    pub fn from_kernel() -> Result<Self> {
        Self::from_btf(&kernel()?)
    }

    pub fn from_btf(btf: &Btf) -> Result<Self> {
        Ok(Self {
            tgid: field_offset(btf, "task_struct", "tgid")?,
            start_boottime: field_offset(btf, "task_struct", "start_boottime")?,
            group_leader: field_offset(btf, "task_struct", "group_leader")?,
            real_parent: field_offset(btf, "task_struct", "real_parent")?,
            signal: field_offset(btf, "task_struct", "signal")?,
            signal_live: field_offset(btf, "signal_struct", "live")?,
            signal_flags: field_offset(btf, "signal_struct", "flags")?,
            sigaction_handler: field_offset(btf, "k_sigaction", "sa")?
                + field_offset(btf, "sigaction", "sa_handler")?,
        })
    }
}

/// Where the whois program finds a task's namespaces (see `leash_common::NamespaceOffsets`).
pub fn namespace_offsets(btf: &Btf) -> Result<leash_common::NamespaceOffsets> {
    let at = |structure, field| field_offset(btf, structure, field);
    let inum = at("ns_common", "inum")?;
    let upid_ns = at("upid", "ns")?;
    Ok(leash_common::NamespaceOffsets {
        task_pid: at("task_struct", "pid")?,
        task_real_cred: at("task_struct", "real_cred")?,
        cred_user_ns: at("cred", "user_ns")?,
        user_ns_parent: at("user_namespace", "parent")?,
        user_ns_owner: at("user_namespace", "owner")?,
        user_ns_inum: at("user_namespace", "ns")? + inum,
        task_thread_pid: at("task_struct", "thread_pid")?,
        pid_level: at("pid", "level")?,
        pid_numbers: at("pid", "numbers")?,
        // `struct upid` is an int and a pointer: its size is the pointer's end.
        upid_size: upid_ns + size_of::<u64>() as u32,
        upid_ns,
        pid_ns_inum: at("pid_namespace", "ns")? + inum,
    })
}

/// The byte offset of `field` in `structure`, looking through anonymous structs and unions
/// (task_struct wraps its randomizable part in one).
pub fn field_offset(btf: &Btf, structure: &str, field: &str) -> Result<u32> {
    let types = btf
        .resolve_types_by_name(structure)
        .with_context(|| format!("no type {structure} in BTF"))?;
    for ty in types {
        if let Type::Struct(s) = ty
            && let Some(bits) = find_member(btf, &s, field, 0)?
        {
            if bits % 8 != 0 {
                bail!("{structure}.{field} is a bit field");
            }
            return Ok(bits / 8);
        }
    }
    bail!("{structure} has no field {field} in this kernel's BTF")
}

fn find_member(btf: &Btf, s: &btf_rs::Struct, field: &str, base_bits: u32) -> Result<Option<u32>> {
    for member in &s.members {
        let bits = base_bits + member.bit_offset();
        let name = btf.resolve_name(member).unwrap_or_default();
        if name == field {
            return Ok(Some(bits));
        }
        if name.is_empty() {
            let inner = resolve_through_modifiers(btf, btf.resolve_chained_type(member)?)?;
            if let Type::Struct(inner) | Type::Union(inner) = inner
                && let Some(found) = find_member(btf, &inner, field, bits)?
            {
                return Ok(Some(found));
            }
        }
    }
    Ok(None)
}

fn resolve_through_modifiers(btf: &Btf, mut ty: Type) -> Result<Type> {
    loop {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t)?,
            Type::Const(t) => btf.resolve_chained_type(t)?,
            Type::Volatile(t) => btf.resolve_chained_type(t)?,
            _ => return Ok(ty),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this machine's BTF: the offsets must be plausible and distinct. (Exact values are
    /// per kernel build, so they are not asserted.)
    #[test]
    fn namespace_offsets_of_this_kernel() {
        let offsets = namespace_offsets(&kernel().unwrap()).unwrap();
        assert_eq!(offsets.upid_size, 16, "{offsets:?}");
        assert_ne!(offsets.task_real_cred, offsets.task_thread_pid);
        assert!(offsets.user_ns_parent.is_multiple_of(8), "{offsets:?}");
    }

    #[test]
    fn task_offsets_of_this_kernel() {
        if !Path::new(VMLINUX_BTF).exists() {
            panic!("{VMLINUX_BTF} is missing: leash needs a kernel with BTF");
        }
        let offsets = TaskOffsets::from_kernel().unwrap();
        assert!(
            offsets.tgid > 0 && offsets.tgid.is_multiple_of(4),
            "{offsets:?}"
        );
        assert!(offsets.start_boottime.is_multiple_of(8), "{offsets:?}");
        assert_ne!(offsets.tgid, offsets.start_boottime);
        assert!(offsets.signal.is_multiple_of(8), "a pointer: {offsets:?}");
        assert!(
            offsets.signal_live.is_multiple_of(4),
            "an atomic_t: {offsets:?}"
        );
        assert!(offsets.signal_flags.is_multiple_of(4), "{offsets:?}");
        assert_ne!(offsets.signal_flags, offsets.signal_live);
        assert!(
            offsets.sigaction_handler.is_multiple_of(8),
            "a pointer: {offsets:?}"
        );
    }
}
