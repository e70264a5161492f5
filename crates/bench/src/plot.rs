//! The picture of one or more results: output throughput, TTFT and TPOT against the ladder
//! (concurrency or request rate, on a log axis), three panels side by side, one colour per
//! result file, p50 solid and p99 dashed. Overlaying met and a peer measured with the same
//! flags shows at a glance who is faster where.
//!
//! Drawn with plotters' SVG backend and no font files: text is left to the SVG viewer, so
//! the output is small and the same on every machine. Points with no value (no request
//! completed) are left out of their line.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::Summary;
use crate::report::{BenchResult, RunResult};

/// The SVG's size in pixels.
const SIZE: (u32, u32) = (1500, 460);

/// One colour per result file, in order (Tableau 10, readable on white).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// What the x axis is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    Concurrency,
    RequestRate,
}

impl Axis {
    fn of(result: &BenchResult) -> Option<Self> {
        let run = result.runs.first()?;
        Some(if run.concurrency.is_some() { Self::Concurrency } else { Self::RequestRate })
    }

    fn x(self, run: &RunResult) -> Option<f64> {
        match self {
            Self::Concurrency => run.concurrency.map(|c| c as f64),
            Self::RequestRate => run.request_rate,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::RequestRate => "request rate (req/s)",
        }
    }
}

/// `met bench plot`: reads result files and draws them into `out`. A result's label is its
/// `--label`, else the file's stem.
///
/// # Errors
/// A file that is not a result, results of different ladders (concurrency and request
/// rate), or an SVG that cannot be written.
pub fn plot_files(paths: &[PathBuf], out: &Path) -> Result<()> {
    let results = paths
        .iter()
        .map(|path| {
            let result = BenchResult::read_json(path)?;
            let stem =
                path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
            Ok((result.label.clone().unwrap_or(stem), result))
        })
        .collect::<Result<Vec<_>>>()?;
    write_svg(&results, out)
}

/// Draws `(label, result)` pairs into the SVG file `out`.
///
/// # Errors
/// As [`render`], or the file cannot be written.
pub fn write_svg(results: &[(String, BenchResult)], out: &Path) -> Result<()> {
    let svg = render(results)?;
    std::fs::write(out, svg).with_context(|| format!("cannot write {}", out.display()))
}

/// The SVG text of `(label, result)` pairs.
///
/// # Errors
/// No result has a ladder point, or the results mix concurrency and request-rate ladders.
pub fn render(results: &[(String, BenchResult)]) -> Result<String> {
    let axis = axis_of(results)?;
    let xs: Vec<f64> =
        results.iter().flat_map(|(_, r)| r.runs.iter().filter_map(|run| axis.x(run))).filter(|x| *x > 0.0).collect();
    let (lo, hi) = xs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    if xs.is_empty() {
        bail!("nothing to plot: no result has a ladder point");
    }
    // Some room on either side of the first and last point on the log axis.
    let x_range = (lo / 1.5)..(hi * 1.5);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let panels = root.split_evenly((1, 3));
        let throughput = |run: &RunResult| Some(run.figures.output_throughput).filter(|_| run.figures.completed > 0);
        let pct = |f: fn(&RunResult) -> Option<Summary>, p99: bool| {
            move |run: &RunResult| f(run).map(|s| if p99 { s.p99 } else { s.p50 })
        };
        let panel = Panel { results, axis, x_range: x_range.clone() };
        panel.draw(&panels[0], "output throughput (tok/s)", &[(&throughput, false, "")])?;
        let ttft = |run: &RunResult| run.figures.ttft_ms;
        let tpot = |run: &RunResult| run.figures.tpot_ms;
        panel.draw(
            &panels[1],
            "TTFT (ms): p50 solid, p99 dashed",
            &[(&pct(ttft, false), false, " p50"), (&pct(ttft, true), true, " p99")],
        )?;
        panel.draw(
            &panels[2],
            "TPOT (ms): p50 solid, p99 dashed",
            &[(&pct(tpot, false), false, " p50"), (&pct(tpot, true), true, " p99")],
        )?;
        root.present()?;
    }
    Ok(svg)
}

fn axis_of(results: &[(String, BenchResult)]) -> Result<Axis> {
    let mut axes = results.iter().filter_map(|(label, r)| Axis::of(r).map(|a| (label, a)));
    let Some((first_label, axis)) = axes.next() else { bail!("nothing to plot: no result has a ladder point") };
    if let Some((label, _)) = axes.find(|(_, a)| *a != axis) {
        bail!("cannot overlay `{first_label}` ({}) and `{label}` (the other kind of ladder)", axis.name());
    }
    Ok(axis)
}

/// A figure of one ladder point, `None` where it was not measured.
type Metric<'a> = &'a dyn Fn(&RunResult) -> Option<f64>;

/// What every panel shares.
struct Panel<'r> {
    results: &'r [(String, BenchResult)],
    axis: Axis,
    x_range: std::ops::Range<f64>,
}

/// One metric of one result file, as drawn.
struct Line {
    colour: RGBColor,
    label: String,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

impl Panel<'_> {
    /// One panel: each metric (with whether it is dashed and its legend suffix) drawn once
    /// per result, in the result's colour.
    fn draw(
        &self,
        area: &DrawingArea<SVGBackend<'_>, Shift>,
        title: &str,
        metrics: &[(Metric<'_>, bool, &str)],
    ) -> Result<()> {
        let lines: Vec<Line> = self
            .results
            .iter()
            .enumerate()
            .flat_map(|(file, (label, result))| {
                metrics.iter().map(move |(metric, dashed, suffix)| Line {
                    colour: COLOURS[file % COLOURS.len()],
                    label: format!("{label}{suffix}"),
                    dashed: *dashed,
                    points: result.runs.iter().filter_map(|run| Some((self.axis.x(run)?, metric(run)?))).collect(),
                })
            })
            .collect();
        let y_max = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
        // Headroom above the highest point keeps the upper-left legend off most lines (they
        // usually rise with load, so that corner is the emptiest).
        let y_range = 0.0..if y_max > 0.0 { y_max * 1.3 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(self.x_range.clone().log_scale(), y_range)?;
        chart
            .configure_mesh()
            .x_desc(self.axis.name())
            .x_label_formatter(&|x| tick(*x))
            .y_label_formatter(&|y| tick(*y))
            .light_line_style(BLACK.mix(0.05))
            .label_style(("sans-serif", 13))
            .draw()?;
        for Line { colour, label, dashed, points } in lines {
            let style = colour.stroke_width(2);
            if dashed {
                let legend = move |(x, y): (i32, i32)| {
                    EmptyElement::at((x, y))
                        + PathElement::new([(0, 0), (6, 0)], style)
                        + PathElement::new([(10, 0), (16, 0)], style)
                        + PathElement::new([(20, 0), (22, 0)], style)
                };
                chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?.label(label).legend(legend);
            } else {
                let legend = move |(x, y): (i32, i32)| PathElement::new([(x, y), (x + 22, y)], style);
                chart.draw_series(LineSeries::new(points.clone(), style))?.label(label).legend(legend);
            }
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()?;
        Ok(())
    }
}

/// An axis tick: at most three significant digits (all of an integer part), no trailing
/// zeros.
fn tick(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let digits = (2 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_owned() } else { text }
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn ticks_are_short() {
        assert_eq!(
            [tick(1.0), tick(16.0), tick(0.6667), tick(2.5), tick(1234.6), tick(0.0)],
            ["1", "16", "0.667", "2.5", "1235", "0"]
        );
    }
}
