//! Host deaths, seen as they begin. A lease ends when its host dies, and its trees with it; the
//! host's socket closes and its pidfd turns readable only once the kernel has torn down its
//! whole address space, which for a host holding gigabytes takes a tenth of a second while its
//! agent runs on. These programs see the death where it is decided, and wake the daemon:
//!
//! - at `signal_generate`, after the kernel has handled a signal for a host: if the signal set
//!   the thread group exiting (SIGKILL, the OOM killer's SIGKILL, a default-fatal signal that
//!   is neither caught, ignored nor blocked), the group will die. A caught, ignored or blocked
//!   signal leaves the flag alone.
//! - at `signal_deliver`, as a host's thread takes a signal whose action is the default and
//!   fatal: a crash (SIGSEGV, SIGABRT, ...), whose group exits only after its core dump, or a
//!   fatal signal that was blocked when it came. (The SIGKILL that exec sends a process's
//!   other threads sets no group exit, and is not taken for a death.)
//!
//! Both are BTF tracepoints: no trampoline needed, on every kernel leash supports. A thread's
//! exit sends no signal and exec's end of the other threads sets no group exit, so neither is
//! taken for a death. Each host is reported once: the report takes it out of `HOSTS`.

use aya_ebpf::{
    helpers::bpf_get_current_task, macros::btf_tracepoint, macros::map, maps::HashMap,
    programs::BtfTracePointContext,
};
use core::ptr::read_volatile;
use leash_common::{EventKind, Pid};

use crate::programs::{
    SIGKILL, TASK_SIGNAL_OFFSET, TASK_TGID_OFFSET, current_tgid, emit_at, read_at, read_task,
    started_at,
};

/// Host pid → its start time (see `leash_common::map::HOSTS`).
#[map]
static HOSTS: HashMap<Pid, u64> = HashMap::with_max_entries(1, 0);

// Offsets set by user space at load, from the kernel's BTF (see programs.rs).
#[unsafe(no_mangle)]
static SIGNAL_FLAGS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SIGACTION_HANDLER_OFFSET: u32 = 0;

/// `signal_struct.flags`: the thread group is exiting (include/linux/sched/signal.h, the same
/// value on every kernel leash supports).
const SIGNAL_GROUP_EXIT: u32 = 0x4;
/// `signal_struct.flags`: an init of a pid namespace, which takes no fatal signal but SIGKILL
/// from outside.
const SIGNAL_UNKILLABLE: u32 = 0x40;
/// `SIG_DFL`: the default action.
const SIG_DFL: u64 = 0;

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task, int group,
/// int result)` fires in the sender, after the kernel has queued the signal (or found it
/// ignored) and, for a fatal one, set the target's group exiting.
#[btf_tracepoint(function = "signal_generate")]
pub(crate) fn leash_hostkill(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(2);
    // The hot path for every signal on the machine (a SIGCHLD at every exit among them): one
    // read and one lookup, and out for any process that is not a host.
    let Some(tgid) = read_task::<u32>(task, &TASK_TGID_OFFSET) else {
        return 0;
    };
    // SAFETY: a u64 copied at once (see "Reading the hash maps" in programs.rs).
    let Some(start_ns) = (unsafe { HOSTS.get(tgid) }).copied() else {
        return 0;
    };
    if group_flags(task) & SIGNAL_GROUP_EXIT == 0 {
        return 0;
    }
    let signal: i32 = ctx.arg(0);
    report_dying(task, tgid, start_ns, signal)
}

/// `signal_deliver(int sig, struct kernel_siginfo *info, struct k_sigaction *ka)` fires in the
/// thread that takes the signal, with the action it is about to take.
#[btf_tracepoint(function = "signal_deliver")]
pub(crate) fn leash_hostcrash(ctx: BtfTracePointContext) -> i32 {
    let tgid = current_tgid();
    // SAFETY: a u64 copied at once (see "Reading the hash maps" in programs.rs).
    let Some(start_ns) = (unsafe { HOSTS.get(tgid) }).copied() else {
        return 0;
    };
    let signal: i32 = ctx.arg(0);
    let action: *const u8 = ctx.arg(2);
    // SAFETY: as for NS_PER_TICK in programs.rs.
    let handler_offset = unsafe { read_volatile(&SIGACTION_HANDLER_OFFSET) };
    if read_at::<u64>(action, handler_offset) != Some(SIG_DFL) || !kills_by_default(signal) {
        return 0;
    }
    // SAFETY: the helper takes nothing and returns the current task's address.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let flags = group_flags(task);
    let dies = if signal == SIGKILL as i32 {
        // The SIGKILL an exec from another thread sends the rest of its group sets no group
        // exit: the process lives on, running the new program.
        flags & SIGNAL_GROUP_EXIT != 0
    } else {
        // A namespace's init skips a fatal signal's default action (bar SIGKILL).
        flags & SIGNAL_UNKILLABLE == 0
    };
    if !dies {
        return 0;
    }
    report_dying(task, tgid, start_ns, signal)
}

/// Reports host `tgid` dying, once, if it is the process `HOSTS` names (the same start time:
/// not a later process that got its pid).
fn report_dying(task: *const u8, tgid: Pid, start_ns: u64, signal: i32) -> i32 {
    if !started_at(task, start_ns) {
        return 0;
    }
    // Whoever takes the entry out reports: one report per death, whatever else fires.
    if HOSTS.remove(tgid).is_ok() {
        emit_at(EventKind::HostDying, 0, tgid, signal as u32, start_ns);
    }
    0
}

/// `task->signal->flags`, 0 if unreadable.
fn group_flags(task: *const u8) -> u32 {
    let Some(signal) = read_task::<*const u8>(task, &TASK_SIGNAL_OFFSET) else {
        return 0;
    };
    // SAFETY: as for NS_PER_TICK in programs.rs.
    let offset = unsafe { read_volatile(&SIGNAL_FLAGS_OFFSET) };
    read_at::<u32>(signal, offset).unwrap_or(0)
}

/// Whether `signal`'s default action ends the process: every signal but those ignored by
/// default (SIGCHLD, SIGCONT, SIGURG, SIGWINCH) and the stop signals (SIGSTOP, SIGTSTP,
/// SIGTTIN, SIGTTOU), in the numbering x86_64 and arm64 share.
fn kills_by_default(signal: i32) -> bool {
    const SIGCHLD: i32 = 17;
    const SIGTTOU: i32 = 22;
    const SIGURG: i32 = 23;
    const SIGWINCH: i32 = 28;
    const LAST: i32 = 64;
    // 17 SIGCHLD, 18 SIGCONT, 19 SIGSTOP, 20 SIGTSTP, 21 SIGTTIN, 22 SIGTTOU.
    let spared = (SIGCHLD..=SIGTTOU).contains(&signal) || signal == SIGURG || signal == SIGWINCH;
    (1..=LAST).contains(&signal) && !spared
}
