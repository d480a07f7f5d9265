//! Marks: membership the kernel never skips. From Linux 7.0 a tracepoint program is skipped
//! on a CPU where a preempted task is inside it, and a fork the fork programs miss leaves a
//! child outside its tree. LSM programs and iterators have no such guard.
//!
//! - `leash_task_alloc`, a BPF LSM program on `task_alloc` (the one hook of the fork path: it
//!   runs in the forking task, before the child can run, and may fail the fork), gives a
//!   member's child, process or thread, the member's mark in `MARKS`. A child that cannot be
//!   marked is not made; a doomed tree's member makes nothing and dies as it forks, so a kill
//!   converges as cgroup.kill does.
//! - `leash_reconcile`, a task iterator, puts every marked process that `MEMBERS` lacks into
//!   it: `MEMBERS` stays the index the kill searches and the source of events, whole again.
//!
//! Task storage is freed with its task: a mark never outlives its process, and user space,
//! which reads and writes marks by pidfd, never finds one on a recycled pid. A mark counts only
//! while its generation is its tree's (tree ids are reused).
//!
//! Task storage needs Linux 5.11: these live in an object of their own (leash-ebpf-marks,
//! everything else too), which user space loads where the kernel has it.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type, task_struct},
    helpers::{bpf_get_current_task_btf, bpf_send_signal, bpf_task_storage_get},
    macros::btf_map,
    programs::FEntryContext,
};
use leash_common::{ALL_ACCOUNTS, EventKind, Mark, Member, TreeControl, flags, stat};

use crate::programs::{
    BPF_NOEXIST, Counter, MEMBERS, SIGKILL, TASK_START_OFFSET, TASK_TGID_OFFSET, TREE_CONTROL,
    add_to_account, add_to_tree, count, current_tgid, emit, group_dead, is_member, iter_task,
    lsm_denial, parent_tgid, read_task, same_start, take_out_stale,
};
use crate::whois::task_pid;

/// `BPF_MAP_TYPE_TASK_STORAGE` of [`Mark`], declared by hand: aya-ebpf 0.2 has no such type,
/// and its `btf_map_def!` is private. The layout is what loaders read from BTF: the fields'
/// pointee types carry the map's type, key, value, size and flags.
#[repr(C)]
pub(crate) struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; nothing dereferences them,
// and the map's memory is the kernel's, reached only through helpers.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    /// The value stored on `task`; with `create`, `create` is stored first if it has none.
    /// Null if it has none (or could not be given one).
    ///
    /// # Safety
    ///
    /// `task` is a task pointer the verifier knows as one (a program's BTF-typed argument,
    /// `bpf_get_current_task_btf`, an iterator's task).
    unsafe fn get(&self, task: *mut task_struct, create: Option<&mut T>) -> *mut T {
        let (value, flags) = match create {
            Some(value) => (
                ptr::from_mut(value).cast::<c_void>(),
                u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE),
            ),
            None => (ptr::null_mut(), 0),
        };
        let map = ptr::from_ref(self).cast_mut().cast::<c_void>();
        // SAFETY: the caller's contract for `task`; `value` is null or a valid T on the stack.
        unsafe { bpf_task_storage_get(map, task, value, flags) }.cast::<T>()
    }
}

#[btf_map]
static MARKS: TaskStorage<Mark> = TaskStorage::new();

const EPERM: i64 = 1;
const ENOMEM: i64 = 12;

/// LSM `task_alloc(struct task_struct *task, unsigned long clone_flags)`: `task` is the child,
/// made but not yet given its pid, which still reads as its parent's; the program runs in the
/// forking task.
#[unsafe(no_mangle)]
#[unsafe(link_section = "lsm/task_alloc")]
pub(crate) fn leash_task_alloc(ctx: *mut c_void) -> i64 {
    let ctx = FEntryContext::new(ctx);
    let child: *mut task_struct = ctx.arg(0);
    match forker_mark() {
        None => 0,
        Some((mark, control)) if control.flags & flags::DOOMED != 0 => {
            // The forker dies as it forks, as at the fork programs: a doomed tree makes
            // nothing, and its members' own cleanup may not start anything new.
            // SAFETY: the helper takes a signal number, signals the current task and touches
            // no memory of ours.
            let _ = unsafe { bpf_send_signal(SIGKILL) };
            emit(EventKind::ForkKilled, mark.tree, current_tgid(), 0);
            count(stat::FORKS_REFUSED);
            lsm_denial::<EPERM>()
        }
        Some((mut mark, _)) => {
            // SAFETY: `child` is the hook's BTF-typed argument.
            let marked = unsafe { MARKS.get(child, Some(&mut mark)) };
            if marked.is_null() {
                count(stat::FORKS_REFUSED);
                lsm_denial::<ENOMEM>()
            } else {
                0
            }
        }
    }
}

/// The forking task's mark and its tree's control, if the forker is a member: its own mark, or,
/// for a thread user space could not mark (it marks a process by pidfd, which names its main
/// thread), its process's entry in `MEMBERS`, which user space put in.
#[inline(always)]
fn forker_mark() -> Option<(Mark, TreeControl)> {
    // SAFETY: the helper takes nothing and returns the current task, which the verifier knows.
    let current = unsafe { bpf_get_current_task_btf() };
    // SAFETY: `current` is as the contract asks.
    let own = unsafe { MARKS.get(current, None) };
    if !own.is_null() {
        // SAFETY: a non-null answer points at the task's value, aligned, which lives as long
        // as the task (this one, running); copied at once.
        let mark = unsafe { *own };
        if let Some(control) = tree_of(&mark) {
            return Some((mark, control));
        }
    }
    let tgid = current_tgid();
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let entry = unsafe { MEMBERS.get(tgid) }.copied()?;
    if !is_member(current as *const u8, &entry) {
        return None;
    }
    // SAFETY: as above.
    let control = unsafe { TREE_CONTROL.get(entry.tree) }.copied()?;
    let mark = Mark {
        tree: entry.tree,
        generation: control.generation,
    };
    Some((mark, control))
}

/// The control of the tree `mark` names, if it is still that registration of it.
#[inline(always)]
fn tree_of(mark: &Mark) -> Option<TreeControl> {
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let control = unsafe { TREE_CONTROL.get(mark.tree) }.copied()?;
    (control.generation == mark.generation).then_some(control)
}

/// Runs once per task (thread), and once more with no task at the end.
///
/// - A task whose process has an entry in `MEMBERS` carries that entry's mark: the member map
///   says where a process user space put in or moved belongs (an adoption, a nested tree, a
///   hand-back), and its threads and its children, marked in the kernel, follow.
/// - A marked process (by its main thread) that `MEMBERS` has no entry for is put in, counted
///   as joined, and reported as a fork. A stale entry of an earlier process by the pid (the pid
///   is this process's, so that one is gone) is taken out first, as the fork programs take it
///   out.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub(crate) fn leash_reconcile(ctx: *mut c_void) -> i32 {
    let Some(task) = iter_task::<task_struct>(ctx) else {
        return 0;
    };
    if mark_as_member(task) {
        return 0;
    }
    // SAFETY: an iterator's task, checked for null.
    let mark = unsafe { MARKS.get(task, None) };
    if mark.is_null() {
        return 0;
    }
    // SAFETY: as in forker_mark: the task's value, copied at once.
    let mark = unsafe { *mark };
    let Some(control) = tree_of(&mark) else {
        return 0;
    };
    let task = task as *const u8;
    let Some(tgid) = read_task::<u32>(task, &TASK_TGID_OFFSET) else {
        return 0;
    };
    // The process once, by its main thread: its other threads carry the same mark.
    if task_pid(task) != Some(tgid) {
        return 0;
    }
    // A process whose threads have all exited has left (a zombie keeps its mark until it is
    // reaped): put in now, it would never leave.
    if group_dead(task) {
        return 0;
    }
    let Some(start_ns) = read_task::<u64>(task, &TASK_START_OFFSET) else {
        return 0;
    };
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    if let Some(existing) = unsafe { MEMBERS.get(tgid) }.copied() {
        if same_start(existing.start_ns, start_ns) {
            return 0;
        }
        // An earlier process's entry by this pid, whose exit the exit programs missed: as the
        // fork programs do, which the kernel may have skipped for this very fork.
        take_out_stale(tgid, &existing);
    }
    let parent = parent_tgid(task).unwrap_or(0);
    let member = Member {
        tree: mark.tree,
        parent,
        start_ns,
    };
    if MEMBERS.insert(tgid, member, BPF_NOEXIST).is_err() {
        return 0;
    }
    // As at fork: the event before the count.
    count(stat::RECONCILED);
    emit(EventKind::Fork, mark.tree, tgid, parent);
    add_to_account(control.holder.account, 1);
    add_to_account(ALL_ACCOUNTS, 1);
    add_to_tree(mark.tree, Counter::Joined);
    // Its last thread may have begun exiting since the check above, and the exit programs run
    // before this insert: whoever takes the entry out counts the leave, they or this.
    if group_dead(task) && MEMBERS.remove(tgid).is_ok() {
        add_to_account(control.holder.account, u64::MAX);
        add_to_account(ALL_ACCOUNTS, u64::MAX);
        add_to_tree(mark.tree, Counter::Left);
    }
    0
}

/// Gives `task` its process's mark as `MEMBERS` has it, if it has a live entry there. Returns
/// whether it has one.
#[inline(always)]
fn mark_as_member(task: *mut task_struct) -> bool {
    let Some(tgid) = read_task::<u32>(task as *const u8, &TASK_TGID_OFFSET) else {
        return false;
    };
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let Some(entry) = (unsafe { MEMBERS.get(tgid) }).copied() else {
        return false;
    };
    if !is_member(task as *const u8, &entry) {
        return false;
    }
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let Some(control) = (unsafe { TREE_CONTROL.get(entry.tree) }).copied() else {
        return true;
    };
    let mut wanted = Mark {
        tree: entry.tree,
        generation: control.generation,
    };
    // SAFETY: an iterator's task (the caller's, checked for null); `wanted` is on the stack.
    let mark = unsafe { MARKS.get(task, Some(&mut wanted)) };
    if !mark.is_null() {
        // SAFETY: a non-null answer points at the task's value, aligned, which lives as long
        // as the task (held by the iterator); only iterators and user space write a mark
        // that exists, and a torn mark is one of two trees the process was in.
        unsafe { *mark = wanted };
    }
    true
}
