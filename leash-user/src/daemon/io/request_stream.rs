//! The request side of a connection: its bytes, who sent them, and the pidfds sent with them. A client names a
//! process to register by a pidfd attached to the request's line (SCM_RIGHTS): right in any pid
//! namespace, where a pid is a number of the client's. Reading with recvmsg keeps them; a plain
//! read would have the kernel drop them.
//!
//! A pidfd belongs to the line it was sent with, and only a `register` on that line that says
//! `"pidfd": true` takes it; one that no request took is closed as the next line is served. So
//! a request refused before it is read (over the uid's rate, say) cannot leave its pidfd to
//! the next one. The kernel hands descriptors over with the first byte of the message they
//! came with, and a recvmsg returns no data past that message: descriptors read with a chunk
//! belong to the last line that begins in it. At most [`MAX_WAITING`] wait; more are closed.
//!
//! The socket has SO_PASSCRED, so each read comes from one sender, whom the kernel names: a line
//! a process other than the one that connected sent (in whole or in part) is noted, and
//! refused when it is served (see `Strangers`).
//!
//! A descriptor that is not a pidfd ends the connection, and is closed apart (`disposal`): its
//! close may block. Each read is peeked at first, which says whether descriptors come with it
//! without putting any in the daemon's table (closing a copy would flush its file, and a FUSE
//! file's flush may never return): a read that brings some happens only once the disposal has
//! room for as many as a message can carry, and what is not taken of it is given back at once.
//! A read and its reservation run within one poll, on one of the runtime's two threads: two
//! messages' worth at most, whatever the number of connections.
//! An account whose descriptors wait there, their closes stuck, has further ones refused, and
//! its connection ended, before they are read.

use std::{
    collections::VecDeque,
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
};

use tokio::{
    io::{AsyncRead, Interest, ReadBuf},
    net::unix::OwnedReadHalf,
};

use leash_common::Account;

use super::disposal::{Disposal, Reservation};
use crate::{
    proc,
    sys::{self, SCM_MAX_FD},
};

/// Pidfds waiting for their requests, per connection.
pub(in crate::daemon) const MAX_WAITING: usize = 4;

/// The pidfds a connection sent that no request has taken yet, each with the number of the
/// line it came with (counted from 0).
#[derive(Clone, Default)]
pub(in crate::daemon) struct Pidfds(Arc<Mutex<VecDeque<(u64, OwnedFd)>>>);

impl Pidfds {
    fn waiting(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, OwnedFd)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pidfd that came with line `line`, if one did. Those of earlier lines, which no
    /// request took, are closed.
    pub(in crate::daemon) fn take(&self, line: u64) -> Option<OwnedFd> {
        let mut waiting = self.waiting();
        while waiting
            .front()
            .is_some_and(|(sent_with, _)| *sent_with < line)
        {
            waiting.pop_front();
        }
        match waiting.front() {
            Some((sent_with, _)) if *sent_with == line => waiting.pop_front().map(|(_, fd)| fd),
            _ => None,
        }
    }

    fn keep(&self, line: u64, pidfd: OwnedFd) {
        let mut waiting = self.waiting();
        if waiting.len() < MAX_WAITING {
            waiting.push_back((line, pidfd));
        } else {
            tracing::debug!("more pidfds than requests to take them: one closed");
        }
    }
}

/// The lines of a connection that a process other than the one that connected sent, in whole
/// or in part (a lease socket leaked to a child, or taken with `pidfd_getfd`): each range of
/// line numbers with the first such sender's pid (0: one in no pid namespace the daemon sees).
/// Pruned as lines are served.
#[derive(Clone, Default)]
pub(in crate::daemon) struct Strangers(Arc<Mutex<VecDeque<(u64, u64, u32)>>>);

impl Strangers {
    fn lines(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, u64, u32)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Who other than the host sent (part of) line `line`, if anyone did.
    pub(in crate::daemon) fn sender_of(&self, line: u64) -> Option<u32> {
        let mut lines = self.lines();
        while lines.front().is_some_and(|&(_, last, _)| last < line) {
            lines.pop_front();
        }
        match lines.front() {
            Some(&(first, _, sender)) if first <= line => Some(sender),
            _ => None,
        }
    }

    /// Lines `first..=last` came (in part) from `sender`.
    fn mark(&self, first: u64, last: u64, sender: u32) {
        let mut lines = self.lines();
        match lines.back_mut() {
            // Reads from strangers in a row, or within one line, are one range.
            Some((_, end, _)) if *end + 1 >= first => *end = (*end).max(last),
            _ => lines.push_back((first, last, sender)),
        }
    }
}

/// A connection's read half, read with recvmsg.
pub(in crate::daemon) struct RequestStream {
    half: OwnedReadHalf,
    pidfds: Pidfds,
    strangers: Strangers,
    /// The process that connected (its pid in the daemon's namespace).
    host: u32,
    /// Newlines read so far: the number of the line the next byte is in.
    newlines: u64,
    /// The client's account, whose room in the disposal its descriptors take.
    account: Account,
    disposal: Disposal,
}

impl RequestStream {
    /// The read half of a connection (with SO_PASSCRED set) of process `host`, of `account`:
    /// pidfds it sends go to `pidfds`, lines other processes send to `strangers`.
    pub(in crate::daemon) fn new(
        half: OwnedReadHalf,
        host: u32,
        pidfds: Pidfds,
        strangers: Strangers,
        account: Account,
        disposal: Disposal,
    ) -> Self {
        Self {
            half,
            pidfds,
            strangers,
            host,
            newlines: 0,
            account,
            disposal,
        }
    }

    /// The read half, once reading is over (to reunite it with its write half).
    pub(in crate::daemon) fn into_half(self) -> OwnedReadHalf {
        self.half
    }

    /// Counts the lines of `chunk`, just read from `sender`, notes them if the host did not
    /// send them, and files the descriptors that came with it under the last line that begins
    /// in it; those that are not pidfds go to the disposal, in `room`. Err: something that is
    /// not a pidfd.
    fn file(
        &mut self,
        chunk: &[u8],
        sender: Option<u32>,
        received: Vec<OwnedFd>,
        room: Reservation,
    ) -> io::Result<()> {
        let line = last_line_begun(self.newlines, chunk);
        // No credentials: sent before SO_PASSCRED was set, as the connection was made.
        if let Some(sender) = sender.filter(|&sender| sender != self.host)
            && !chunk.is_empty()
        {
            self.strangers.mark(self.newlines, line, sender);
        }
        self.newlines += newlines(chunk);
        let mut not_pidfds = Vec::new();
        for fd in received {
            if proc::pidfd_pid(fd.as_fd()).is_some() {
                self.pidfds.keep(line, fd);
            } else {
                not_pidfds.push(fd);
            }
        }
        if not_pidfds.is_empty() {
            return Ok(());
        }
        room.dispose(not_pidfds);
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a descriptor that is not a pidfd",
        ))
    }
}

/// Reads from `socket` into `buf` what [`sys::peek_carries_fds`] shows, once `disposal` has
/// room for the descriptors it brings, if it brings any: then into `received`, with the room
/// in `room` (for [`SCM_MAX_FD`] of them: how many is known only once they are read).
fn receive(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    account: Account,
    disposal: &Disposal,
    received: &mut Vec<OwnedFd>,
    room: &mut Option<Reservation>,
    sender: &mut Option<u32>,
) -> io::Result<usize> {
    let (peeked, carries) = sys::peek_carries_fds(socket, buf)?;
    *room = disposal.reserve(account, if carries { SCM_MAX_FD } else { 0 });
    if room.is_none() {
        tracing::debug!(
            account,
            "descriptors refused: too many wait to be closed already"
        );
        return Err(io::Error::other(
            "descriptors refused: too many of this account's wait to be closed",
        ));
    }
    let (read, sent_by) = sys::recv_with_fds_from(socket, &mut buf[..peeked], received)?;
    *sender = sent_by;
    Ok(read)
}

fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// The number of the last line that begins in `chunk`, read after `newlines_before` newlines
/// (or of the line it continues, if none begins in it). A newline that ends the chunk begins
/// the next line outside it.
fn last_line_begun(newlines_before: u64, chunk: &[u8]) -> u64 {
    let inner = &chunk[..chunk.len().saturating_sub(1)];
    newlines_before + newlines(inner)
}

impl AsyncRead for RequestStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let stream = this.half.as_ref();
            ready!(stream.poll_read_ready(cx))?;
            let mut received = Vec::new();
            let mut room = None;
            let mut sender = None;
            let (account, disposal) = (this.account, &this.disposal);
            let read = stream.try_io(Interest::READABLE, || {
                receive(
                    stream.as_fd(),
                    buf.initialize_unfilled(),
                    account,
                    disposal,
                    &mut received,
                    &mut room,
                    &mut sender,
                )
            });
            let chunk = match &read {
                Ok(read) => &buf.initialize_unfilled()[..*read],
                Err(_) => &[],
            };
            if let Some(room) = room {
                this.file(chunk, sender, received, room)?;
            }
            match read {
                Ok(read) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                // Not ready after all: try_io cleared the readiness; wait for it again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peek_tells_whether_descriptors_come_and_the_read_brings_them() {
        use std::os::unix::net::UnixStream;
        for passcred in [true, false] {
            let (ours, theirs) = UnixStream::pair().unwrap();
            if passcred {
                sys::set_passcred(ours.as_fd()).unwrap();
            }
            std::io::Write::write_all(&mut &theirs, b"plain\n").unwrap();
            let (pipe, _) = std::io::pipe().unwrap();
            leash_client::sys::send_with_fd(&theirs, b"with\n", pipe.as_fd()).unwrap();
            let mut buf = [0; 64];
            let (peeked, carries) = sys::peek_carries_fds(ours.as_fd(), &mut buf).unwrap();
            // The kernel stops after the message that carries descriptors.
            assert_eq!((&buf[..peeked], carries), (&b"plain\nwith\n"[..], true));
            let mut fds = Vec::new();
            let read = sys::recv_with_fds(ours.as_fd(), &mut buf[..peeked], &mut fds).unwrap();
            assert_eq!((read, fds.len()), (peeked, 1), "SO_PASSCRED {passcred}");
            std::io::Write::write_all(&mut &theirs, b"plain again\n").unwrap();
            let (peeked, carries) = sys::peek_carries_fds(ours.as_fd(), &mut buf).unwrap();
            assert_eq!((&buf[..peeked], carries), (&b"plain again\n"[..], false));
        }
    }

    #[test]
    fn descriptors_go_with_the_last_line_begun_in_their_chunk() {
        assert_eq!(last_line_begun(0, b"{\"id\":1}\n"), 0);
        assert_eq!(last_line_begun(0, b"{\"id\":1}\n{\"id\":2}\n"), 1);
        assert_eq!(last_line_begun(3, b"tail\n{\"id\":5"), 4);
        assert_eq!(last_line_begun(3, b"middle of line 3"), 3);
        assert_eq!(last_line_begun(3, b""), 3);
    }

    #[test]
    fn lines_a_stranger_sent_are_known_until_served() {
        let strangers = Strangers::default();
        strangers.mark(2, 2, 700);
        strangers.mark(3, 5, 701);
        strangers.mark(9, 9, 702);
        assert_eq!(strangers.sender_of(1), None);
        assert_eq!(strangers.sender_of(2), Some(700));
        assert_eq!(strangers.sender_of(4), Some(700), "one range with line 2's");
        assert_eq!(strangers.sender_of(6), None);
        assert_eq!(strangers.sender_of(9), Some(702));
        assert!(strangers.lines().len() == 1, "served ranges are forgotten");
    }

    #[test]
    fn a_pidfd_no_request_took_is_closed_when_a_later_line_is_served() {
        let pidfds = Pidfds::default();
        let fd = |_| OwnedFd::from(std::io::pipe().unwrap().0);
        pidfds.keep(2, fd(()));
        pidfds.keep(4, fd(()));
        assert!(pidfds.take(1).is_none(), "not line 1's");
        assert!(
            pidfds.take(3).is_none(),
            "line 2's is closed, not given to line 3"
        );
        assert!(pidfds.take(4).is_some());
        assert!(pidfds.waiting().is_empty());
    }
}
