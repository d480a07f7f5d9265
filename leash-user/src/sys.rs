//! The one module of leash-user that calls the kernel through `unsafe`: thin wrappers with
//! safe signatures. Everything else is safe code. (The host library has its own, for the one
//! call hosts need: starting a process held before exec.)

use std::{
    ffi::{CStr, CString, OsStr, OsString},
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use tokio::io::{Interest, unix::AsyncFd};

pub use leash_client::sys::{SpawnHeldError, spawn_held};

/// mount -t FSTYPE -o OPTIONS FSTYPE TARGET, for filesystems with no device (bpf), with the
/// filesystem's own options (e.g. `mode=0700`).
pub fn mount_with(
    fstype: &std::ffi::CStr,
    target: &Path,
    options: Option<&std::ffi::CStr>,
) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_bytes())?;
    let options = options.map_or(std::ptr::null(), |o| o.as_ptr().cast());
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call, or
    // null for no options.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            options,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the process's file mode creation mask to `mask`; returns the one it replaces. The mask
/// is the whole process's: change it only while no other thread makes files.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: umask takes a number, touches no memory of ours and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// The id of the group named `name` in the system's group database (getgrnam_r: /etc/group,
/// or whatever NSS is set up to ask). None if there is no such group.
pub fn group_id(name: &str) -> io::Result<Option<u32>> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut buffer = vec![0u8; 1024];
    loop {
        // SAFETY: zeroed group and null pointer are valid out-parameters; name is
        // NUL-terminated; buffer is valid for its length and outlives the call, and the
        // strings the result points into are not read.
        let (rc, found) = unsafe {
            let mut group: libc::group = std::mem::zeroed();
            let mut result: *mut libc::group = std::ptr::null_mut();
            let rc = libc::getgrnam_r(
                name.as_ptr(),
                &raw mut group,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &raw mut result,
            );
            (rc, (!result.is_null()).then_some(group.gr_gid))
        };
        match rc {
            0 => return Ok(found),
            // A group with many members needs more room; 1 MiB is more than any sane one.
            libc::ERANGE if buffer.len() < 1 << 20 => buffer.resize(buffer.len() * 4, 0),
            errno => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

unsafe extern "C" {
    /// The C library's environment: "NAME=VALUE" strings, up to a null pointer.
    static mut environ: *mut *mut libc::c_char;
}

/// Removes variable `name` from this process's environment and returns its value, once wiped
/// where /proc/PID/environ shows it. The kernel shows the block the process was started with,
/// which unsetenv leaves as it was: a secret there is readable by every process of the same
/// user for as long as this one runs. Call it before any other thread starts.
pub fn take_env_secret(name: &str) -> Option<OsString> {
    let prefix = format!("{name}=");
    let mut value = None;
    // SAFETY: no other thread runs (the caller's promise), so nothing changes the environment
    // meanwhile. Every entry of `environ` up to the null one is a NUL-terminated string of this
    // process's own, writable memory (the block the kernel set up on the stack, or one setenv
    // allocated); the bytes overwritten are the value's, before its NUL.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let bytes = CStr::from_ptr(*entry).to_bytes();
            if let Some(found) = bytes.strip_prefix(prefix.as_bytes()) {
                let length = found.len();
                value.get_or_insert_with(|| OsStr::from_bytes(found).to_owned());
                std::ptr::write_bytes((*entry).add(prefix.len()), 0, length);
            }
            entry = entry.add(1);
        }
        std::env::remove_var(name);
    }
    value
}

/// Whether `path` is the root of a mounted BPF filesystem (statfs's magic number).
pub fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out-parameter; path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut stat) };
    rc == 0 && stat.f_type as i64 == BPF_FS_MAGIC
}

/// `union bpf_attr` as BPF_MAP_*_BATCH commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries read per system call. A hash map bucket larger than this would fail with ENOSPC;
/// buckets hold a few entries.
const BATCH: usize = 4096;

/// A BPF hash map's descriptor, checked to hold keys `K` and values `V`, for batch reads.
pub struct HashMapReader<K, V> {
    fd: OwnedFd,
    entry: std::marker::PhantomData<(K, V)>,
}

impl<K: aya::Pod, V: aya::Pod> HashMapReader<K, V> {
    pub fn new(map: &aya::maps::MapData) -> io::Result<Self> {
        let info = map.info().map_err(io::Error::other)?;
        let is_hash = matches!(info.map_type(), Ok(aya::maps::MapType::Hash));
        if !is_hash
            || info.key_size() as usize != size_of::<K>()
            || info.value_size() as usize != size_of::<V>()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a hash map of these key and value types",
            ));
        }
        Ok(Self {
            fd: map.fd().as_fd().try_clone_to_owned()?,
            entry: std::marker::PhantomData,
        })
    }

    /// Every entry, read with BPF_MAP_LOOKUP_BATCH: one system call per 4096 entries, where
    /// walking keys costs two per entry, and each bucket read whole under its lock, so entries
    /// deleted meanwhile never restart the walk. `Unsupported` before Linux 5.6.
    pub fn entries(&self) -> io::Result<Vec<(K, V)>> {
        let call = |attr: &mut BatchAttr| {
            // SAFETY: `lookup_batch` hands over a BPF_MAP_LOOKUP_BATCH attr whose pointers are
            // valid for the call, for as many entries of the map's key and value sizes as its
            // count says.
            unsafe { bpf(BPF_MAP_LOOKUP_BATCH, attr) }.map(drop)
        };
        // SAFETY: `call` is the system call itself, which keeps the contract: the kernel
        // writes `count` back, and that many entries, wherever it succeeds or says ENOENT.
        unsafe { read_batches(self.fd.as_raw_fd(), call) }
    }
}

/// Every entry of the hash map `fd` holds, read in batches, each read by `call` (the bpf(2)
/// system call, or a fake in the tests).
///
/// # Safety
///
/// As for [`lookup_batch`]: `call` keeps the kernel's contract.
unsafe fn read_batches<K: aya::Pod, V: aya::Pod>(
    fd: RawFd,
    mut call: impl FnMut(&mut BatchAttr) -> io::Result<()>,
) -> io::Result<Vec<(K, V)>> {
    let mut entries = Vec::new();
    let mut keys: Vec<K> = Vec::with_capacity(BATCH);
    let mut values: Vec<V> = Vec::with_capacity(BATCH);
    // The position: for hash maps, a bucket index the kernel hands back. None: the start.
    let mut position = None;
    loop {
        // SAFETY: the caller's contract for `call`; keys and values are empty, with room.
        let (error, next) =
            unsafe { lookup_batch(fd, position, &mut keys, &mut values, &mut call) };
        let filled = keys.len();
        entries.extend(keys.drain(..).zip(values.drain(..)));
        match error {
            // Never seen (the end comes as ENOENT), but it must not loop.
            None if filled == 0 => return Ok(entries),
            None => {}
            // The end of the map: the last chunk came with it.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(entries),
            Some(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Some(e) => return Err(e),
        }
        position = Some(next);
    }
}

/// One BPF_MAP_LOOKUP_BATCH of map `fd` from `position` (None: from the start), made by
/// `call`: up to [`BATCH`] entries into `keys` and `values`, which are empty, with room for
/// that many. Returns the call's error, if it failed, and the position to go on from.
///
/// The kernel writes back how many entries it filled only where it filled them: when the
/// call succeeds, and when it fails with ENOENT (the end of the map, which comes with the last
/// entries). Any other error, EINVAL from a kernel without batch commands (before 5.6) above
/// all, leaves the count as it was sent, the room offered, over entries nobody wrote.
///
/// # Safety
///
/// `call` keeps that contract: where it returns Ok or ENOENT, it has written the attr's
/// `count` back, and that many whole entries where `keys` and `values` point.
unsafe fn lookup_batch<K: aya::Pod, V: aya::Pod>(
    fd: RawFd,
    position: Option<u32>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
    call: impl FnOnce(&mut BatchAttr) -> io::Result<()>,
) -> (Option<io::Error>, u32) {
    debug_assert!(keys.is_empty() && values.is_empty());
    let room = BATCH.min(keys.capacity()).min(values.capacity());
    let in_batch = position.unwrap_or(0);
    let mut next = 0u32;
    let mut attr = BatchAttr {
        in_batch: if position.is_some() {
            &raw const in_batch as u64
        } else {
            0
        },
        out_batch: &raw mut next as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: room as u32,
        map_fd: fd as u32,
        ..BatchAttr::default()
    };
    // The attr is a valid bpf_attr prefix for BPF_MAP_LOOKUP_BATCH: in_batch and next outlive
    // the call; keys and values have room for `count` entries of K and V, the sizes the map's
    // keys and values were checked to have (HashMapReader::new).
    let error = call(&mut attr).err();
    let filled = match &error {
        None => attr.count as usize,
        Some(e) if e.raw_os_error() == Some(libc::ENOENT) => attr.count as usize,
        Some(_) => 0,
    };
    let filled = filled.min(room);
    // SAFETY: `call` wrote `filled` whole entries (the caller's contract; no count, and so
    // none, after any other error), within the capacity; K and V are plain data.
    unsafe {
        keys.set_len(filled);
        values.set_len(filled);
    }
    (error, next)
}

/// A process file descriptor: names one process for good, so a signal sent through it can never
/// reach a process that later got the same pid.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// A pidfd for process `pid`. A shortage of descriptors or memory is waited out a little
    /// (see [`retry_on_shortage`]) and then returned as the error it is: it says nothing about
    /// the process, which only ESRCH (and EINVAL or ENOENT, for a thread's id) does.
    pub fn open(pid: u32) -> io::Result<Self> {
        retry_on_shortage(|| leash_client::sys::pidfd_open(pid).map(Self))
    }

    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Pidfd {
    /// Whether the process has finished exiting (a zombie, or reaped): the pidfd polls
    /// readable then. Does not wait.
    pub fn has_exited(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout.
        let rc = unsafe { libc::poll(&mut poll, 1, 0) };
        rc == 1 && poll.revents & libc::POLLIN != 0
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Signals taken from a descriptor (signalfd) instead of by their default action: `leash run`
/// forwards them to its tree. They are blocked in the thread that makes it, and so in every
/// thread it starts later, and in every child it forks, unless [`SignalFd::unblock_in`].
pub struct SignalFd {
    fd: OwnedFd,
    set: libc::sigset_t,
}

impl SignalFd {
    /// Blocks `signals` and opens a non-blocking signalfd for them. Make it before any thread
    /// is started: one started earlier would still take them the default way.
    pub fn block(signals: &[i32]) -> io::Result<Self> {
        // SAFETY: a zeroed sigset is valid storage for sigemptyset; the set outlives the calls
        // that read it, and signalfd returns a new descriptor or -1.
        let (fd, set) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for &signal in signals {
                if libc::sigaddset(&raw mut set, signal) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            let fd = libc::signalfd(-1, &raw const set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            (fd, set)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, set })
    }

    /// Unblocks the signals again in the child `command` forks, before it execs: a mask is
    /// inherited across fork and exec, and a command that could not be stopped by SIGTERM
    /// would be another command.
    pub fn unblock_in(&self, command: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let set = self.set;
        let unblock = move || -> io::Result<()> {
            // SAFETY: sigprocmask is async-signal-safe and allocates nothing; `set` is a copy
            // owned by the closure. The child has one thread, whose mask this is.
            if unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut()) }
                != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: the closure makes one async-signal-safe call and allocates nothing.
        unsafe { command.pre_exec(unblock) };
    }

    /// The next signal that came, if one did (never waits).
    pub fn take(&self) -> io::Result<Option<i32>> {
        // SAFETY: plain data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = size_of::<libc::signalfd_siginfo>();
        // SAFETY: info is valid for `size` bytes.
        let read = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut info).cast(), size) };
        match read {
            n if n == size as isize => Ok(i32::try_from(info.ssi_signo).ok()),
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => Ok(None),
            -1 => Err(io::Error::last_os_error()),
            _ => Err(io::Error::other("a short read from a signalfd")),
        }
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Waits until one of `fds` is readable; returns the index of the first that is.
pub fn wait_readable(fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `polls` is valid for its length; no timeout.
        let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if let Some(ready) = polls.iter().position(|p| p.revents != 0) {
            return Ok(ready);
        }
    }
}

/// SO_PEERPIDFD (Linux 6.5): a pidfd for the process that connected a Unix socket.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd naming the peer of a connected Unix socket. The kernel takes it from the socket
/// itself, so a pid recycled since the connect cannot be confused with the peer; on kernels
/// without SO_PEERPIDFD, falls back to opening `pid`.
pub fn peer_pidfd(socket: BorrowedFd<'_>, pid: u32) -> io::Result<Pidfd> {
    let mut fd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just returned this fd, and nothing else owns it.
        return Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        // A kernel without SO_PEERPIDFD: the pid, read from the same socket just before, is
        // the best there is.
        Some(libc::ENOPROTOOPT) => Pidfd::open(pid),
        // Any other error is returned, never answered by opening `pid`: the peer may have
        // exited (EINVAL, ESRCH) and its pid named another process since. Nor is a shortage
        // waited out here: a connection is refused at once, for its client to try again,
        // rather than hold up a thread of the daemon for each one.
        _ => Err(error),
    }
}

/// The errors that say the system or this process is short of something for now (file
/// descriptors: EMFILE, ENFILE; memory: ENOMEM, ENOBUFS), not that the call was wrong or its
/// object is gone.
pub fn is_shortage(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS)
    )
}

/// Pauses between the tries of [`retry_on_shortage`]: 15 ms in all.
const SHORTAGE_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(1),
    std::time::Duration::from_millis(2),
    std::time::Duration::from_millis(4),
    std::time::Duration::from_millis(8),
];

/// Runs `call` again, after a short pause, while it fails for a shortage (see
/// [`is_shortage`]): another task may close a descriptor or free memory meanwhile. The last
/// error when the shortage lasts. The pauses block the thread, 15 ms at most, and only while
/// descriptors or memory are short.
pub fn retry_on_shortage<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    for pause in SHORTAGE_PAUSES {
        match call() {
            Err(e) if is_shortage(&e) => std::thread::sleep(pause),
            done => return done,
        }
    }
    call()
}

/// Fills `bytes` from the kernel's random number generator (getrandom(2)): no descriptor is
/// needed, so it works when a process is out of them, where reading /dev/urandom does not.
pub fn random_bytes(bytes: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: `rest` is valid for writes of its length.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += got as usize;
    }
    Ok(())
}

/// The limits on open file descriptors (RLIMIT_NOFILE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit before it was raised.
    pub was: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit on open file descriptors to the hard limit, which needs no
/// privilege. The soft limit is often 1024 while the hard one is far higher: kept low for
/// programs that still use select(2), which this one does not.
pub fn raise_fd_limit() -> io::Result<FdLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit, read above, with the soft limit raised to the
        // hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(FdLimit {
        was,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// Registers an owned descriptor with tokio's reactor, to await its readability (a pidfd
/// polls readable when its process exits; a ring buffer when records wait).
pub fn async_readable<T: Into<OwnedFd>>(fd: T) -> io::Result<AsyncFd<OwnedFd>> {
    let fd: OwnedFd = fd.into();
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open and is never replaced until the
    // AsyncFd is dropped, so as_raw_fd always returns the same open descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}

/// The most descriptors one message may carry (the kernel's SCM_MAX_FD): the control buffer
/// has room for them all, so the kernel never has to close any for want of room.
pub const SCM_MAX_FD: usize = 253;

/// Room for a message's control data: every descriptor it may carry, and the sender's
/// credentials beside them (SO_PASSCRED; without room for both, the kernel truncates).
const CONTROL_SPACE: usize = {
    // SAFETY: CMSG_SPACE only computes a size.
    let rights = unsafe { libc::CMSG_SPACE((SCM_MAX_FD * size_of::<RawFd>()) as u32) };
    // SAFETY: as above.
    let credentials = unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) };
    (rights + credentials) as usize
};

/// Reads from the Unix socket `socket` into `buf` (recvmsg), and the descriptors sent with
/// what was read (SCM_RIGHTS) into `fds`, close-on-exec. A plain read() would have the kernel
/// close them unseen; so would a control buffer too small for them, and the kernel would
/// close them here, in the calling thread, where a close may block (a TCP socket lingering on
/// a send queue its peer never reads waits out its linger). Should the control data be
/// truncated all the same, what did arrive is in `fds` and the read is an error.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    recvmsg_rights(socket, buf, 0, fds).map(|(read, _)| read)
}

/// [`recv_with_fds`], and the process that sent what was read: its pid in this process's pid
/// namespace (0 if it has none here), from SCM_CREDENTIALS, which the kernel attaches to every
/// message sent while the socket has SO_PASSCRED (see [`set_passcred`]) and never merges into
/// one read with another sender's. None: no credentials came (sent before SO_PASSCRED was set).
pub fn recv_with_fds_from(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, Option<u32>)> {
    recvmsg_rights(socket, buf, 0, fds)
}

/// Has the kernel say who sent each message read from the Unix socket `socket` from now on
/// (SO_PASSCRED): the credentials of the sending process, which no sender can forge.
pub fn set_passcred(socket: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid descriptor and a c_int option value that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What [`recv_with_fds`] would read now, without reading it (MSG_PEEK): the bytes, and the
/// descriptors that came with them into `copies`. Reading as many bytes next reads the same
/// messages (the kernel stops at the first one that carries descriptors, peeking or not), so
/// the descriptors it brings are of the same files. Those in `copies` are copies the kernel
/// makes of the queued ones, which keep their files open: closing a copy is never the last
/// close of its file, and cannot block.
pub fn peek_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    copies: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    recvmsg_rights(socket, buf, libc::MSG_PEEK, copies).map(|(read, _)| read)
}

fn recvmsg_rights(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, Option<u32>)> {
    #[repr(C)]
    union Control {
        header: libc::cmsghdr,
        bytes: [u8; CONTROL_SPACE],
    }
    let mut control = Control {
        bytes: [0; CONTROL_SPACE],
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = (&raw mut control).cast();
    message.msg_controllen = CONTROL_SPACE as _;
    // SAFETY: message points at iov (over buf) and control, both alive for the call.
    let read = unsafe {
        libc::recvmsg(
            socket.as_raw_fd(),
            &raw mut message,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT | flags,
        )
    };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sender = None;
    // SAFETY: the kernel filled message.msg_control up to msg_controllen; the CMSG_* macros
    // walk the headers within it, each SCM_RIGHTS payload holds whole descriptors, new to this
    // process and owned by nothing else, and an SCM_CREDENTIALS payload is one ucred.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const message);
        while !header.is_null() {
            let data = libc::CMSG_DATA(header);
            let payload = (*header).cmsg_len as usize - (data as usize - header as usize);
            match ((*header).cmsg_level, (*header).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..payload / size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS)
                    if payload >= size_of::<libc::ucred>() =>
                {
                    let credentials = std::ptr::read_unaligned(data.cast::<libc::ucred>());
                    sender = Some(credentials.pid as u32);
                }
                _ => {}
            }
            header = libc::CMSG_NXTHDR(&raw const message, header);
        }
    }
    if message.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control data truncated: descriptors were lost",
        ));
    }
    Ok((read as usize, sender))
}

/// Makes the close of socket `fd` abortive (SO_LINGER on, 0 s): it resets the connection
/// instead of waiting, for as long as the socket's own linger says, for a peer to take what
/// is queued. Fails with ENOTSOCK for anything but a socket.
pub fn set_abortive_close(fd: BorrowedFd<'_>) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid struct linger for the call, and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Shuts socket `fd` down both ways: on a Unix stream socket, the peer can queue nothing more
/// (its sends fail with EPIPE).
pub fn shutdown(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: shutdown takes numbers only.
    let rc = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The bytes queued unread on socket `fd` (SIOCINQ). On a Unix stream socket every message
/// has a byte at least, so 0 means that no descriptor waits there either.
pub fn queued_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD (SIOCINQ) writes one int, into `queued`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &raw mut queued) };
    if rc == 0 {
        Ok(usize::try_from(queued).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Pidfd {
    /// Takes `fd` as a pidfd. The caller has checked that it is one (its fdinfo has a `Pid:`
    /// line); anything else fails where a pidfd is used, as EBADF or EINVAL.
    pub fn from_checked(fd: OwnedFd) -> Self {
        Self(fd)
    }
}

impl From<Pidfd> for OwnedFd {
    fn from(pidfd: Pidfd) -> Self {
        pidfd.0
    }
}

/// `union bpf_attr` as BPF_PROG_LOAD reads it, up to `attach_prog_fd` (Linux 5.5).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    _pad: u32,
}

/// bpf(2): `command` with `attr`; returns what the call returned (a new descriptor, for the
/// commands that make one).
///
/// # Safety
///
/// `attr` is the prefix of `union bpf_attr` that `command` reads, and every pointer in it is
/// valid (for reads, or for the writes the command makes) for the duration of the call.
unsafe fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut T, size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A descriptor a bpf(2) command returned: new, and owned by nothing else.
fn new_bpf_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;
const BPF_MODIFY_RETURN: u32 = 26;

/// What the verifier said of a program it refused, beside the errno.
#[derive(Debug)]
pub struct LoadError {
    pub error: io::Error,
    pub log: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        let log = self.log.trim();
        if !log.is_empty() {
            // The end of the log says why.
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            write!(f, "; verifier log, last lines:")?;
            for line in tail.iter().rev() {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// BPF_PROG_LOAD of a tracing program of attach type BPF_MODIFY_RETURN (fmod_ret) on the
/// kernel function whose BTF id (in vmlinux) is `attach_btf_id`. aya 0.14 cannot load this
/// type. A refusal is retried once with the verifier's log, which the error carries.
pub fn load_fmod_ret(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &std::ffi::CStr,
    attach_btf_id: u32,
) -> Result<OwnedFd, LoadError> {
    load_tracing(name, insns, license, BPF_MODIFY_RETURN, attach_btf_id)
}

/// BPF_PROG_LOAD of a BTF-typed tracepoint program (tp_btf) on the tracepoint whose
/// `btf_trace_*` typedef has the BTF id `attach_btf_id` in vmlinux: what `leash doctor` loads
/// and attaches to see that the kernel takes the programs' kind.
pub fn load_tp_btf(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &std::ffi::CStr,
    attach_btf_id: u32,
) -> Result<OwnedFd, LoadError> {
    load_tracing(name, insns, license, BPF_TRACE_RAW_TP, attach_btf_id)
}

/// BPF_PROG_LOAD of a tracing program of `expected_attach_type`.
fn load_tracing(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &std::ffi::CStr,
    expected_attach_type: u32,
    attach_btf_id: u32,
) -> Result<OwnedFd, LoadError> {
    let mut prog_name = [0u8; 16];
    // 15 bytes at most, and NUL-terminated: the kernel refuses a name without its NUL.
    let shown = name.len().min(15);
    prog_name[..shown].copy_from_slice(&name.as_bytes()[..shown]);
    let load = |log: &mut Vec<u8>| {
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_TRACING,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name,
            expected_attach_type,
            attach_btf_id,
            ..ProgLoadAttr::default()
        };
        // SAFETY: attr is a valid bpf_attr prefix for BPF_PROG_LOAD; insns (8-byte
        // instructions, insn_cnt of them), license (NUL-terminated) and log (log_size bytes,
        // written by the kernel) outlive the call.
        unsafe { bpf(BPF_PROG_LOAD, &mut attr) }.map(new_bpf_fd)
    };
    match load(&mut Vec::new()) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            let mut log = vec![0u8; 1 << 20];
            match load(&mut log) {
                Ok(fd) => Ok(fd),
                Err(error) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    Err(LoadError {
                        error,
                        log: String::from_utf8_lossy(&log[..end]).into_owned(),
                    })
                }
            }
        }
    }
}

/// Attaches a loaded tracing program (fentry, fexit, fmod_ret) where its load named, through
/// BPF_RAW_TRACEPOINT_OPEN with no name: the way that works on every kernel from Linux 5.5
/// (BPF_LINK_CREATE came to tracing programs later; this one attached on 5.10, 6.1 and 6.12).
/// The descriptor returned is a BPF link (5.7): it can be pinned, and the program stays
/// attached while the link or its pin lives.
pub fn attach_tracing(program: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct RawTracepointAttr {
        name: u64,
        prog_fd: u32,
        _pad: u32,
    }
    let mut attr = RawTracepointAttr {
        name: 0,
        prog_fd: program.as_raw_fd() as u32,
        _pad: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_RAW_TRACEPOINT_OPEN (a null name).
    unsafe { bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr) }.map(new_bpf_fd)
}

/// BPF_OBJ_PIN: pins a BPF object (here a link) at `path` on a BPF filesystem.
pub fn pin_object(object: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    #[repr(C)]
    struct PinAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let path = CString::new(path.as_os_str().as_bytes())?;
    let mut attr = PinAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: object.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_OBJ_PIN; path is NUL-terminated and
    // outlives the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// CLOCK_BOOTTIME in nanoseconds: the clock of the kernel's task start times and of the
/// programs' `bpf_ktime_get_boot_ns`.
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// CLOCK_MONOTONIC in nanoseconds: to compare a moment here with one another process took
/// (std's `Instant` is that clock, but opaque).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into; both clocks used here always exist.
    unsafe { libc::clock_gettime(clock, &raw mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Sets the calling thread's nice value (lower runs first; below 0 needs CAP_SYS_NICE).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes numbers only; on Linux PRIO_PROCESS with a thread id sets
    // that one thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the memory the allocator holds free back to the system (glibc keeps what a burst of
/// work freed, so the daemon's size would otherwise stay at its peak).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_ITER_CREATE: libc::c_long = 33;

/// A new descriptor of the BPF link `id`: it holds the link whatever becomes of the one that
/// made it (aya's own link handles do not lend theirs).
pub fn bpf_link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct GetFdById {
        link_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = GetFdById {
        link_id: id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command, with no pointers.
    unsafe { bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) }.map(new_bpf_fd)
}

/// A new iterator of the iterator link `link`: reading it to its end runs the program once per
/// object (and once more with none).
pub fn bpf_iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    #[repr(C)]
    struct IterCreate {
        link_fd: u32,
        flags: u32,
    }
    let mut attr = IterCreate {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command, with no pointers.
    unsafe { bpf(BPF_ITER_CREATE, &mut attr) }.map(|fd| new_bpf_fd(fd).into())
}

/// BPF_MAP_CREATE of the smallest array map (one 4-byte entry), closed at once: whether this
/// process may use the bpf(2) system call at all. EPERM without the privileges (CAP_BPF or
/// CAP_SYS_ADMIN), ENOSYS on a kernel built without CONFIG_BPF_SYSCALL.
pub fn bpf_map_create_probe() -> io::Result<()> {
    #[repr(C)]
    struct MapCreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_MAP_CREATE; it holds no pointers.
    unsafe { bpf(BPF_MAP_CREATE, &mut attr) }.map(|fd| drop(new_bpf_fd(fd)))
}

/// The pid of the process at the other end of a connected Unix socket, as this process's pid
/// namespace numbers it (SO_PEERCRED): 0 when that process is outside this namespace.
pub fn peer_pid(socket: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: a zeroed ucred is a valid out-parameter.
    let mut credentials: libc::ucred = unsafe { std::mem::zeroed() };
    let mut size = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: credentials and size are valid for writes of size bytes for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut size,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(credentials.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_is_retried_and_then_returned() {
        let mut calls = 0;
        let result: io::Result<()> = retry_on_shortage(|| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::EMFILE))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EMFILE));
        assert_eq!(calls, SHORTAGE_PAUSES.len() + 1);

        let mut calls = 0;
        let result = retry_on_shortage(|| {
            calls += 1;
            match calls {
                1 => Err(io::Error::from_raw_os_error(libc::ENFILE)),
                _ => Ok(calls),
            }
        });
        assert_eq!(result.unwrap(), 2, "succeeds once descriptors are back");
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        let mut calls = 0;
        let result: io::Result<()> = retry_on_shortage(|| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::ESRCH))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ESRCH));
        assert_eq!(calls, 1);
    }

    /// A kernel without batch commands (before 5.6): EINVAL, with nothing written back.
    fn no_batches(_: &mut BatchAttr) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// A fake BPF_MAP_LOOKUP_BATCH over `map`, at most `per_call` entries a call, that hands
    /// back the index to go on from as its position and ends with ENOENT, as the kernel does.
    fn fake_batches(
        map: &[(u32, u64)],
        per_call: usize,
    ) -> impl FnMut(&mut BatchAttr) -> io::Result<()> {
        move |attr| {
            let from = match attr.in_batch {
                0 => 0,
                // SAFETY: a position this fake handed back, read through the pointer
                // lookup_batch sets.
                position => (unsafe { *(position as *const u32) }) as usize,
            };
            let take = per_call.min(attr.count as usize).min(map.len() - from);
            for (i, &(key, value)) in map[from..from + take].iter().enumerate() {
                // SAFETY: lookup_batch gave room for `count` entries, and take <= count.
                unsafe {
                    (attr.keys as *mut u32).add(i).write(key);
                    (attr.values as *mut u64).add(i).write(value);
                }
            }
            attr.count = take as u32;
            // SAFETY: out_batch points at lookup_batch's position, a u32.
            unsafe { *(attr.out_batch as *mut u32) = (from + take) as u32 };
            if from + take == map.len() {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn a_failed_batch_read_fills_nothing() {
        let mut keys = Vec::<u32>::with_capacity(BATCH);
        let mut values = Vec::<u64>::with_capacity(BATCH);
        // SAFETY: the fake writes nothing, and fails with neither Ok nor ENOENT.
        let (error, _) = unsafe { lookup_batch(-1, None, &mut keys, &mut values, no_batches) };
        assert_eq!(error.unwrap().raw_os_error(), Some(libc::EINVAL));
        // The count still says BATCH, as sent: none of those entries was written.
        assert!(keys.is_empty() && values.is_empty());
    }

    #[test]
    fn a_kernel_without_batch_reads_is_unsupported() {
        // SAFETY: as above.
        let result = unsafe { read_batches::<u32, u64>(-1, no_batches) };
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::Unsupported);
    }

    #[test]
    fn batches_are_read_to_the_end_of_the_map() {
        let map: Vec<(u32, u64)> = (0..7).map(|i| (i, u64::from(i) * 100)).collect();
        for per_call in [1, 3, 7, 10] {
            // SAFETY: the fake writes `count` entries and the count, on Ok and ENOENT alike.
            let read = unsafe { read_batches::<u32, u64>(-1, fake_batches(&map, per_call)) };
            assert_eq!(read.unwrap(), map, "{per_call} a call");
        }
        // SAFETY: as above.
        let empty = unsafe { read_batches::<u32, u64>(-1, fake_batches(&[], 4)) };
        assert_eq!(empty.unwrap(), []);
    }

    #[test]
    fn random_bytes_fill_the_buffer() {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        random_bytes(&mut a).unwrap();
        random_bytes(&mut b).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; 32]);
    }

    #[test]
    fn the_soft_fd_limit_is_raised_to_the_hard_one() {
        let limit = raise_fd_limit().unwrap();
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.was <= limit.soft);
        assert_eq!(raise_fd_limit().unwrap().was, limit.soft, "it stays raised");
    }
}
