//! Structured logs (tracing) on stderr, as text or JSON lines.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

pub fn init(format: &str, level: &str) -> Result<()> {
    let filter = EnvFilter::try_new(level).with_context(|| format!("log level {level:?}"))?;
    // Colour codes only on a terminal: a log file or journal should read as plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}
