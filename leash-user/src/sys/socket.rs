//! Unix sockets: descriptors and credentials passed with messages, the peer's identity, and
//! how a connection ends.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use super::Pidfd;

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

/// What [`recv_with_fds`] would read now, without reading it (MSG_PEEK): the bytes, and
/// whether descriptors came with them. Reading as many bytes next reads the same messages (the
/// kernel stops at the first one that carries descriptors, peeking or not). None of those
/// descriptors is put in this process's table: the control buffer has no room for one (none
/// at all, or just the sender's credentials where the socket has SO_PASSCRED, which the kernel
/// then always gives first), so the kernel says it had descriptors to give (MSG_CTRUNC) and
/// drops its own references to them, the queued ones still holding their files. A copy in the
/// table would not do: every close(2) of a descriptor flushes its file, and a FUSE file's
/// flush waits on its server, which need never answer.
pub fn peek_carries_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, bool)> {
    #[repr(C)]
    union Control {
        header: libc::cmsghdr,
        bytes: [u8; CREDENTIALS_SPACE],
    }
    let mut control = Control {
        bytes: [0; CREDENTIALS_SPACE],
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // No control buffer at all without SO_PASSCRED.
    let room = if passes_credentials(socket)? {
        CREDENTIALS_SPACE
    } else {
        0
    };
    let mut message = message_over(&mut iov, (&raw mut control).cast(), room);
    // SAFETY: message points at iov (over buf) and, if at all, control, both alive for the
    // call; the control buffer has no room for a descriptor, so the kernel installs none.
    let read = unsafe {
        libc::recvmsg(
            socket.as_raw_fd(),
            &raw mut message,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((read as usize, message.msg_flags & libc::MSG_CTRUNC != 0))
}

/// Room for a message's credentials alone (SO_PASSCRED).
const CREDENTIALS_SPACE: usize =
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) } as usize;

/// Whether `socket` has SO_PASSCRED set.
fn passes_credentials(socket: BorrowedFd<'_>) -> io::Result<bool> {
    let mut on: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: on and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw mut on).cast(),
            &raw mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(on != 0)
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
    let mut message = message_over(&mut iov, (&raw mut control).cast(), CONTROL_SPACE);
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

/// A message header over the one buffer `iov` and `room` bytes of control data at `control`
/// (none if 0). The caller keeps both alive, and in place, for as long as it is used.
fn message_over(iov: &mut libc::iovec, control: *mut libc::c_void, room: usize) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zeroed is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iov;
    message.msg_iovlen = 1;
    if room > 0 {
        message.msg_control = control;
        message.msg_controllen = room as _;
    }
    message
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

/// Sends one byte and `fds` (at most [`SCM_MAX_FD`]) over the Unix socket `socket` as one
/// message, without waiting for room (MSG_DONTWAIT: EAGAIN when there is none). While the
/// message is queued it keeps the files open: the sender may close its own descriptors at
/// once, and that close is not their last.
pub fn send_fds(socket: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    #[repr(C)]
    union Control {
        header: libc::cmsghdr,
        bytes: [u8; CONTROL_SPACE],
    }
    assert!(
        fds.len() <= SCM_MAX_FD,
        "at most SCM_MAX_FD descriptors a message"
    );
    let mut control = Control {
        bytes: [0; CONTROL_SPACE],
    };
    let byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr().cast_mut().cast(),
        iov_len: 1,
    };
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let payload = size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size; at most SCM_MAX_FD descriptors fit CONTROL_SPACE.
    let room = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let message = message_over(&mut iov, (&raw mut control).cast(), room);
    // SAFETY: the control buffer has room for one header and `payload` bytes (checked above);
    // CMSG_FIRSTHDR and CMSG_DATA point inside it. `message` points at iov and control, both
    // alive for the call.
    let sent = unsafe {
        let header = libc::CMSG_FIRSTHDR(&raw const message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(header), payload);
        libc::sendmsg(
            socket.as_raw_fd(),
            &raw const message,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a Unix socket (of any type, listening or not).
pub fn is_unix_socket(fd: BorrowedFd<'_>) -> bool {
    let mut domain: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: domain and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&raw mut domain).cast(),
            &raw mut len,
        )
    };
    rc == 0 && domain == libc::AF_UNIX
}

/// The next connection waiting on the listening socket `fd`, without waiting for one
/// (close-on-exec). Fails with EAGAIN when none waits, and EINVAL if `fd` is not listening.
pub fn accept_waiting(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: no address is asked for; the kernel returns a new descriptor or -1.
    let accepted = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if accepted < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(accepted) })
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
