//! `shale volume ...` and `shale stats`: requests to a running daemon's admin socket.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use shale_daemon::admin::{call, AdminRequest};
use shale_workload::{format_size, parse_size};

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The daemon's admin socket [default: DATA_DIR/admin.sock]
    #[arg(long, global = true)]
    pub admin_socket: Option<PathBuf>,
    /// The daemon's data directory [default: ./shale-data]
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Print JSON
    #[arg(long, global = true)]
    pub json: bool,
}

impl AdminArgs {
    fn socket(&self) -> PathBuf {
        self.admin_socket.clone().unwrap_or_else(|| {
            self.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./shale-data"))
                .join("admin.sock")
        })
    }
}

#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    pub command: VolumeCommand,
    #[command(flatten)]
    pub admin: AdminArgs,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume
    Create { name: String, size: String },
    /// List volumes
    List,
    /// Grow a volume
    Resize { name: String, size: String },
    /// Delete a volume and trim all of its blocks
    Delete { name: String },
}

fn size(text: &str) -> Result<u64> {
    let b = parse_size(text).with_context(|| format!("size {text:?}"))?;
    anyhow::ensure!(
        b > 0 && b % 4096 == 0,
        "size {text:?} is not a positive multiple of 4 KiB"
    );
    Ok(b)
}

pub fn volume(args: VolumeArgs) -> Result<()> {
    let req = match &args.command {
        VolumeCommand::Create { name, size: s } => AdminRequest::VolumeCreate {
            name: name.clone(),
            size_bytes: size(s)?,
        },
        VolumeCommand::List => AdminRequest::VolumeList,
        VolumeCommand::Resize { name, size: s } => AdminRequest::VolumeResize {
            name: name.clone(),
            size_bytes: size(s)?,
        },
        VolumeCommand::Delete { name } => AdminRequest::VolumeDelete { name: name.clone() },
    };
    let v = call(&args.admin.socket(), &req)?;
    if args.admin.json {
        println!("{v}");
        return Ok(());
    }
    match args.command {
        VolumeCommand::List => {
            println!("{:>4}  {:<24} {:>12}", "id", "name", "size");
            for vol in v.as_array().into_iter().flatten() {
                println!(
                    "{:>4}  {:<24} {:>12}",
                    vol["id"],
                    vol["name"].as_str().unwrap_or("?"),
                    format_size(vol["size_bytes"].as_u64().unwrap_or(0))
                );
            }
        }
        VolumeCommand::Delete { name } => println!("deleted volume {name}"),
        _ => println!(
            "volume {} (id {}): {}",
            v["name"].as_str().unwrap_or("?"),
            v["id"],
            format_size(v["size_bytes"].as_u64().unwrap_or(0))
        ),
    }
    Ok(())
}

pub fn stats(args: AdminArgs) -> Result<()> {
    let v = call(&args.socket(), &AdminRequest::Stats)?;
    if args.json {
        println!("{v}");
        return Ok(());
    }
    for (section, fields) in v.as_object().into_iter().flatten() {
        println!("{section}:");
        for (k, val) in fields.as_object().into_iter().flatten() {
            println!("  {k:<32} {val}");
        }
    }
    Ok(())
}
