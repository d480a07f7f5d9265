//! Tracepoint record layouts, read from the tracefs `format` files at load time: field offsets
//! differ between kernels (`sched_process_fork` has `parent_pid` at 24 before 6.x's `__data_loc`
//! comms and at 12 after), so one binary must not bake them in.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::sys;

/// Where tracefs is mounted on current kernels, and where older setups have it.
const MOUNT_POINTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

/// The parsed `format` file of one tracepoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    pub fields: Vec<Field>,
}

impl Format {
    /// Parses the text of a tracefs `format` file.
    pub fn parse(text: &str) -> Result<Self> {
        let mut name = None;
        let mut fields = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("name:") {
                name = Some(rest.trim().to_owned());
            } else if line.starts_with("field:") {
                fields.push(parse_field(line).with_context(|| format!("bad field line {line:?}"))?);
            }
        }
        let Some(name) = name else {
            bail!("no `name:` line in the format text");
        };
        Ok(Self { name, fields })
    }

    /// Reads and parses `events/<category>/<event>/format` from the mounted tracefs.
    pub fn read(category: &str, event: &str) -> Result<Self> {
        let path = tracefs_root()?
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The offset of a field the program cannot do without.
    pub fn required_offset(&self, name: &str, size: u32) -> Result<u32> {
        match self.field(name) {
            Some(f) if f.size == size => Ok(f.offset),
            Some(f) => bail!("{}.{name} has size {}, expected {size}", self.name, f.size),
            None => bail!("tracepoint {} has no field {name}", self.name),
        }
    }
}

/// `field:pid_t child_pid; offset:20; size:4; signed:1;` (tab-separated)
fn parse_field(line: &str) -> Result<Field> {
    let mut declaration = None;
    let mut offset = None;
    let mut size = None;
    for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once(':').context("part without ':'")?;
        match key.trim() {
            "field" => declaration = Some(value.trim()),
            "offset" => offset = Some(value.trim().parse()?),
            "size" => size = Some(value.trim().parse()?),
            _ => {}
        }
    }
    let declaration = declaration.context("no declaration")?;
    // The name is the declaration's last word, less any array suffix: `char comm[16]`.
    let last = declaration
        .split_whitespace()
        .last()
        .context("empty declaration")?;
    let name = last.split('[').next().unwrap_or(last).to_owned();
    Ok(Field {
        name,
        offset: offset.context("no offset")?,
        size: size.context("no size")?,
    })
}

/// The tracefs mount point, mounting tracefs at /sys/kernel/tracing if nothing is mounted
/// (it is not at boot on some machines, and aya needs it to attach tracepoints).
pub fn tracefs_root() -> Result<PathBuf> {
    if let Some(root) = MOUNT_POINTS.iter().map(Path::new).find(|p| is_tracefs(p)) {
        return Ok(root.to_path_buf());
    }
    let target = Path::new(MOUNT_POINTS[0]);
    sys::mount(c"tracefs", target).with_context(|| {
        format!(
            "tracefs is not readable at {0} (leash needs root) or not mounted there, and mounting \
             it failed; as root: mount -t tracefs tracefs {0}",
            target.display()
        )
    })?;
    tracing::info!(path = %target.display(), "mounted tracefs");
    Ok(target.to_path_buf())
}

fn is_tracefs(path: &Path) -> bool {
    path.join("events").is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORK_6_18: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d child_comm=%s child_pid=%d\", __get_str(parent_comm), REC->parent_pid, __get_str(child_comm), REC->child_pid
";

    const FORK_OLD: &str = "name: sched_process_fork
ID: 311
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d child_comm=%s child_pid=%d\", REC->parent_comm, REC->parent_pid, REC->child_comm, REC->child_pid
";

    const EXIT_6_18: &str = "name: sched_process_exit
ID: 369
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;

print fmt: \"comm=%s pid=%d prio=%d group_dead=%s\", REC->comm, REC->pid, REC->prio, REC->group_dead ? \"true\" : \"false\"
";

    const EXIT_OLD: &str = "name: sched_process_exit
ID: 313
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d prio=%d\", REC->comm, REC->pid, REC->prio
";

    #[test]
    fn fork_layout_of_6_18() {
        let format = Format::parse(FORK_6_18).unwrap();
        assert_eq!(format.name, "sched_process_fork");
        assert_eq!(format.required_offset("parent_pid", 4).unwrap(), 12);
        assert_eq!(format.required_offset("child_pid", 4).unwrap(), 20);
        assert_eq!(format.field("parent_comm").unwrap().size, 4);
    }

    #[test]
    fn fork_layout_before_data_loc_comms() {
        let format = Format::parse(FORK_OLD).unwrap();
        assert_eq!(format.required_offset("parent_pid", 4).unwrap(), 24);
        assert_eq!(format.required_offset("child_pid", 4).unwrap(), 44);
        assert_eq!(format.field("child_comm").unwrap().offset, 28);
    }

    #[test]
    fn exit_layouts_with_and_without_group_dead() {
        let new = Format::parse(EXIT_6_18).unwrap();
        assert_eq!(new.required_offset("group_dead", 1).unwrap(), 32);
        assert_eq!(new.required_offset("pid", 4).unwrap(), 24);
        let old = Format::parse(EXIT_OLD).unwrap();
        assert!(old.field("group_dead").is_none());
        assert!(old.required_offset("group_dead", 1).is_err());
    }

    #[test]
    fn a_wrong_size_is_refused() {
        let format = Format::parse(FORK_6_18).unwrap();
        let err = format.required_offset("child_pid", 8).unwrap_err();
        assert!(err.to_string().contains("size 4"), "{err}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Format::parse("").is_err());
        assert!(Format::parse("name: x\n\tfield:int a;\toffset:zz;\tsize:4;").is_err());
        assert!(Format::parse("name: x\n\tfield:;\toffset:1;\tsize:4;").is_err());
    }
}
