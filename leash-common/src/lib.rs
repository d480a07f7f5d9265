//! The ABI shared by the leash eBPF programs and user space: map names, keys, values, event
//! records and flags. Every type is `#[repr(C)]` plain data; user space gets `aya::Pod` impls
//! with the `user` feature. Nothing else lives here.
#![no_std]

/// Who a tree's members are charged to, whatever uids its processes run as: a user (their
/// uid, in the initial user namespace), which includes every user namespace they own and so
/// every subordinate uid they map; or, for a user namespace that root owns (an unprivileged
/// pod, a system container), that namespace (`1 << 32 | its inode number`). 0 is root, which
/// has no quota.
pub type Account = u64;

/// Identifies a registered tree. Allocated by user space; 0 is never a tree.
pub type TreeId = u32;

/// A process id as the kernel's init pid namespace sees it (a thread group id).
pub type Pid = u32;

/// Names of the maps, as user space looks them up in the loaded object.
pub mod map {
    /// `HashMap<Pid, Member>`: every tracked process. The truth about membership.
    pub const MEMBERS: &str = "MEMBERS";
    /// `HashMap<TreeId, TreeCounters>`: written by the programs only (atomic adds, one writer
    /// per flag), created by user space before the tree's first member.
    pub const TREE_COUNTERS: &str = "TREE_COUNTERS";
    /// `HashMap<TreeId, TreeControl>`: written by user space only, read by the programs.
    pub const TREE_CONTROL: &str = "TREE_CONTROL";
    /// `PerCpuArray<u64>` indexed by [`super::stat`]: global counters.
    pub const STATS: &str = "STATS";
    /// Ring buffer of [`super::Event`] records. Best effort: drops are counted in `STATS`.
    pub const EVENTS: &str = "EVENTS";
    /// `HashMap<Account, i64>`: per account, members that joined at fork less members that
    /// left at exit, over all the account's trees; under [`super::ALL_ACCOUNTS`], over every
    /// tree. Written by the programs only (atomic adds), created by user space (before the
    /// account's first tree; `ALL_ACCOUNTS` as the maps are made).
    pub const ACCOUNT_JOINED: &str = "ACCOUNT_JOINED";
    /// `HashMap<Account, i64>`: per account, members user space put in less those it took out;
    /// under [`super::ALL_ACCOUNTS`], over every tree. Written by user space only. With
    /// `ACCOUNT_JOINED`, the account's members now.
    pub const ACCOUNT_SEEDED: &str = "ACCOUNT_SEEDED";
    /// `Array<Whois>` of one entry: user space writes the pid it asks about, the whois program
    /// writes what the kernel knows of it (see [`super::Whois`]).
    pub const WHOIS: &str = "WHOIS";
    /// `HashMap<Pid, u64>`: the hosts of leases that hold trees, by thread group id, each with
    /// its start time (boot-time ns, at /proc's clock-tick resolution). Written by user space;
    /// the host programs take a host out as they report that it is dying.
    pub const HOSTS: &str = "HOSTS";
    /// Task storage of [`super::Mark`], one per task (thread) of a tree: the membership the
    /// kernel never skips (see [`super::program::TASK_ALLOC`]). Written by the `task_alloc`
    /// program as a member's child (or thread) is made, and by user space, by pidfd, for roots
    /// and what it puts in. Freed with the task, so a mark never outlives its process nor lands
    /// on a recycled pid. Only in the object with marks (Linux 5.11): not in [`ALL`].
    pub const MARKS: &str = "MARKS";
    /// `HashMap<u32, Descent>`, keyed by the thread id of the thread that reads a descent
    /// iterator: what that reading asks (see [`super::Descent`]). Written by user space before
    /// it makes the iterator, taken out after; the descent program writes back how it ended.
    /// Pinned where the descent iterator's link is: not in [`ALL`].
    pub const DESCENTS: &str = "DESCENTS";
    /// Every map of both objects, as pinned.
    pub const ALL: [&str; 9] = [
        MEMBERS,
        TREE_COUNTERS,
        TREE_CONTROL,
        STATS,
        EVENTS,
        ACCOUNT_JOINED,
        ACCOUNT_SEEDED,
        WHOIS,
        HOSTS,
    ];
}

/// The version of this ABI (the maps' layouts and meanings). Pinned maps are kept under it, so
/// a daemon never takes over maps it would misread.
pub const ABI_VERSION: u32 = 9;

/// Names of the programs in the object.
pub mod program {
    /// tp_btf on `sched_process_fork`: a member's child joins the member's tree.
    pub const FORK: &str = "leash_fork";
    /// tp_btf on `sched_process_exit`: a member leaves when its thread group is dead.
    pub const EXIT: &str = "leash_exit";
    /// The same program as [`FORK`], attached again: the kernel skips a tracepoint's program on
    /// a CPU where a preempted task is inside that very program (its recursion guard; on a
    /// preemptible kernel, 7.x's lazy preemption among them, a task can be preempted there),
    /// and a fork or exit that no program sees is a member lost, or an entry left behind. A
    /// second program has a guard of its own: an event goes unseen only if both are held at
    /// once on its CPU. Whichever runs second finds the work done.
    pub const FORK_AGAIN: &str = "leash_fork2";
    /// A kprobe on `wake_up_new_task`, which the forker calls after `sched_process_fork` and
    /// before the child first runs: the fork programs' work a third time, where the marks are
    /// not in place (no BPF LSM). Kprobes run with preemption off and are skipped only while the
    /// CPU's `bpf_prog_active` is held (another kprobe or perf program, or a `bpf()` map call
    /// preempted inside it), a condition apart from the tracepoints': a fork goes unseen only
    /// when all three miss it.
    pub const FORK_KPROBE: &str = "leash_fork_kp";
    /// [`EXIT`], attached again (see [`FORK_AGAIN`]).
    pub const EXIT_AGAIN: &str = "leash_exit2";
    /// tp_btf on `sched_process_exec`: tells what a member runs now (an event only).
    pub const EXEC: &str = "leash_exec";
    /// (The kernel keeps 15 characters of a program's name: these two differ within them.)
    /// tp_btf on `signal_generate`: a host in `HOSTS` whose thread group a signal has set
    /// exiting (SIGKILL, the OOM killer's, a default-fatal signal neither caught nor blocked)
    /// is reported dying, before its exit tears down its memory.
    pub const HOST_KILL: &str = "leash_hostkill";
    /// tp_btf on `signal_deliver`: a host in `HOSTS` that takes a signal whose action is the
    /// default and fatal (a crash: SIGSEGV, SIGABRT, ..., which dump core before the group
    /// exits) is reported dying.
    pub const HOST_CRASH: &str = "leash_hostcrash";
    /// A BPF LSM program on `task_alloc`, the one hook of the fork path, which runs in the
    /// forking task before the child can run and may fail the fork. The kernel never skips an
    /// LSM program (it has no recursion guard), where 7.x skips a tracepoint program on a CPU
    /// where a preempted task is inside it. A member's child (process or thread) gets the
    /// member's mark in `MARKS`; a child that cannot be marked is not made (the fork fails);
    /// a doomed tree's member makes nothing. Where the BPF LSM is active.
    pub const TASK_ALLOC: &str = "leash_task_alloc";
    /// A task iterator (`iter/task`): every marked process that `MEMBERS` lacks (a fork the
    /// fork programs were skipped for) is put into it, and counted as joined. Run before each
    /// kill's searches, and when the fork programs' skips rise.
    pub const RECONCILE: &str = "leash_reconcile";
    /// A task iterator (`iter/task`) that finds processes by their ancestry, as the reading
    /// thread's entry in `DESCENTS` asks: an adoption's descendants of a root, put into its
    /// tree (or moved down into it from the tree it is nested in); or, where there are no
    /// marks, every process whose nearest tracked ancestor is a member while it is not (a fork
    /// every fork program was skipped for), put into that member's tree. It writes one
    /// [`super::Descended`] to the iterator for each.
    pub const DESCEND: &str = "leash_descend";
    /// A task iterator (`iter/task`) that sends a signal to every member of a tree from the
    /// kernel, with the `bpf_send_signal_task` kfunc (Linux 6.13), as the reading thread's
    /// entry in `DESCENTS` asks ([`super::Descent::KILL`]): one pass over the machine's tasks
    /// in place of a pidfd and a system call per member. Its call is patched in the object at
    /// load (the kfunc's BTF id); where the kernel lacks the kfunc it is not attached.
    pub const KILL: &str = "leash_kill";
    /// A task iterator (`iter/task`): fills `WHOIS` for the process it names.
    pub const WHOIS: &str = "leash_whois";
    /// fmod_ret on `security_ptrace_access_check`: refuses a member attach-mode access to any
    /// process outside its tree (ptrace attach, `pidfd_getfd`, `process_vm_writev`,
    /// /proc/PID/mem). In the object as an `fentry` section, which aya parses; user space
    /// loads it as fmod_ret itself.
    pub const PTRACE_GUARD: &str = "leash_ptrace_guard";
    /// The same guard as a BPF LSM program on the `ptrace_access_check` hook, where the BPF
    /// LSM is active (`bpf` in /sys/kernel/security/lsm), in place of `PTRACE_GUARD`. A kernel
    /// that runs tracing programs preemptibly (7.x with lazy preemption, any kernel with full
    /// preemption) skips `PTRACE_GUARD` on a CPU where a preempted task is inside it, and the
    /// access it would have refused goes through; it never skips an LSM program.
    pub const PTRACE_GUARD_LSM: &str = "leash_ptrace_lsm";
    /// A kprobe on `cap_ptrace_access_check`, the capability module's hook, which
    /// `security_ptrace_access_check` calls first, and only when fmod_ret has not refused: it
    /// SIGKILLs a member asking an attach-mode access to a process outside its tree. The call
    /// runs on with the kill pending, and the member never returns to user space. A kprobe
    /// runs with preemption off and is skipped only while another kprobe or perf program, or
    /// a `bpf()` map call, holds its CPU: a condition apart from fmod_ret's. Attached beside
    /// `PTRACE_GUARD` on a kernel that runs tracing programs preemptibly (7.x) without the BPF
    /// LSM, where it acts only when fmod_ret was skipped; and in its place, before the syscall
    /// tracepoints, on a kernel without BPF trampolines.
    pub const PTRACE_GUARD_KPROBE: &str = "leash_ptrace_kp";
    /// The fallback where the kernel cannot attach `PTRACE_GUARD` (no BPF trampolines): the
    /// syscall tracepoints below SIGKILL a member that reaches outside its tree.
    /// `syscalls/sys_enter_ptrace`, for PTRACE_ATTACH and PTRACE_SEIZE.
    pub const PTRACE_ATTACH_TP: &str = "leash_ptrace_attach";
    /// `syscalls/sys_enter_pidfd_getfd`.
    pub const PIDFD_GETFD_TP: &str = "leash_pidfd_getfd";
    /// `syscalls/sys_enter_process_vm_writev`.
    pub const VM_WRITEV_TP: &str = "leash_vm_writev";
}

/// How far up the chain of nested trees the ptrace guard looks for the accessor's own tree. A
/// process in a tree nested deeper than this below the accessor's is treated as outside it:
/// refused, never let through.
pub const MAX_TREE_NESTING: u32 = 16;

/// Names of the read-only globals user space sets at load time (`EbpfLoader::override_global`).
pub mod global {
    /// Byte offset of `task_struct.tgid` (from the kernel's BTF).
    pub const TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
    /// Byte offset of `task_struct.start_boottime` (from the kernel's BTF).
    pub const TASK_START_OFFSET: &str = "TASK_START_OFFSET";
    /// Byte offset of `task_struct.group_leader` (from the kernel's BTF).
    pub const TASK_GROUP_LEADER_OFFSET: &str = "TASK_GROUP_LEADER_OFFSET";
    /// Byte offset of `task_struct.real_parent` (from the kernel's BTF).
    pub const TASK_REAL_PARENT_OFFSET: &str = "TASK_REAL_PARENT_OFFSET";
    /// Nanoseconds per clock tick of /proc's start times: a member entry that user space made
    /// from /proc carries a start time of that resolution.
    pub const NS_PER_TICK: &str = "NS_PER_TICK";
    /// Members one account other than root may have over all its trees, or
    /// [`super::NO_LIMIT`] for no limit. A fork beyond it is refused the way a doomed tree's
    /// is, and the tree is killed.
    pub const MEMBERS_PER_UID: &str = "MEMBERS_PER_UID";
    /// Byte offset of `task_struct.signal` (from the kernel's BTF).
    pub const TASK_SIGNAL_OFFSET: &str = "TASK_SIGNAL_OFFSET";
    /// Byte offset of `signal_struct.live`, the thread group's live threads (from the kernel's
    /// BTF): 0 once the group is dead.
    pub const SIGNAL_LIVE_OFFSET: &str = "SIGNAL_LIVE_OFFSET";
    /// Members the trees may have at once, over all of them. The member map holds
    /// [`super::MEMBER_RESERVE`] more: a child forked at the capacity still joins (into the
    /// reserve), so it is tracked before it runs, and its forker is killed and its tree with
    /// it, as at the quota. Fail closed with no window.
    pub const MEMBER_CAPACITY: &str = "MEMBER_CAPACITY";
    /// Byte offset of `signal_struct.flags` (from the kernel's BTF): `SIGNAL_GROUP_EXIT` there
    /// says the thread group is exiting.
    pub const SIGNAL_FLAGS_OFFSET: &str = "SIGNAL_FLAGS_OFFSET";
    /// Byte offset of the handler in `struct k_sigaction` (`sa.sa_handler`, from the kernel's
    /// BTF).
    pub const SIGACTION_HANDLER_OFFSET: &str = "SIGACTION_HANDLER_OFFSET";
    /// [`super::NamespaceOffsets`]: where the whois program finds a task's namespaces.
    pub const NAMESPACE_OFFSETS: &str = "NAMESPACE_OFFSETS";
}

/// Byte offsets of the fields the whois program reads (from the kernel's BTF): from a task to
/// the user namespace of its credentials and their owners, and to its pid namespaces.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceOffsets {
    /// `task_struct.pid` (the thread id).
    pub task_pid: u32,
    /// `task_struct.real_cred`: the credentials others see the task by.
    pub task_real_cred: u32,
    /// `cred.user_ns`
    pub cred_user_ns: u32,
    /// `user_namespace.parent` (NULL in the initial one).
    pub user_ns_parent: u32,
    /// `user_namespace.owner`: the uid that made it, in its parent namespace.
    pub user_ns_owner: u32,
    /// `user_namespace.ns` + `ns_common.inum`
    pub user_ns_inum: u32,
    /// `task_struct.thread_pid`
    pub task_thread_pid: u32,
    /// `pid.level`: how deep the task's pid namespace is (0: the initial one).
    pub pid_level: u32,
    /// `pid.numbers`: one `struct upid` per level.
    pub pid_numbers: u32,
    /// `sizeof(struct upid)`
    pub upid_size: u32,
    /// `upid.ns`
    pub upid_ns: u32,
    /// `pid_namespace.ns` + `ns_common.inum`
    pub pid_ns_inum: u32,
}

/// The deepest pid namespace nesting the kernel allows (`MAX_PID_NS_LEVEL`), plus one.
pub const PID_NS_LEVELS: usize = 33;

/// What the kernel knows of one process, which user space cannot read for itself without the
/// right to trace it: the value in `WHOIS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Whois {
    /// The process asked about (its thread group id): written by user space.
    pub pid: Pid,
    /// 1 once the program has found it.
    pub found: u32,
    /// The uid that owns the outermost user namespace the process is in, below the initial
    /// one, as the initial namespace numbers it; 0 if the process is in the initial one.
    pub user_ns_owner: u32,
    /// That namespace's inode number; 0 if the process is in the initial one.
    pub user_ns_inum: u32,
    /// How many of `pid_ns` are filled: the depth of its pid namespace, plus one.
    pub pid_ns_levels: u32,
    /// The inode numbers of its pid namespaces, the initial one first, its own last.
    pub pid_ns: [u32; PID_NS_LEVELS],
}

impl Whois {
    /// A question about `pid`.
    pub const fn asking(pid: Pid) -> Self {
        Self {
            pid,
            found: 0,
            user_ns_owner: 0,
            user_ns_inum: 0,
            pid_ns_levels: 0,
            pid_ns: [0; PID_NS_LEVELS],
        }
    }
}

/// What one reading of the descent iterator asks (`DESCENTS`' value; see
/// [`program::DESCEND`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descent {
    /// [`Descent::ADOPT`], [`Descent::RECONCILE`] or [`Descent::KILL`].
    pub mode: u32,
    /// ADOPT: the tree being adopted, whose root is its member already. KILL: the tree whose
    /// members are signalled.
    pub tree: TreeId,
    /// ADOPT: the tree it is nested in (0: none), whose members under the root come down.
    pub enclosing: TreeId,
    /// Written by the program: [`Descent::FULL`] or [`Descent::DOOMED`] if it stopped early.
    pub stopped: u32,
    /// Written by the program: 1 once it has run for this entry. 0 after a reading means the
    /// program never found it: the reader's thread id is not the kernel's (a pid namespace).
    pub seen: u32,
    /// Written by the program: processes it put in that no tree held, in this reading (KILL:
    /// members it signalled).
    pub added: u32,
    /// Written by the program: ADOPT: members of `enclosing` it moved down into `tree`.
    pub moved: u32,
    /// KILL: the signal to send.
    pub signal: u32,
}

impl Descent {
    /// Every process whose nearest tracked ancestor is a member of `tree`, or of `enclosing`
    /// on the way to one, and which is not a member of `tree` already, is put in.
    pub const ADOPT: u32 = 1;
    /// Every process no tree holds whose nearest tracked ancestor is a member joins that
    /// member's tree.
    pub const RECONCILE: u32 = 2;
    /// Every member of `tree` (its entry's start time its own) is sent `signal`, through each
    /// of its threads, by `program::KILL`; `added` counts the threads it was sent through.
    pub const KILL: u32 = 3;
    /// Stopped: the member map is at its capacity.
    pub const FULL: u32 = 1;
    /// Stopped: the tree being adopted is doomed.
    pub const DOOMED: u32 = 2;

    pub const fn adopting(tree: TreeId, enclosing: Option<TreeId>) -> Self {
        Self {
            mode: Self::ADOPT,
            tree,
            enclosing: match enclosing {
                Some(tree) => tree,
                None => 0,
            },
            stopped: 0,
            seen: 0,
            added: 0,
            moved: 0,
            signal: 0,
        }
    }

    pub const fn killing(tree: TreeId, signal: u32) -> Self {
        Self {
            mode: Self::KILL,
            tree,
            enclosing: 0,
            stopped: 0,
            seen: 0,
            added: 0,
            moved: 0,
            signal,
        }
    }

    pub const fn reconciling() -> Self {
        Self {
            mode: Self::RECONCILE,
            tree: 0,
            enclosing: 0,
            stopped: 0,
            seen: 0,
            added: 0,
            moved: 0,
            signal: 0,
        }
    }
}

/// One process the descent iterator put into a tree, as it writes it to the iterator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descended {
    pub pid: Pid,
    /// The tree it is now a member of.
    pub tree: TreeId,
    /// The tree it was moved from (the enclosing tree of an adoption); 0: it was in none.
    pub from: TreeId,
}

/// The key of `ACCOUNT_JOINED` and `ACCOUNT_SEEDED` that counts every member, whoever owns it:
/// how the fork program knows the member map is at its capacity. No account has it.
pub const ALL_ACCOUNTS: Account = u64::MAX;

/// The value of [`global::MEMBERS_PER_UID`] that sets no limit.
pub const NO_LIMIT: u32 = u32::MAX;

/// Entries the member map holds beyond [`global::MEMBER_CAPACITY`]. Every fork past the
/// capacity kills its forker, so the reserve fills only as fast as forks are in flight at once
/// between the count and the forker's exit: a few per CPU. Should it ever be full, the child is
/// not tracked (a failed insert, `ForkFailed`), and user space kills it on the event.
pub const MEMBER_RESERVE: u32 = 4096;

/// Indexes of the global counters in the `STATS` per-CPU array.
pub mod stat {
    /// Event records that did not fit in the ring buffer.
    pub const EVENTS_DROPPED: u32 = 0;
    /// Children of members forked past the member capacity: tracked in the reserve, or (the
    /// reserve full too) not inserted at all.
    pub const INSERTS_FAILED: u32 = 1;
    /// Members whose thread group died.
    pub const EXITS: u32 = 2;
    /// Children that joined a tree at fork.
    pub const JOINS: u32 = 3;
    /// Marked processes the member map lacked, put in by the reconciling iterator: forks the
    /// fork programs were skipped for.
    pub const RECONCILED: u32 = 4;
    /// Forks `task_alloc` refused: a doomed tree's, or a child that could not be marked.
    pub const FORKS_REFUSED: u32 = 5;
    /// Number of slots.
    pub const COUNT: u32 = 6;
}

/// One tracked process: the value in `MEMBERS`, keyed by its pid (thread group id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub tree: TreeId,
    /// The pid of the process that forked it (or its parent when it was registered).
    pub parent: Pid,
    /// `task_struct.start_boottime` in nanoseconds: with the pid, names the process uniquely.
    /// Members registered from /proc carry the clock-tick resolution /proc gives.
    pub start_ns: u64,
}

/// A task's membership, in `MARKS`: the tree, as of its registration `generation` (a mark of
/// an earlier tree by the same id counts for nothing).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub tree: TreeId,
    pub generation: u32,
}

/// What the programs keep about a tree. Only the programs write it, with atomic adds, so user
/// space never overwrites a concurrent update.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeCounters {
    /// Children that joined at fork (or that a reconciling iterator put in: see
    /// `program::RECONCILE` and `program::DESCEND`).
    pub joined: u64,
    /// Members that left (their thread group died).
    pub left: u64,
    /// Children forked past the member capacity (tracked in the reserve, or not at all if even
    /// that was full): the tree is to be killed, `untrackable`.
    pub failed: u64,
    /// Boot-time nanoseconds at which the root's thread group died; 0 while it lives.
    pub root_exit_ns: u64,
    /// Forks made while the tree's account had its whole member quota: the tree is to be killed.
    pub over_quota: u64,
}

/// What user space says about a tree. Only user space writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeControl {
    /// The root's pid.
    pub root: Pid,
    /// [`flags`] bits.
    pub flags: u32,
    /// Members that user space put in (the root and descendants found in /proc), less those it
    /// took out (moved into a nested tree, or found stale): with the counters' `joined` and
    /// `left`, the tree's size. Negative when more were moved out than put in.
    pub seeded: i64,
    /// Boot-time nanoseconds at which the tree was first doomed; 0 while it is not. A member
    /// that started after it was born into a doomed tree.
    pub doomed_ns: u64,
    /// The tree this one is nested in (registered by one of its members, or for one), or 0.
    /// Killing a tree kills the trees nested in it; releasing a nested tree hands its members
    /// back to it.
    pub parent: TreeId,
    /// Which registration under this id the tree is (ids are reused once released): a mark
    /// counts only while its generation is its tree's. Never 0 for a registered tree.
    pub generation: u32,
    /// Who holds the tree. Kept here, beside the tree, so a daemon that takes over the pinned
    /// maps after a restart knows whose tree it is; the programs read only its account.
    pub holder: Holder,
}

/// The lease a tree is held under, as a daemon that has lost its connections can still check
/// it: the host process (pid and start time) and what the tree's owner asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// The host's pid; 0 when no daemon recorded a holder.
    pub host_pid: Pid,
    /// The uid that owns the tree.
    pub owner_uid: u32,
    /// The host's start time in /proc's clock ticks: with the pid, names the host uniquely.
    pub host_start_ticks: u64,
    /// Time between SIGTERM and SIGKILL when the tree is killed.
    pub grace_ms: u32,
    /// [`holder_flags`] bits.
    pub flags: u32,
    /// Whom the tree's members are charged to (the fork program reads it for the quota).
    pub account: Account,
}

/// Bits of [`TreeControl::flags`].
pub mod flags {
    /// The tree is being killed: the fork program SIGKILLs any member that forks.
    pub const DOOMED: u32 = 1;
}

/// Bits of [`Holder::flags`].
pub mod holder_flags {
    /// When the root exits, the rest of the tree is left running (until the host dies).
    pub const KEEP_ON_ROOT_EXIT: u32 = 1;
}

/// Kinds of [`Event`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `pid` joined `tree`, forked by `parent`.
    Fork = 1,
    /// `pid`'s thread group died and it left `tree`.
    Exit = 2,
    /// The root `pid` of `tree` died (also recorded in `TreeCounters::root_exit_ns`).
    RootExit = 3,
    /// `pid`, a member of a doomed tree, tried to fork and was sent SIGKILL.
    ForkKilled = 4,
    /// `pid` executed a new program, named in `comm`.
    Exec = 5,
    /// `pid`, the child of member `parent`, could not join `tree` (the member map is full);
    /// `time_ns` is its start time. The forker was sent SIGKILL; user space kills the child.
    ForkFailed = 6,
    /// A program met something on a rare path that user space should log: `parent` holds a
    /// [`Diagnostic`] code, `pid` the member concerned. Never written for a non-member.
    Diagnostic = 7,
    /// `pid`, a host in `HOSTS`, is dying: a signal set its thread group exiting, or it takes
    /// a fatal signal's default action. `parent` holds the signal, `time_ns` the host's start
    /// time as `HOSTS` has it, `comm` the name of the task the program ran in: the sender of the
    /// signal that set the group exiting, or the host itself taking a fatal default action.
    HostDying = 8,
}

/// What a [`EventKind::Diagnostic`] record reports: rare paths of the programs, for the
/// daemon's log. They go through the ring buffer, which a daemon that takes over the pins reads
/// as the one before it did, so no diagnostic is lost to a hand-over.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Diagnostic {
    /// A member forked, and the child's thread group id could not be read: the child is not
    /// tracked.
    ChildUnread = 1,
    /// A member forked, and the child's start time could not be read: the child is tracked
    /// with a start time of 0.
    StartUnread = 2,
    /// A member of the tree forked past its owner's member quota, the tree's first such fork
    /// (two at once on two CPUs may both be first): the forker was killed, and the tree is
    /// killed as over its quota.
    QuotaHit = 3,
}

impl Diagnostic {
    pub fn from_u32(value: u32) -> Option<Self> {
        Some(match value {
            1 => Self::ChildUnread,
            2 => Self::StartUnread,
            3 => Self::QuotaHit,
            _ => return None,
        })
    }
}

impl EventKind {
    pub fn from_u32(value: u32) -> Option<Self> {
        Some(match value {
            1 => Self::Fork,
            2 => Self::Exit,
            3 => Self::RootExit,
            4 => Self::ForkKilled,
            5 => Self::Exec,
            6 => Self::ForkFailed,
            7 => Self::Diagnostic,
            8 => Self::HostDying,
            _ => return None,
        })
    }
}

/// A record in the `EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// An [`EventKind`] as u32.
    pub kind: u32,
    pub tree: TreeId,
    pub pid: Pid,
    pub parent: Pid,
    /// Boot-time nanoseconds.
    pub time_ns: u64,
    /// The task's command name (NUL-padded): the forker's for a fork (the child has not run
    /// yet), the new program's for an exec, the exiting one's for an exit.
    pub comm: [u8; 16],
}

/// Every map value and key type is `repr(C)`, of integers (and arrays of them) only, laid out
/// with no padding: the size of each is the sum of its fields', so every byte is a field's and
/// any bytes are a valid value. Checked here at compile time, for the `Pod` impls below and for
/// the programs, which share these layouts with user space.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Member>() == 4 + 4 + 8);
    assert!(size_of::<Mark>() == 4 + 4);
    assert!(size_of::<TreeCounters>() == 5 * 8);
    assert!(size_of::<Holder>() == 4 + 4 + 8 + 4 + 4 + 8);
    assert!(size_of::<TreeControl>() == 4 + 4 + 8 + 8 + 4 + 4 + size_of::<Holder>());
    assert!(size_of::<Event>() == 4 * 4 + 8 + 16);
    assert!(size_of::<NamespaceOffsets>() == 12 * 4);
    assert!(size_of::<Whois>() == (5 + PID_NS_LEVELS) * 4);
    assert!(size_of::<Descent>() == 8 * 4);
    assert!(size_of::<Descended>() == 3 * 4);
};

#[cfg(feature = "user")]
mod pod {
    // Each type below is a repr(C) struct of integers with no padding (checked above): any
    // bytes are a valid value of it, and viewing one as bytes reads no uninitialised padding.
    // All are Copy and 'static, and hold no pointers.

    // SAFETY: as said above; tree, parent (u32s) and start_ns (u64).
    unsafe impl aya::Pod for super::Member {}
    // SAFETY: see above; two u32s.
    unsafe impl aya::Pod for super::Mark {}
    // SAFETY: see above; five u64 counters.
    unsafe impl aya::Pod for super::TreeCounters {}
    // SAFETY: see above; u32s, an i64, a u64 and a Holder, itself Pod.
    unsafe impl aya::Pod for super::TreeControl {}
    // SAFETY: see above; u32s and u64s.
    unsafe impl aya::Pod for super::Holder {}
    // SAFETY: see above; u32s, a u64 and a [u8; 16].
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: see above; twelve u32 offsets.
    unsafe impl aya::Pod for super::NamespaceOffsets {}
    // SAFETY: see above; u32s and a [u32; PID_NS_LEVELS].
    unsafe impl aya::Pod for super::Whois {}
    // SAFETY: see above; eight u32s.
    unsafe impl aya::Pod for super::Descent {}
    // SAFETY: see above; three u32s.
    unsafe impl aya::Pod for super::Descended {}
}
