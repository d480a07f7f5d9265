//! bpf(2): loading and attaching the programs aya cannot (tracing programs by BTF id), pins,
//! links by id, iterators, and the probe of whether the system call may be used at all.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

/// `union bpf_attr` as BPF_PROG_LOAD reads it, up to `attach_prog_fd` (Linux 5.5).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    _pad: u32,
}

/// bpf(2): `command` with `attr`; returns what the call returned (a new descriptor, for the
/// commands that make one).
///
/// # Safety
///
/// `attr` is the prefix of `union bpf_attr` that `command` reads, and every pointer in it is
/// valid (for reads, or for the writes the command makes) for the duration of the call.
pub(super) unsafe fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut T, size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A descriptor a bpf(2) command returned: new, and owned by nothing else.
fn new_bpf_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;
const BPF_MODIFY_RETURN: u32 = 26;
const BPF_PROG_TYPE_LSM: u32 = 29;
const BPF_LSM_MAC: u32 = 27;

/// The BPF instruction of opcode `code` whose registers, offset and immediate are all zero
/// (`r0 = 0` is 0xb7, `exit` 0x95).
pub fn zeroed_insn(code: u8) -> aya_obj::generated::bpf_insn {
    // SAFETY: bpf_insn is plain data (integers and a bitfield of integers), for which all
    // zeroes is a valid value.
    let mut insn: aya_obj::generated::bpf_insn = unsafe { std::mem::zeroed() };
    insn.code = code;
    insn
}

/// What the verifier said of a program it refused, beside the errno.
#[derive(Debug)]
pub struct LoadError {
    pub error: io::Error,
    pub log: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        let log = self.log.trim();
        if !log.is_empty() {
            // The end of the log says why.
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            write!(f, "; verifier log, last lines:")?;
            for line in tail.iter().rev() {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// What a program loaded by BTF id attaches as. aya 0.14 cannot load fmod_ret programs, nor
/// the guard's LSM program relocated as this project's is (see kernel/ptrace_guard.rs).
#[derive(Clone, Copy, Debug)]
pub enum AttachKind {
    /// A tracing program of attach type BPF_MODIFY_RETURN on a kernel function.
    FmodRet,
    /// A BPF LSM program (Linux 5.7) on the hook whose `bpf_lsm_*` stub is named.
    Lsm,
    /// A BTF-typed tracepoint program (tp_btf) on the tracepoint whose `btf_trace_*` typedef is
    /// named: what `leash doctor` loads to see that the kernel takes the programs' kind.
    TpBtf,
}

impl AttachKind {
    /// Its `(prog_type, expected_attach_type)`.
    fn types(self) -> (u32, u32) {
        match self {
            Self::FmodRet => (BPF_PROG_TYPE_TRACING, BPF_MODIFY_RETURN),
            Self::Lsm => (BPF_PROG_TYPE_LSM, BPF_LSM_MAC),
            Self::TpBtf => (BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP),
        }
    }
}

/// BPF_PROG_LOAD of a program of `kind` on what the BTF id `attach_btf_id` names in vmlinux.
/// A refusal is retried once with the verifier's log, which the error carries.
pub fn load_by_btf_id(
    kind: AttachKind,
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &std::ffi::CStr,
    attach_btf_id: u32,
) -> Result<OwnedFd, LoadError> {
    let (prog_type, expected_attach_type) = kind.types();
    let mut prog_name = [0u8; 16];
    // 15 bytes at most, and NUL-terminated: the kernel refuses a name without its NUL.
    let shown = name.len().min(15);
    prog_name[..shown].copy_from_slice(&name.as_bytes()[..shown]);
    let load = |log: &mut Vec<u8>| {
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name,
            expected_attach_type,
            attach_btf_id,
            ..ProgLoadAttr::default()
        };
        // SAFETY: attr is a valid bpf_attr prefix for BPF_PROG_LOAD; insns (8-byte
        // instructions, insn_cnt of them), license (NUL-terminated) and log (log_size bytes,
        // written by the kernel) outlive the call.
        unsafe { bpf(BPF_PROG_LOAD, &mut attr) }.map(new_bpf_fd)
    };
    match load(&mut Vec::new()) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            let mut log = vec![0u8; 1 << 20];
            match load(&mut log) {
                Ok(fd) => Ok(fd),
                Err(error) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    Err(LoadError {
                        error,
                        log: String::from_utf8_lossy(&log[..end]).into_owned(),
                    })
                }
            }
        }
    }
}

/// Attaches a loaded tracing program (fentry, fexit, fmod_ret) or LSM program where its load
/// named, through
/// BPF_RAW_TRACEPOINT_OPEN with no name: the way that works on every kernel from Linux 5.5
/// (BPF_LINK_CREATE came to tracing programs later; this one attached on 5.10, 6.1 and 6.12).
/// The descriptor returned is a BPF link (5.7): it can be pinned, and the program stays
/// attached while the link or its pin lives.
pub fn attach_tracing(program: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct RawTracepointAttr {
        name: u64,
        prog_fd: u32,
        _pad: u32,
    }
    let mut attr = RawTracepointAttr {
        name: 0,
        prog_fd: program.as_raw_fd() as u32,
        _pad: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_RAW_TRACEPOINT_OPEN (a null name).
    unsafe { bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr) }.map(new_bpf_fd)
}

/// BPF_OBJ_PIN: pins a BPF object (here a link) at `path` on a BPF filesystem.
pub fn pin_object(object: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    #[repr(C)]
    struct PinAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let path = CString::new(path.as_os_str().as_bytes())?;
    let mut attr = PinAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: object.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_OBJ_PIN; path is NUL-terminated and
    // outlives the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_ITER_CREATE: libc::c_long = 33;

/// A new descriptor of the BPF link `id`: it holds the link whatever becomes of the one that
/// made it (aya's own link handles do not lend theirs).
pub fn bpf_link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct GetFdById {
        link_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = GetFdById {
        link_id: id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command, with no pointers.
    unsafe { bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) }.map(new_bpf_fd)
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// A new descriptor of the loaded program `id` (a link's program, say).
pub fn bpf_prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct GetFdById {
        prog_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = GetFdById {
        prog_id: id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command, with no pointers.
    unsafe { bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) }.map(new_bpf_fd)
}

/// The id of the program the BPF link `link` attaches (`bpf_link_info.prog_id`).
pub fn bpf_link_program_id(link: BorrowedFd<'_>) -> io::Result<u32> {
    /// The start of `struct bpf_link_info`, all this needs of it.
    #[repr(C)]
    #[derive(Default)]
    struct LinkInfo {
        type_: u32,
        id: u32,
        prog_id: u32,
    }
    let mut info = LinkInfo::default();
    // SAFETY: LinkInfo is a prefix of bpf_link_info, plain integers.
    unsafe { obj_get_info(link, &mut info) }?;
    Ok(info.prog_id)
}

/// BPF_OBJ_GET_INFO_BY_FD of `object` into `info`. A kernel whose struct is shorter writes only
/// its own part, and one whose struct is longer only `info`'s.
///
/// # Safety
///
/// `T` is a prefix of the object kind's `bpf_*_info` (or all of it), for which zero is a value,
/// zeroed where the kernel reads it (its pointer fields).
unsafe fn obj_get_info<T>(object: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    #[repr(C)]
    struct GetInfo {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr = GetInfo {
        bpf_fd: object.as_raw_fd() as u32,
        info_len: size_of::<T>() as u32,
        info: info as *mut T as u64,
    };
    // SAFETY: attr is the bpf_attr prefix of this command; info points to info_len writable
    // bytes that outlive the call.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }.map(drop)
}

/// How many times the kernel skipped the program `program` rather than run it again on a CPU
/// where it was running already (`recursion_misses`, Linux 5.12; for tracepoint programs,
/// counted since 6.1, which brought their guard). 0 where the kernel does not count them.
pub fn bpf_prog_recursion_misses(program: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: bpf_prog_info is plain integers and arrays, for which zero is a value.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: the whole bpf_prog_info of the headers aya was made with, zeroed (no array
    // asked for).
    unsafe { obj_get_info(program, &mut info) }?;
    Ok(info.recursion_misses)
}

/// A new iterator of the iterator link `link`: reading it to its end runs the program once per
/// object (and once more with none).
pub fn bpf_iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    #[repr(C)]
    struct IterCreate {
        link_fd: u32,
        flags: u32,
    }
    let mut attr = IterCreate {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command, with no pointers.
    unsafe { bpf(BPF_ITER_CREATE, &mut attr) }.map(|fd| new_bpf_fd(fd).into())
}

/// BPF_MAP_CREATE of the smallest array map (one 4-byte entry), closed at once: whether this
/// process may use the bpf(2) system call at all. EPERM without the privileges (CAP_BPF or
/// CAP_SYS_ADMIN), ENOSYS on a kernel built without CONFIG_BPF_SYSCALL.
pub fn bpf_map_create_probe() -> io::Result<()> {
    #[repr(C)]
    struct MapCreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_MAP_CREATE; it holds no pointers.
    unsafe { bpf(BPF_MAP_CREATE, &mut attr) }.map(|fd| drop(new_bpf_fd(fd)))
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM and BPF_MAP_UPDATE_ELEM read it.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The value of a task storage map (`map`) on the process `pidfd` names: the key of such a map
/// is a pidfd, so a recycled pid can never match. None if it has none.
pub fn task_storage_get<V: aya::Pod>(
    map: BorrowedFd<'_>,
    pidfd: BorrowedFd<'_>,
) -> io::Result<Option<V>> {
    let key: u32 = pidfd.as_raw_fd() as u32;
    let mut value = std::mem::MaybeUninit::<V>::zeroed();
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: value.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command; key (4 bytes, the map's key size)
    // and value (a V, the map's value size as the map was made for it) outlive the call.
    match unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
        // SAFETY: zeroed, then written by the kernel; a Pod is valid for any bytes.
        Ok(_) => Ok(Some(unsafe { value.assume_init() })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Stores `value` in a task storage map (`map`) on the process `pidfd` names (BPF_ANY).
pub fn task_storage_set<V: aya::Pod>(
    map: BorrowedFd<'_>,
    pidfd: BorrowedFd<'_>,
    value: &V,
) -> io::Result<()> {
    let key: u32 = pidfd.as_raw_fd() as u32;
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: value as *const V as u64,
        flags: 0,
    };
    // SAFETY: attr is the bpf_attr prefix of this command; key and value (the map's sizes)
    // outlive the call, and are only read.
    unsafe { bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}
