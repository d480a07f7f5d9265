//! A Python script run as another user in a cgroup: an attack or a load that a test drives.
//! Its standard output comes line by line on a channel; its standard input stays open (a script
//! may wait on it) until it is dropped, which kills it.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    sync::mpsc,
};

use crate::{Cgroup, daemon::setpriv_args, python};

pub struct Script {
    child: Child,
    /// What it prints, a line at a time.
    pub lines: mpsc::Receiver<String>,
}

impl Script {
    /// `python -c SOURCE ARGS...` as `uid`, in `cgroup`, from `/`.
    pub fn start_as(uid: u32, cgroup: &Cgroup, source: &str, args: &[&str]) -> Self {
        let mut argv = setpriv_args(uid);
        argv.extend([python(), "-c".to_owned(), source.to_owned()]);
        argv.extend(args.iter().map(|arg| (*arg).to_owned()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut child = cgroup
            .command("setpriv", &argv)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the script");
        let stdout = child.stdout.take().expect("the script's stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
