//! A writer of the archive format the kernel unpacks as its initramfs: cpio "newc" (ASCII
//! headers, no compression). Written here rather than through `cpio -o` so that the archive can
//! hold a device node (/dev/console, which init needs before it mounts devtmpfs) without the
//! files being staged as root, and so that each file streams straight from where it lies.

use std::io::{self, Read, Write};

const MAGIC: &str = "070701";
const HEADER_LEN: usize = 110;

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

pub(super) struct Writer<W: Write> {
    out: W,
    next_inode: u32,
    written: u64,
}

/// One entry's header fields that vary.
struct Header<'a> {
    name: &'a str,
    mode: u32,
    size: u64,
    mtime: u64,
    rdev: (u32, u32),
}

impl<W: Write> Writer<W> {
    pub(super) fn new(out: W) -> Self {
        Self {
            out,
            next_inode: 1,
            written: 0,
        }
    }

    /// `path` is the path inside the image, absolute or not ("/usr/bin" and "usr/bin" are the
    /// same). A directory must come before what it holds: the kernel creates no parents.
    pub(super) fn dir(&mut self, path: &str, permissions: u32) -> io::Result<()> {
        self.header(&Header {
            name: path,
            mode: S_IFDIR | permissions,
            size: 0,
            mtime: 0,
            rdev: (0, 0),
        })
    }

    pub(super) fn file(
        &mut self,
        path: &str,
        permissions: u32,
        mtime: u64,
        size: u64,
        data: &mut impl Read,
    ) -> io::Result<()> {
        self.header(&Header {
            name: path,
            mode: S_IFREG | permissions,
            size,
            mtime,
            rdev: (0, 0),
        })?;
        let copied = io::copy(&mut data.take(size), &mut self.out)?;
        if copied != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{path}: {copied} of {size} bytes (did it change while being read?)"),
            ));
        }
        self.written += size;
        self.pad()
    }

    pub(super) fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.header(&Header {
            name: path,
            mode: S_IFLNK | 0o777,
            size: target.len() as u64,
            mtime: 0,
            rdev: (0, 0),
        })?;
        self.write(target.as_bytes())?;
        self.pad()
    }

    pub(super) fn char_device(
        &mut self,
        path: &str,
        permissions: u32,
        major: u32,
        minor: u32,
    ) -> io::Result<()> {
        self.header(&Header {
            name: path,
            mode: S_IFCHR | permissions,
            size: 0,
            mtime: 0,
            rdev: (major, minor),
        })
    }

    /// Writes the trailer; returns the archive's size and its output.
    pub(super) fn finish(mut self) -> io::Result<(u64, W)> {
        self.header(&Header {
            name: "TRAILER!!!",
            mode: 0,
            size: 0,
            mtime: 0,
            rdev: (0, 0),
        })?;
        self.out.flush()?;
        Ok((self.written, self.out))
    }

    fn header(&mut self, header: &Header) -> io::Result<()> {
        let name = header.name.trim_start_matches('/');
        let name = if name.is_empty() { "." } else { name };
        let size = u32::try_from(header.size).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: over 4 GiB"))
        })?;
        let inode = self.next_inode;
        self.next_inode += 1;
        let nlink = if header.mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            inode,
            header.mode,
            0, // uid
            0, // gid
            nlink,
            header.mtime as u32,
            size,
            0, // device major
            0, // device minor
            header.rdev.0,
            header.rdev.1,
            name.len() as u32 + 1, // with its NUL
            0,                     // checksum: unused in newc
        ];
        let mut text = String::with_capacity(HEADER_LEN);
        text.push_str(MAGIC);
        for field in fields {
            text.push_str(&format!("{field:08x}"));
        }
        self.write(text.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Headers and data each start on a 4-byte boundary.
    fn pad(&mut self) -> io::Result<()> {
        let padding = (4 - self.written % 4) % 4;
        self.write(&[0; 3][..padding as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_headed_as_newc() {
        let mut writer = Writer::new(Vec::new());
        writer.dir("/bin", 0o755).unwrap();
        writer
            .file("/bin/hello", 0o755, 7, 5, &mut &b"hello"[..])
            .unwrap();
        writer.symlink("/sh", "bin/hello").unwrap();
        writer.char_device("/dev/console", 0o600, 5, 1).unwrap();
        let (size, bytes) = writer.finish().unwrap();
        assert_eq!(size as usize, bytes.len());
        assert_eq!(bytes.len() % 4, 0);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("070701"));
        // The directory's header: inode 1, mode 040755, name "bin" (4 with its NUL).
        assert_eq!(&text[6..22], "00000001000041ed");
        assert_eq!(&text[94..102], "00000004");
        assert_eq!(&text[110..114], "bin\0");
        // The file's data starts on the next 4-byte boundary after its name.
        let data = (text.find("bin/hello\0").unwrap() + 10).next_multiple_of(4);
        assert_eq!(&text[data..data + 5], "hello");
        assert!(text.ends_with("TRAILER!!!\0\0\0\0"), "{text:?}");
        // The device: rdev 5:1.
        let console = text.find("dev/console").unwrap();
        assert_eq!(
            &text[console - 110 + 78..console - 110 + 94],
            "0000000500000001"
        );
    }

    #[test]
    fn a_short_read_is_an_error() {
        let mut writer = Writer::new(Vec::new());
        assert!(writer.file("f", 0o644, 0, 10, &mut &b"short"[..]).is_err());
    }
}
