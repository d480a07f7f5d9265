//! The whois program: a task iterator that tells user space what only the kernel knows of a
//! process, without the right to trace it (the daemon has no CAP_SYS_PTRACE, and
//! /proc/PID/ns/* needs it): who owns the user namespace it runs in, and which pid namespaces
//! it is in. User space writes the pid into `WHOIS`, reads a new iterator to its end (which
//! runs this over every task), and reads the answer back. Task iterators exist from 5.8.

use core::{ffi::c_void, ptr::read_volatile};

use aya_ebpf::{macros::map, maps::Array};
use leash_common::{NamespaceOffsets, PID_NS_LEVELS, Whois};

use crate::programs::{TASK_TGID_OFFSET, iter_task, read_at, read_task};

#[map]
static WHOIS: Array<Whois> = Array::with_max_entries(1, 0);

#[unsafe(no_mangle)]
pub(crate) static NAMESPACE_OFFSETS: NamespaceOffsets = NamespaceOffsets {
    task_pid: 0,
    task_real_cred: 0,
    cred_user_ns: 0,
    user_ns_parent: 0,
    user_ns_owner: 0,
    user_ns_inum: 0,
    task_thread_pid: 0,
    pid_level: 0,
    pid_numbers: 0,
    upid_size: 0,
    upid_ns: 0,
    pid_ns_inum: 0,
};

/// The thread id of `task` (`task_struct.pid`, at an offset of the namespace offsets).
pub(crate) fn task_pid(task: *const u8) -> Option<u32> {
    // SAFETY: a reference to a static is valid and aligned (volatile: see the globals in
    // programs.rs).
    let offsets = unsafe { read_volatile(&NAMESPACE_OFFSETS) };
    read_at::<u32>(task, offsets.task_pid)
}

/// User namespaces nest at most 32 deep (`MAX_USER_NS_LEVEL`).
const USER_NS_LEVELS: usize = 33;

/// Runs once per task (thread), and once more with no task at the end.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub(crate) fn leash_whois(ctx: *mut c_void) -> i32 {
    let Some(task) = iter_task::<u8>(ctx) else {
        return 0;
    };
    let task = task as *const u8;
    let Some(query) = WHOIS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a pointer into the array map's one value, aligned memory that lives as long as
    // the map. User space asks one question at a time, and reads the answer only after the
    // iterator has run to its end.
    let wanted = unsafe { (*query).pid };
    // SAFETY: a reference to a static is valid and aligned for the read (volatile: the value
    // user space set at load, not the placeholder).
    let offsets = unsafe { read_volatile(&NAMESPACE_OFFSETS) };
    let tgid = read_task::<u32>(task, &TASK_TGID_OFFSET);
    let pid = read_at::<u32>(task, offsets.task_pid);
    // The process, by its main thread: not each of its threads again.
    if tgid != Some(wanted) || pid != Some(wanted) {
        return 0;
    }
    let mut answer = Whois::asking(wanted);
    read_user_ns(task, &offsets, &mut answer);
    read_pid_ns(task, &offsets, &mut answer);
    answer.found = 1;
    // SAFETY: as above.
    unsafe { *query = answer };
    0
}

/// The owner and inode number of the outermost user namespace below the initial one that the
/// task's credentials are in (none: the initial one).
fn read_user_ns(task: *const u8, offsets: &NamespaceOffsets, answer: &mut Whois) {
    let Some(cred) = read_at::<*const u8>(task, offsets.task_real_cred) else {
        return;
    };
    let Some(mut ns) = read_at::<*const u8>(cred, offsets.cred_user_ns) else {
        return;
    };
    let mut outermost: *const u8 = core::ptr::null();
    for _ in 0..USER_NS_LEVELS {
        match read_at::<*const u8>(ns, offsets.user_ns_parent) {
            Some(parent) if !parent.is_null() => {
                outermost = ns;
                ns = parent;
            }
            _ => break,
        }
    }
    if outermost.is_null() {
        return;
    }
    answer.user_ns_owner = read_at::<u32>(outermost, offsets.user_ns_owner).unwrap_or(0);
    answer.user_ns_inum = read_at::<u32>(outermost, offsets.user_ns_inum).unwrap_or(0);
}

/// The inode numbers of the task's pid namespaces, from the initial one down to its own.
fn read_pid_ns(task: *const u8, offsets: &NamespaceOffsets, answer: &mut Whois) {
    let Some(pid) = read_at::<*const u8>(task, offsets.task_thread_pid) else {
        return;
    };
    let Some(level) = read_at::<u32>(pid, offsets.pid_level) else {
        return;
    };
    let levels = (level as usize + 1).min(PID_NS_LEVELS);
    for i in 0..PID_NS_LEVELS {
        if i >= levels {
            break;
        }
        let upid = offsets.pid_numbers + i as u32 * offsets.upid_size;
        let Some(ns) = read_at::<*const u8>(pid, upid + offsets.upid_ns) else {
            return;
        };
        let Some(inum) = read_at::<u32>(ns, offsets.pid_ns_inum) else {
            return;
        };
        answer.pid_ns[i] = inum;
        answer.pid_ns_levels = i as u32 + 1;
    }
}
