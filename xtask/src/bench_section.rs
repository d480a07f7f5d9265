//! BENCHMARKS.md's section "Overhead on arm64 (emulated)": made from the overhead section that
//! leash-bench writes in an arm64 guest (`cargo xtask bench --arch arm64`), its ratios and the
//! programs' costs beside each other (no absolute time), and kept across runs of the x86
//! benchmarks, which write the rest of the report.

use anyhow::{Context, Result};

/// The section's title (its heading is `## TITLE`).
pub(crate) const TITLE: &str = "Overhead on arm64 (emulated)";

/// The title of the section on membership under Linux 7.x, the hostile scenario's escapes per
/// kernel line in the vmtest guests (`cargo xtask vmtest ... --test hostile_storm`): written by
/// hand from those runs, and kept across runs of the benchmarks as the arm64 section is.
pub(crate) const MEMBERSHIP_TITLE: &str = "Membership on Linux 7.x (emulated)";

/// The sections the x86 benchmarks cannot measure, which a run of them keeps.
pub(crate) const KEPT: [&str; 2] = [TITLE, MEMBERSHIP_TITLE];

/// The heading of leash-bench's overhead section, whose table the guest's report holds.
const OVERHEAD_HEADING: &str = "## 1. Overhead";

/// What the arm64 section reports of the guest's overhead section.
#[derive(Debug, PartialEq)]
pub(crate) struct Ratios {
    /// Each loop's name, b/a and c/a (with their goal's verdict), in the table's order.
    pub rows: Vec<[String; 3]>,
    /// The ptrace guard's programs the daemon reported in the guest.
    pub guard: Option<String>,
    /// Each program's runs and ns per run, from the kernel's BPF statistics in the guest (the
    /// overhead section's second table), if it has them.
    pub costs: Vec<[String; 3]>,
}

/// The ratios of the overhead section of `report` (a BENCHMARKS.md leash-bench wrote): its
/// table's `loop`, `b/a` and `c/a` columns, and the ptrace guard its intro names.
pub(crate) fn ratios(report: &str) -> Result<Ratios> {
    let section = report
        .split_once(OVERHEAD_HEADING)
        .map(|(_, rest)| rest)
        .with_context(|| format!("the guest's report has no section {OVERHEAD_HEADING:?}"))?;
    let section = section.split("\n## ").next().unwrap_or(section);
    let guard = section.lines().find_map(|line| {
        let guard = line.split_once("Ptrace guard in place: ")?.1.trim_end();
        Some(guard.strip_suffix('.').unwrap_or(guard).to_owned())
    });
    let rows = columns(section, "| loop |", ["loop", "b/a", "c/a"])?
        .context("the overhead section has no table")?;
    if rows.is_empty() {
        anyhow::bail!("the overhead table has no rows");
    }
    let costs =
        columns(section, "| program |", ["program", "runs", "ns per run"])?.unwrap_or_default();
    Ok(Ratios { rows, guard, costs })
}

/// The cells of columns `names` of each row of the first table in `section` whose header line
/// starts with `header`; None if there is no such table.
fn columns(section: &str, header: &str, names: [&str; 3]) -> Result<Option<Vec<[String; 3]>>> {
    let mut lines = section.lines().skip_while(|line| !line.starts_with(header));
    let Some(header) = lines.next().map(cells) else {
        return Ok(None);
    };
    let column = |name: &str| {
        header
            .iter()
            .position(|cell| cell == name)
            .with_context(|| format!("a table has no column {name:?}: {header:?}"))
    };
    let at = [column(names[0])?, column(names[1])?, column(names[2])?];
    Ok(Some(
        lines
            .take_while(|line| line.starts_with('|'))
            .filter(|line| !line.starts_with("|---"))
            .map(cells)
            .map(|row| at.map(|i| row.get(i).cloned().unwrap_or_default()))
            .collect(),
    ))
}

/// The cells of a markdown table's row.
fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(|cell| cell.trim().to_owned())
        .collect()
}

/// The section, from the guest's `ratios`; `about` says where they come from (the kernel,
/// the run's mode, the host's load), one or more sentences.
pub(crate) fn section(ratios: &Ratios, about: &str) -> String {
    let guard = ratios.guard.as_deref().unwrap_or("not reported");
    let mut text = format!(
        "## {TITLE}\n\n\
         Section 1's loops in an arm64 guest, with leash and leash-bench cross-built (release): \
         (b) the daemon running and the loop untracked, (c) the loop tracked, each against (a) \
         no leash, as the median of per-repetition ratios. {about} Emulation (QEMU's TCG) \
         inflates absolute times many times over, and unevenly, so none are given: only the \
         ratios. Nor are the x86 section's goals judged here: under emulation on a shared host, \
         two identical quick runs have differed by up to 40% and ratios have come out below 1, \
         so these ratios can show that nothing costs many times more on arm64, not whether \
         leash costs a few percent. Ptrace guard in place: {guard}.\n\n\
         | loop | b/a | c/a |\n|---|---|---|\n"
    );
    for [name, ba, ca] in &ratios.rows {
        let (ba, ca) = (without_verdict(ba), without_verdict(ca));
        text.push_str(&format!("| {name} | {ba} | {ca} |\n"));
    }
    text.push('\n');
    if !ratios.costs.is_empty() {
        text.push_str(
            "Each program's cost per run in the same guest, from the kernel's BPF run-time \
             statistics over one tracked and one untracked run of the exec and ps loops: \
             emulated instructions, many times arm64's own cost, so only the programs' costs \
             beside each other say anything (`leash_task_alloc`, the marks' LSM program, runs \
             at every fork of the machine, beside `leash_fork`).\n\n\
             | program | runs | ns per run (emulated) |\n|---|---|---|\n",
        );
        for [program, runs, per_run] in &ratios.costs {
            text.push_str(&format!("| {program} | {runs} | {per_run} |\n"));
        }
        text.push('\n');
    }
    text
}

/// A ratio's cell without the goal's verdict leash-bench appends: `1.011 (goal missed)` is
/// `1.011`.
fn without_verdict(cell: &str) -> &str {
    cell.split_once(" (").map_or(cell, |(ratio, _)| ratio)
}

/// The section titled `title` that `report` holds, if it holds one: from its heading to the
/// next section or the report's closing line.
pub(crate) fn existing<'a>(report: &'a str, title: &str) -> Option<&'a str> {
    let start = report.find(&format!("## {title}\n"))?;
    let rest = &report[start..];
    Some(&rest[..section_end(rest)])
}

/// Where the section that `text` starts with ends: at the next heading or the closing `---`.
fn section_end(text: &str) -> usize {
    let mut at = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if n > 0 && (line.starts_with("## ") || line.starts_with("---")) {
            return at;
        }
        at += line.len();
    }
    text.len()
}

/// `report` with `section` (titled `title`) in place of the one it holds, or, without one,
/// after its overhead section (before its closing line, or at its end, without that).
pub(crate) fn splice(report: &str, title: &str, section: &str) -> String {
    if let Some(old) = existing(report, title) {
        return report.replacen(old, section, 1);
    }
    let at = report
        .find(OVERHEAD_HEADING)
        .map(|start| start + section_end(&report[start..]))
        .or_else(|| report.find("\n---\n").map(|closing| closing + 1))
        .unwrap_or(report.len());
    let (before, after) = report.split_at(at);
    let gap = if before.is_empty() || before.ends_with("\n\n") {
        ""
    } else if before.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    format!("{before}{gap}{section}{after}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: &str = "# leash benchmarks\n\nMachine: 2 cores (unknown).\n\n\
        ## 1. Overhead on fork-heavy work\n\n\
        A shell loop of 1000 iterations. Ptrace guard in place: leash_ptrace_guard.\n\n\
        | loop | a: no leash (ms) | b: untracked (ms) | c: tracked (ms) | b/a | c/a |\n\
        |---|---|---|---|---|---|\n\
        | fork+exit+wait | 900.0 | 910.0 | 950.0 | 1.011 (goal missed) | 1.055 (goal missed) |\n\
        | fork+exec(/bin/true)+wait | 1900.0 | 1901.0 | 1950.0 | 1.000 (goal met) | 1.026 (goal met) |\n\n\
        Each program's cost per run:\n\n\
        | program | runs | ns per run |\n|---|---|---|\n| leash_fork | 10 | 300.0 |\n\n\
        ---\nThe whole run took 200 s.\n";

    #[test]
    fn the_ratios_and_the_guard_come_from_the_overhead_table_without_its_times() {
        let ratios = ratios(GUEST).unwrap();
        assert_eq!(ratios.guard.as_deref(), Some("leash_ptrace_guard"));
        assert_eq!(
            ratios.rows,
            [
                [
                    "fork+exit+wait",
                    "1.011 (goal missed)",
                    "1.055 (goal missed)"
                ],
                [
                    "fork+exec(/bin/true)+wait",
                    "1.000 (goal met)",
                    "1.026 (goal met)"
                ],
            ]
            .map(|row| row.map(String::from))
        );
        let text = section(&ratios, "On trixie-6.12.");
        assert!(text.starts_with("## Overhead on arm64 (emulated)\n\n"));
        assert!(text.contains("| fork+exit+wait | 1.011 | 1.055 |\n"));
        assert!(!text.contains("goal met") && !text.contains("goal missed"));
        assert!(text.contains("On trixie-6.12."));
        assert!(!text.contains("900.0"));
        // The programs' costs, beside each other.
        assert_eq!(
            ratios.costs,
            [["leash_fork", "10", "300.0"].map(String::from)]
        );
        assert!(text.contains("| leash_fork | 10 | 300.0 |\n"), "{text}");
    }

    #[test]
    fn a_report_without_the_overhead_table_is_refused() {
        assert!(ratios("# leash benchmarks\n\n## 2. Kill latency\n").is_err());
        assert!(ratios("## 1. Overhead on fork-heavy work\n\nIt failed.\n").is_err());
    }

    #[test]
    fn the_section_goes_after_the_overhead_section_and_replaces_itself_later() {
        let host = "# leash benchmarks\n\n## 1. Overhead on fork-heavy work\n\nx\n\n\
                    ## 2. Kill latency\n\ny\n\n---\nThe whole run took 1 s.\n";
        let first = splice(host, TITLE, "## Overhead on arm64 (emulated)\n\nold\n\n");
        assert_eq!(
            first,
            "# leash benchmarks\n\n## 1. Overhead on fork-heavy work\n\nx\n\n\
             ## Overhead on arm64 (emulated)\n\nold\n\n\
             ## 2. Kill latency\n\ny\n\n---\nThe whole run took 1 s.\n"
        );
        assert_eq!(
            existing(&first, TITLE),
            Some("## Overhead on arm64 (emulated)\n\nold\n\n")
        );
        let second = splice(&first, TITLE, "## Overhead on arm64 (emulated)\n\nnew\n\n");
        assert_eq!(second, first.replace("old", "new"));
        // A report of other sections only: before its closing line; no report: alone.
        let other = "# leash benchmarks\n\n## 2. Kill latency\n\ny\n\n---\nThe end.\n";
        assert_eq!(
            splice(other, TITLE, "## Overhead on arm64 (emulated)\n\nz\n\n"),
            "# leash benchmarks\n\n## 2. Kill latency\n\ny\n\n\
             ## Overhead on arm64 (emulated)\n\nz\n\n---\nThe end.\n"
        );
        assert_eq!(splice("", "A", "## A\n\nz\n\n"), "## A\n\nz\n\n");
        assert_eq!(existing(other, TITLE), None);
    }
}
