//! The `shale` binary: one module per subcommand.
#![forbid(unsafe_code)]

mod bench;
mod check;
mod device;
mod logging;
mod progress;
mod serve;
mod top;
mod volume;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "shale",
    version,
    about = "Shale: a host-side log-structured flash translation layer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: export every volume over NBD (creates and formats the embedded
    /// default under ./shale-data on first start).
    Serve(Box<serve::ServeArgs>),
    /// Format a cache and a capacity device.
    Format(Box<serve::FormatArgs>),
    /// Create, list, resize or delete volumes of a running daemon.
    Volume(volume::VolumeArgs),
    /// Statistics of a running daemon.
    Stats(volume::AdminArgs),
    /// A live view of a running daemon: pool fill, compaction and GC, and each
    /// volume's IOPS, throughput, WAF and latency ('q' quits).
    Top(top::TopArgs),
    /// Run benchmarks against Shale and its baselines on simulated drives.
    Bench(bench::BenchArgs),
    /// Verify a cache and capacity device pair offline (never writes to them).
    Check(check::CheckArgs),
    /// A running daemon's devices: list them, fail an array member, replace one.
    Device(device::DeviceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::main(*args),
        Command::Format(args) => serve::format(*args),
        Command::Volume(args) => volume::volume(args),
        Command::Stats(args) => volume::stats(args),
        Command::Top(args) => top::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Check(args) => check::main(args),
        Command::Device(args) => device::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shale: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
