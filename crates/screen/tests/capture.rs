//! Captures a real Xvfb. Needs the Debian packages xvfb, x11-xserver-utils
//! (xsetroot) and xdotool; fails (never skips) without them.

mod common;

use std::time::{Duration, Instant};

use common::{assert_no_children, serial, Xvfb};
use drums_screen::{Frame, Screen};

fn decode_png(png: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut r = png::Decoder::new(png).read_info().expect("png header");
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).expect("png data");
    buf.truncate(info.buffer_size());
    assert_eq!(info.color_type, png::ColorType::Rgb);
    (info.width, info.height, buf)
}

#[test]
fn screen_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Screen>();
}

#[test]
fn captures_root_window_and_cursor() {
    let _serial = serial();
    {
        let x = Xvfb::start();
        let screen = Screen::connect(&x.display).expect("connect");
        assert_eq!(screen.size(), (1280, 800));

        x.run("xsetroot", &["-solid", "red"]);
        let plain = screen.capture(false).expect("capture");
        assert_eq!((plain.width, plain.height), (1280, 800));
        assert_eq!(plain.rgba.len(), 1280 * 800 * 4);
        assert_eq!(plain.pixel(640, 400), [255, 0, 0, 255]);
        assert_eq!(
            plain.differing_fraction(&Frame::solid(1280, 800, [255, 0, 0])),
            0.0
        );

        let (w, h, rgb) = decode_png(&plain.to_png());
        assert_eq!((w, h), (1280, 800));
        assert_eq!(&rgb[..3], &[255, 0, 0]);

        x.run("xdotool", &["mousemove", "100", "120"]);
        assert_eq!(screen.cursor_position().unwrap(), (100, 120));
        let with_cursor = screen.capture(true).expect("capture with cursor");
        let plain = screen.capture(false).expect("capture");
        let diff = with_cursor.differing_fraction(&plain);
        // The cursor covers some pixels, and only a few.
        assert!(
            diff > 0.0 && diff < 0.001,
            "cursor covers {diff} of the screen"
        );
        let mut changed = Vec::new();
        for y in 0..800 {
            for x in 0..1280 {
                if with_cursor.pixel(x, y) != plain.pixel(x, y) {
                    changed.push((x as i32, y as i32));
                }
            }
        }
        // Every drawn cursor pixel lies near the pointer (cursor images are
        // at most 64x64 here and placed around their hotspot).
        assert!(changed
            .iter()
            .all(|&(x, y)| (x - 100).abs() < 64 && (y - 120).abs() < 64));
        drop(screen);
    }
    assert_no_children();
}

#[test]
fn waits_for_damage_instead_of_polling() {
    let _serial = serial();
    {
        let x = Xvfb::start();
        let screen = Screen::connect(&x.display).expect("connect");
        x.run("xsetroot", &["-solid", "red"]);
        // Repaints from startup and the red root are old news.
        assert!(screen.wait_for_damage(Duration::from_secs(5)).unwrap());
        screen.reset_damage().unwrap();

        let t = Instant::now();
        assert!(!screen.wait_for_damage(Duration::from_millis(300)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(300));

        let before = screen.capture(false).unwrap();
        x.run("xsetroot", &["-solid", "blue"]);
        assert!(screen.wait_for_damage(Duration::from_secs(5)).unwrap());
        let after = screen.capture(false).unwrap();
        assert_eq!(after.pixel(5, 5), [0, 0, 255, 255]);
        assert_eq!(before.differing_fraction(&after), 1.0);

        // Delivered once: nothing changed since.
        assert!(!screen.wait_for_damage(Duration::from_millis(100)).unwrap());
        drop(screen);
    }
    assert_no_children();
}
