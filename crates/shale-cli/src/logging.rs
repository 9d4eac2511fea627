//! Structured logs (tracing) on stderr, as text or JSON lines.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::progress::BarSlot;

pub fn init(format: &str, level: &str) -> Result<()> {
    install(format, level, std::io::stderr)
}

/// [`init`], with each line written above the progress bar `slot` holds while one
/// is drawn.
pub fn init_above_bar(format: &str, level: &str, slot: BarSlot) -> Result<()> {
    install(format, level, slot)
}

fn install<W>(format: &str, level: &str, writer: W) -> Result<()>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(level).with_context(|| format!("log level {level:?}"))?;
    // Colour codes only on a terminal: a log file or journal should read as plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    let result = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}
