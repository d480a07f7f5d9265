//! What `leash doctor` found: one finding per check, the verdict over them, and the text that
//! shows them (the JSON is their serialization, described in docs/JSON.md).

use std::path::PathBuf;

use serde::Serialize;

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Status {
    Ok,
    /// Works, with a caveat worth knowing.
    Warn,
    /// The daemon cannot run here, or cannot be reached.
    Fail,
    /// Not checked: this needs privileges the caller lacks.
    NeedsRoot,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::NeedsRoot => "ROOT?",
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Finding {
    pub(super) name: &'static str,
    pub(super) status: Status,
    /// What was found; for anything but ok, what is wrong.
    pub(super) message: String,
    /// The command or setting that fixes it; absent when there is nothing to fix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fix: Option<String>,
}

impl Finding {
    pub(super) fn new(name: &'static str, status: Status, message: impl Into<String>) -> Self {
        Self {
            name,
            status,
            message: message.into(),
            fix: None,
        }
    }

    pub(super) fn ok(name: &'static str, message: impl Into<String>) -> Self {
        Self::new(name, Status::Ok, message)
    }

    pub(super) fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    /// `ok`: every finding ok; `warn`: the daemon runs and is reached, with warnings or
    /// checks that need root; `fail`: something fails (exit status 1).
    pub(super) verdict: Status,
    /// This leash's version, and the daemon's when it answered.
    pub(super) version: &'static str,
    pub(super) daemon_version: Option<String>,
    pub(super) socket: PathBuf,
    pub(super) findings: Vec<Finding>,
}

pub(super) fn text(report: &Report) -> String {
    let mut text = String::new();
    for finding in &report.findings {
        text += &format!(
            "{:<5}  {:<26} {}\n",
            finding.status.label(),
            finding.name,
            finding.message
        );
        if let (Some(fix), Status::Fail | Status::Warn) = (&finding.fix, finding.status) {
            text += &format!("{:33}fix: {fix}\n", "");
        }
    }
    if report
        .findings
        .iter()
        .any(|f| f.status == Status::NeedsRoot)
    {
        text += "the checks marked ROOT? need root: run `sudo leash doctor` for them\n";
    }
    let warned = report.findings.iter().any(|f| f.status == Status::Warn);
    text += match report.verdict {
        Status::Ok => "the daemon can run here, and answers\n",
        Status::Warn if warned => "the daemon answers; see the warnings above\n",
        // Only checks that need root are left: the line above says so.
        Status::Warn => "the daemon answers, and nothing this user can check fails\n",
        _ => "leash is not ready here: fix what FAILs above\n",
    };
    text
}

#[cfg(test)]
mod tests {
    use leash_client::protocol::DEFAULT_SOCKET;

    use super::*;

    #[test]
    fn the_text_has_a_line_a_check_and_the_fix_under_a_failure() {
        let report = Report {
            verdict: Status::Fail,
            version: "0.1.0",
            daemon_version: None,
            socket: DEFAULT_SOCKET.into(),
            findings: vec![
                Finding::ok("kernel", "Linux 6.1").with_fix("never shown"),
                Finding::new("daemon", Status::Fail, "no daemon").with_fix("start it"),
                Finding::new("pins", Status::NeedsRoot, "needs root")
                    .with_fix("run `sudo leash doctor` to check it"),
            ],
        };
        let text = text(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ok     kernel "), "{text}");
        assert!(lines[1].starts_with("FAIL   daemon "), "{text}");
        assert_eq!(lines[2].trim(), "fix: start it", "{text}");
        assert!(lines[3].starts_with("ROOT?  pins "), "{text}");
        assert!(!text.contains("never shown"), "{text}");
        assert!(text.contains("marked ROOT? need root"), "{text}");
        assert!(text.ends_with("fix what FAILs above\n"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["findings"][2]["status"], "needs_root");
        assert!(json["findings"][0].get("fix").is_some());
    }

    #[test]
    fn the_last_line_names_warnings_only_where_there_are_some() {
        let report = |findings| Report {
            verdict: Status::Warn,
            version: "0.1.0",
            daemon_version: Some("0.1.0".into()),
            socket: DEFAULT_SOCKET.into(),
            findings,
        };
        let needs_root = || Finding::new("pins", Status::NeedsRoot, "needs root");
        let only_root = text(&report(vec![
            Finding::ok("kernel", "Linux 6.1"),
            needs_root(),
        ]));
        assert!(!only_root.contains("warnings"), "{only_root}");
        assert!(
            only_root.ends_with("the daemon answers, and nothing this user can check fails\n"),
            "{only_root}"
        );
        let warned = text(&report(vec![
            Finding::new("membership", Status::Warn, "layered"),
            needs_root(),
        ]));
        assert!(warned.ends_with("see the warnings above\n"), "{warned}");
    }
}
