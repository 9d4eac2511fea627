//! Tells the crash tests whether they run optimised: `cfg(unoptimized)` below
//! opt-level 2. Debug assertions are no sign of it (the CI profile keeps them on at
//! full optimisation).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(unoptimized)");
    println!("cargo::rerun-if-changed=build.rs");
    let opt = std::env::var("OPT_LEVEL").unwrap_or_default();
    if matches!(opt.as_str(), "0" | "1") {
        println!("cargo::rustc-cfg=unoptimized");
    }
}
