//! The daemon's log is queryable: each lease opened, lease ended, tree registered, tree killed
//! and request refused is one INFO line with a stable `event` and the fields an operator filters
//! on (the tree, the host's pid, the owner's uid, the reason), the same names that are journal
//! fields under systemd (`LEASH_EVENT`, `LEASH_TREE`, ...; docs/DEPLOY.md, "Logs").

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::Duration,
};

use leash_tests::{Cgroup, daemon::Daemon, wait_for};

/// A tree no daemon ever numbered: asking to kill it is refused.
const NO_SUCH_TREE: u32 = 987_654_321;

#[test]
fn each_event_is_one_line_with_its_fields() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // A refused request, from a connection that holds no tree: no lease line of its own.
    let mut asker = daemon.client();
    let refused = asker.kill(NO_SUCH_TREE, None);
    assert!(refused.is_err(), "killing tree {NO_SUCH_TREE}: {refused:?}");
    drop(asker);

    let cgroup = Cgroup::new("log-fields");
    let mut host = daemon
        .leash()
        .args(["run", "--grace", "100ms", "--"])
        .args(cgroup.argv("sleep", &["600"]))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let host_pid = host.id().to_string();
    cgroup.settle_exactly(&["sleep"]);
    host.kill().unwrap();
    let _ = host.wait();
    assert!(
        cgroup.wait_empty(Duration::from_secs(10)).is_some(),
        "the tree outlived its host"
    );
    let killed = wait_for(Duration::from_secs(10), || {
        events(&daemon.log()).contains_key("tree_killed")
    });
    assert!(killed, "no tree_killed line:\n{}", daemon.log());

    let log = daemon.log();
    assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    let events = events(&log);
    let one = |event: &str| -> &Fields {
        match events.get(event).map(Vec::as_slice) {
            Some([fields]) => fields,
            other => panic!(
                "{event}: {} lines, not one:\n{log}",
                other.map_or(0, <[_]>::len)
            ),
        }
    };
    let (opened, registered, killed, ended, refused) = (
        one("lease_opened"),
        one("tree_registered"),
        one("tree_killed"),
        one("lease_ended"),
        one("request_refused"),
    );
    // SAFETY: getuid takes nothing, touches no memory of ours and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    for (event, fields) in [
        ("lease_opened", opened),
        ("tree_registered", registered),
        ("tree_killed", killed),
        ("lease_ended", ended),
    ] {
        assert_eq!(field(fields, "host_pid"), host_pid, "{event}: {fields:?}");
        assert_eq!(field(fields, "uid"), uid, "{event}: {fields:?}");
        assert_eq!(field(fields, "lease"), field(opened, "lease"), "{event}");
    }
    // The tree: registered, then killed because its lease ended with its host.
    let tree = field(registered, "tree");
    assert!(tree.parse::<u64>().is_ok(), "{registered:?}");
    assert_eq!(field(killed, "tree"), tree);
    assert_ne!(
        field(registered, "root"),
        host_pid,
        "the root is the command"
    );
    assert_eq!(field(killed, "reason"), "lease_ended");
    // SIGKILLed: the kernel's report of its death came before its socket closed.
    assert_eq!(field(ended, "reason"), "host_killed", "{ended:?}");
    let number = |fields: &Fields, name: &str| -> u64 {
        field(fields, name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number: {fields:?}"))
    };
    assert!(number(killed, "terminated") >= 1, "{killed:?}");
    number(killed, "killed");
    number(killed, "elapsed_ms");
    // The refusal: who asked (this process), of which tree, its code and why.
    assert_eq!(field(refused, "host_pid"), std::process::id().to_string());
    assert_eq!(field(refused, "uid"), uid);
    assert_eq!(field(refused, "tree"), NO_SUCH_TREE.to_string());
    assert_eq!(field(refused, "code"), "not_found");
    assert!(!field(refused, "reason").is_empty(), "{refused:?}");
}

/// The log is words and `name=value` fields, for a file as for the journal: no colours (the
/// test harness writes it to a file, as a service manager or a redirect does), and no Rust
/// debug dumps (`Some(16384)`, `KillSummary { tree: 1, .. }`), at DEBUG too, through a
/// daemon's common work: trees registered, listed, killed on request and by their lease's end,
/// a status, a refusal, a stop.
#[test]
fn the_log_is_plain_words_and_fields() {
    // LEASH_LOG=debug for leash's own lines only: what other crates write is theirs.
    let wrapper = ["env", "LEASH_LOG=info,leash=debug"];
    let Some(mut daemon) = Daemon::start_wrapped(&wrapper, &["--grace", "100ms"]) else {
        return;
    };
    let cgroup = Cgroup::new("log-plain");
    let mut host = daemon.client();
    host.subscribe().expect("subscribe");
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "sleep 600 & exec sleep 600"]),
            &leash_client::TreeOptions::default(),
        )
        .expect("spawn");
    cgroup.settle(2, &["sleep"]);
    assert_eq!(host.list().expect("list").len(), 1);
    host.status().expect("status");
    assert!(host.kill(NO_SUCH_TREE, None).is_err());
    host.kill(tree, None).expect("kill");
    let _ = root.wait();
    let (second, mut root) = host
        .spawn(
            &mut cgroup.command("sleep", &["600"]),
            &leash_client::TreeOptions::default(),
        )
        .expect("spawn");
    let adopted = Command::new("sleep").arg("600").spawn().unwrap();
    let mut adopted = KillOnDrop(adopted);
    host.adopt(adopted.0.id(), &leash_client::TreeOptions::default())
        .expect("adopt");
    host.release(second).expect("release");
    let _ = root.kill();
    let _ = root.wait();
    drop(host);
    let _ = adopted.0.wait();
    assert!(daemon.stop(), "the daemon stops cleanly");
    let log = daemon.log();
    assert!(
        log.lines().any(|line| line.contains(" DEBUG ")),
        "the DEBUG lines are there to check:\n{log}"
    );
    assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    for dump in ["Some(", "None", " { ", "Ok(", "Err("] {
        let found: Vec<&str> = log.lines().filter(|line| line.contains(dump)).collect();
        assert!(
            found.is_empty(),
            "{dump:?} in the log:\n{}",
            found.join("\n")
        );
    }
}

/// A child killed when the test is done with it, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Fields = HashMap<String, String>;

fn field<'a>(fields: &'a Fields, name: &str) -> &'a str {
    fields
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
}

/// The INFO lines that name an `event`, by event, each as its fields.
fn events(log: &str) -> HashMap<String, Vec<Fields>> {
    let mut events: HashMap<String, Vec<Fields>> = HashMap::new();
    for line in log.lines().filter(|line| line.contains(" INFO ")) {
        let fields = fields(line);
        if let Some(event) = fields.get("event") {
            events.entry(event.clone()).or_default().push(fields);
        }
    }
    events
}

/// A text log line's `name=value` fields: a value is a bare word or a quoted string (with
/// backslash escapes), as tracing's text format writes them.
fn fields(line: &str) -> Fields {
    let mut fields = Fields::new();
    let mut rest = line;
    while let Some(equals) = rest.find('=') {
        let name_start = rest[..equals]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |at| at + 1);
        let name = &rest[name_start..equals];
        let after = &rest[equals + 1..];
        let (value, consumed) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((at, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = at + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, 1 + end)
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_owned(), end)
        };
        if !name.is_empty() {
            fields.insert(name.to_owned(), value);
        }
        rest = &after[consumed..];
    }
    fields
}

#[test]
fn fields_are_parsed_as_tracing_writes_them() {
    let line = r#"2026-01-01T00:00:00.000000Z  INFO leash::daemon::requests: request refused event="request_refused" request=1 tree=7 code=not_found reason="no tree 7 (a \"tree\" = x)" uid=0"#;
    let fields = fields(line);
    assert_eq!(fields["event"], "request_refused");
    assert_eq!(fields["tree"], "7");
    assert_eq!(fields["code"], "not_found");
    assert_eq!(fields["reason"], r#"no tree 7 (a "tree" = x)"#);
    assert_eq!(fields["uid"], "0");
}
