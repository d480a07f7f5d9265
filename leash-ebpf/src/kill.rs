//! The kernel kill: a task iterator that signals every member of a tree from the kernel, with
//! the `bpf_send_signal_task` kfunc (Linux 6.13). A kill from user space costs a pidfd and two
//! system calls per member; this is one pass over the machine's tasks, a few hundred ns each.
//!
//! The kfunc is declared here as an external function: the object keeps an undefined symbol
//! and a call relocation to it, which user space patches before the object is loaded (the
//! kfunc's BTF id in the call, `src_reg` 2), or turns into `r0 = 0` where the kernel lacks it
//! (the program is then not attached). aya links only calls whose `src_reg` is 1, and leaves
//! the patched one as it is.
//!
//! What a reading asks is the reading thread's entry in `DESCENTS` (mode `Descent::KILL`), as
//! for the descent program.

use core::ffi::c_void;

use leash_common::Descent;

use crate::{
    descent::request,
    programs::{MEMBERS, TASK_TGID_OFFSET, group_dead, is_member, iter_task, read_task},
};

/// `PIDTYPE_TGID`: the signal goes to the task's whole thread group.
const PIDTYPE_TGID: u32 = 1;

unsafe extern "C" {
    /// `int bpf_send_signal_task(struct task_struct *task, int sig, enum pid_type type,
    /// u64 value)`: a kfunc, its call patched at load (see the module doc).
    fn bpf_send_signal_task(task: *const c_void, sig: i32, kind: u32, value: u64) -> i32;
}

/// Runs once per task (thread), and once more with no task at the end.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub(crate) fn leash_kill(ctx: *mut c_void) -> i32 {
    let Some(task) = iter_task::<c_void>(ctx) else {
        return 0;
    };
    let Some(request) = request() else {
        return 0;
    };
    // SAFETY: a pointer into this reading's own entry (see `descent::request`); copied at once.
    let asked = unsafe { *request };
    if asked.mode != Descent::KILL || !is_thread_of_member(task as *const u8, asked.tree) {
        return 0;
    }
    // Sent through every thread of the group, not its main thread alone: the kfunc refuses a
    // task that has begun exiting (PF_EXITING), as a main thread that exited before the
    // others has. A group already dying takes the signals after the first as no-ops.
    // SAFETY: `task` is the iterator's trusted task pointer, not null; the kfunc takes numbers
    // besides and touches no memory of ours.
    let sent = unsafe { bpf_send_signal_task(task, asked.signal as i32, PIDTYPE_TGID, 0) };
    if sent == 0 {
        // SAFETY: as above; a field written by this reading alone.
        unsafe { (*request).added += 1 };
    }
    0
}

/// Whether `task` is a thread of a live member of `tree` (by its entry's start time).
#[inline(always)]
fn is_thread_of_member(task: *const u8, tree: u32) -> bool {
    let Some(tgid) = read_task::<u32>(task, &TASK_TGID_OFFSET) else {
        return false;
    };
    if group_dead(task) {
        return false;
    }
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    unsafe { MEMBERS.get(tgid) }
        .copied()
        .is_some_and(|entry| entry.tree == tree && is_member(task, &entry))
}
