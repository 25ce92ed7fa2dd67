use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ImageError;

/// Revision of what drums does to a tree after debootstrap (see
/// [`crate::customize`]). It is part of [`Recipe::hash`], so bumping it makes
/// every cached image stale and the next build redo it.
///
/// Bump this whenever `customize()` changes. History:
/// - 1: the first customization (identity files, hosts, apt caches);
/// - 2: the Python reseed hook (`drums_reseed.py` and its `.pth`);
/// - 3: the hook byte-compiled at build time, so no session writes its `.pyc`.
pub const RECIPE_REVISION: u32 = 3;

/// What goes into an image: everything that, when changed, requires a rebuild.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// Debian suite or codename, e.g. `bookworm`.
    pub suite: String,
    /// debootstrap variant, e.g. `minbase` (only Essential and apt).
    pub variant: String,
    /// Extra packages installed with `--include`, on top of the variant.
    pub packages: Vec<String>,
    /// Python packages Debian does not ship, installed with pip after
    /// debootstrap, each pinned as `name==version` so a rebuild gets the same
    /// code. Built without build isolation, from Debian's setuptools.
    pub pip: Vec<String>,
    /// The desktop layer (see [`crate::desktop`]): the user `user`, the
    /// `google-chrome` wrapper and Chromium's profile directory.
    pub desktop: bool,
}

impl Recipe {
    /// The headless default: suite bookworm, variant minbase, plus what a
    /// shell/coding agent expects to find: python3, procps (ps, top),
    /// iproute2 (ip), git, sudo, ca-certificates (https) and less.
    /// (Later a desktop recipe is added next to this one.)
    pub fn headless() -> Recipe {
        Recipe {
            suite: "bookworm".into(),
            variant: "minbase".into(),
            packages: [
                "python3",
                // Coding agents install packages; the inspector's corpus does.
                "python3-pip",
                "procps",
                "iproute2",
                "git",
                "sudo",
                "ca-certificates",
                "less",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            pip: Vec::new(),
            desktop: false,
        }
    }

    /// The desktop profile's image: the headless set plus Xvfb, D-Bus,
    /// openbox, Chromium and what OSWorld's guest protocol and its tasks use
    /// (xdotool and wmctrl for windows, ffmpeg for recordings, socat, Python
    /// with Xlib, Pillow, Tk and AT-SPI for pyautogui and the accessibility
    /// tree). pyautogui itself is not packaged by Debian, so it and its small
    /// pure-Python dependencies come from pip, pinned.
    pub fn desktop() -> Recipe {
        let mut r = Recipe::headless();
        r.packages.extend(
            [
                "xvfb",
                "dbus",
                "dbus-x11",
                "openbox",
                "chromium",
                "xdotool",
                "wmctrl",
                "socat",
                "ffmpeg",
                "python-is-python3",
                "python3-setuptools",
                "python3-wheel",
                "python3-xlib",
                "python3-pil",
                "python3-tk",
                "python3-pyatspi",
                "at-spi2-core",
                "x11-utils",
                "x11-xserver-utils",
                "xclip",
                "xdg-utils",
                "fonts-dejavu-core",
                "fonts-liberation",
            ]
            .into_iter()
            .map(String::from),
        );
        r.pip = [
            "pyautogui==0.9.54",
            "pymsgbox==2.0.1",
            "pytweening==1.2.0",
            "pyscreeze==1.0.1",
            "pygetwindow==0.0.9",
            "pyrect==0.2.0",
            "mouseinfo==0.1.3",
            "pyperclip==1.11.0",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        r.desktop = true;
        r
    }

    /// The headless set plus the official `openai` Python SDK and what it
    /// needs, pinned: the image of `drums eval`'s agent that lives in its
    /// session (docs/eval.md). Debian packages none of them.
    pub fn agent() -> Recipe {
        let mut r = Recipe::headless();
        r.pip = [
            "openai==3.57.0",
            "anyio==4.16.0",
            "httpx2==2.16.2",
            "httpcore2==2.16.2",
            "h11==0.16.0",
            "truststore==0.10.5",
            "idna==3.20",
            "jiter==0.19.0",
            "pydantic==2.14.4",
            "pydantic_core==2.50.5",
            "annotated-types==0.8.0",
            "typing-inspection==0.4.5",
            "typing_extensions==4.16.0",
            "sniffio==1.3.1",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        r
    }

    /// The recipe an image of this name is built from: `desktop` is the
    /// desktop profile's image, `agent` the eval's agent image, every other
    /// name the headless one.
    pub fn for_image(name: &str) -> Recipe {
        match name {
            "desktop" => Recipe::desktop(),
            "agent" => Recipe::agent(),
            _ => Recipe::headless(),
        }
    }

    /// Hex sha256 identifying the recipe, used to decide whether a cached
    /// image is still current.
    ///
    /// It covers [`RECIPE_REVISION`], the suite, the variant and the package
    /// set. Packages are sorted and deduplicated first: debootstrap's
    /// `--include` does not depend on their order, so neither does the hash.
    /// The input is JSON, so no choice of values can make two different
    /// recipes serialize the same.
    pub fn hash(&self) -> String {
        let mut packages: Vec<&str> = self.packages.iter().map(String::as_str).collect();
        packages.sort_unstable();
        packages.dedup();
        let mut canonical = serde_json::json!({
            "kind": "drums-image-recipe",
            "revision": RECIPE_REVISION,
            // The hook is written into every image: a change to it is a change
            // to the image.
            "reseed_hook": format!("{:x}", Sha256::digest(crate::RESEED_MODULE.as_bytes())),
            "suite": self.suite,
            "variant": self.variant,
            "packages": packages,
        });
        // Only present when used, so images without them keep their hash
        // (and are not rebuilt) across the version that introduced them.
        if !self.pip.is_empty() {
            let mut pip: Vec<&str> = self.pip.iter().map(String::as_str).collect();
            pip.sort_unstable();
            pip.dedup();
            canonical["pip"] = pip.into();
        }
        if self.desktop {
            canonical["desktop_layer"] = crate::desktop::layer_hash().into();
        }
        let digest = Sha256::digest(canonical.to_string().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Checks that every value is safe to hand to debootstrap as (part of)
    /// an argument: no option-looking values, no commas inside `--include`.
    pub fn validate(&self) -> Result<(), ImageError> {
        // Suites are codenames or aliases (bookworm, stable, sid, bookworm-backports).
        if !is_token(&self.suite, |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
        }) {
            return Err(ImageError::InvalidRecipe {
                field: "suite",
                value: self.suite.clone(),
                reason: "expected a debian suite name such as bookworm",
            });
        }
        // debootstrap variants: minbase, buildd, fakechroot (or "-" for its default).
        if self.variant != "-" && !is_token(&self.variant, |c| c.is_ascii_lowercase()) {
            return Err(ImageError::InvalidRecipe {
                field: "variant",
                value: self.variant.clone(),
                reason: "expected a debootstrap variant such as minbase",
            });
        }
        // Debian policy 5.6.1: lowercase letters, digits, '+', '-', '.';
        // at least two characters, starting with an alphanumeric.
        for p in &self.packages {
            if p.len() < 2
                || !is_token(p, |c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.')
                })
            {
                return Err(ImageError::InvalidRecipe {
                    field: "package",
                    value: p.clone(),
                    reason: "not a valid debian package name",
                });
            }
        }
        // pip requirement specifiers, pinned: `name==version` only, so
        // nothing reaches pip's command line as an option or a URL.
        for p in &self.pip {
            let pinned = p.split_once("==").is_some_and(|(name, version)| {
                is_token(&name.to_ascii_lowercase(), |c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
                }) && is_token(version, |c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '+')
                })
            });
            if !pinned {
                return Err(ImageError::InvalidRecipe {
                    field: "pip",
                    value: p.clone(),
                    reason: "expected a pinned requirement such as pyautogui==0.9.54",
                });
            }
        }
        Ok(())
    }
}

/// Non-empty, starts with a lowercase letter or digit, rest allowed by `ok`.
fn is_token(s: &str, ok: impl Fn(char) -> bool) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit() => chars.all(ok),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_hex_sha256_and_stable() {
        let h = Recipe::headless().hash();
        assert_eq!(h.len(), 64);
        assert!(h
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(h, Recipe::headless().hash());
    }

    #[test]
    fn hash_changes_with_packages_suite_and_variant() {
        let base = Recipe::headless();
        let mut more = base.clone();
        more.packages.push("vim".into());
        assert_ne!(base.hash(), more.hash());

        let mut fewer = base.clone();
        fewer.packages.pop();
        assert_ne!(base.hash(), fewer.hash());

        let mut suite = base.clone();
        suite.suite = "trixie".into();
        assert_ne!(base.hash(), suite.hash());

        let mut variant = base.clone();
        variant.variant = "buildd".into();
        assert_ne!(base.hash(), variant.hash());
    }

    /// The default image's hash: a change rebuilds every host's default image,
    /// so it must be deliberate. (The empty `pip` and `desktop` fields never
    /// entered it; python3-pip did, for coding agents and the inspector's
    /// corpus, and revision 3.)
    #[test]
    fn headless_hash_changes_only_deliberately() {
        assert_eq!(
            Recipe::headless().hash(),
            "b862e7b24ff578e1a3e2dcdb978460bdb2399a8d23addf24de02ab701b35563f"
        );
    }

    #[test]
    fn desktop_recipe_differs_and_validates() {
        let d = Recipe::desktop();
        d.validate().unwrap();
        assert_ne!(d.hash(), Recipe::headless().hash());
        let mut no_layer = d.clone();
        no_layer.desktop = false;
        assert_ne!(d.hash(), no_layer.hash());
        let mut more = d.clone();
        more.pip.push("numpy==1.26.4".into());
        assert_ne!(d.hash(), more.hash());
        for bad in [
            "pyautogui",
            "pyautogui>=1",
            "--index-url=x==1",
            "a==1 b",
            "x==",
            "==1",
        ] {
            let mut r = d.clone();
            r.pip.push(bad.into());
            assert!(r.validate().is_err(), "{bad:?} accepted");
        }
        assert_eq!(Recipe::for_image("desktop"), d);
        assert_eq!(Recipe::for_image("default"), Recipe::headless());
    }

    #[test]
    fn hash_ignores_package_order_and_duplicates() {
        let base = Recipe::headless();
        let mut shuffled = base.clone();
        shuffled.packages.reverse();
        shuffled.packages.push("git".into());
        assert_eq!(base.hash(), shuffled.hash());
    }

    #[test]
    fn validate_accepts_headless_and_rejects_argument_injection() {
        Recipe::headless().validate().unwrap();
        for bad in ["--foreign", "a,b", "Python3", "x", "py thon", ""] {
            let mut r = Recipe::headless();
            r.packages.push(bad.into());
            assert!(r.validate().is_err(), "{bad:?} accepted");
        }
        let mut r = Recipe::headless();
        r.suite = "--keyring=/x".into();
        assert!(r.validate().is_err());
        let mut r = Recipe::headless();
        r.variant = "min base".into();
        assert!(r.validate().is_err());
        let mut r = Recipe::headless();
        r.packages = vec!["g++".into(), "libstdc++6".into(), "python3.11".into()];
        r.validate().unwrap();
    }
}
