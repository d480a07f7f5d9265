//! Who a client is, beyond the uid it connected as: the account its trees, members, connections
//! and requests are charged to, and the pid namespaces it runs in.
//!
//! - Account: a user's own uid, for a client in the initial user namespace. For one in a user
//!   namespace of its own (a rootless container, whose processes run as the user's subordinate
//!   uids), the uid that owns the outermost such namespace: a user with 65,536 subordinate uids
//!   is one user, and so are all their containers. A namespace root owns (an unprivileged pod,
//!   a system container) is charged as itself, apart from root and from the other such ones.
//! - Pid namespaces: a client sees and acts on the trees registered from its own pid namespace
//!   or from those nested in it (see `auth::may_see`).
//!
//! A client in the daemon's pid namespace and the initial user namespace (the usual case) is
//! told by /proc alone. Any other is asked about in the kernel (kernel::Whois), since the
//! namespace links in /proc need the right to trace the process: one question at a time, each
//! a pass over the machine's tasks.

use std::sync::Arc;

use anyhow::{Context, Result};
use leash_common::{Account, Pid};

use super::shared::Daemon;
use crate::{daemon::rules::pid_numbering::PidNumbering, kernel::UserNamespace, proc};

/// A client, as the kernel knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::daemon) struct ClientIdentity {
    pub account: Account,
    /// It runs in a user namespace other than the initial one.
    pub in_user_namespace: bool,
    /// Its pid namespace (inode number), then each above it, up to the daemon's at least.
    pub pid_namespaces: Arc<[u32]>,
}

impl ClientIdentity {
    /// The client's own pid namespace.
    pub(in crate::daemon) fn pid_namespace(&self) -> u32 {
        self.pid_namespaces.first().copied().unwrap_or(0)
    }
}

/// The account of a process of `uid` that runs in `user_ns` (None: the initial namespace).
pub(in crate::daemon) fn account_of(uid: u32, user_ns: Option<UserNamespace>) -> Account {
    match user_ns {
        None => uid.into(),
        Some(ns) if ns.creator_uid != 0 => ns.creator_uid.into(),
        Some(ns) => 1 << 32 | Account::from(ns.inum),
    }
}

/// Who the client process `pid` is (`uid` as it connected, its pids as `numbering` gives them).
/// None: it has exited.
pub(in crate::daemon) async fn identify(
    daemon: &Daemon,
    pid: Pid,
    uid: u32,
    numbering: PidNumbering,
) -> Result<Option<ClientIdentity>> {
    if numbering.is_daemons() && proc::in_initial_user_namespace(pid) == Some(true) {
        return Ok(Some(ClientIdentity {
            account: uid.into(),
            in_user_namespace: false,
            pid_namespaces: [daemon.pid_namespace].into(),
        }));
    }
    // One at a time: a flood of such clients waits here, holding no thread.
    let _turn = daemon.whois_turn.acquire().await?;
    let whois = daemon.whois.clone();
    let identity = tokio::task::spawn_blocking(move || whois.ask(pid))
        .await
        .context("asking the kernel who the client is")??;
    Ok(identity.map(|identity| ClientIdentity {
        account: account_of(uid, identity.user_ns),
        in_user_namespace: identity.user_ns.is_some(),
        pid_namespaces: identity.pid_namespaces.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_charged_for_the_namespaces_they_own() {
        assert_eq!(account_of(1000, None), 1000);
        let alices = UserNamespace {
            creator_uid: 1000,
            inum: 4026532500,
        };
        assert_eq!(account_of(100_005, Some(alices)), 1000, "a subordinate uid");
        assert_eq!(
            account_of(0, Some(alices)),
            1000,
            "root inside her container"
        );
        let roots = UserNamespace {
            creator_uid: 0,
            inum: 4026532600,
        };
        let pod = account_of(0, Some(roots));
        assert_ne!(pod, 0, "not root, which has no quota");
        assert_ne!(
            pod,
            account_of(
                0,
                Some(UserNamespace {
                    inum: 4026532601,
                    ..roots
                })
            )
        );
        assert_eq!(
            crate::daemon::rules::limits::describe(pod),
            "user namespace 4026532600"
        );
    }
}
