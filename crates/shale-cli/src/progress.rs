//! The open of `shale serve` drawn on a terminal: a bar per step (a count and an ETA
//! for steps that report units, a spinner otherwise), with the log lines, and so the
//! finished steps, printed above it. The engine only reports the steps
//! ([`OpenProgress`]); this is where they are drawn.
//!
//! The log and the bar share stderr: while a bar is drawn, each log line is written
//! with the bar suspended ([`BarSlot`] is the log's writer), so neither garbles the
//! other. The bar is cleared when the last step finishes, before `ready` is logged.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use shale_engine::{OpenEvent, OpenProgress, StepReport};

/// The bar being drawn on stderr, if any; as the log's writer, it writes each line
/// above the bar.
#[derive(Debug, Clone, Default)]
pub struct BarSlot(Arc<Mutex<Option<ProgressBar>>>);

impl BarSlot {
    fn get(&self) -> Option<ProgressBar> {
        // A poisoned slot only means a panic elsewhere; the bar in it is still good.
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, bar: Option<ProgressBar>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = bar;
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BarSlot {
    type Writer = AboveBar;

    fn make_writer(&'a self) -> AboveBar {
        AboveBar(self.get())
    }
}

/// stderr, with the bar (if one is drawn) suspended while a log line is written.
/// The formatter writes each line with one `write_all`.
pub struct AboveBar(Option<ProgressBar>);

impl Write for AboveBar {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match &self.0 {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf)),
            None => std::io::stderr().write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Draws an open's steps on stderr (a terminal): one bar per step, made with its
/// style, prefix and message before it is first drawn.
pub struct OpenBar {
    slot: BarSlot,
    /// The running step's bar.
    bar: Option<ProgressBar>,
    total: Option<usize>,
    /// The running step's bar counts units (it has had an advance).
    counting: bool,
    /// Print each finished step above the bar: when the log does not (its level
    /// hides the engine's `open step` lines, logged from `shale_engine::recovery`),
    /// the bar does.
    print_steps: bool,
}

impl OpenBar {
    pub fn new(slot: BarSlot) -> OpenBar {
        let print_steps =
            !tracing::enabled!(target: "shale_engine::recovery", tracing::Level::INFO);
        OpenBar {
            slot,
            bar: None,
            total: None,
            counting: false,
            print_steps,
        }
    }

    /// Clears the bar (the open ended, or failed).
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.slot.set(None);
    }
}

/// A step that reports no units: its name and time, the spinner turning while a
/// long device call runs.
fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// A step that counts units: the bar takes the width the text leaves.
fn counting_style(unit: &str) -> Option<ProgressStyle> {
    ProgressStyle::with_template(&format!(
        "{{spinner}} {{prefix}} {{msg}} [{{wide_bar}}] {{human_pos}}/{{human_len}} {unit}, ETA {{eta}}"
    ))
    .ok()
    .map(|s| s.progress_chars("=> "))
}

/// A finished step as printed above the bar.
pub fn step_line(step: &StepReport) -> String {
    let sep = if step.detail.is_empty() { "" } else { ": " };
    let read = if step.bytes_read > 0 {
        format!(", read {}", HumanBytes(step.bytes_read))
    } else {
        String::new()
    };
    format!(
        "  {}{sep}{} ({:.2} s{read})",
        step.name,
        step.detail,
        step.duration_ns as f64 / 1e9
    )
}

impl OpenProgress for OpenBar {
    fn event(&mut self, event: &OpenEvent<'_>) {
        match *event {
            OpenEvent::StepStarted { index, total, name } => {
                if let Some(old) = self.bar.take() {
                    old.finish_and_clear();
                }
                self.total = total;
                self.counting = false;
                let prefix = match total {
                    Some(t) => format!("open {}/{t}", index + 1),
                    None => format!("open {}", index + 1),
                };
                let bar = ProgressBar::new(0)
                    .with_style(spinner_style())
                    .with_prefix(prefix)
                    .with_message(name);
                self.slot.set(Some(bar.clone()));
                bar.enable_steady_tick(Duration::from_millis(100));
                self.bar = Some(bar);
            }
            OpenEvent::StepAdvanced {
                done, total, unit, ..
            } => {
                let Some(bar) = &self.bar else { return };
                if !self.counting {
                    self.counting = true;
                    if let Some(style) = counting_style(unit) {
                        bar.set_style(style);
                    }
                    bar.set_length(total);
                    bar.reset_eta();
                }
                bar.set_position(done);
            }
            OpenEvent::StepFinished { index, step } => {
                if self.print_steps {
                    if let Some(bar) = &self.bar {
                        bar.println(step_line(step));
                    }
                }
                if self.total == Some(index + 1) {
                    self.finish();
                }
            }
        }
    }
}
