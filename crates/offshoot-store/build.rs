//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! migrations at compile time, and cargo does not watch the directories it reads.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
