//! Attaching one program where the list of programs says (programs.rs), and the link that
//! holds it there: aya's loaders for tracepoints and iterators, the raw loader (raw.rs) for LSM
//! and fmod_ret programs, which aya 0.14 cannot load as they need.

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{
        BtfTracePoint, Iter, KProbe, TracePoint, kprobe::KProbeLink, links::FdLink,
        trace_point::TracePointLink,
    },
};

use super::{
    programs::{self, AttachPoint, Program, program_mut},
    raw, support,
};
use crate::sys;

/// A program's link, held by this process until it is pinned (or for good, if it cannot be):
/// the program stays attached while it or its pin lives.
pub(super) enum HeldLink {
    /// A BPF link aya made (tp_btf, iterator), taken out of its program.
    Fd(FdLink),
    /// A BPF link made by raw `bpf()` (LSM, fmod_ret).
    Raw(OwnedFd),
    /// A classic tracepoint's link, taken out of its program: a BPF link from Linux 5.15, a
    /// perf event before (see [`tracepoint_links_pin`]).
    TracePoint(TracePointLink),
    /// A kprobe's link, taken out of its program (see [`kprobe_links_pin`]).
    KProbe(KProbeLink),
}

/// A program attached: which one, its id (its skips are read by it), and its link.
pub(super) struct Attachment {
    pub(super) program: &'static Program,
    pub(super) id: u32,
    pub(super) link: HeldLink,
}

/// Loads `program` of `ebpf` (loaded, its maps made) and attaches it where the list says.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    program: &'static Program,
) -> Result<Attachment> {
    let name = program.name;
    let at = program.at;
    let mut attached = || -> Result<(u32, HeldLink)> {
        Ok(match at {
            AttachPoint::TpBtf(tracepoint) => {
                let loaded: &mut BtfTracePoint = program_mut(ebpf, name)?.try_into()?;
                loaded.load(tracepoint, kernel_btf)?;
                let link = loaded.attach()?;
                let link = FdLink::from(loaded.take_link(link)?);
                (loaded.info()?.id(), HeldLink::Fd(link))
            }
            AttachPoint::Iter(kind) => {
                let loaded: &mut Iter = program_mut(ebpf, name)?.try_into()?;
                loaded.load(kind, kernel_btf)?;
                let link = loaded.attach()?;
                let link = FdLink::try_from(loaded.take_link(link)?)?;
                (loaded.info()?.id(), HeldLink::Fd(link))
            }
            AttachPoint::Lsm(hook) => raw_attached(
                ebpf,
                kernel_btf,
                name,
                sys::AttachKind::Lsm,
                &format!("bpf_lsm_{hook}"),
            )?,
            AttachPoint::FmodRet(function) => {
                raw_attached(ebpf, kernel_btf, name, sys::AttachKind::FmodRet, function)?
            }
            AttachPoint::KProbe(function) => {
                let loaded: &mut KProbe = program_mut(ebpf, name)?.try_into()?;
                loaded.load()?;
                let link = loaded.attach(function, 0)?;
                let link = loaded.take_link(link)?;
                (loaded.info()?.id(), HeldLink::KProbe(link))
            }
            AttachPoint::TracePoint(category, event) => {
                ensure_tracefs();
                let loaded: &mut TracePoint = program_mut(ebpf, name)?.try_into()?;
                loaded.load()?;
                let link = loaded.attach(category, event)?;
                let link = loaded.take_link(link)?;
                (loaded.info()?.id(), HeldLink::TracePoint(link))
            }
        })
    };
    let (id, link) = attached().with_context(|| format!("attaching {name} to {at}"))?;
    Ok(Attachment { program, id, link })
}

/// Loads program `name` with the raw loader and attaches it to the kernel function `target`;
/// its id and link.
fn raw_attached(
    ebpf: &Ebpf,
    kernel_btf: &aya::Btf,
    name: &str,
    kind: sys::AttachKind,
    target: &str,
) -> Result<(u32, HeldLink)> {
    let object = programs::object(ebpf)?;
    let link = raw::attach_by_btf_id(ebpf, &object.bytes, kernel_btf, name, kind, target)?;
    let id = sys::bpf_link_program_id(link.as_fd())?;
    Ok((id, HeldLink::Raw(link)))
}

/// Whether a classic tracepoint's link is a BPF link, which can be pinned (Linux 5.15);
/// before, aya attaches through a perf event, which lives only as long as its descriptor.
pub(super) fn tracepoint_links_pin() -> bool {
    support::version().is_some_and(|version| version >= (5, 15))
}

/// Whether a kprobe's link is a BPF link, which can be pinned: as a tracepoint's, but aya makes
/// one only where it can read the kernel's version (it cannot read 7.3's release candidates'),
/// and attaches through tracefs's kprobe_events otherwise.
pub(super) fn kprobe_links_pin() -> bool {
    tracepoint_links_pin() && aya::util::KernelVersion::current().is_ok()
}

/// Classic tracepoints are found through tracefs, which some machines do not mount at boot.
fn ensure_tracefs() {
    let tracefs = std::path::Path::new("/sys/kernel/tracing");
    if tracefs.join("events").exists() || !tracefs.exists() {
        return;
    }
    match sys::mount_with(c"tracefs", tracefs, None) {
        Ok(()) => tracing::info!(path = %tracefs.display(), "mounted tracefs"),
        Err(e) => tracing::warn!("cannot mount tracefs at {}: {e}", tracefs.display()),
    }
}
