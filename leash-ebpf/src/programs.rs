use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::read_volatile,
};

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_boot_ns, bpf_probe_read_kernel, bpf_send_signal,
    },
    macros::{btf_tracepoint, kprobe, map},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, ProbeContext},
};
use leash_common::{
    ALL_ACCOUNTS, Account, Diagnostic, Event, EventKind, Member, NO_LIMIT, Pid, TreeControl,
    TreeCounters, TreeId, flags, stat,
};

// Capacities here are placeholders: user space sets the real ones at load time.
#[map]
pub(crate) static MEMBERS: HashMap<Pid, Member> = HashMap::with_max_entries(1, 0);
#[map]
pub(crate) static TREE_COUNTERS: HashMap<TreeId, TreeCounters> = HashMap::with_max_entries(1, 0);
#[map]
pub(crate) static TREE_CONTROL: HashMap<TreeId, TreeControl> = HashMap::with_max_entries(1, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
static ACCOUNT_JOINED: HashMap<Account, u64> = HashMap::with_max_entries(1, 0);
#[map]
static ACCOUNT_SEEDED: HashMap<Account, i64> = HashMap::with_max_entries(1, 0);

// Reading the hash maps (what makes `HashMap::get` unsafe): they are preallocated (flags 0), so
// the memory of every value lives as long as the map, which a running program holds. But a
// value may be written meanwhile, by user space or a program on another CPU, and once deleted
// its memory may be reused for another key. So the reference `get` returns is never kept: the
// value is copied at once, or a field or two read within the expression, and every type read
// this way is plain integers, valid whatever a concurrent write leaves there. At worst what is
// read is stale, or mixed with a concurrent replacement, never invalid memory.

// Offsets differ between kernels; user space finds them in the kernel's BTF and sets these at
// load.
// They are read through volatile loads so the compiler cannot fold the placeholder values.
#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub(crate) static TASK_START_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_REAL_PARENT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub(crate) static TASK_SIGNAL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NS_PER_TICK: u64 = 10_000_000;
#[unsafe(no_mangle)]
static MEMBERS_PER_UID: u32 = NO_LIMIT;
#[unsafe(no_mangle)]
static MEMBER_CAPACITY: u32 = NO_LIMIT;

pub(crate) const SIGKILL: u32 = 9;
pub(crate) const BPF_NOEXIST: u64 = 1;
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// sched_process_fork fires in the forking task, after the child is made and before it is woken:
/// a child that joins here is a member before it runs one instruction.
#[btf_tracepoint(function = "sched_process_fork")]
pub(crate) fn leash_fork(ctx: BtfTracePointContext) -> i32 {
    on_fork(ctx.arg(0), ctx.arg(1))
}

/// [`leash_fork`] again, for the forks the kernel skips it for (see `program::FORK_AGAIN`).
#[btf_tracepoint(function = "sched_process_fork")]
pub(crate) fn leash_fork2(ctx: BtfTracePointContext) -> i32 {
    on_fork(ctx.arg(0), ctx.arg(1))
}

/// The fork programs' work a third time, from a kprobe on `wake_up_new_task(struct task_struct
/// *p)`, which the forker calls after `sched_process_fork` and before the child first runs
/// (see `program::FORK_KPROBE`). A kprobe runs with preemption off, and is skipped only while
/// another kprobe or perf program, or a `bpf()` map call, holds the CPU's `bpf_prog_active`: a
/// condition apart from the tracepoints'.
#[kprobe(function = "wake_up_new_task")]
pub(crate) fn leash_fork_kp(ctx: ProbeContext) -> u32 {
    let Some(child) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    // SAFETY: the helper returns the current task's address; it is only read through
    // bpf_probe_read_kernel.
    let forker = unsafe { bpf_get_current_task() } as *const u8;
    on_fork(forker, child);
    0
}

/// What each fork program does, for the forking task `forker` and its new task `child`. All
/// run at every fork, one after the other, and any of them may have been skipped: a later one
/// finds the child's entry that an earlier one made, and does nothing.
#[inline(always)]
fn on_fork(forker: *const u8, child: *const u8) -> i32 {
    let parent = current_tgid();
    // The hot path for every fork on the machine: one lookup, and out for non-members.
    // SAFETY: copied at once (see "Reading the hash maps").
    let Some(entry) = (unsafe { MEMBERS.get(parent) }).copied() else {
        return 0;
    };
    let Some(child_tgid) = read_task::<u32>(child, &TASK_TGID_OFFSET) else {
        diagnose(Diagnostic::ChildUnread, entry.tree, parent);
        return 0;
    };
    // A new thread shares its creator's thread group: threads are not members.
    if child_tgid == parent {
        return 0;
    }
    // An entry names a process by pid and start time: one for an earlier process by this pid
    // is not this process's, and nothing is done on its account.
    if !is_member(forker, &entry) {
        return 0;
    }
    let tree = entry.tree;
    let start_ns = read_task::<u64>(child, &TASK_START_OFFSET).unwrap_or_else(|| {
        diagnose(Diagnostic::StartUnread, tree, child_tgid);
        0
    });
    // SAFETY: copied at once (see "Reading the hash maps").
    if let Some(existing) = unsafe { MEMBERS.get(child_tgid) }.copied() {
        // Another fork program's work, or the reconciling iterator's (which takes the parent
        // as it is then: the forker may have died since, and the child been reparented).
        if same_start(existing.start_ns, start_ns) {
            return 0;
        }
        // An earlier process's entry by this pid, whose exit the exit programs missed (7.x
        // skips them on a CPU where a preempted task is inside them): the pid is this child's
        // now, so that process is gone. Left in, the child could not join, and its tree would
        // be killed as untrackable.
        take_out_stale(child_tgid, &existing);
    }
    join(tree, child_tgid, parent, start_ns)
}

/// Takes out `pid`'s entry `stale`, whose process is gone, and counts it out of its tree as a
/// member that left (whoever takes it out counts it: this, or user space).
#[inline(always)]
pub(crate) fn take_out_stale(pid: Pid, stale: &Member) {
    if MEMBERS.remove(pid).is_err() {
        return;
    }
    count(stat::EXITS);
    // SAFETY: one field read within the expression (see "Reading the hash maps").
    let account =
        unsafe { TREE_CONTROL.get(stale.tree) }.map_or(0, |control| control.holder.account);
    add_to_account(account, u64::MAX);
    add_to_account(ALL_ACCOUNTS, u64::MAX);
    emit(EventKind::Exit, stale.tree, pid, 0);
    if let Some(counters) = TREE_COUNTERS.get_ptr_mut(stale.tree) {
        // SAFETY: as in join: memory that lives as long as the map, only added to atomically.
        unsafe { add(&raw mut (*counters).left, 1) };
    }
}

/// The child `child_tgid` of member `parent`, which started at `start_ns`, joins `tree`; the
/// parent dies if the tree makes no more members.
#[inline(always)]
fn join(tree: TreeId, child_tgid: Pid, parent: Pid, start_ns: u64) -> i32 {
    // SAFETY: copied at once (see "Reading the hash maps").
    let control = unsafe { TREE_CONTROL.get(tree) }
        .copied()
        .unwrap_or_default();
    let account = control.holder.account;
    let over_quota = over_quota(account);
    let over_capacity = over_capacity();
    let member = Member {
        tree,
        parent,
        start_ns,
    };
    // Over the quota or the capacity, the child is still tracked (so it dies with its tree:
    // past the capacity, in the map's reserve), and the tree makes no more.
    let joined = MEMBERS.insert(child_tgid, member, BPF_NOEXIST).is_ok();
    // Another program put the child in meanwhile (the reconciling iterator, on another CPU):
    // its work, counted by it.
    if !joined {
        // SAFETY: copied at once (see "Reading the hash maps").
        let entry = unsafe { MEMBERS.get(child_tgid) }.copied();
        if entry.is_some_and(|entry| same_start(entry.start_ns, start_ns)) {
            return 0;
        }
    }
    // As at exit: the event before the count.
    if joined {
        count(stat::JOINS);
        emit(EventKind::Fork, tree, child_tgid, parent);
        add_to_account(account, 1);
        add_to_account(ALL_ACCOUNTS, 1);
    } else {
        emit_at(EventKind::ForkFailed, tree, child_tgid, parent, start_ns);
    }
    let untrackable = over_capacity || !joined;
    if untrackable {
        count(stat::INSERTS_FAILED);
    }
    let mut quota_spent = over_quota;
    if let Some(counters) = TREE_COUNTERS.get_ptr_mut(tree) {
        // SAFETY: `counters` points into the tree's value, memory that lives as long as the map
        // (see "Reading the hash maps"), aligned for its u64s. Other CPUs update the same
        // counters: they are only added to atomically; the read of over_quota may be stale.
        unsafe {
            let spent_before = (*counters).over_quota != 0;
            quota_spent |= spent_before;
            if over_quota && !spent_before {
                diagnose(Diagnostic::QuotaHit, tree, parent);
            }
            if joined {
                add(&raw mut (*counters).joined, 1);
            }
            if untrackable {
                add(&raw mut (*counters).failed, 1);
            }
            if over_quota {
                add(&raw mut (*counters).over_quota, 1);
            }
        }
    }
    if control.flags & flags::DOOMED != 0 || quota_spent || untrackable {
        // The forker dies before it returns to user space; the child is tracked and killed by
        // user space (or, untracked because even the reserve was full, killed by user space on
        // the ForkFailed event), and if it execs first, it dies as it execs (leash_exec). A
        // fork storm cannot outrun that.
        // SAFETY: the helper takes a signal number, signals the current task and touches no
        // memory of ours.
        let _ = unsafe { bpf_send_signal(SIGKILL) };
        emit(EventKind::ForkKilled, tree, parent, 0);
    }
    0
}

/// sched_process_exit fires in the exiting thread. A member leaves when its thread group is
/// dead, not when one of its threads ends: not when its main thread ends first (the others go
/// on under its pid), nor when exec from another thread ends the old main thread (the process
/// goes on under its pid, running the new program).
///
/// Run twice, as the fork program is (see `program::EXIT_AGAIN`): the entry goes once.
#[btf_tracepoint(function = "sched_process_exit")]
pub(crate) fn leash_exit(ctx: BtfTracePointContext) -> i32 {
    on_exit(&ctx)
}

/// [`leash_exit`] again, for the exits the kernel skips it for.
#[btf_tracepoint(function = "sched_process_exit")]
pub(crate) fn leash_exit2(ctx: BtfTracePointContext) -> i32 {
    on_exit(&ctx)
}

#[inline(always)]
fn on_exit(ctx: &BtfTracePointContext) -> i32 {
    let tgid = current_tgid();
    // The hot path for every thread's exit on the machine: one lookup, and out for
    // non-members, before any read of the task.
    // SAFETY: copied at once (see "Reading the hash maps").
    let Some(entry) = (unsafe { MEMBERS.get(tgid) }).copied() else {
        return 0;
    };
    let task: *const u8 = ctx.arg(0);
    if !group_dead(task) {
        return 0;
    }
    // Not this process's entry (see leash_fork): user space takes such an entry out.
    if !is_member(task, &entry) {
        return 0;
    }
    let tree = entry.tree;
    if MEMBERS.remove(tgid).is_err() {
        return 0;
    }
    count(stat::EXITS);
    // SAFETY: copied at once (see "Reading the hash maps").
    let control = unsafe { TREE_CONTROL.get(tree) }
        .copied()
        .unwrap_or_default();
    add_to_account(control.holder.account, u64::MAX);
    add_to_account(ALL_ACCOUNTS, u64::MAX);
    let is_root = control.root == tgid;
    // The event goes out before the counters count the exit: whoever sees the counters say
    // "empty" finds every exit event already in the ring buffer.
    let kind = if is_root {
        EventKind::RootExit
    } else {
        EventKind::Exit
    };
    emit(kind, tree, tgid, 0);
    // SAFETY: the helper takes nothing and returns a clock's reading.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    if let Some(counters) = TREE_COUNTERS.get_ptr_mut(tree) {
        // SAFETY: as in leash_fork: memory that lives as long as the map, `left` only added to
        // atomically. root_exit_ns has one writer: the root's single group death.
        unsafe {
            add(&raw mut (*counters).left, 1);
            if is_root {
                (*counters).root_exit_ns = now;
            }
        }
    }
    0
}

/// sched_process_exec fires in the task that has just executed a new program, its comm already
/// set to the program's name, before the program runs an instruction. Membership does not
/// change; the event says what the member is now. A member born into a doomed tree (the child
/// of a fork that killed its parent, which user space kills a moment later) is sent SIGKILL
/// here, so the program it executes never runs: a doomed tree starts nothing new. Members that
/// were there at the doom keep their grace period, exec or not.
#[btf_tracepoint(function = "sched_process_exec")]
pub(crate) fn leash_exec(ctx: BtfTracePointContext) -> i32 {
    let tgid = current_tgid();
    // SAFETY: copied at once (see "Reading the hash maps").
    let Some(entry) = (unsafe { MEMBERS.get(tgid) }).copied() else {
        return 0;
    };
    let task: *const u8 = ctx.arg(0);
    if !is_member(task, &entry) {
        return 0;
    }
    emit(EventKind::Exec, entry.tree, tgid, 0);
    // SAFETY: two fields read within the expression (see "Reading the hash maps").
    let born_doomed = unsafe { TREE_CONTROL.get(entry.tree) }.is_some_and(|control| {
        control.flags & flags::DOOMED != 0 && entry.start_ns >= control.doomed_ns
    });
    if born_doomed {
        // SAFETY: the helper takes a signal number, signals the current task and touches no
        // memory of ours.
        let _ = unsafe { bpf_send_signal(SIGKILL) };
    }
    0
}

/// An LSM program's denial, `-ERRNO`, as every verifier can bound it: a constant, through the
/// stack, 64 bits wide. Left to itself the compiler computes `-errno` from a bool or a variable
/// (BPF_NEG), which verifiers before 6.13 cannot bound, and they check all 64 bits of an LSM
/// program's answer against its range. Each branch of a program returns this or 0.
#[inline(always)]
pub(crate) fn lsm_denial<const ERRNO: i64>() -> i64 {
    let mut value: i64 = 0;
    // SAFETY: a write to a local.
    unsafe { core::ptr::write_volatile(&mut value, -ERRNO) };
    // SAFETY: a read of a local.
    unsafe { core::ptr::read_volatile(&value) }
}

pub(crate) fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Whether the thread group of `task`, an exiting thread, is dead: `task->signal->live`, the
/// group's live threads, is 0. do_exit counts the thread out of it before this tracepoint, on
/// every kernel; 6.16's `group_dead` argument is the same test, which older kernels lack. Two
/// threads ending at once may both see 0: the second finds the entry gone.
pub(crate) fn group_dead(task: *const u8) -> bool {
    let Some(signal) = read_task::<*const u8>(task, &TASK_SIGNAL_OFFSET) else {
        return false;
    };
    read_task::<i32>(signal, &SIGNAL_LIVE_OFFSET) == Some(0)
}

/// Whether `entry` is the entry of the process `task` (any of its threads) belongs to: the
/// same start time, to the resolution of the entry (user space makes entries from /proc's
/// clock ticks; the programs, exact).
pub(crate) fn is_member(task: *const u8, entry: &Member) -> bool {
    started_at(task, entry.start_ns)
}

/// Whether the process `task` belongs to (any of its threads) started at `start_ns`, to the
/// resolution of /proc's clock ticks where user space took it from /proc.
pub(crate) fn started_at(task: *const u8, start_ns: u64) -> bool {
    let Some(leader) = read_task::<*const u8>(task, &TASK_GROUP_LEADER_OFFSET) else {
        return false;
    };
    let Some(start) = read_task::<u64>(leader, &TASK_START_OFFSET) else {
        return false;
    };
    same_start(start, start_ns)
}

/// Whether two start times are one process's: the same, or the same clock tick where one of
/// them is /proc's (user space's entries).
pub(crate) fn same_start(a: u64, b: u64) -> bool {
    // SAFETY: a reference to a static is valid and aligned for the read (volatile only so
    // that the value user space set at load is read, not the placeholder: see the globals).
    let tick = unsafe { read_volatile(&NS_PER_TICK) }.max(1);
    a == b || a / tick == b / tick
}

/// Whether `account` has all the members its quota allows (root has no quota).
fn over_quota(account: Account) -> bool {
    // SAFETY: as for NS_PER_TICK in is_member.
    let quota = unsafe { read_volatile(&MEMBERS_PER_UID) };
    if account == 0 || quota == NO_LIMIT {
        return false;
    }
    members_of(account) >= i64::from(quota)
}

/// Whether the trees have all the members the capacity allows, over all of them (user space's
/// entries and the programs' together).
pub(crate) fn over_capacity() -> bool {
    // SAFETY: as for NS_PER_TICK in is_member.
    let capacity = unsafe { read_volatile(&MEMBER_CAPACITY) };
    if capacity == NO_LIMIT {
        return false;
    }
    members_of(ALL_ACCOUNTS) >= i64::from(capacity)
}

/// The members `account` has now, over all its trees (every member, for [`ALL_ACCOUNTS`]).
fn members_of(account: Account) -> i64 {
    // SAFETY: copied at once (see "Reading the hash maps").
    let joined = unsafe { ACCOUNT_JOINED.get(account) }.map_or(0, |&n| n as i64);
    // SAFETY: as above.
    let seeded = unsafe { ACCOUNT_SEEDED.get(account) }.copied().unwrap_or(0);
    joined.wrapping_add(seeded)
}

/// Adds `delta` (two's complement: `u64::MAX` is -1) to `account`'s joined members.
pub(crate) fn add_to_account(account: Account, delta: u64) {
    if let Some(joined) = ACCOUNT_JOINED.get_ptr_mut(account) {
        // SAFETY: `joined` points into the account's value, an aligned u64 that lives as long
        // as the map (see "Reading the hash maps"), and is only ever added to atomically.
        unsafe { add(joined, delta) };
    }
}

/// The task a task iterator's program is run for: its context is `struct bpf_iter__task {
/// meta, task }`, two pointers. None for the last run, which has no task.
#[inline(always)]
pub(crate) fn iter_task<T>(ctx: *mut c_void) -> Option<*mut T> {
    // SAFETY: reads the context's second pointer, which the verifier checks as a context
    // access (a trusted task pointer, or null).
    let task = unsafe { *(ctx as *const *mut T).add(1) };
    (!task.is_null()).then_some(task)
}

/// Reads a `T` at the offset a global holds (read through a volatile load: see the globals).
pub(crate) fn read_task<T>(task: *const u8, offset: &u32) -> Option<T> {
    // SAFETY: `offset` is a reference, valid and aligned (volatile: see the globals).
    read_at(task, unsafe { read_volatile(offset) })
}

/// Reads a `T` at `offset` bytes into the kernel object at `base`.
pub(crate) fn read_at<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one returns an error, not a fault.
    // What it reads is returned as a T only on success, and every T read here (u32, u64, i32,
    // a pointer only ever read through this function again) is valid for any bytes.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T) }.ok()
}

/// An atomic add whose result is unused, which compiles to BPF_XADD: counters shared by all
/// CPUs. (`AtomicU64::fetch_add` does not exist on the BPF target.)
///
/// # Safety
///
/// `counter` points at a u64, aligned, valid for reads and writes for the call, that is only
/// ever written atomically (or by one writer that no adder races).
pub(crate) unsafe fn add(counter: *mut u64, delta: u64) {
    // SAFETY: the caller's contract.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, delta) };
}

pub(crate) fn count(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: `slot` points into this CPU's copy of the array, valid and aligned memory as
        // long as the map lives; programs run with migration disabled, so only one that
        // nests on this CPU could race this add, and lose a count, never corrupt memory.
        unsafe { *slot += 1 };
    }
}

pub(crate) fn emit(kind: EventKind, tree: TreeId, pid: Pid, parent: Pid) {
    // SAFETY: the helper takes nothing and returns a clock's reading.
    emit_at(kind, tree, pid, parent, unsafe { bpf_ktime_get_boot_ns() });
}

/// Reports a rare path to the daemon's log (see [`Diagnostic`]), for member `pid` of `tree`.
fn diagnose(what: Diagnostic, tree: TreeId, pid: Pid) {
    emit(EventKind::Diagnostic, tree, pid, what as u32);
}

pub(crate) fn emit_at(kind: EventKind, tree: TreeId, pid: Pid, parent: Pid, time_ns: u64) {
    let event = Event {
        kind: kind as u32,
        tree,
        pid,
        parent,
        time_ns,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    // Waking the reader costs more than writing the record: only what the daemon must act on
    // at once (a root's exit, a host's death, a child it must kill) wakes it; it collects the
    // rest on its own schedule.
    let wakeup = if matches!(
        kind,
        EventKind::RootExit | EventKind::ForkFailed | EventKind::HostDying
    ) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<Event>(&event, wakeup).is_err() {
        count(stat::EVENTS_DROPPED);
    }
}

/// The thread group id of `task`'s parent (`real_parent`: the process that forked it, or its
/// reaper since).
pub(crate) fn parent_tgid(task: *const u8) -> Option<Pid> {
    read_task::<u32>(real_parent(task)?, &TASK_TGID_OFFSET)
}

/// `task`'s `real_parent`: the task that forked it, or its reaper since. Null for the idle
/// task's parent's parent: never followed far.
pub(crate) fn real_parent(task: *const u8) -> Option<*const u8> {
    read_task::<*const u8>(task, &TASK_REAL_PARENT_OFFSET).filter(|parent| !parent.is_null())
}

/// A counter of a tree's members.
pub(crate) enum Counter {
    Joined,
    Left,
}

/// Counts one member more as joined in `tree`, or as left.
pub(crate) fn add_to_tree(tree: TreeId, counter: Counter) {
    if let Some(counters) = TREE_COUNTERS.get_ptr_mut(tree) {
        // SAFETY: as in join: memory that lives as long as the map, only added to atomically.
        unsafe {
            match counter {
                Counter::Joined => add(&raw mut (*counters).joined, 1),
                Counter::Left => add(&raw mut (*counters).left, 1),
            }
        }
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
