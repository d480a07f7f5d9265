//! The one module of leash-user that calls the kernel through `unsafe`: thin wrappers with
//! safe signatures, one file per family of system calls. Everything else is safe code. (The
//! host library has its own, for the one call hosts need: starting a process held before exec.)

mod bpf;
mod bpf_map;
mod fs;
mod pidfd;
mod poll;
mod process;
mod pty;
mod reserve;
mod signal;
mod socket;

pub use bpf::{
    AttachKind, LoadError, attach_tracing, bpf_iter_create, bpf_link_fd_by_id, bpf_link_program_id,
    bpf_map_create_probe, bpf_prog_fd_by_id, bpf_prog_recursion_misses, load_by_btf_id, pin_object,
    task_storage_get, task_storage_set, zeroed_insn,
};
pub use bpf_map::HashMapReader;
pub use fs::{is_bpffs, mount_with};
pub use leash_client::sys::{SpawnHeldError, spawn_held};
pub use pidfd::{Pidfd, is_shortage, retry_on_shortage};
pub use poll::{async_readable, wait_readable};
pub use process::{
    FdLimit, Unpreempted, boottime_ns, effective_uid, group_id, monotonic_ns, raise_fd_limit,
    random_bytes, release_free_memory, set_thread_nice, take_env_secret, umask,
};
pub use pty::{controlling_terminal_in, open_pty};
pub use reserve::{keep_reserve, refill_reserve, with_reserve};
pub use signal::{SignalFd, stop_until_continued};
pub use socket::{
    SCM_MAX_FD, accept_waiting, is_unix_socket, peek_carries_fds, peer_pid, peer_pidfd,
    queued_bytes, recv_with_fds, recv_with_fds_from, send_fds, set_abortive_close, set_passcred,
    shutdown,
};
