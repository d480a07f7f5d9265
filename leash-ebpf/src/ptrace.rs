//! The ptrace guard: a member may not reach, in attach mode, a process outside its own tree and
//! the trees nested in it, even one of its own uid. Attach mode is what ptrace attach,
//! `pidfd_getfd`, `process_vm_writev` and writes to /proc/PID/mem ask for; read mode (`ps`,
//! `top`, /proc/PID/stat) is never refused.
//!
//! - `leash_ptrace_lsm` is a BPF LSM program on the `ptrace_access_check` hook, the check all of
//!   those pass through: it returns -EPERM, and the access fails. Where the BPF LSM is active.
//! - `leash_ptrace_guard` does the same as an fmod_ret program on
//!   `security_ptrace_access_check`. It sits in an `fentry` section only because aya cannot
//!   parse `fmod_ret` ones; user space loads it as fmod_ret.
//! - `leash_ptrace_kp`, a kprobe on `cap_ptrace_access_check` (the capability module's hook,
//!   which the check calls first, and only if fmod_ret did not refuse), SIGKILLs the member as
//!   it asks: beside fmod_ret on a kernel that may skip fmod_ret (7.x without the BPF LSM),
//!   since a kprobe is skipped on other conditions; and in its place where the kernel has no
//!   BPF trampolines. It sees every access the check sees, /proc/PID/mem included.
//! - Where the kernel has neither, the three syscall tracepoints below stand in: they
//!   SIGKILL the member as the call enters, so it never returns to user space. The call itself
//!   still runs, with the kill pending: process_vm_writev writes nothing (get_user_pages stops at a
//!   pending fatal signal), the descriptor pidfd_getfd installs is closed by the exit, but
//!   PTRACE_ATTACH still stops its target. They cannot see /proc/PID/mem.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_send_signal},
    macros::{kprobe, tracepoint},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use leash_common::{MAX_TREE_NESTING, Member, TreeId};

use crate::programs::{
    MEMBERS, SIGKILL, TASK_TGID_OFFSET, TREE_CONTROL, current_tgid, is_member, lsm_denial,
    read_task,
};

const EPERM: i64 = 1;
/// `PTRACE_MODE_ATTACH` in the `mode` argument of `security_ptrace_access_check`.
const PTRACE_MODE_ATTACH: u64 = 0x02;
/// ptrace(2) requests that attach a tracer.
const PTRACE_ATTACH: u64 = 16;
const PTRACE_SEIZE: u64 = 0x4206;
/// Where a syscall tracepoint's arguments start: after the common fields (8 bytes) and
/// `__syscall_nr` (padded to 8). Each argument is 8 bytes. The same on every kernel.
const SYSCALL_ARGS: usize = 16;

/// fmod_ret on `int security_ptrace_access_check(struct task_struct *child, unsigned int mode)`:
/// arguments 0 and 1, and the return value so far (another program's) at 2. It runs on every
/// ptrace-class check of another process, which every /proc read of one makes: read mode and
/// non-members leave after reading their context and at most one lookup.
#[unsafe(no_mangle)]
#[unsafe(link_section = "fentry/security_ptrace_access_check")]
pub(crate) fn leash_ptrace_guard(ctx: *mut c_void) -> i32 {
    let ctx = FEntryContext::new(ctx);
    let previous = ctx.arg::<u64>(2) as i32;
    // Another program has refused already: its answer stands.
    if previous != 0 {
        return previous;
    }
    if refuses(ctx.arg(0), ctx.arg(1)) {
        -(EPERM as i32)
    } else {
        0
    }
}

/// The same guard as a BPF LSM program on the `ptrace_access_check` hook (arguments as above;
/// the kernel calls the hook only while no other LSM has refused). The kernel never skips an
/// LSM program, where it skips a tracing one on a CPU where a preempted task is inside it (see
/// `program::PTRACE_GUARD_LSM`). Its answers are 0 and -EPERM alone, the range the verifier
/// allows an LSM program.
#[unsafe(no_mangle)]
#[unsafe(link_section = "lsm/ptrace_access_check")]
pub(crate) fn leash_ptrace_lsm(ctx: *mut c_void) -> i64 {
    let ctx = FEntryContext::new(ctx);
    let refused = refuses(ctx.arg(0), ctx.arg(1));
    if refused { lsm_denial::<EPERM>() } else { 0 }
}

/// A kprobe on `cap_ptrace_access_check(child, mode)`, which `security_ptrace_access_check`
/// reaches only where fmod_ret on it did not refuse (skipped by the kernel, or not attached): a
/// member asking what the other guards refuse is SIGKILLed before the call returns to user
/// space (a kprobe cannot change the answer). The access itself goes on with the kill pending:
/// process_vm_writev and a read of /proc/PID/mem stop at it, a descriptor taken is closed by
/// the exit, but a ptrace attach still stops its target, as under the syscall tracepoints.
#[kprobe(function = "cap_ptrace_access_check")]
pub(crate) fn leash_ptrace_kp(ctx: ProbeContext) -> u32 {
    let (Some(child), Some(mode)) = (ctx.arg::<*const u8>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    if refuses(child, mode) {
        kill_current();
    }
    0
}

/// Whether a check of `child` in `mode` is a member's attach-mode access to a process outside
/// its tree and the trees nested in it.
fn refuses(child: *const u8, mode: u64) -> bool {
    if mode & PTRACE_MODE_ATTACH == 0 {
        return false;
    }
    let Some(accessor) = current_member() else {
        return false;
    };
    let Some(child_tgid) = read_task::<u32>(child, &TASK_TGID_OFFSET) else {
        return true;
    };
    // An entry whose start time is not the child's is an earlier process's by the same pid:
    // the child is not a member then.
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let child_tree = unsafe { MEMBERS.get(child_tgid) }
        .copied()
        .filter(|entry| is_member(child, entry))
        .map(|entry| entry.tree);
    !child_tree.is_some_and(|tree| within(tree, accessor.tree))
}

/// `ptrace(request, pid, ...)`: PTRACE_ATTACH or PTRACE_SEIZE of a process outside the tree.
#[tracepoint(category = "syscalls", name = "sys_enter_ptrace")]
pub(crate) fn leash_ptrace_attach(ctx: TracePointContext) -> u32 {
    let Some(request) = syscall_arg(&ctx, 0) else {
        return 0;
    };
    if request != PTRACE_ATTACH && request != PTRACE_SEIZE {
        return 0;
    }
    kill_if_outside(&ctx, 1);
    0
}

/// `pidfd_getfd(pidfd, fd, flags)`. The pidfd names its process only through the caller's
/// descriptor table, which this tracepoint does not walk: every call by a member is refused.
#[tracepoint(category = "syscalls", name = "sys_enter_pidfd_getfd")]
pub(crate) fn leash_pidfd_getfd(_ctx: TracePointContext) -> u32 {
    if current_member().is_some() {
        kill_current();
    }
    0
}

/// `process_vm_writev(pid, ...)`.
#[tracepoint(category = "syscalls", name = "sys_enter_process_vm_writev")]
pub(crate) fn leash_vm_writev(ctx: TracePointContext) -> u32 {
    kill_if_outside(&ctx, 0);
    0
}

/// The member entry of the current process, if it is a member (checked as the other programs
/// check it). Non-members leave after one lookup.
fn current_member() -> Option<Member> {
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let entry = unsafe { MEMBERS.get(current_tgid()) }.copied()?;
    // SAFETY: the helper returns the current task's address; it is only read through
    // bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    is_member(task, &entry).then_some(entry)
}

/// SIGKILLs the current process if it is a member and the pid in syscall argument `index` is
/// not a process of its tree or of one nested in it. The pid is as the caller's pid namespace
/// numbers it, and may name a thread: inside a container, or for a thread that is not its
/// process's first, the lookup misses and the call is refused.
fn kill_if_outside(ctx: &TracePointContext, index: usize) {
    let Some(accessor) = current_member() else {
        return;
    };
    let target = syscall_arg(ctx, index).map_or(0, |pid| pid as u32);
    // SAFETY: one field read within the expression (see "Reading the hash maps" in
    // programs.rs).
    let inside =
        unsafe { MEMBERS.get(target) }.is_some_and(|entry| within(entry.tree, accessor.tree));
    if !inside {
        kill_current();
    }
}

fn kill_current() {
    // Before the call returns to user space: the access it asked for never serves it.
    // SAFETY: the helper takes a signal number, signals the current task and touches no memory
    // of ours.
    let _ = unsafe { bpf_send_signal(SIGKILL) };
}

fn syscall_arg(ctx: &TracePointContext, index: usize) -> Option<u64> {
    // SAFETY: read_at reads through bpf_probe_read_kernel, which checks the address; a u64 is
    // valid for any bytes.
    unsafe { ctx.read_at::<u64>(SYSCALL_ARGS + 8 * index) }.ok()
}

/// Whether `tree` is `own` or nested in it, looking up at most [`MAX_TREE_NESTING`] levels.
fn within(tree: TreeId, own: TreeId) -> bool {
    let mut tree = tree;
    for _ in 0..MAX_TREE_NESTING {
        if tree == own {
            return true;
        }
        // SAFETY: one field read within the match (see "Reading the hash maps" in
        // programs.rs).
        match unsafe { TREE_CONTROL.get(tree) } {
            Some(control) if control.parent != 0 => tree = control.parent,
            _ => return false,
        }
    }
    false
}
