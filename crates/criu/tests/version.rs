//! Needs CRIU 4.2.1 installed (the project builds it from source).

mod common;

use drums_criu::{Criu, CriuError};

#[test]
fn version_is_4_2_1() {
    common::require_root();
    let criu = common::criu();
    assert_eq!(criu.version().unwrap_or_else(|e| panic!("{e}")), "4.2.1");
    assert_eq!(common::children_of_self(), Vec::<i32>::new());
}

#[test]
fn missing_binary_is_named() {
    let err = Criu::with_binary("/nonexistent/criu")
        .version()
        .unwrap_err();
    assert!(matches!(err, CriuError::Spawn { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/criu"), "{err}");
}
