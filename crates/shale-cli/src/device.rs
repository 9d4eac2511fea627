//! `shale device ...`: a running daemon's devices, and what to do when one fails.

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::Value;
use shale_daemon::admin::{call, AdminRequest};
use shale_workload::format_size;

use crate::volume::AdminArgs;

#[derive(Debug, Args)]
pub struct DeviceArgs {
    #[command(subcommand)]
    pub command: DeviceCommand,
    #[command(flatten)]
    pub admin: AdminArgs,
}

#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// Every device: role, slot, state, errors, rebuild progress
    List,
    /// Take an array member out of service (like mdadm --fail)
    Fail {
        /// The member's path as listed (or its slot number)
        device: String,
    },
    /// Put a new device in a member's place and rebuild it, online
    Replace {
        /// The member to replace (path as listed, or slot number)
        old: String,
        /// The new device: a file (created sparse if missing) or block device
        new: String,
    },
}

pub fn main(args: DeviceArgs) -> Result<()> {
    let req = match &args.command {
        DeviceCommand::List => AdminRequest::DeviceList,
        DeviceCommand::Fail { device } => AdminRequest::DeviceFail {
            device: device.clone(),
        },
        DeviceCommand::Replace { old, new } => AdminRequest::DeviceReplace {
            old: old.clone(),
            new: new.clone(),
        },
    };
    let v = call(&args.admin.socket(), &req)?;
    if args.admin.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if matches!(args.command, DeviceCommand::List) {
        print!("{}", table(&v));
    } else {
        println!("{}", v["message"].as_str().unwrap_or_default());
    }
    Ok(())
}

fn table(v: &Value) -> String {
    let mut out = format!(
        "{:<9} {:>4} {:<11} {:>7} {:>7} {:>7}  {:<24} {}\n",
        "ROLE", "SLOT", "STATE", "R-ERR", "W-ERR", "O-ERR", "REBUILD", "PATH"
    );
    for d in v.as_array().into_iter().flatten() {
        let n = |k: &str| d["errors"][k].as_u64().unwrap_or(0);
        let rebuild = match &d["rebuild"] {
            Value::Object(r) => {
                let done = r.get("done_bytes").and_then(Value::as_u64).unwrap_or(0);
                let pct = r.get("percent").and_then(Value::as_f64).unwrap_or(0.0);
                let eta = r
                    .get("eta_seconds")
                    .and_then(Value::as_f64)
                    .map_or("-".to_string(), |s| format!("{s:.0}s"));
                format!("{pct:.1}% {} eta {eta}", format_size(done))
            }
            _ => "-".into(),
        };
        out.push_str(&format!(
            "{:<9} {:>4} {:<11} {:>7} {:>7} {:>7}  {:<24} {}\n",
            d["role"].as_str().unwrap_or("?"),
            d["index"].as_u64().unwrap_or(0),
            d["state"].as_str().unwrap_or("?"),
            n("read"),
            n("write"),
            n("other"),
            rebuild,
            d["path"].as_str().unwrap_or("?"),
        ));
        if let Some(r) = d["reason"].as_str() {
            out.push_str(&format!("{:>16}  {r}\n", "reason:"));
        }
    }
    out
}
