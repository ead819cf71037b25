//! Nothing here: the crate exists for `benches/vs_dynamo.rs`, which needs `dynamo-kv-router` as a
//! dev-dependency without the product's crates depending on it.
