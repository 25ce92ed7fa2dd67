use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ImageError;

/// Revision of what drums does to a tree after debootstrap (see
/// [`crate::customize`]). It is part of [`Recipe::hash`], so bumping it makes
/// every cached image stale and the next build redo it.
///
/// Bump this whenever `customize()` changes. History:
/// - 1: the first customization (identity files, hosts, apt caches);
/// - 2: the Python reseed hook (`drums_reseed.py` and its `.pth`).
pub const RECIPE_REVISION: u32 = 2;

/// What goes into an image: everything that, when changed, requires a rebuild.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// Debian suite or codename, e.g. `bookworm`.
    pub suite: String,
    /// debootstrap variant, e.g. `minbase` (only Essential and apt).
    pub variant: String,
    /// Extra packages installed with `--include`, on top of the variant.
    pub packages: Vec<String>,
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
        let canonical = serde_json::json!({
            "kind": "drums-image-recipe",
            "revision": RECIPE_REVISION,
            // The hook is written into every image: a change to it is a change
            // to the image.
            "reseed_hook": format!("{:x}", Sha256::digest(crate::RESEED_MODULE.as_bytes())),
            "suite": self.suite,
            "variant": self.variant,
            "packages": packages,
        });
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
