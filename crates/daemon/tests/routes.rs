//! The router's own routes against `api/openapi.yaml`, both ways: every
//! route drumsd serves is documented, and every documented one is served.
//! The list comes from the table the router is built from
//! (`drums_daemon::server::routes`), not from a copy kept beside it.
//! No root needed: nothing is started.

mod common;

use std::collections::BTreeSet;

#[test]
fn the_router_serves_exactly_the_operations_of_the_spec() {
    let served = drums_daemon::server::routes();
    let served_set: BTreeSet<_> = served.iter().cloned().collect();
    assert_eq!(served.len(), served_set.len(), "a route twice in the table");
    let spec: BTreeSet<_> = common::spec_operations()
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
    let undocumented: Vec<_> = served_set.difference(&spec).collect();
    let unserved: Vec<_> = spec.difference(&served_set).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "served but not in api/openapi.yaml: {undocumented:?}\n\
         in api/openapi.yaml but not served: {unserved:?}"
    );
}
