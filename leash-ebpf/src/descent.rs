//! Descent: processes found by their ancestry, in the kernel, in one pass over the machine's
//! tasks. A task iterator runs with no recursion guard, so the kernel never skips it.
//!
//! - An adoption: every process whose nearest tracked ancestor is a member of the tree being
//!   adopted (its root is one already) joins that tree; members of the tree it is nested in
//!   are walked through on the way, and come down into it. Where /proc would be read twice per
//!   process in each pass, this reads the task list once, and writes the map in place.
//! - Reconciling, where there are no marks: a process no tree holds, whose nearest tracked
//!   ancestor is a member, joins that member's tree. Such a process was forked while every
//!   fork program was skipped (7.x skips tracepoint programs on a CPU where a preempted task is
//!   inside them), or forked by one that was. What was reparented away before this runs is
//!   beyond it.
//!
//! Walking each process's ancestry, not the tree from its root down, is what lets one pass
//! in pid order do: after the pid counter wraps, a child may come before its parent.
//!
//! Which of the two a reading does is the reading thread's entry in `DESCENTS` (user space
//! makes one per reading thread, so that readings on several threads never mix): a thread with
//! no entry gets nothing done. Each process put in is written to the iterator as a
//! [`Descended`], for user space's index.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::seq_file,
    helpers::{bpf_get_current_pid_tgid, bpf_seq_write},
    macros::map,
    maps::HashMap,
};
use leash_common::{ALL_ACCOUNTS, Descended, Descent, EventKind, Member, Pid, TreeId, flags, stat};

use crate::programs::{
    BPF_NOEXIST, Counter, MEMBERS, TASK_START_OFFSET, TASK_TGID_OFFSET, TREE_CONTROL,
    add_to_account, add_to_tree, count, emit, group_dead, is_member, over_capacity, parent_tgid,
    read_task, real_parent, same_start, take_out_stale,
};
use crate::whois::task_pid;

#[map]
static DESCENTS: HashMap<u32, Descent> = HashMap::with_max_entries(64, 0);

const BPF_EXIST: u64 = 2;

/// How far up a process's ancestry a walk looks for a member. A process deeper below its
/// nearest member than this is found by a later pass of the adoption, once the ancestors
/// between have joined (an adoption passes until one finds nothing new).
const MAX_DEPTH: usize = 48;

/// The start of `struct bpf_iter_meta`, the first member of a task iterator's context.
#[repr(C)]
struct IterMeta {
    seq: *mut seq_file,
}

/// Runs once per task (thread), and once more with no task at the end.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub(crate) fn leash_descend(ctx: *mut c_void) -> i32 {
    // SAFETY: the context of a task iterator is `struct bpf_iter__task { meta, task }`, two
    // pointers: this reads them, which the verifier checks as context accesses.
    let (meta, task) = unsafe {
        let fields = ctx as *const *const u8;
        (*fields as *const IterMeta, *fields.add(1))
    };
    if task.is_null() {
        return 0;
    }
    let Some(request) = request() else {
        return 0;
    };
    // SAFETY: a pointer into this reading's own entry (see `request`); copied at once.
    let asked = unsafe { *request };
    if asked.stopped != 0 {
        return 0;
    }
    let Some(found) = descend(task, &asked) else {
        return 0;
    };
    // SAFETY: as above; fields written by this reading alone.
    unsafe {
        (*request).stopped = found.stopped;
        if found.stopped == 0 && found.record.from == 0 {
            (*request).added += 1;
        } else if found.stopped == 0 {
            (*request).moved += 1;
        }
    }
    if found.stopped == 0 {
        let record = found.record;
        // SAFETY: `meta` is the context's BTF-typed pointer, whose `seq` the helper takes;
        // `record` is on the stack, its size given. A full buffer ends this read() early, and
        // the kernel shows the task again to the next one: a member by then, it writes
        // nothing, and this record is lost. The count in `DESCENTS` is what user space trusts;
        // the records only feed its index, a hint.
        unsafe {
            bpf_seq_write(
                (*meta).seq,
                (&raw const record).cast::<c_void>(),
                size_of::<Descended>() as u32,
            )
        };
    }
    0
}

/// The reading thread's entry in `DESCENTS`, marked as seen: a pointer into an entry that only
/// this thread's reading writes, and user space only once the reading is over.
#[inline(always)]
pub(crate) fn request() -> Option<*mut Descent> {
    let reader = bpf_get_current_pid_tgid() as u32;
    let request = DESCENTS.get_ptr_mut(reader)?;
    // SAFETY: as said above; one field written.
    unsafe { (*request).seen = 1 };
    Some(request)
}

/// What came of one task.
struct Found {
    record: Descended,
    /// [`Descent::FULL`] or [`Descent::DOOMED`]: nothing was put in, and the reading stops.
    stopped: u32,
}

/// Puts the process of `task` (by its main thread) where `asked` says, if it belongs there.
#[inline(always)]
fn descend(task: *const u8, asked: &Descent) -> Option<Found> {
    let tgid = read_task::<u32>(task, &TASK_TGID_OFFSET)?;
    // The process once, by its main thread.
    if task_pid(task) != Some(tgid) || group_dead(task) {
        return None;
    }
    let start_ns = read_task::<u64>(task, &TASK_START_OFFSET)?;
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let held = match unsafe { MEMBERS.get(tgid) }.copied() {
        Some(entry) if same_start(entry.start_ns, start_ns) => Some(entry.tree),
        // An earlier process's entry by this pid, whose exit the exit programs missed.
        Some(stale) => {
            take_out_stale(tgid, &stale);
            None
        }
        None => None,
    };
    let (tree, from) = if asked.mode == Descent::ADOPT {
        let from = match held {
            None => 0,
            Some(tree) if asked.enclosing != 0 && tree == asked.enclosing => tree,
            // A member of the tree already, or of another that follows its own.
            Some(_) => return None,
        };
        if nearest_tree(task, asked.enclosing)? != asked.tree {
            return None;
        }
        (asked.tree, from)
    } else if asked.mode == Descent::RECONCILE && held.is_none() {
        (nearest_tree(task, 0)?, 0)
    } else {
        return None;
    };
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let control = unsafe { TREE_CONTROL.get(tree) }.copied()?;
    let record = Descended {
        pid: tgid,
        tree,
        from,
    };
    if asked.mode == Descent::ADOPT && control.flags & flags::DOOMED != 0 {
        return Some(Found {
            record,
            stopped: Descent::DOOMED,
        });
    }
    if from == 0 && over_capacity() {
        return Some(Found {
            record,
            stopped: Descent::FULL,
        });
    }
    let member = Member {
        tree,
        parent: parent_tgid(task).unwrap_or(0),
        start_ns,
    };
    if from == 0 {
        put_in(task, tgid, member, control.holder.account, asked.mode)?;
    } else {
        move_down(tgid, member, from, control.holder.account)?;
    }
    Some(Found { record, stopped: 0 })
}

/// The tree of the nearest of `task`'s ancestors that is a member, walking through members of
/// `through` (0: none). None: no member within [`MAX_DEPTH`], or the walk reached the top.
#[inline(always)]
fn nearest_tree(task: *const u8, through: TreeId) -> Option<TreeId> {
    let mut ancestor = task;
    for _ in 0..MAX_DEPTH {
        let parent = real_parent(ancestor)?;
        // The idle task is its own parent, and init's.
        if parent == ancestor {
            return None;
        }
        ancestor = parent;
        let tgid = read_task::<u32>(ancestor, &TASK_TGID_OFFSET)?;
        if tgid <= 1 {
            return None;
        }
        // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
        let Some(entry) = (unsafe { MEMBERS.get(tgid) }).copied() else {
            continue;
        };
        if !is_member(ancestor, &entry) || (through != 0 && entry.tree == through) {
            continue;
        }
        return Some(entry.tree);
    }
    None
}

/// Puts the process `tgid` into `member.tree`, held by `account`, counted in the accounts at
/// once (the capacity and the quotas read them). Reconciling, it counts as joined the tree;
/// adopting, user space counts the reading's `added` as seeded. Whoever takes the entry out
/// counts the leave, should its last thread begin exiting meanwhile (the exit programs run
/// before this insert and find nothing): they or this.
#[inline(always)]
fn put_in(task: *const u8, tgid: Pid, member: Member, account: u64, mode: u32) -> Option<()> {
    let tree = member.tree;
    MEMBERS.insert(tgid, member, BPF_NOEXIST).ok()?;
    let reconciling = mode == Descent::RECONCILE;
    if reconciling {
        // As at fork: the event before the count.
        count(stat::RECONCILED);
        emit(EventKind::Fork, tree, tgid, member.parent);
        add_to_tree(tree, Counter::Joined);
    }
    add_to_account(account, 1);
    add_to_account(ALL_ACCOUNTS, 1);
    if group_dead(task) && MEMBERS.remove(tgid).is_ok() {
        add_to_account(account, u64::MAX);
        add_to_account(ALL_ACCOUNTS, u64::MAX);
        add_to_tree(tree, Counter::Left);
    }
    Some(())
}

/// Moves the member `tgid` of `from` down into `member.tree` (held by `account`), if its entry
/// is still there: one gone with its process stays gone. The accounts move at once; user space
/// moves the trees' seeded counts by the reading's `moved`.
#[inline(always)]
fn move_down(tgid: Pid, member: Member, from: TreeId, account: u64) -> Option<()> {
    MEMBERS.insert(tgid, member, BPF_EXIST).ok()?;
    // SAFETY: copied at once (see "Reading the hash maps" in programs.rs).
    let from_account = unsafe { TREE_CONTROL.get(from) }.map_or(0, |c| c.holder.account);
    add_to_account(from_account, u64::MAX);
    add_to_account(account, 1);
    Some(())
}
