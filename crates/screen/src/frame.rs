/// One captured screen image, 8-bit RGBA, rows top to bottom, no padding.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    /// `width * height * 4` bytes.
    pub rgba: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    // A multi-megabyte pixel dump helps nobody in a failed assert.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("rgba_len", &self.rgba.len())
            .finish()
    }
}

impl Frame {
    /// A frame of one opaque colour.
    pub fn solid(width: u32, height: u32, rgb: [u8; 3]) -> Frame {
        let pixel = [rgb[0], rgb[1], rgb[2], 0xff];
        let rgba = pixel.repeat(width as usize * height as usize);
        Frame {
            width,
            height,
            rgba,
        }
    }

    /// The RGBA value at (x, y); panics when out of bounds.
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 4] {
        assert!(x < self.width && y < self.height, "pixel out of bounds");
        let i = (y as usize * self.width as usize + x as usize) * 4;
        [
            self.rgba[i],
            self.rgba[i + 1],
            self.rgba[i + 2],
            self.rgba[i + 3],
        ]
    }

    /// Encodes as an 8-bit RGB PNG.
    ///
    /// RGB, not RGBA: screen captures are opaque, and a quarter fewer bytes
    /// go through deflate. `Compression::Fast` because screenshots are on
    /// the hot path of agent readiness; the PNG is roughly 1.5x larger than
    /// with the default level and several times quicker to produce.
    pub fn to_png(&self) -> Vec<u8> {
        let mut rgb = Vec::with_capacity(self.width as usize * self.height as usize * 3);
        for px in self.rgba.chunks_exact(4) {
            rgb.extend_from_slice(&px[..3]);
        }
        let mut out = Vec::with_capacity(rgb.len() / 8);
        {
            let mut enc = png::Encoder::new(&mut out, self.width, self.height);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            enc.set_compression(png::Compression::Fast);
            // Writing into a Vec cannot fail, and the header matches the
            // data by construction; a failure here is a bug in this crate.
            let mut w = enc.write_header().expect("png header into a Vec");
            w.write_image_data(&rgb).expect("png data into a Vec");
        }
        out
    }

    /// The fraction (0.0..=1.0) of pixels whose RGB differs; frames of
    /// different sizes differ entirely (1.0). Alpha is ignored because
    /// captures are opaque.
    pub fn differing_fraction(&self, other: &Frame) -> f64 {
        if self.width != other.width || self.height != other.height {
            return 1.0;
        }
        let total = self.width as usize * self.height as usize;
        if total == 0 {
            return 0.0;
        }
        let differing = self
            .rgba
            .chunks_exact(4)
            .zip(other.rgba.chunks_exact(4))
            .filter(|(a, b)| a[..3] != b[..3])
            .count();
        differing as f64 / total as f64
    }

    /// Draws a premultiplied-ARGB image (XFixes' cursor format) with its
    /// top-left corner at (x, y), clipped to the frame.
    pub(crate) fn blend_argb_premultiplied(
        &mut self,
        x: i32,
        y: i32,
        width: u32,
        height: u32,
        argb: &[u32],
    ) {
        for cy in 0..height as i32 {
            let fy = y + cy;
            if fy < 0 || fy >= self.height as i32 {
                continue;
            }
            for cx in 0..width as i32 {
                let fx = x + cx;
                if fx < 0 || fx >= self.width as i32 {
                    continue;
                }
                let Some(&src) = argb.get((cy as u32 * width + cx as u32) as usize) else {
                    return;
                };
                let a = src >> 24;
                if a == 0 {
                    continue;
                }
                let i = (fy as usize * self.width as usize + fx as usize) * 4;
                let inv = 255 - a;
                let channels = [(src >> 16) & 0xff, (src >> 8) & 0xff, src & 0xff];
                for (k, s) in channels.into_iter().enumerate() {
                    let d = self.rgba[i + k] as u32;
                    // Premultiplied "over": out = src + dst * (1 - a).
                    self.rgba[i + k] = (s + (d * inv + 127) / 255).min(255) as u8;
                }
                self.rgba[i + 3] = 0xff;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_fraction_counts_changed_pixels() {
        let a = Frame::solid(10, 10, [1, 2, 3]);
        let mut b = a.clone();
        assert_eq!(a.differing_fraction(&b), 0.0);
        b.rgba[0] = 9;
        b.rgba[4 * 99 + 2] = 9;
        assert!((a.differing_fraction(&b) - 0.02).abs() < 1e-9);
        // Alpha alone does not count.
        b = a.clone();
        b.rgba[3] = 0;
        assert_eq!(a.differing_fraction(&b), 0.0);
    }

    #[test]
    fn differing_fraction_of_different_sizes_is_one() {
        let a = Frame::solid(10, 10, [0, 0, 0]);
        let b = Frame::solid(10, 11, [0, 0, 0]);
        assert_eq!(a.differing_fraction(&b), 1.0);
    }

    #[test]
    fn blend_clips_and_composites() {
        let mut f = Frame::solid(4, 4, [0, 0, 255]);
        // Opaque red, half-transparent white (premultiplied), transparent.
        let img = [0xffff0000, 0x80808080, 0x00000000, 0xffffffff];
        f.blend_argb_premultiplied(-1, 3, 2, 2, &img);
        // Only the top-right of the 2x2 image (0x80808080) lands, at (0, 3).
        assert_eq!(f.pixel(0, 3), [128, 128, 128 + 127, 255]);
        assert_eq!(f.pixel(1, 3), [0, 0, 255, 255]);
        f.blend_argb_premultiplied(2, 0, 2, 1, &img);
        assert_eq!(f.pixel(2, 0), [255, 0, 0, 255]);
    }

    #[test]
    fn png_round_trips() {
        let f = Frame::solid(3, 2, [10, 20, 30]);
        let png = f.to_png();
        let dec = png::Decoder::new(&png[..]);
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (3, 2));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(&buf[..3], &[10, 20, 30]);
    }
}
