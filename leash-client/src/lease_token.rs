//! Lease tokens as `leash exec` takes them: from an environment variable or a descriptor.

use std::io::{self, Read};

/// The environment variable `leash exec` takes a lease token from when it is not given a
/// descriptor (`--lease-fd`). The shim removes it from the environment of the command it
/// runs, so the agent and the tools it starts do not inherit it.
pub const LEASE_ENV: &str = "LEASH_LEASE";

/// The most bytes [`read_lease_token`] reads (a token is 32).
pub const MAX_TOKEN_BYTES: usize = 256;

/// Reads a lease token as `leash exec --lease-fd` takes it: up to the first newline or the end
/// of the stream, at most [`MAX_TOKEN_BYTES`], without surrounding white space. Empty is an
/// error.
pub fn read_lease_token(mut reader: impl Read) -> io::Result<String> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut buffer = [0u8; MAX_TOKEN_BYTES + 1];
    let mut filled = 0;
    let end = loop {
        if let Some(newline) = buffer[..filled].iter().position(|&b| b == b'\n') {
            break newline;
        }
        if filled > MAX_TOKEN_BYTES {
            return Err(invalid("the lease token is too long"));
        }
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break filled,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let token = std::str::from_utf8(&buffer[..end])
        .map_err(|_| invalid("the lease token is not UTF-8"))?
        .trim();
    if token.is_empty() {
        return Err(invalid("no lease token (empty)"));
    }
    Ok(token.to_owned())
}
