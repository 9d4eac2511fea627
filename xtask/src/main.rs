//! `cargo xtask <task>`: the project's one entry point for checks.
//!
//! `cargo xtask ci` is the README's test command and what `.ci/run` calls: it installs
//! the system packages the end-to-end tests need (when missing and running as root),
//! then runs formatting, lints, the whole test suite and short smoke runs of the
//! fuzzers and benchmarks.

mod bench_nbd;
mod vm_test;

use std::process::{Command, ExitCode};
use std::time::Instant;

/// Client tools the end-to-end tests drive, and the Debian package providing each.
const SYSTEM_TOOLS: &[(&str, &str)] = &[
    ("qemu-img", "qemu-utils"),
    ("qemu-io", "qemu-utils"),
    ("qemu-nbd", "qemu-utils"),
    ("nbdinfo", "libnbd-bin"),
    ("nbdcopy", "libnbd-bin"),
    ("nbdsh", "python3-libnbd"),
    ("nbdfuse", "nbdfuse"),
    ("fio", "fio"),
    ("openssl", "openssl"),
    ("script", "bsdutils"),
    ("tmux", "tmux"),
];

/// Files the build needs, and the Debian package providing each: libublk's
/// bindings are generated with bindgen, which loads libclang.
const BUILD_FILES: &[(&str, &str)] = &[("/usr/lib/llvm-14/lib/libclang.so", "libclang-dev")];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "ci" => ci(),
        "deps" => deps(),
        "lint" => lint(),
        "test" => test(),
        "vm-test" => vm_test::run(&args[1..], false),
        "bench-nbd" => bench_nbd::Options::parse(&args[1..]).and_then(|o| {
            run("cargo", &["build", "--release", "-p", "shale-cli"], &[])?;
            bench_nbd::run(&o)
        }),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n  ci    deps + lint + test + smoke runs (the README's test command)\n  deps  install missing system packages the tests need (apt-get, as root)\n  lint  cargo fmt --check and cargo clippy -D warnings\n  test  the whole test suite\n  vm-test [--jobs N] [SCENARIO...]\n        guests under QEMU, N at a time: vhost-user-blk, zns, zoned-nullblk, zoned-nullblk-shards, nbd, ublk (default: all, one at a time)\n  bench-nbd [--size 4GiB] [--runtime 10] [--repeat 3] [--jobs 4] [--iodepth 32] [--dir D] [--shards N] [--direct-write-min SIZE] [--direct-write-policy sequential|any] [--baseline qemu-nbd|shale-no-handoff|shale-one-shard|shale-no-direct|shale-windows]\n        fio over NBD against shale serve and against a baseline: qemu-nbd on a plain file, shale without its hand-off store, shale on one engine shard, shale without direct writes, or shale's shards in fixed windows of the capacity"
            );
            return if task == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ci() -> Result<(), String> {
    let start = Instant::now();
    deps()?;
    lint()?;
    test()?;
    smoke()?;
    // One guest at a time: the guests are CPU-bound under software emulation, and
    // on a 2-core machine two at once took as long as one after the other.
    vm_test::run_scenarios(&[], 1, true, true)?;
    eprintln!("xtask ci: all green in {:.0?}", start.elapsed());
    Ok(())
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null 2>&1")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn deps() -> Result<(), String> {
    let mut missing: Vec<&str> = SYSTEM_TOOLS
        .iter()
        .filter(|(tool, _)| !have(tool))
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.extend(
        BUILD_FILES
            .iter()
            .filter(|(f, _)| !has_libclang(f))
            .map(|(_, pkg)| *pkg),
    );
    missing.extend(vm_test::missing_packages());
    install(&missing)?;
    vm_test::ensure_qemu()
}

/// Whether libclang is there: at `path`, or wherever `LIBCLANG_PATH` or the
/// dynamic loader's cache says.
fn has_libclang(path: &str) -> bool {
    std::path::Path::new(path).exists()
        || std::env::var_os("LIBCLANG_PATH").is_some()
        || Command::new("sh")
            .args(["-c", "ldconfig -p | grep -q 'libclang[-.0-9]*\\.so'"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
}

/// apt-get's environment: no questions, and no initramfs for the kernel package
/// (the guest scenarios boot it with their own; building one takes a minute).
const APT_ENV: &[(&str, &str)] = &[("DEBIAN_FRONTEND", "noninteractive"), ("INITRD", "No")];

/// Installs Debian packages with apt-get (as root), or says how to.
fn install(packages: &[&str]) -> Result<(), String> {
    let mut missing = packages.to_vec();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !is_root {
        return Err(format!(
            "missing system packages {missing:?}; install them with: sudo apt-get install -y {}",
            missing.join(" ")
        ));
    }
    eprintln!("xtask deps: installing {}", missing.join(" "));
    run("apt-get", &["update", "-qq"], crate::APT_ENV)?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(missing.iter().copied());
    run("apt-get", &install, crate::APT_ENV)
}

fn lint() -> Result<(), String> {
    run("cargo", &["fmt", "--all", "--", "--check"], &[])?;
    run(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            UBLK_FEATURE,
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )
}

/// The test profile ([profile.ci] in Cargo.toml): optimised like release, because the
/// simulators and end-to-end tests move gigabytes, with debug assertions and overflow
/// checks on. The tests find the `shale` binary through `CARGO_BIN_EXE_shale`, which
/// follows the profile.
const TEST_PROFILE: &str = "ci";

/// Checks and tests build the daemon with ublk (`shale serve --ublk`), which needs
/// libclang to build; `deps` installs it.
const UBLK_FEATURE: &str = "shale-cli/ublk";

/// Unit and integration tests of every crate. Not the doc tests: rustdoc's pass over
/// every crate took 46 s here for the one example in the docs (shale-vhost's `serve`,
/// compile-only, which the frontend tests run for real). Not the examples either:
/// clippy checks that they compile.
fn test() -> Result<(), String> {
    run(
        "cargo",
        &[
            "test",
            "--workspace",
            "--features",
            UBLK_FEATURE,
            "--profile",
            TEST_PROFILE,
            "--no-fail-fast",
            "--lib",
            "--bins",
            "--tests",
        ],
        &[],
    )
}

/// Short fuzzing runs of what strangers write: the NBD parsers, every on-disk decoder
/// and the configuration file. cargo-fuzz needs a nightly toolchain; where there is
/// none, the stable stand-in replays the committed corpus plus seeded random and
/// mutated inputs through the same entry points (each crate's `tests/fuzz_corpus.rs`,
/// a few seconds to twenty each under the test profile).
fn smoke() -> Result<(), String> {
    let nightly_fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if nightly_fuzz {
        return run("bash", &["fuzz/smoke.sh", "15"], &[]);
    }
    eprintln!("xtask: no nightly cargo-fuzz here; running the stable fuzz stand-in");
    // Every crate's `fuzz_corpus` in one run, built as the test step built them
    // (the same features and profile, so nothing is rebuilt). Zone emulation
    // opens a device per input and takes a third of the inputs.
    run(
        "cargo",
        &[
            "test",
            "--workspace",
            "--features",
            UBLK_FEATURE,
            "--profile",
            TEST_PROFILE,
            "--test",
            "fuzz_corpus",
        ],
        &[("SHALE_FUZZ_ITERS", "300000")],
    )
}

fn run(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: {cmd} {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new(cmd)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("could not run {cmd}: {e}"))?;
    eprintln!(
        "xtask: {cmd} {} finished in {:.1?}",
        args.first().unwrap_or(&""),
        start.elapsed()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{cmd} {}` failed ({status})", args.join(" ")))
    }
}
