//! The `shale` binary: one module per subcommand.
#![forbid(unsafe_code)]

mod bench;

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
    /// Run benchmarks against Shale and its baselines on simulated drives.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shale: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
