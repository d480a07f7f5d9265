//! The guests' whole file system: an initramfs that mirrors the host's paths. The test binary
//! and `leash` sit where cargo built them (the tests find `leash` next to themselves, and other
//! paths they know are absolute), the host programs the tests run sit where the host has them,
//! with the libraries `ldd` names and every symlink on the way (/bin -> usr/bin...), and busybox
//! fills in the rest (/vmtest/bin, last on PATH) and runs the init script.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{BufWriter, Read},
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{arch::Arch, cpio};
use crate::output;

/// Where busybox and its applets go in the guest.
pub(super) const BUSYBOX_DIR: &str = "/vmtest/bin";

/// Programs the tests run, by name, from the host's system directories. Each must exist.
const PROGRAMS: &[&str] = &[
    "sh", "bash", "sleep", "seq", "setsid", "setpriv", "prlimit", "kill", "cat", "true", "false",
    "echo", "env", "mkfifo", "touch", "mkdir", "rm", "tail", "mount", "umount", "unshare", "id",
    "ls", "chmod", "chown", "ln", "mv", "cp", "head", "wc", "timeout",
];
/// Where [`PROGRAMS`] are looked for: the system's own, never a user's (pyenv shims, cargo).
const SYSTEM_PATH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"];
/// Debian's interpreter: the tests ask `python3` for `sys.executable`.
const PYTHON: &str = "/usr/bin/python3";

/// An entry of the image.
enum Entry {
    Dir,
    Symlink(PathBuf),
    /// A host file, copied as it is or with its debug information stripped.
    File {
        source: PathBuf,
        strip: bool,
    },
    /// A file the image alone has.
    Text {
        content: String,
        permissions: u32,
    },
    CharDevice(u32, u32),
}

/// The image, path by path. A BTreeMap of paths keeps every directory before what it holds, as
/// the kernel needs.
pub(super) struct Image {
    entries: BTreeMap<PathBuf, Entry>,
    /// Where stripped copies are kept between runs.
    stripped: PathBuf,
    /// Where the guest's system comes from (its programs and the libraries every program
    /// loads): `/`, this machine, when the guest is of its architecture; a Debian tree of the
    /// guest's architecture otherwise.
    sysroot: PathBuf,
    /// The guest's architecture: where its libraries live in `sysroot`.
    arch: Arch,
}

impl Image {
    /// An image whose programs and libraries are this machine's.
    pub(super) fn new(stripped: &Path) -> Self {
        Self::with_sysroot(stripped, Path::new("/"), Arch::X86_64)
    }

    /// The image of a guest of `arch`: this machine's programs for x86_64, Debian's packages of
    /// the architecture for another (sysroot.rs).
    pub(super) fn for_guest(stripped: &Path, arch: Arch) -> Result<Self> {
        Ok(match arch {
            Arch::X86_64 => Self::new(stripped),
            _ => Self::with_sysroot(stripped, &super::sysroot::sysroot(arch)?, arch),
        })
    }

    /// An image whose programs and libraries come from `sysroot`, a system of `arch`.
    pub(super) fn with_sysroot(stripped: &Path, sysroot: &Path, arch: Arch) -> Self {
        let mut image = Self {
            entries: BTreeMap::new(),
            stripped: stripped.to_path_buf(),
            sysroot: sysroot.to_path_buf(),
            arch,
        };
        for dir in [
            "/", "/dev", "/proc", "/sys", "/tmp", "/run", "/root", "/etc",
        ] {
            image.entries.insert(dir.into(), Entry::Dir);
        }
        // init's stdin, stdout and stderr, before devtmpfs is mounted over /dev.
        image
            .entries
            .insert("/dev/console".into(), Entry::CharDevice(5, 1));
        image
    }

    /// The host's file at `path` (a build's output), at the same path, with the symlinks on
    /// the way to it, and (for a program or library) the libraries it needs, from the
    /// sysroot. `strip`: copy it without its debug information (test binaries are ten times
    /// smaller so).
    pub(super) fn add_host_file(&mut self, path: &Path, strip: bool) -> Result<()> {
        self.add_file(Path::new("/"), path, strip)
    }

    /// The host's file `source` at `at` in the guest (a program where the tests look for
    /// another of its name), with the libraries it needs, as [`Self::add_host_file`] adds one
    /// at its own path.
    pub(super) fn add_host_file_at(&mut self, source: &Path, at: &Path, strip: bool) -> Result<()> {
        let meta = fs::metadata(source).with_context(|| format!("reading {}", source.display()))?;
        if !meta.is_file() {
            bail!("{} is not a file", source.display());
        }
        self.add_parents(at);
        self.entries.insert(
            at.to_path_buf(),
            Entry::File {
                source: source.to_path_buf(),
                strip,
            },
        );
        if meta.permissions().mode() & 0o111 != 0 {
            for library in self.libraries(source)? {
                self.add_system_file(&library)?;
            }
        }
        Ok(())
    }

    /// The sysroot's file at `path`, as [`Self::add_host_file`] adds the host's.
    fn add_system_file(&mut self, path: &Path) -> Result<()> {
        let sysroot = self.sysroot.clone();
        self.add_file(&sysroot, path, false)
    }

    /// `root`'s file at `path` (absolute, read as if `root` were `/`).
    fn add_file(&mut self, root: &Path, path: &Path, strip: bool) -> Result<()> {
        let real = self.add_path(root, path)?;
        if self.entries.contains_key(&real) {
            return Ok(());
        }
        let source = under(root, &real);
        let meta =
            fs::metadata(&source).with_context(|| format!("reading {}", source.display()))?;
        if !meta.is_file() {
            bail!("{} is not a file", source.display());
        }
        self.entries.insert(
            real.clone(),
            Entry::File {
                source: source.clone(),
                strip,
            },
        );
        if meta.permissions().mode() & 0o111 != 0 || is_shared_library(&real) {
            for library in self.libraries(&source)? {
                self.add_system_file(&library)?;
            }
        }
        Ok(())
    }

    /// The host's directory tree at `dir`, but what `skip` rejects (given each path).
    pub(super) fn add_host_tree(&mut self, dir: &Path, skip: &dyn Fn(&Path) -> bool) -> Result<()> {
        self.add_tree(Path::new("/"), dir, skip)
    }

    /// `root`'s directory tree at `dir`, but what `skip` rejects (given each path as the guest
    /// sees it).
    fn add_tree(&mut self, root: &Path, dir: &Path, skip: &dyn Fn(&Path) -> bool) -> Result<()> {
        let real = self.add_path(root, dir)?;
        self.entries.insert(real.clone(), Entry::Dir);
        let source = under(root, &real);
        let mut names: Vec<_> = fs::read_dir(&source)
            .with_context(|| format!("reading {}", source.display()))?
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        names.sort();
        for name in names {
            let path = real.join(name);
            if skip(&path) {
                continue;
            }
            let meta = fs::symlink_metadata(under(root, &path))?;
            if meta.is_dir() {
                self.add_tree(root, &path, skip)?;
            } else if (meta.is_file() || meta.file_type().is_symlink())
                // A dangling symlink leads nowhere the guest could need.
                && resolve(root, &path, &mut Vec::new())
                    .is_ok_and(|real| under(root, &real).is_file())
            {
                self.add_file(root, &path, false)?;
            }
        }
        Ok(())
    }

    /// A program from the sysroot's system directories, by name.
    pub(super) fn add_program(&mut self, name: &str) -> Result<()> {
        let path = self.find_program(name).with_context(|| {
            format!(
                "the tests run {name}, which is in none of {} in {}",
                SYSTEM_PATH.join(", "),
                self.sysroot.display()
            )
        })?;
        self.add_system_file(&path)
    }

    /// Where `name` is in the sysroot's system directories.
    fn find_program(&self, name: &str) -> Option<PathBuf> {
        SYSTEM_PATH
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|path| {
                resolve(&self.sysroot, path, &mut Vec::new())
                    .is_ok_and(|real| under(&self.sysroot, &real).is_file())
            })
    }

    /// The libraries the program or library `source` (a file of the host's) loads, as paths
    /// of the sysroot: `ldd`'s when the sysroot is this machine; else from its ELF headers
    /// (its interpreter, and each NEEDED library found in the sysroot's library directories;
    /// their own come when each is added).
    fn libraries(&self, source: &Path) -> Result<Vec<PathBuf>> {
        if self.sysroot == Path::new("/") {
            return libraries(source);
        }
        if !is_elf(source) {
            return Ok(Vec::new());
        }
        let headers = output(
            Command::new("readelf")
                .args(["--wide", "-d", "-l"])
                .arg(source),
        )?;
        let multiarch = self.arch.gnu_triple();
        let dirs = [
            format!("/lib/{multiarch}"),
            format!("/usr/lib/{multiarch}"),
            "/lib".to_owned(),
            "/usr/lib".to_owned(),
        ];
        let (interpreter, needed) = elf_needs(&headers);
        Ok(interpreter
            .into_iter()
            .chain(needed.into_iter().filter_map(|name| {
                // Not found: as ldd's "not found", the guest says so if it loads it.
                dirs.iter()
                    .map(|dir| Path::new(dir).join(&name))
                    .find(|path| {
                        resolve(&self.sysroot, path, &mut Vec::new())
                            .is_ok_and(|real| under(&self.sysroot, &real).is_file())
                    })
            }))
            .collect())
    }

    pub(super) fn add_text(&mut self, path: &str, content: String, permissions: u32) {
        self.add_parents(Path::new(path));
        self.entries.insert(
            path.into(),
            Entry::Text {
                content,
                permissions,
            },
        );
    }

    /// An empty directory (a working directory the guest needs).
    pub(super) fn add_dir(&mut self, path: &Path) {
        self.add_parents(path);
        self.entries.insert(path.to_path_buf(), Entry::Dir);
    }

    /// Mirrors `path`'s directories in `root` and every symlink met on the way to it, and on
    /// the way to each symlink's target; returns the path with no symlink in it, where the
    /// file or directory itself goes (the caller adds a file: it knows whether to strip it).
    fn add_path(&mut self, root: &Path, path: &Path) -> Result<PathBuf> {
        let mut met = Vec::new();
        let real = resolve(root, path, &mut met)?;
        for (path, target) in met {
            match target {
                Some(target) => {
                    self.entries.insert(path, Entry::Symlink(target));
                }
                None => {
                    self.entries.entry(path).or_insert(Entry::Dir);
                }
            }
        }
        Ok(real)
    }

    fn add_parents(&mut self, path: &Path) {
        for parent in path.ancestors().skip(1) {
            self.entries
                .entry(parent.to_path_buf())
                .or_insert(Entry::Dir);
        }
    }

    /// Writes the image as an uncompressed initramfs (the kernel unpacks it faster than it
    /// would decompress it under emulation); returns its size.
    pub(super) fn write(&self, to: &Path) -> Result<u64> {
        let partial = to.with_extension("partial");
        let file =
            File::create(&partial).with_context(|| format!("writing {}", partial.display()))?;
        let mut writer = cpio::Writer::new(BufWriter::new(file));
        for (path, entry) in &self.entries {
            let name = path
                .to_str()
                .with_context(|| format!("{} is not UTF-8", path.display()))?;
            match entry {
                Entry::Dir => writer.dir(name, 0o755)?,
                Entry::Symlink(target) => writer.symlink(
                    name,
                    target
                        .to_str()
                        .with_context(|| format!("{} is not UTF-8", target.display()))?,
                )?,
                Entry::CharDevice(major, minor) => {
                    writer.char_device(name, 0o600, *major, *minor)?
                }
                Entry::Text {
                    content,
                    permissions,
                } => writer.file(
                    name,
                    *permissions,
                    0,
                    content.len() as u64,
                    &mut content.as_bytes(),
                )?,
                Entry::File { source, strip } => {
                    let copy = if *strip {
                        self.stripped(source)?
                    } else {
                        source.clone()
                    };
                    let mut file =
                        File::open(&copy).with_context(|| format!("reading {}", copy.display()))?;
                    let meta = file.metadata()?;
                    // The source's own mtime: Python checks its cached bytecode against it.
                    let mtime = fs::metadata(source)?.mtime().max(0) as u64;
                    writer
                        .file(name, meta.mode() & 0o7777, mtime, meta.len(), &mut file)
                        .with_context(|| format!("archiving {}", source.display()))?;
                }
            }
        }
        let (size, _) = writer.finish()?;
        fs::rename(&partial, to)?;
        Ok(size)
    }

    /// `source` without its debug information, from the copies kept by an earlier run when
    /// `source` has not changed since.
    fn stripped(&self, source: &Path) -> Result<PathBuf> {
        let copy = self
            .stripped
            .join(source.strip_prefix("/").unwrap_or(source));
        let modified = |path: &Path| fs::metadata(path).and_then(|m| m.modified()).ok();
        if let (Some(copied), Some(changed)) = (modified(&copy), modified(source))
            && copied >= changed
        {
            return Ok(copy);
        }
        fs::create_dir_all(copy.parent().context("a directory")?)?;
        crate::status(
            Command::new("objcopy")
                .arg("--strip-debug")
                .arg(source)
                .arg(&copy),
        )?;
        Ok(copy)
    }

    /// What the image holds directly in `dir`, where init mounts a file system of its own that
    /// hides it (a checkout under /tmp holds the test binaries at their build paths): init keeps
    /// the image's `dir` reachable and puts each of these back on top.
    pub(super) fn held_in(&self, dir: &Path) -> Vec<Held> {
        self.entries
            .iter()
            .filter(|(path, _)| path.parent() == Some(dir))
            .map(|(path, entry)| Held {
                path: path.clone(),
                kind: match entry {
                    Entry::Dir => HeldKind::Dir,
                    Entry::Symlink(target) => HeldKind::Symlink(target.clone()),
                    Entry::File { .. } | Entry::Text { .. } | Entry::CharDevice(..) => {
                        HeldKind::File
                    }
                },
            })
            .collect()
    }

    /// How many files the image holds.
    pub(super) fn file_count(&self) -> usize {
        self.entries
            .values()
            .filter(|entry| matches!(entry, Entry::File { .. }))
            .count()
    }
}

/// A path the image holds in a directory init mounts over: see [`Image::held_in`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub path: PathBuf,
    pub kind: HeldKind,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeldKind {
    /// Bound back, with all it holds.
    Dir,
    /// Bound back.
    File,
    /// Made again (a bind mount would follow it).
    Symlink(PathBuf),
}

/// `path` (absolute) as the kernel would find it chrooted in `root`: the path with no symlink in
/// it, and, in `met`, each directory (None) and symlink (its target) on the way to it and to each
/// symlink's target.
fn resolve(root: &Path, path: &Path, met: &mut Vec<(PathBuf, Option<PathBuf>)>) -> Result<PathBuf> {
    if !path.is_absolute() {
        bail!("{} is not an absolute path", path.display());
    }
    let mut real = PathBuf::from("/");
    for component in path.components().skip(1) {
        let Component::Normal(name) = component else {
            bail!("{}: only plain names, please", path.display());
        };
        let next = real.join(name);
        let source = under(root, &next);
        let meta = fs::symlink_metadata(&source)
            .with_context(|| format!("reading {}", source.display()))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&source)?;
            met.push((next, Some(target.clone())));
            // An absolute target replaces `real`; a relative one is read from it. Either may go
            // through symlinks of its own: they are mirrored too.
            real = resolve(root, &lexically_normal(&real.join(&target)), met)?;
        } else {
            if meta.is_dir() {
                met.push((next.clone(), None));
            }
            real = next;
        }
    }
    Ok(real)
}

/// The file at `path` (absolute) of the system at `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// An ELF file's interpreter and NEEDED libraries, from `readelf --wide -d -l`.
fn elf_needs(headers: &str) -> (Option<PathBuf>, Vec<String>) {
    let interpreter = headers.lines().find_map(|line| {
        let path = line.split_once("[Requesting program interpreter: ")?.1;
        Some(PathBuf::from(path.strip_suffix(']')?))
    });
    let needed = headers
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| {
            let name = line.split_once("Shared library: [")?.1;
            Some(name.strip_suffix(']')?.to_owned())
        })
        .collect();
    (interpreter, needed)
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0; 4];
    File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// `path` with its `.` and `..` taken out, without asking the file system: right for a path whose
/// directories before a `..` are not symlinks, as the targets met here are.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::Normal(name) => normal.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    normal
}

/// The libraries `ldd` says `path` loads (none for a static program or a script).
fn libraries(path: &Path) -> Result<Vec<PathBuf>> {
    if !is_elf(path) {
        return Ok(Vec::new());
    }
    // ldd fails on a static binary ("not a dynamic executable"): it needs nothing.
    let Ok(listing) = output(Command::new("ldd").arg(path)) else {
        return Ok(Vec::new());
    };
    Ok(listing
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso has no file.
            let line = line.trim();
            let file = line.split_once("=> ").map_or(line, |(_, file)| file);
            let file = file.split(" (").next()?;
            file.starts_with('/').then(|| PathBuf::from(file))
        })
        .collect())
}

fn is_shared_library(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.contains(".so"))
}

/// The host's programs the tests run, busybox, and Debian's Python with its standard library
/// (less its test suites, the development files and the GUI and packaging modules).
pub(super) fn add_host_programs(image: &mut Image) -> Result<()> {
    for program in PROGRAMS {
        image.add_program(program)?;
    }
    // The tests also name programs by a path of their own (/bin/true): the top-level links of a
    // merged /usr (/bin -> usr/bin) must be there, whatever went through them.
    let sysroot = image.sysroot.clone();
    for link in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        if fs::symlink_metadata(under(&sysroot, Path::new(link)))
            .is_ok_and(|meta| meta.file_type().is_symlink())
        {
            image.add_path(&sysroot, Path::new(link))?;
        }
    }
    add_busybox(image)?;
    add_python(image)
}

/// busybox as /vmtest/bin/busybox: a path of its own, so that its applets (installed there by
/// init) do not shadow the host's programs.
pub(super) fn add_busybox(image: &mut Image) -> Result<()> {
    let busybox = image
        .find_program("busybox")
        .context("busybox is missing (apt-get install busybox-static)")?;
    let source = under(
        &image.sysroot,
        &resolve(&image.sysroot, &busybox, &mut Vec::new())?,
    );
    for library in image.libraries(&source)? {
        image.add_system_file(&library)?;
    }
    let guest_busybox = PathBuf::from(format!("{BUSYBOX_DIR}/busybox"));
    image.add_parents(&guest_busybox);
    image.entries.insert(
        guest_busybox,
        Entry::File {
            source,
            strip: false,
        },
    );
    Ok(())
}

fn add_python(image: &mut Image) -> Result<()> {
    let sysroot = image.sysroot.clone();
    let python = Path::new(PYTHON);
    let Ok(real) = resolve(&sysroot, python, &mut Vec::new()) else {
        bail!(
            "{PYTHON} is missing in {} (apt-get install python3)",
            sysroot.display()
        );
    };
    image.add_system_file(python)?;
    // python3 -> python3.11: the standard library is /usr/lib/python3.11.
    let version = real
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.starts_with("python3."))
        .with_context(|| format!("{PYTHON} leads to {}, not python3.X", real.display()))?;
    let stdlib = Path::new("/usr/lib").join(version);
    let skip = |path: &Path| {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        matches!(
            name,
            "test"
                | "tests"
                | "idle_test"
                | "idlelib"
                | "tkinter"
                | "turtledemo"
                | "ensurepip"
                | "lib2to3"
                | "pydoc_data"
                | "site-packages"
                | "dist-packages"
        ) || name.starts_with("config-")
            || name.contains(".opt-")
            || (name.starts_with("_test") && name.ends_with(".so"))
    };
    image.add_tree(&sysroot, &stdlib, &skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_library_paths() {
        // /bin/sh is dynamic on every Debian: it needs libc and the loader.
        let needed = libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            needed
                .iter()
                .any(|l| l.to_string_lossy().contains("libc.so")),
            "{needed:?}"
        );
        assert!(needed.iter().all(|l| l.is_absolute()));
        assert!(libraries(Path::new("/etc/passwd")).unwrap().is_empty());
    }

    #[test]
    fn symlinks_on_the_way_are_mirrored() {
        let mut image = Image::new(Path::new("/nonexistent"));
        image.add_host_file(Path::new("/bin/sh"), false).unwrap();
        let real = fs::canonicalize("/bin/sh").unwrap();
        assert!(matches!(image.entries.get(&real), Some(Entry::File { .. })));
        // Whatever the layout (merged /usr or not), each ancestor of the real file is a
        // directory of the image, and /bin/sh resolves in it.
        for parent in real.ancestors().skip(1) {
            assert!(
                matches!(image.entries.get(parent), Some(Entry::Dir)),
                "{parent:?}"
            );
        }
        assert!(image.entries.contains_key(Path::new("/bin")));
    }

    #[test]
    fn what_a_mount_would_hide_is_each_entry_directly_in_its_directory() {
        let mut image = Image::new(Path::new("/nonexistent"));
        image.add_dir(Path::new("/tmp/clone/tests"));
        image.add_text("/tmp/clone/target/debug/leash", String::new(), 0o755);
        image.add_text("/tmp/notes", String::new(), 0o644);
        image
            .entries
            .insert("/tmp/link".into(), Entry::Symlink("clone/tests".into()));
        image.add_text("/run/x/y", String::new(), 0o644);
        assert_eq!(
            image.held_in(Path::new("/tmp")),
            [
                Held {
                    path: "/tmp/clone".into(),
                    kind: HeldKind::Dir
                },
                Held {
                    path: "/tmp/link".into(),
                    kind: HeldKind::Symlink("clone/tests".into())
                },
                Held {
                    path: "/tmp/notes".into(),
                    kind: HeldKind::File
                },
            ]
        );
        assert_eq!(
            image.held_in(Path::new("/run")),
            [Held {
                path: "/run/x".into(),
                kind: HeldKind::Dir
            }]
        );
        // The image's own directories, but empty.
        assert!(image.held_in(Path::new("/dev/shm")).is_empty());
    }

    #[test]
    fn readelf_gives_the_interpreter_and_the_needed_libraries() {
        let headers = "
Program Headers:
  INTERP         0x000238 0x0000000000000238 0x0000000000000238 0x00001b 0x00001b R   0x1
      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]
Dynamic section at offset 0x1fdd8 contains 27 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libselinux.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000000c (INIT)               0x3a48
";
        let (interpreter, needed) = elf_needs(headers);
        assert_eq!(interpreter, Some("/lib/ld-linux-aarch64.so.1".into()));
        assert_eq!(needed, ["libselinux.so.1", "libc.so.6"]);
        assert_eq!(elf_needs("not an ELF"), (None, Vec::new()));
    }

    #[test]
    fn a_sysroot_is_walked_as_if_it_were_root() {
        let root = std::env::temp_dir().join(format!("leash-xtask-sysroot-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/lib/aarch64-linux-gnu")).unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        fs::write(
            root.join("usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1"),
            "",
        )
        .unwrap();
        // An absolute target means the sysroot's, never this machine's.
        std::os::unix::fs::symlink(
            "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
            root.join("usr/lib/ld-linux-aarch64.so.1"),
        )
        .unwrap();
        let mut met = Vec::new();
        let real = resolve(&root, Path::new("/lib/ld-linux-aarch64.so.1"), &mut met);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            real.unwrap(),
            Path::new("/usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1")
        );
        assert!(met.contains(&("/lib".into(), Some("usr/lib".into()))));
        assert!(met.contains(&(
            "/usr/lib/ld-linux-aarch64.so.1".into(),
            Some("/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1".into())
        )));
        assert_eq!(
            under(Path::new("/r"), Path::new("/usr/bin")),
            Path::new("/r/usr/bin")
        );
    }

    #[test]
    fn dot_dot_goes_up() {
        assert_eq!(
            lexically_normal(Path::new("/usr/lib64/../lib/./x86_64-linux-gnu/libc.so.6")),
            Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(lexically_normal(Path::new("/../a")), Path::new("/a"));
    }
}
