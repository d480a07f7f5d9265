//! Filesystems: mounting one, and telling a BPF filesystem.

use std::{ffi::CString, io, os::unix::ffi::OsStrExt, path::Path};

/// mount -t FSTYPE -o OPTIONS FSTYPE TARGET, for filesystems with no device (bpf), with the
/// filesystem's own options (e.g. `mode=0700`).
pub fn mount_with(
    fstype: &std::ffi::CStr,
    target: &Path,
    options: Option<&std::ffi::CStr>,
) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_bytes())?;
    let options = options.map_or(std::ptr::null(), |o| o.as_ptr().cast());
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call, or
    // null for no options.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            options,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` is the root of a mounted BPF filesystem (statfs's magic number).
pub fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain data (integers), for which all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and `stat` a valid statfs to write into, both alive for
    // the call.
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut stat) };
    rc == 0 && stat.f_type as i64 == BPF_FS_MAGIC
}
