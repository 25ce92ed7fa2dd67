//! X11 screen capture for the guest agent, in pure Rust (x11rb's
//! `RustConnection`, so the guest binary needs no libxcb).
//!
//! `Screen` is blocking, like the X protocol client under it. From a tokio
//! program, keep it in an `Arc` and call it inside
//! `tokio::task::spawn_blocking`; `Screen` is `Send + Sync`. Requests from
//! several threads are fine (x11rb serialises them); only one thread at a
//! time should wait for damage, since waiting consumes the connection's
//! events.

mod error;
mod frame;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::{AtomEnum, ConnectionExt as _, ImageFormat, ImageOrder, Window};
use x11rb::protocol::Event;
use x11rb::rust_connection::RustConnection;

pub use error::ScreenError;
pub use frame::Frame;

/// A connection to one X display and its first screen.
pub struct Screen {
    conn: RustConnection,
    root: Window,
    width: u16,
    height: u16,
    format: PixelFormat,
    /// Accumulates changes to the root window (and so to everything on
    /// screen) from the moment of connecting; see `wait_for_damage`.
    damage: damage::Damage,
}

/// How GetImage's ZPixmap bytes encode a pixel on this server.
#[derive(Clone, Copy, Debug)]
struct PixelFormat {
    bits_per_pixel: u8,
    /// Bytes from one row to the next, including scanline padding.
    stride_pad_bits: u8,
    msb_first: bool,
    masks: [u32; 3],
}

impl Screen {
    /// Connects to `display` (e.g. ":0") and prepares XFixes (cursor
    /// image) and DAMAGE (change notification) on its root window.
    pub fn connect(display: &str) -> Result<Screen, ScreenError> {
        let (conn, screen_num) =
            RustConnection::connect(Some(display)).map_err(|source| ScreenError::Connect {
                display: display.to_string(),
                source,
            })?;
        let setup = conn.setup();
        let screen = &setup.roots[screen_num];
        let (root, width, height, depth) = (
            screen.root,
            screen.width_in_pixels,
            screen.height_in_pixels,
            screen.root_depth,
        );
        let visual = screen
            .allowed_depths
            .iter()
            .flat_map(|d| d.visuals.iter())
            .find(|v| v.visual_id == screen.root_visual);
        let pixmap = setup.pixmap_formats.iter().find(|f| f.depth == depth);
        let (Some(visual), Some(pixmap)) = (visual, pixmap) else {
            return Err(ScreenError::UnsupportedFormat {
                depth,
                bits_per_pixel: 0,
            });
        };
        if !matches!(pixmap.bits_per_pixel, 24 | 32) {
            return Err(ScreenError::UnsupportedFormat {
                depth,
                bits_per_pixel: pixmap.bits_per_pixel,
            });
        }
        let format = PixelFormat {
            bits_per_pixel: pixmap.bits_per_pixel,
            stride_pad_bits: pixmap.scanline_pad,
            msb_first: setup.image_byte_order == ImageOrder::MSB_FIRST,
            masks: [visual.red_mask, visual.green_mask, visual.blue_mask],
        };

        // Both extensions refuse requests from clients that did not first
        // announce the version they speak.
        for (name, ext) in [
            ("XFIXES", x11rb::protocol::xfixes::X11_EXTENSION_NAME),
            ("DAMAGE", damage::X11_EXTENSION_NAME),
        ] {
            let present = conn
                .extension_information(ext)
                .map_err(ScreenError::send("QueryExtension"))?
                .is_some();
            if !present {
                return Err(ScreenError::MissingExtension(name));
            }
        }
        conn.xfixes_query_version(5, 0)
            .map_err(ScreenError::send("XFixesQueryVersion"))?
            .reply()
            .map_err(ScreenError::request("XFixesQueryVersion"))?;
        conn.damage_query_version(1, 1)
            .map_err(ScreenError::send("DamageQueryVersion"))?
            .reply()
            .map_err(ScreenError::request("DamageQueryVersion"))?;
        let damage = conn
            .generate_id()
            .map_err(|source| ScreenError::AllocateId {
                op: "allocate DAMAGE id",
                source,
            })?;
        // NonEmpty: one event when the damage region goes from empty to
        // non-empty, not one per drawn rectangle, so a busy screen does not
        // flood the connection between waits.
        conn.damage_create(damage, root, damage::ReportLevel::NON_EMPTY)
            .map_err(ScreenError::send("DamageCreate on root window"))?
            .check()
            .map_err(ScreenError::request("DamageCreate on root window"))?;

        Ok(Screen {
            conn,
            root,
            width,
            height,
            format,
            damage,
        })
    }

    /// The screen's size in pixels, as (width, height).
    pub fn size(&self) -> (u32, u32) {
        (self.width as u32, self.height as u32)
    }

    /// The pointer's position on the root window.
    pub fn cursor_position(&self) -> Result<(i32, i32), ScreenError> {
        let reply = self
            .conn
            .query_pointer(self.root)
            .map_err(ScreenError::send("QueryPointer"))?
            .reply()
            .map_err(ScreenError::request("QueryPointer"))?;
        Ok((reply.root_x as i32, reply.root_y as i32))
    }

    /// The size of the first window the window manager lists in
    /// `_NET_CLIENT_LIST` whose WM_CLASS instance or class name equals
    /// `class`, ignoring case; `None` when there is none (or no EWMH window
    /// manager). Windows that vanish while we look are skipped.
    pub fn window_size_by_class(&self, class: &str) -> Result<Option<(u32, u32)>, ScreenError> {
        let atom = self
            .conn
            .intern_atom(true, b"_NET_CLIENT_LIST")
            .map_err(ScreenError::send("InternAtom _NET_CLIENT_LIST"))?
            .reply()
            .map_err(ScreenError::request("InternAtom _NET_CLIENT_LIST"))?
            .atom;
        if atom == x11rb::NONE {
            return Ok(None);
        }
        let list = self
            .conn
            .get_property(false, self.root, atom, AtomEnum::ANY, 0, u32::MAX / 4)
            .map_err(ScreenError::send("GetProperty _NET_CLIENT_LIST"))?
            .reply()
            .map_err(ScreenError::request("GetProperty _NET_CLIENT_LIST"))?;
        let wanted = class.to_lowercase();
        let Some(windows) = list.value32() else {
            return Ok(None);
        };
        for w in windows {
            let Ok(cookie) =
                self.conn
                    .get_property(false, w, AtomEnum::WM_CLASS, AtomEnum::STRING, 0, 1024)
            else {
                continue;
            };
            let Ok(prop) = cookie.reply() else { continue };
            let matches = prop.value.split(|b| *b == 0).any(|name| {
                !name.is_empty() && String::from_utf8_lossy(name).to_lowercase() == wanted
            });
            if !matches {
                continue;
            }
            if let Ok(Ok(g)) = self.conn.get_geometry(w).map(|c| c.reply()) {
                return Ok(Some((g.width as u32, g.height as u32)));
            }
        }
        Ok(None)
    }

    /// Captures the whole root window; with `cursor`, draws the current
    /// cursor image over it at the pointer, offset by the cursor's hotspot
    /// (X never includes the cursor in GetImage).
    pub fn capture(&self, cursor: bool) -> Result<Frame, ScreenError> {
        let reply = self
            .conn
            .get_image(
                ImageFormat::Z_PIXMAP,
                self.root,
                0,
                0,
                self.width,
                self.height,
                !0,
            )
            .map_err(ScreenError::send("GetImage of root window"))?
            .reply()
            .map_err(ScreenError::request("GetImage of root window"))?;
        let mut frame = self.format.to_frame(&reply.data, self.width, self.height)?;
        if cursor {
            let c = self
                .conn
                .xfixes_get_cursor_image()
                .map_err(ScreenError::send("XFixesGetCursorImage"))?
                .reply()
                .map_err(ScreenError::request("XFixesGetCursorImage"))?;
            frame.blend_argb_premultiplied(
                c.x as i32 - c.xhot as i32,
                c.y as i32 - c.yhot as i32,
                c.width as u32,
                c.height as u32,
                &c.cursor_image,
            );
        }
        Ok(frame)
    }

    /// Forgets the changes accumulated so far, so that the next
    /// `wait_for_damage` reports only later ones. Call it before the
    /// action whose effect you want to wait for.
    pub fn reset_damage(&self) -> Result<(), ScreenError> {
        self.subtract_damage()?;
        // Drop notifications already queued for the damage just cleared.
        while self
            .conn
            .poll_for_event()
            .map_err(ScreenError::send("read X events"))?
            .is_some()
        {}
        Ok(())
    }

    /// Waits until something on screen has changed since connecting or since
    /// the previous `wait_for_damage` / `reset_damage`, then clears it.
    /// Returns `Ok(false)` when `timeout` passes first.
    ///
    /// Blocking: from async code, run it in `spawn_blocking`.
    pub fn wait_for_damage(&self, timeout: Duration) -> Result<bool, ScreenError> {
        let deadline = Instant::now() + timeout;
        loop {
            // Events may already sit in x11rb's buffer, where poll(2) on the
            // socket cannot see them: drain the buffer before sleeping.
            while let Some(event) = self
                .conn
                .poll_for_event()
                .map_err(ScreenError::send("read X events"))?
            {
                if let Event::DamageNotify(ev) = event {
                    if ev.damage == self.damage {
                        self.subtract_damage()?;
                        return Ok(true);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let fd = self.conn.stream().as_fd();
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(ScreenError::Poll(e)),
            }
        }
    }

    fn subtract_damage(&self) -> Result<(), ScreenError> {
        // Subtracting everything (NONE, NONE) re-arms NonEmpty reporting.
        self.conn
            .damage_subtract(self.damage, x11rb::NONE, x11rb::NONE)
            .map_err(ScreenError::send("DamageSubtract"))?;
        self.conn
            .flush()
            .map_err(ScreenError::send("flush X connection"))
    }
}

impl PixelFormat {
    fn to_frame(self, data: &[u8], width: u16, height: u16) -> Result<Frame, ScreenError> {
        let (w, h) = (width as usize, height as usize);
        let bpp = self.bits_per_pixel as usize;
        let pad = self.stride_pad_bits.max(8) as usize;
        let stride = (w * bpp).div_ceil(pad) * pad / 8;
        let expected = stride * h;
        if data.len() < expected {
            return Err(ScreenError::ShortImage {
                got: data.len(),
                expected,
            });
        }
        let bytes = bpp / 8;
        let channels = self.masks.map(Channel::from_mask);
        let mut rgba = Vec::with_capacity(w * h * 4);
        for row in data.chunks_exact(stride).take(h) {
            for px in row[..w * bytes].chunks_exact(bytes) {
                let mut v = 0u32;
                if self.msb_first {
                    for &b in px {
                        v = (v << 8) | b as u32;
                    }
                } else {
                    for &b in px.iter().rev() {
                        v = (v << 8) | b as u32;
                    }
                }
                rgba.extend_from_slice(&[
                    channels[0].extract(v),
                    channels[1].extract(v),
                    channels[2].extract(v),
                    0xff,
                ]);
            }
        }
        Ok(Frame {
            width: width as u32,
            height: height as u32,
            rgba,
        })
    }
}

/// One colour channel of a TrueColor visual, from its mask.
#[derive(Clone, Copy)]
struct Channel {
    shift: u32,
    max: u32,
}

impl Channel {
    fn from_mask(mask: u32) -> Channel {
        if mask == 0 {
            return Channel { shift: 0, max: 0 };
        }
        let shift = mask.trailing_zeros();
        Channel {
            shift,
            max: mask >> shift,
        }
    }

    fn extract(self, pixel: u32) -> u8 {
        if self.max == 0 {
            return 0;
        }
        let v = (pixel >> self.shift) & self.max;
        // Scale channels narrower than 8 bits (e.g. 10-bit visuals) to 0..=255.
        ((v * 255 + self.max / 2) / self.max) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bgrx() -> PixelFormat {
        PixelFormat {
            bits_per_pixel: 32,
            stride_pad_bits: 32,
            msb_first: false,
            masks: [0xff0000, 0x00ff00, 0x0000ff],
        }
    }

    #[test]
    fn converts_lsb_first_32bpp() {
        // Two pixels: red, then (1, 2, 3); LSB-first stores B, G, R, X.
        let data = [0, 0, 255, 0, 3, 2, 1, 0];
        let f = bgrx().to_frame(&data, 2, 1).unwrap();
        assert_eq!(f.rgba, vec![255, 0, 0, 255, 1, 2, 3, 255]);
    }

    #[test]
    fn converts_msb_first_24bpp_with_padding() {
        let fmt = PixelFormat {
            bits_per_pixel: 24,
            stride_pad_bits: 32,
            msb_first: true,
            ..bgrx()
        };
        // One 24-bit pixel per row, padded to 4 bytes; two rows.
        let data = [10, 20, 30, 0, 40, 50, 60, 0];
        let f = fmt.to_frame(&data, 1, 2).unwrap();
        assert_eq!(f.rgba, vec![10, 20, 30, 255, 40, 50, 60, 255]);
    }

    #[test]
    fn short_image_is_an_error() {
        let err = bgrx().to_frame(&[0; 7], 2, 1).unwrap_err();
        assert!(matches!(
            err,
            ScreenError::ShortImage {
                got: 7,
                expected: 8
            }
        ));
    }

    #[test]
    fn narrow_channels_scale_to_full_range() {
        let c = Channel::from_mask(0b1111_1000_0000_0000);
        assert_eq!(c.extract(0xffff), 255);
        assert_eq!(c.extract(0), 0);
    }

    #[test]
    fn connect_error_names_the_display() {
        let err = Screen::connect(":4242")
            .err()
            .expect("no X server on :4242");
        assert_eq!(err.to_string(), "connect to X display :4242");
    }
}
