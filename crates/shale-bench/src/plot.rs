//! PNG line charts of the suites' sweeps and time series, drawn with plotters' bitmap
//! backend. Text is rendered with ab_glyph from a font shipped in the crate
//! (`fonts/DejaVuSansMono.ttf`, Bitstream Vera licence in `fonts/`), so drawing needs
//! no system font library.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

static FONT: &[u8] = include_bytes!("../fonts/DejaVuSansMono.ttf");
const FAMILY: &str = "sans-serif";
const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart: x and y axes, linear or logarithmic.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    /// Labels for integer x positions (categorical axes); empty for numeric ones.
    pub x_names: Vec<String>,
    pub lines: Vec<Line>,
}

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the embedded font does not load")]
    Font,
    #[error("drawing {path}: {reason}")]
    Draw { path: String, reason: String },
}

fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

fn palette(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
    ];
    COLORS[i % COLORS.len()]
}

fn range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.05).max(1e-9);
        ((lo - pad).min(0.0_f64.max(lo - pad)), hi + pad)
    }
}

/// Draws `chart` into a PNG at `path`.
#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
pub fn draw(chart: &Chart, path: &Path) -> Result<(), PlotError> {
    register_font()?;
    let err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let xs = chart
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0));
    let ys = chart
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1));
    let (x0, x1) = range(xs, chart.x_log);
    let (y0, y1) = range(ys, chart.y_log);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&chart.title, (FAMILY, 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70);
    let names = chart.x_names.clone();
    let x_fmt = move |x: &f64| -> String {
        if names.is_empty() {
            if x.abs() >= 100.0 || x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.2}")
            }
        } else {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
    };
    let y_fmt = |y: &f64| -> String {
        if y.abs() >= 100.0 {
            format!("{y:.0}")
        } else if y.abs() >= 1.0 {
            format!("{y:.1}")
        } else {
            format!("{y:.2}")
        }
    };
    macro_rules! body {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(chart.x_label.as_str())
                .y_desc(chart.y_label.as_str())
                .x_label_formatter(&x_fmt)
                .y_label_formatter(&y_fmt)
                .x_labels(if chart.x_names.is_empty() {
                    10
                } else {
                    chart.x_names.len()
                })
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 15))
                .draw()
                .map_err(|e| err(&e))?;
            for (i, line) in chart.lines.iter().enumerate() {
                let color = palette(i);
                let pts: Vec<(f64, f64)> = line
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| {
                        x.is_finite()
                            && y.is_finite()
                            && (!chart.x_log || *x > 0.0)
                            && (!chart.y_log || *y > 0.0)
                    })
                    .collect();
                ctx.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(line.label.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                ctx.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            ctx.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FAMILY, 13))
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    match (chart.x_log, chart.y_log) {
        (false, false) => body!(builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| err(&e))?),
        (true, false) => body!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(|e| err(&e))?),
        (false, true) => body!(builder
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(|e| err(&e))?),
        (true, true) => body!(builder
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(|e| err(&e))?),
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png_with_text_and_log_axes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chart = Chart {
            title: "test".into(),
            x_label: "bs (KiB)".into(),
            y_label: "MiB/s".into(),
            x_log: true,
            y_log: true,
            x_names: Vec::new(),
            lines: vec![
                Line {
                    label: "a".into(),
                    points: vec![(4.0, 1.0), (64.0, 100.0)],
                },
                Line {
                    label: "b".into(),
                    points: vec![(4.0, 0.0), (16.0, 5.0)],
                },
            ],
        };
        let path = dir.path().join("a.png");
        draw(&chart, &path).expect("draw");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(&bytes[1..4], b"PNG");
        let cat = Chart {
            x_log: false,
            y_log: false,
            x_names: vec!["uniform".into(), "zipf0.8".into()],
            ..chart
        };
        draw(&cat, &dir.path().join("b.png")).expect("draw categorical");
    }
}
