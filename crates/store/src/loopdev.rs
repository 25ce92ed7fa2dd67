//! Attaching the store image to a loop device through the ioctls of linux/loop.h,
//! so the daemon needs no `losetup` and the device cleans itself up.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::StoreError;

const LOOP_CONTROL: &str = "/dev/loop-control";
/// LO_NAME_SIZE.
const LO_NAME_SIZE: usize = 64;
/// LO_KEY_SIZE.
const LO_KEY_SIZE: usize = 32;
/// LO_FLAGS_AUTOCLEAR: the device detaches from its file when its last user (the
/// mount) goes away, so an unmount, or a crash before the mount, leaks nothing.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// struct loop_info64.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LoopInfo64 {
    pub lo_device: u64,
    pub lo_inode: u64,
    pub lo_rdevice: u64,
    pub lo_offset: u64,
    pub lo_sizelimit: u64,
    pub lo_number: u32,
    pub lo_encrypt_type: u32,
    pub lo_encrypt_key_size: u32,
    pub lo_flags: u32,
    pub lo_file_name: [u8; LO_NAME_SIZE],
    pub lo_crypt_name: [u8; LO_NAME_SIZE],
    pub lo_encrypt_key: [u8; LO_KEY_SIZE],
    pub lo_init: [u64; 2],
}

/// struct loop_config.
#[repr(C)]
pub(crate) struct LoopConfig {
    pub fd: u32,
    pub block_size: u32,
    pub info: LoopInfo64,
    pub reserved: [u64; 8],
}

// Sizes gcc reports for linux/loop.h; the loop ioctls do not encode sizes, so a
// mistake here would not be caught by the kernel.
const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);
const _: () = assert!(std::mem::offset_of!(LoopConfig, info) == 8);

mod ioctl {
    use super::{LoopConfig, LoopInfo64};

    // The loop ioctls predate the _IOC encoding, hence the *_bad variants.
    nix::ioctl_none_bad!(ctl_get_free, 0x4C82);
    nix::ioctl_write_ptr_bad!(configure, 0x4C0A, LoopConfig);
    nix::ioctl_write_int_bad!(set_fd, 0x4C00);
    nix::ioctl_none_bad!(clr_fd, 0x4C01);
    nix::ioctl_write_ptr_bad!(set_status64, 0x4C04, LoopInfo64);
}

/// Attach `image` to a free loop device with autoclear set. Returns the device path
/// and an open fd of the device: keep it open until the device is mounted, since
/// closing the last reference of an autoclear device detaches it.
pub(crate) fn attach(image: &Path) -> Result<(PathBuf, File), StoreError> {
    attach_with(image, false)
}

/// `legacy` skips LOOP_CONFIGURE, so tests can exercise the fallback on new kernels.
fn attach_with(image: &Path, legacy: bool) -> Result<(PathBuf, File), StoreError> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)
        .map_err(|source| StoreError::Open {
            path: image.into(),
            source,
        })?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(LOOP_CONTROL)
        .map_err(|source| StoreError::Open {
            path: LOOP_CONTROL.into(),
            source,
        })?;

    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; LO_NAME_SIZE],
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; LO_KEY_SIZE],
        lo_init: [0; 2],
    };
    // Informational only (losetup shows it); the kernel keeps the real file. Leave
    // the last byte NUL.
    let name = image.as_os_str().as_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    info.lo_file_name[..len].copy_from_slice(&name[..len]);

    // Between GET_FREE and binding, another process (another daemon, losetup) can
    // take the same device, which shows up as EBUSY: ask for another one.
    const ATTEMPTS: u32 = 8;
    for _ in 0..ATTEMPTS {
        // SAFETY: `control` is an open fd of /dev/loop-control; the ioctl takes no
        // argument.
        let number = unsafe { ioctl::ctl_get_free(control.as_raw_fd()) }.map_err(|errno| {
            StoreError::Ioctl {
                op: "get free loop device",
                path: LOOP_CONTROL.into(),
                source: errno.into(),
            }
        })?;
        let device = PathBuf::from(format!("/dev/loop{number}"));
        let dev = open_device(&device)?;
        match bind(&dev, &backing, &info, legacy) {
            Ok(()) => {
                tracing::debug!(device = %device.display(), image = %image.display(), "attached loop device");
                return Ok((device, dev));
            }
            Err(Errno::EBUSY) => {
                tracing::debug!(device = %device.display(), "loop device taken meanwhile, retrying");
                continue;
            }
            Err(errno) => {
                return Err(StoreError::LoopAttach {
                    device,
                    image: image.into(),
                    source: errno.into(),
                })
            }
        }
    }
    Err(StoreError::LoopAttach {
        device: LOOP_CONTROL.into(),
        image: image.into(),
        source: Errno::EBUSY.into(),
    })
}

fn bind(dev: &File, backing: &File, info: &LoopInfo64, legacy: bool) -> Result<(), Errno> {
    if legacy {
        set_fd_and_status(dev, backing, info)
    } else {
        configure(dev, backing, info)
    }
}

/// LOOP_CONFIGURE, falling back to the two-step legacy ioctls where it is missing.
fn configure(dev: &File, backing: &File, info: &LoopInfo64) -> Result<(), Errno> {
    let config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        info: *info,
        reserved: [0; 8],
    };
    // SAFETY: `dev` and `backing` are open fds for the call's duration; `config` is
    // a fully initialised struct loop_config (layout checked above) with zeroed
    // reserved fields, which the kernel only reads.
    match unsafe { ioctl::configure(dev.as_raw_fd(), &config) } {
        Ok(_) => return Ok(()),
        // Kernels before 5.8 have no LOOP_CONFIGURE and answer EINVAL (or ENOTTY).
        Err(Errno::EINVAL | Errno::ENOTTY) => {}
        Err(errno) => return Err(errno),
    }
    tracing::debug!("LOOP_CONFIGURE unsupported, using LOOP_SET_FD + LOOP_SET_STATUS64");
    set_fd_and_status(dev, backing, info)
}

fn set_fd_and_status(dev: &File, backing: &File, info: &LoopInfo64) -> Result<(), Errno> {
    // SAFETY: both fds are open for the call's duration; LOOP_SET_FD takes the
    // backing fd as its integer argument.
    unsafe { ioctl::set_fd(dev.as_raw_fd(), backing.as_raw_fd()) }?;
    // SAFETY: `dev` is open and bound; `info` is a fully initialised loop_info64
    // which the kernel only reads.
    if let Err(errno) = unsafe { ioctl::set_status64(dev.as_raw_fd(), info) } {
        // Without autoclear the device would outlive us, so undo the binding.
        // SAFETY: `dev` is an open fd; LOOP_CLR_FD takes no argument.
        let _ = unsafe { ioctl::clr_fd(dev.as_raw_fd()) };
        return Err(errno);
    }
    Ok(())
}

/// Open /dev/loopN, giving devtmpfs/udev a moment to create a node for a device
/// that LOOP_CTL_GET_FREE has just added.
fn open_device(device: &Path) -> Result<File, StoreError> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(device)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(source) => {
                return Err(StoreError::Open {
                    path: device.into(),
                    source,
                })
            }
        }
    }
}

/// The backing file the kernel reports for `device` (e.g. /dev/loop3), if bound.
pub(crate) fn backing_file(device: &Path) -> Option<PathBuf> {
    let name = device.file_name()?;
    let sys = Path::new("/sys/block").join(name).join("loop/backing_file");
    let text = std::fs::read_to_string(sys).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_file_of_missing_device_is_none() {
        assert_eq!(backing_file(Path::new("/dev/loop-none")), None);
    }

    /// Both ways of binding give an autoclearing device that goes away with its last
    /// fd (needs root and /dev/loop-control).
    #[test]
    fn attach_sets_autoclear_and_detaches_on_close() {
        for legacy in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let image = std::fs::canonicalize(dir.path()).unwrap().join("img");
            std::fs::File::create(&image)
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            let (device, fd) = attach_with(&image, legacy).unwrap();
            assert_eq!(
                backing_file(&device).as_deref(),
                Some(image.as_path()),
                "legacy={legacy}"
            );
            let sys = Path::new("/sys/block").join(device.file_name().unwrap());
            let autoclear = std::fs::read_to_string(sys.join("loop/autoclear")).unwrap();
            assert_eq!(autoclear.trim(), "1", "legacy={legacy}");
            drop(fd);
            let deadline = Instant::now() + Duration::from_secs(2);
            while backing_file(&device).is_some_and(|f| f == image) {
                assert!(
                    Instant::now() < deadline,
                    "{} not detached (legacy={legacy})",
                    device.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
