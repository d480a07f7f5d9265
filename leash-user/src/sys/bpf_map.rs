//! Batch reads of a BPF hash map (BPF_MAP_LOOKUP_BATCH), with the system call injectable so
//! the reading can be tested against a fake kernel.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
};

use super::bpf::bpf;

/// `union bpf_attr` as BPF_MAP_*_BATCH commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries read per system call. A hash map bucket larger than this would fail with ENOSPC;
/// buckets hold a few entries.
const BATCH: usize = 4096;

/// A BPF hash map's descriptor, checked to hold keys `K` and values `V`, for batch reads.
pub struct HashMapReader<K, V> {
    fd: OwnedFd,
    entry: std::marker::PhantomData<(K, V)>,
}

impl<K: aya::Pod, V: aya::Pod> HashMapReader<K, V> {
    pub fn new(map: &aya::maps::MapData) -> io::Result<Self> {
        let info = map.info().map_err(io::Error::other)?;
        let is_hash = matches!(info.map_type(), Ok(aya::maps::MapType::Hash));
        if !is_hash
            || info.key_size() as usize != size_of::<K>()
            || info.value_size() as usize != size_of::<V>()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a hash map of these key and value types",
            ));
        }
        Ok(Self {
            fd: map.fd().as_fd().try_clone_to_owned()?,
            entry: std::marker::PhantomData,
        })
    }

    /// Every entry, read with BPF_MAP_LOOKUP_BATCH: one system call per 4096 entries, where
    /// walking keys costs two per entry, and each bucket read whole under its lock, so entries
    /// deleted meanwhile never restart the walk. `Unsupported` before Linux 5.6.
    pub fn entries(&self) -> io::Result<Vec<(K, V)>> {
        let call = |attr: &mut BatchAttr| {
            // SAFETY: `lookup_batch` hands over a BPF_MAP_LOOKUP_BATCH attr whose pointers are
            // valid for the call, for as many entries of the map's key and value sizes as its
            // count says.
            unsafe { bpf(BPF_MAP_LOOKUP_BATCH, attr) }.map(drop)
        };
        // SAFETY: `call` is the system call itself, which keeps the contract: the kernel
        // writes `count` back, and that many entries, wherever it succeeds or says ENOENT.
        unsafe { read_batches(self.fd.as_raw_fd(), call) }
    }
}

impl<K: aya::Pod, V: aya::Pod> HashMapReader<K, V> {
    /// Takes `key`'s entry out and returns it, in one step (BPF_MAP_LOOKUP_AND_DELETE_ELEM,
    /// for hash maps from Linux 5.14): what was removed is what is returned, whoever wrote the
    /// entry since it was last read. None if there was none; `Unsupported` before 5.14.
    pub fn take(&self, key: &K) -> io::Result<Option<V>> {
        #[repr(C)]
        struct ElemAttr {
            map_fd: u32,
            _pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
        let mut value = std::mem::MaybeUninit::<V>::zeroed();
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key as *const K as u64,
            value: value.as_mut_ptr() as u64,
            flags: 0,
        };
        // SAFETY: attr is the bpf_attr prefix of this command; key and value are the map's
        // key and value sizes (checked in `new`) and outlive the call.
        match unsafe { bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr) } {
            // SAFETY: zeroed, then written by the kernel; a Pod is valid for any bytes.
            Ok(_) => Ok(Some(unsafe { value.assume_init() })),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            // The kernel's own ENOTSUPP (524), which no libc names.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | 524)) => {
                Err(io::Error::new(io::ErrorKind::Unsupported, e))
            }
            Err(e) => Err(e),
        }
    }
}

/// Every entry of the hash map `fd` holds, read in batches, each read by `call` (the bpf(2)
/// system call, or a fake in the tests).
///
/// # Safety
///
/// As for [`lookup_batch`]: `call` keeps the kernel's contract.
unsafe fn read_batches<K: aya::Pod, V: aya::Pod>(
    fd: RawFd,
    mut call: impl FnMut(&mut BatchAttr) -> io::Result<()>,
) -> io::Result<Vec<(K, V)>> {
    let mut entries = Vec::new();
    let mut keys: Vec<K> = Vec::with_capacity(BATCH);
    let mut values: Vec<V> = Vec::with_capacity(BATCH);
    // The position: for hash maps, a bucket index the kernel hands back. None: the start.
    let mut position = None;
    loop {
        // SAFETY: the caller's contract for `call`; keys and values are empty, with room.
        let (error, next) =
            unsafe { lookup_batch(fd, position, &mut keys, &mut values, &mut call) };
        let filled = keys.len();
        entries.extend(keys.drain(..).zip(values.drain(..)));
        match error {
            // Never seen (the end comes as ENOENT), but it must not loop.
            None if filled == 0 => return Ok(entries),
            None => {}
            // The end of the map: the last chunk came with it.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(entries),
            Some(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Some(e) => return Err(e),
        }
        position = Some(next);
    }
}

/// One BPF_MAP_LOOKUP_BATCH of map `fd` from `position` (None: from the start), made by
/// `call`: up to [`BATCH`] entries into `keys` and `values`, which are empty, with room for
/// that many. Returns the call's error, if it failed, and the position to go on from.
///
/// The kernel writes back how many entries it filled only where it filled them: when the
/// call succeeds, and when it fails with ENOENT (the end of the map, which comes with the last
/// entries). Any other error, EINVAL from a kernel without batch commands (before 5.6) above
/// all, leaves the count as it was sent, the room offered, over entries nobody wrote.
///
/// # Safety
///
/// `call` keeps that contract: where it returns Ok or ENOENT, it has written the attr's
/// `count` back, and that many whole entries where `keys` and `values` point.
unsafe fn lookup_batch<K: aya::Pod, V: aya::Pod>(
    fd: RawFd,
    position: Option<u32>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
    call: impl FnOnce(&mut BatchAttr) -> io::Result<()>,
) -> (Option<io::Error>, u32) {
    debug_assert!(keys.is_empty() && values.is_empty());
    let room = BATCH.min(keys.capacity()).min(values.capacity());
    let in_batch = position.unwrap_or(0);
    let mut next = 0u32;
    let mut attr = BatchAttr {
        in_batch: if position.is_some() {
            &raw const in_batch as u64
        } else {
            0
        },
        out_batch: &raw mut next as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: room as u32,
        map_fd: fd as u32,
        ..BatchAttr::default()
    };
    // The attr is a valid bpf_attr prefix for BPF_MAP_LOOKUP_BATCH: in_batch and next outlive
    // the call; keys and values have room for `count` entries of K and V, the sizes the map's
    // keys and values were checked to have (HashMapReader::new).
    let error = call(&mut attr).err();
    let filled = match &error {
        None => attr.count as usize,
        Some(e) if e.raw_os_error() == Some(libc::ENOENT) => attr.count as usize,
        Some(_) => 0,
    };
    let filled = filled.min(room);
    // SAFETY: `call` wrote `filled` whole entries (the caller's contract; no count, and so
    // none, after any other error), within the capacity; K and V are plain data.
    unsafe {
        keys.set_len(filled);
        values.set_len(filled);
    }
    (error, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel without batch commands (before 5.6): EINVAL, with nothing written back.
    fn no_batches(_: &mut BatchAttr) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// A fake BPF_MAP_LOOKUP_BATCH over `map`, at most `per_call` entries a call, that hands
    /// back the index to go on from as its position and ends with ENOENT, as the kernel does.
    fn fake_batches(
        map: &[(u32, u64)],
        per_call: usize,
    ) -> impl FnMut(&mut BatchAttr) -> io::Result<()> {
        move |attr| {
            let from = match attr.in_batch {
                0 => 0,
                // SAFETY: a position this fake handed back, read through the pointer
                // lookup_batch sets.
                position => (unsafe { *(position as *const u32) }) as usize,
            };
            let take = per_call.min(attr.count as usize).min(map.len() - from);
            for (i, &(key, value)) in map[from..from + take].iter().enumerate() {
                // SAFETY: lookup_batch gave room for `count` entries, and take <= count.
                unsafe {
                    (attr.keys as *mut u32).add(i).write(key);
                    (attr.values as *mut u64).add(i).write(value);
                }
            }
            attr.count = take as u32;
            // SAFETY: out_batch points at lookup_batch's position, a u32.
            unsafe { *(attr.out_batch as *mut u32) = (from + take) as u32 };
            if from + take == map.len() {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn a_failed_batch_read_fills_nothing() {
        let mut keys = Vec::<u32>::with_capacity(BATCH);
        let mut values = Vec::<u64>::with_capacity(BATCH);
        // SAFETY: the fake writes nothing, and fails with neither Ok nor ENOENT.
        let (error, _) = unsafe { lookup_batch(-1, None, &mut keys, &mut values, no_batches) };
        assert_eq!(error.unwrap().raw_os_error(), Some(libc::EINVAL));
        // The count still says BATCH, as sent: none of those entries was written.
        assert!(keys.is_empty() && values.is_empty());
    }

    #[test]
    fn a_kernel_without_batch_reads_is_unsupported() {
        // SAFETY: as above.
        let result = unsafe { read_batches::<u32, u64>(-1, no_batches) };
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::Unsupported);
    }

    #[test]
    fn batches_are_read_to_the_end_of_the_map() {
        let map: Vec<(u32, u64)> = (0..7).map(|i| (i, u64::from(i) * 100)).collect();
        for per_call in [1, 3, 7, 10] {
            // SAFETY: the fake writes `count` entries and the count, on Ok and ENOENT alike.
            let read = unsafe { read_batches::<u32, u64>(-1, fake_batches(&map, per_call)) };
            assert_eq!(read.unwrap(), map, "{per_call} a call");
        }
        // SAFETY: as above.
        let empty = unsafe { read_batches::<u32, u64>(-1, fake_batches(&[], 4)) };
        assert_eq!(empty.unwrap(), []);
    }
}
