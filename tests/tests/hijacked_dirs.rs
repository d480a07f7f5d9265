//! The daemon trusts the directories of its socket and its pins only when they are root's
//! alone. One another user made first, or may write, is refused with what to fix, before the
//! daemon serves or pins anything: otherwise that user's own daemon could answer other users'
//! hosts, or the pins could be hidden from the next daemon. Only a stale socket is replaced,
//! never what a path leads to. A good directory gets a socket anyone may connect to.

use std::{
    fs,
    os::unix::{
        fs::{FileTypeExt, MetadataExt, PermissionsExt, chown, symlink},
        process::CommandExt,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use leash_tests::{
    Removed,
    daemon::{Daemon, path_str, signal},
    leash, leash_binary, wait_for,
};

/// Another user (no passwd entry is needed).
const USER: u32 = 61001;

#[test]
fn a_socket_directory_another_user_made_is_refused() {
    // Like /tmp: anyone may make a directory in it before the daemon does.
    // Readable by other users: the user runs only mkdir; root runs the daemon from the clone.
    let shared = scratch("shared", 0o1777);
    let dir = shared.0.join("leash");
    let made = Command::new("mkdir")
        .arg(&dir)
        .uid(USER)
        .gid(USER)
        .status()
        .unwrap();
    assert!(made.success(), "uid {USER} makes the directory first");
    let pins = pin_root("user-socket-dir");

    let said = refused(&dir.join("leash.sock"), &pins.0);
    let d = dir.display();
    assert!(
        said.contains(&format!("refusing {d} (owner uid {USER},")),
        "the error names the directory and its owner: {said}"
    );
    assert!(
        said.contains(&format!("chown root {d} && chmod go-w {d}"))
            && said.contains("fix: choose another --socket in a directory of its own"),
        "the error says what to fix: {said}"
    );
    assert!(!dir.join("leash.sock").exists(), "no socket was bound");
    assert!(!pins.0.exists(), "nothing was pinned");
}

#[test]
fn a_socket_directory_others_may_write_is_refused() {
    let pins = pin_root("writable-socket-dir");
    for (label, mode) in [("group-writable", 0o775), ("world-writable", 0o777)] {
        let dir = scratch(label, mode);
        let said = refused(&dir.0.join("leash.sock"), &pins.0);
        assert!(
            said.contains(&format!(
                "refusing {} (owner uid 0, mode {mode:04o})",
                dir.0.display()
            )),
            "{label}: {said}"
        );
        assert!(!dir.0.join("leash.sock").exists(), "{label}: no socket");
    }
    assert!(!pins.0.exists(), "nothing was pinned");
}

#[test]
fn a_pin_directory_another_user_made_is_refused() {
    mount_bpffs();
    let pins = pin_root("user-pins");
    fs::create_dir(&pins.0).unwrap();
    chown(&pins.0, Some(USER), Some(USER)).unwrap();
    let dir = scratch("user-pins", 0o755);
    let socket = dir.0.join("leash.sock");

    let said = refused(&socket, &pins.0);
    let p = pins.0.display();
    assert!(
        said.contains(&format!("refusing {p} (owner uid {USER},")),
        "the error names the pin directory and its owner: {said}"
    );
    assert!(
        said.contains(&format!("chown root {p} && chmod go-w {p}"))
            && said.contains("fix: choose another --pin-dir in a directory of its own"),
        "the error says what to fix: {said}"
    );
    assert_eq!(
        fs::read_dir(&pins.0).unwrap().count(),
        0,
        "nothing was pinned there"
    );
    assert!(!socket.exists(), "the socket went with the daemon");
}

#[test]
fn only_a_stale_socket_is_replaced() {
    let pins = pin_root("not-a-socket");
    let dir = scratch("not-a-socket", 0o755);
    let socket = dir.0.join("leash.sock");
    // Root's private file, which a chmod through the socket's path would have opened to all.
    let private = dir.0.join("private");
    fs::write(&private, "root's").unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
    symlink(&private, &socket).unwrap();

    let said = refused(&socket, &pins.0);
    assert!(
        said.contains(&format!("{} exists and is not a socket", socket.display())),
        "{said}"
    );
    let link = fs::symlink_metadata(&socket).unwrap();
    assert!(link.file_type().is_symlink(), "the symlink is left alone");
    let target = fs::metadata(&private).unwrap();
    assert_eq!(
        target.mode() & 0o7777,
        0o600,
        "what it leads to is unchanged"
    );
    assert_eq!(fs::read_to_string(&private).unwrap(), "root's");

    fs::remove_file(&socket).unwrap();
    fs::write(&socket, "a file").unwrap();
    let said = refused(&socket, &pins.0);
    assert!(said.contains("exists and is not a socket"), "{said}");
    assert_eq!(
        fs::read_to_string(&socket).unwrap(),
        "a file",
        "a file in the socket's place is left alone"
    );
    assert!(!pins.0.exists(), "nothing was pinned");
}

#[test]
fn a_good_directory_gets_a_socket_anyone_may_use() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let socket = fs::symlink_metadata(&daemon.socket).unwrap();
    assert!(socket.file_type().is_socket());
    assert_eq!(socket.uid(), 0);
    assert_eq!(
        socket.mode() & 0o7777,
        0o666,
        "srw-rw-rw-: anyone may connect"
    );
    // The daemon made the pin directory (it did not exist): root's alone.
    let pins = fs::symlink_metadata(&daemon.pins).unwrap();
    assert!(pins.is_dir());
    assert_eq!((pins.uid(), pins.mode() & 0o7777), (0, 0o700));

    let output = Command::new(daemon.leash_for_anyone())
        .uid(USER)
        .gid(USER)
        .env_remove("LEASH_SOCKET")
        .args(["--socket", path_str(&daemon.socket), "run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "uid {USER} is served: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory of the test's own under /tmp with `mode`, root's, removed however the test ends.
fn scratch(label: &str, mode: u32) -> Removed {
    let path = PathBuf::from(format!("/tmp/leash-test-{}-{label}", std::process::id()));
    let _ = fs::remove_dir_all(&path);
    fs::create_dir(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    Removed(path)
}

/// A pin directory of the test's own under /sys/fs/bpf (not made here), removed with whatever
/// is pinned in it however the test ends.
fn pin_root(label: &str) -> Removed {
    Removed(PathBuf::from(format!(
        "/sys/fs/bpf/leash-test-{}-{label}",
        std::process::id()
    )))
}

/// bpffs at /sys/fs/bpf, mounted as the daemon mounts it if nothing is there.
fn mount_bpffs() {
    let bpffs = Path::new("/sys/fs/bpf");
    if !leash::sys::is_bpffs(bpffs) {
        // Another test mounting it at the same moment is fine: either mount serves.
        leash::sys::mount_with(c"bpf", bpffs, Some(c"mode=0700")).expect("mounting bpffs");
    }
}

/// Starts `leash daemon --socket SOCKET --pin-dir PINS`, which must refuse to start; returns
/// what it said. A daemon that serves instead is stopped (it kills what it holds and unpins),
/// and the test fails.
fn refused(socket: &Path, pins: &Path) -> String {
    let mut daemon = Command::new(leash_binary())
        .arg("daemon")
        .arg("--socket")
        .arg(socket)
        .arg("--pin-dir")
        .arg(pins)
        .env("LEASH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting leash daemon");
    let exited = |daemon: &mut Child| daemon.try_wait().ok().flatten().is_some();
    // Serving means answering: the socket is bound (and connectable) before the pin directory
    // is checked, and a daemon that refuses it closes the socket without a word.
    let serving = || leash_client::Client::connect_to(socket).is_ok();
    wait_for(Duration::from_secs(30), || exited(&mut daemon) || serving());
    let refused = exited(&mut daemon);
    if !refused {
        signal(daemon.id(), "TERM");
        if !wait_for(Duration::from_secs(30), || exited(&mut daemon)) {
            let _ = daemon.kill();
        }
    }
    let output = daemon.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        refused && !output.status.success(),
        "the daemon started on {} with pins in {}; it said:\n{said}",
        socket.display(),
        pins.display()
    );
    said
}
