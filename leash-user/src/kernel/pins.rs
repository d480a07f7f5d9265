//! Pins: the programs' links and their maps, kept in a BPF filesystem so that tracking goes on
//! while the daemon is away (killed, crashed, restarted for an upgrade) and the next daemon
//! takes them over.
//!
//! Layout: `ROOT/v{ABI_VERSION}/links/{program}` and `ROOT/v{ABI_VERSION}/maps/{map}`. A pinned
//! link keeps its program attached with no process holding it; a pinned map keeps its contents.
//! A clean shutdown removes them; a daemon that dies leaves them, and its programs go on
//! following every fork and exit into its maps until another daemon takes over.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    maps::{Map, MapData},
    programs::links::{FdLink, PinnedLink},
};
use leash_common::{ABI_VERSION, map};

use super::{
    link::{HeldLink, kprobe_links_pin, tracepoint_links_pin},
    pin_lock::PinLock,
    programs::{self, Layer, Program},
    ptrace_guard::Guard,
};
use crate::{sys, trusted_dir};

/// Where bpffs is mounted by convention; mounted there if nothing is.
const BPFFS: &str = "/sys/fs/bpf";

/// The pins of this ABI's maps and links, and the links pinned or opened by this process (held
/// so they can be unpinned at a clean shutdown).
#[derive(Debug)]
pub struct Pins {
    dir: PathBuf,
    links: Vec<PinnedLink>,
}

impl Pins {
    /// The pins under `root` (a directory on a BPF filesystem, made 0700 if needed, and
    /// refused unless it and its ancestors are root's alone; bpffs is mounted at /sys/fs/bpf
    /// if `root` is below it and nothing is mounted there).
    pub fn at(root: &Path) -> Result<Self> {
        ensure_on_bpffs(root)?;
        Ok(Self {
            dir: root.join(format!("v{ABI_VERSION}")),
            links: Vec::new(),
        })
    }

    /// The pins under `root` as they are, to look at (`leash doctor`): nothing is mounted,
    /// made or checked.
    pub fn existing(root: &Path) -> Self {
        Self::in_dir(&root.join(format!("v{ABI_VERSION}")))
    }

    /// The pins in `dir` (a [`Pins::dir`]), as they are, to look at.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            links: Vec::new(),
        }
    }

    /// What a complete set of pins lacks here: each missing link's and map's path.
    pub fn missing(&self) -> Vec<PathBuf> {
        always_pinned()
            .map(|program| self.link_path(program.name))
            .chain(map::ALL.iter().map(|m| self.map_path(m)))
            .filter(|path| !path.exists())
            .collect()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pins of other ABI versions beside these: left by a daemon of another leash release,
    /// whose maps this one would misread. Their programs go on tracking, but nothing enforces
    /// their trees.
    pub fn other_versions(&self) -> Vec<PathBuf> {
        let Some(root) = self.dir.parent() else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir(root) else {
            return Vec::new();
        };
        let mut others: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| *path != self.dir && is_version_dir(path))
            .collect();
        others.sort();
        others
    }

    /// Whether anything is pinned here.
    pub fn exist(&self) -> bool {
        self.dir.exists()
    }

    /// Whether a previous daemon left every link and every map pinned here: the marks' and the
    /// descent iterator's too, if it pinned any of them (a kernel without the BPF LSM has no
    /// marks, and that is whole).
    pub fn complete(&self) -> bool {
        let whole = |pins: Vec<PathBuf>| {
            pins.iter().all(|path| path.exists()) || pins.iter().all(|path| !path.exists())
        };
        always_pinned().all(|program| self.link_path(program.name).exists())
            && map::ALL.iter().all(|m| self.map_path(m).exists())
            && whole(self.marks_pins())
            && whole(self.descent_pins())
    }

    /// Whether a previous daemon pinned the marks (their map and both links).
    pub fn marks(&self) -> bool {
        self.marks_pins().iter().all(|path| path.exists())
    }

    fn marks_pins(&self) -> Vec<PathBuf> {
        self.layer_pins(Layer::Marks, Some(map::MARKS))
    }

    /// Whether a previous daemon pinned the descent iterator (its link and map).
    pub fn descent(&self) -> bool {
        self.descent_pins().iter().all(|path| path.exists())
    }

    fn descent_pins(&self) -> Vec<PathBuf> {
        self.layer_pins(Layer::Descent, Some(map::DESCENTS))
    }

    /// Whether a previous daemon pinned the kernel kill (its link; its requests are the
    /// descent iterator's).
    pub fn kernel_kill(&self) -> bool {
        self.descent()
            && self
                .layer_pins(Layer::KernelKill, None)
                .iter()
                .all(|p| p.exists())
    }

    /// The pins of an optional layer: its programs' links and its map.
    fn layer_pins(&self, layer: Layer, map: Option<&str>) -> Vec<PathBuf> {
        programs::of_layer(layer)
            .map(|program| self.link_path(program.name))
            .chain(map.map(|map| self.map_path(map)))
            .collect()
    }

    pub fn pin_map(&self, name: &str, map: &Map) -> Result<()> {
        let path = self.map_path(name);
        fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
        map.pin(&path)
            .with_context(|| format!("pinning map {name} at {}", path.display()))
    }

    pub fn pin_link(&mut self, program: &str, link: FdLink) -> Result<()> {
        let path = self.link_path(program);
        fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
        let pinned = link
            .pin(&path)
            .with_context(|| format!("pinning the link of {program} at {}", path.display()))?;
        self.links.push(pinned);
        Ok(())
    }

    /// Pins the link of `program`; returns it if the kernel cannot pin it (a classic
    /// tracepoint's before Linux 5.15), for this process to hold.
    pub(super) fn pin_held(&mut self, program: &str, link: HeldLink) -> Result<Option<HeldLink>> {
        match link {
            HeldLink::Fd(link) => self.pin_link(program, link)?,
            HeldLink::Raw(link) => self.pin_raw_link(program, link)?,
            HeldLink::TracePoint(link) if tracepoint_links_pin() => {
                self.pin_link(program, FdLink::try_from(link)?)?
            }
            HeldLink::KProbe(link) if kprobe_links_pin() => {
                self.pin_link(program, FdLink::try_from(link)?)?
            }
            held => {
                tracing::warn!(
                    program,
                    "cannot be pinned on this kernel (classic tracepoints' and kprobes' links \
                     are pinnable from Linux 5.15, and kprobes' only where aya reads the \
                     kernel's version): it ends with this daemon, and a daemon that takes over \
                     the pins has none"
                );
                return Ok(Some(held));
            }
        }
        Ok(None)
    }

    /// Pins a link made by raw `bpf()` (an LSM or fmod_ret program's), and holds it as the
    /// others.
    fn pin_raw_link(&mut self, program: &str, link: std::os::fd::OwnedFd) -> Result<()> {
        use std::os::fd::AsFd;
        let path = self.link_path(program);
        fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
        sys::pin_object(link.as_fd(), &path)
            .with_context(|| format!("pinning the link of {program} at {}", path.display()))?;
        let pinned = self.open_pinned(program)?;
        self.links.push(pinned);
        Ok(())
    }

    /// The ptrace guard a previous daemon left pinned here.
    pub fn guard(&self) -> Guard {
        Guard::pinned(|program| self.link_path(program).exists())
    }

    /// Opens a map a previous daemon pinned.
    pub fn open_map(&self, name: &str) -> Result<Map> {
        let path = self.map_path(name);
        let data = MapData::from_pin(&path)
            .with_context(|| format!("opening the pinned map {}", path.display()))?;
        Ok(Map::from_map_data(data)?)
    }

    /// The programs a previous daemon left pinned here: those pinned wherever a daemon pins,
    /// and those of the layers it attached (the fork kprobe, the marks, its ptrace guard and
    /// the kprobe beside fmod_ret).
    pub(super) fn pinned_programs(&self) -> Vec<&'static Program> {
        let guard = self.guard();
        let beside_guard = programs::of_layer(Layer::GuardKprobe)
            .filter(|program| guard == Guard::FmodRet && self.link_path(program.name).exists());
        let kprobe = programs::of_layer(Layer::ForkKprobe)
            .filter(|program| self.link_path(program.name).exists());
        let marks = programs::of_layer(Layer::Marks).filter(|_| self.marks());
        let descent = programs::of_layer(Layer::Descent).filter(|_| self.descent());
        let kill = programs::of_layer(Layer::KernelKill).filter(|_| self.kernel_kill());
        always_pinned()
            .chain(kprobe)
            .chain(descent)
            .chain(kill)
            .chain(marks)
            .chain(guard.programs())
            .chain(beside_guard)
            .collect()
    }

    /// Opens the links a previous daemon pinned, to unpin them at a clean shutdown. Their
    /// programs have been attached all along.
    pub fn open_links(&mut self) -> Result<()> {
        for program in self.pinned_programs() {
            let link = self.open_pinned(program.name)?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Opens the link of `program` a previous daemon pinned (to use it: the whois iterator).
    pub fn open_link(&self, program: &str) -> Result<FdLink> {
        Ok(self.open_pinned(program)?.into())
    }

    fn open_pinned(&self, program: &str) -> Result<PinnedLink> {
        let path = self.link_path(program);
        PinnedLink::from_pin(&path)
            .with_context(|| format!("opening the pinned link {}", path.display()))
    }

    /// Removes every pin of this ABI. Only the lock's holder may: it proves no other daemon
    /// holds these pins. The programs detach when the last descriptor of their link closes, and
    /// the maps go when nothing holds them.
    pub fn remove(self, _held: &PinLock) -> Result<()> {
        for link in self.links {
            // Unpinning removes the file; dropping the link closes its descriptor.
            let _ = link.unpin();
        }
        if self.dir.exists() {
            fs::remove_dir_all(&self.dir)
                .with_context(|| format!("removing the pins in {}", self.dir.display()))?;
        }
        Ok(())
    }

    /// [`Pins::remove`], and the root directory too when nothing else is left in it (a clean
    /// shutdown leaves nothing behind; the lock is on that directory, so only its holder's
    /// last act may remove it: the next daemon checks that what it locked is still there).
    pub fn remove_all(self, held: &PinLock) -> Result<()> {
        let root = self.dir.parent().map(Path::to_path_buf);
        self.remove(held)?;
        if let Some(root) = root {
            // Fails, and leaves it, when it is not empty.
            let _ = fs::remove_dir(root);
        }
        Ok(())
    }

    fn link_path(&self, program: &str) -> PathBuf {
        self.dir.join("links").join(program)
    }

    fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }
}

/// The programs whose links are pinned wherever the daemon pins: the tracking layer's, and the
/// whois iterator's. (The other layers' are there where the kernel took them.)
fn always_pinned() -> impl Iterator<Item = &'static Program> {
    programs::of_layer(Layer::Tracking).chain(programs::of_layer(Layer::Whois))
}

/// `v` and a number: the directory of one ABI version's pins.
fn is_version_dir(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix('v'))
        .is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
}

/// Makes `root` a trusted directory on a BPF filesystem, mounting bpffs at /sys/fs/bpf (root's
/// alone) if `root` is below it and nothing is mounted there (some machines do not mount it
/// at boot).
fn ensure_on_bpffs(root: &Path) -> Result<()> {
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if !sys::is_bpffs(existing) {
        let bpffs = Path::new(BPFFS);
        if !root.starts_with(bpffs) || sys::is_bpffs(bpffs) {
            bail!(
                "{} is not on a BPF filesystem: pins need one (mount -t bpf bpf DIR), or run \
                 the daemon with --no-pin",
                root.display()
            );
        }
        // Root's alone: bpffs defaults to 1777, where anyone could make the pin directory
        // first.
        sys::mount_with(c"bpf", bpffs, Some(c"mode=0700")).with_context(|| {
            format!("mounting bpffs at {BPFFS} (as root: mount -t bpf -o mode=0700 bpf {BPFFS})")
        })?;
        tracing::info!(path = BPFFS, "mounted bpffs");
    }
    // Whoever could write it could hide the pins from the next daemon, or put their own.
    trusted_dir::ensure(root, 0o700, "--pin-dir")
}
