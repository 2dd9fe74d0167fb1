//! `cetera-bench chart RESULTS.json DIR`: SVG charts of a side-by-side run, drawn with
//! plotters: throughput, p99 latency and server CPU per operation of every step, and
//! KB written and fsyncs per put at every rate step; one panel per step, one bar per
//! server, its value written above it ("n/a" where the server could not do the step).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::markdown::RATE_STEPS;
use crate::results::{Results, StepRun};

/// One SVG file: a grid of panels.
pub struct Chart {
    /// File name, e.g. `throughput.svg`.
    pub file: &'static str,
    pub title: String,
    pub panels: Vec<Panel>,
}

/// One step: one bar per server.
pub struct Panel {
    pub title: String,
    /// Each server's label and its value, or why it has none.
    pub bars: Vec<(String, Result<f64, String>)>,
}

/// What each chart of RESULTS shows, before any drawing.
pub fn charts(results: &Results) -> Vec<Chart> {
    let steps: Vec<&str> = results
        .step_labels()
        .into_iter()
        .filter(|s| *s != "idle")
        .collect();
    let rate_steps: Vec<&str> = RATE_STEPS
        .into_iter()
        .filter(|s| steps.contains(s))
        .collect();
    let panel = |step: &str, title: String, value: &dyn Fn(&StepRun) -> Option<f64>| Panel {
        title,
        bars: results
            .peers
            .iter()
            .map(|p| {
                let bar = match results.run(step, &p.name).map(StepRun::outcome) {
                    None => Err("not run".to_string()),
                    Some(Err(reason)) => Err(reason.to_string()),
                    Some(Ok(run)) => value(run).ok_or_else(|| "not measured".to_string()),
                };
                (p.label.clone(), bar)
            })
            .collect(),
    };
    let unit = |step: &str| {
        results
            .steps
            .iter()
            .find(|r| r.step == step)
            .and_then(StepRun::headline)
            .map_or("op".to_string(), |r| format!("{} {}", r.name, r.unit))
    };
    vec![
        Chart {
            file: "throughput.svg",
            title: "Throughput per second (higher is better)".into(),
            panels: steps
                .iter()
                .map(|s| {
                    panel(s, format!("{s}: {}/s", unit(s)), &|r| {
                        r.headline().map(|h| h.per_sec)
                    })
                })
                .collect(),
        },
        Chart {
            file: "p99.svg",
            title: "Latency p99, ms (lower is better)".into(),
            panels: steps
                .iter()
                .map(|s| {
                    panel(s, format!("{s}: {}", unit(s)), &|r| {
                        r.headline().map(|h| h.latency_ms.p99)
                    })
                })
                .collect(),
        },
        Chart {
            file: "cpu-per-op.svg",
            title: "Server CPU per operation, ms (lower is better)".into(),
            panels: steps
                .iter()
                .map(|s| panel(s, s.to_string(), &StepRun::cpu_ms_per_op))
                .collect(),
        },
        Chart {
            file: "bytes-per-put.svg",
            title: "KB written per put at each rate, 1 KiB values (lower is better)".into(),
            panels: rate_steps
                .iter()
                .map(|s| panel(s, s.to_string(), &StepRun::kib_per_op))
                .collect(),
        },
        Chart {
            file: "fsyncs-per-put.svg",
            title: "fsyncs per put at each rate (lower is better)".into(),
            panels: rate_steps
                .iter()
                .map(|s| panel(s, s.to_string(), &StepRun::fsyncs_per_op))
                .collect(),
        },
    ]
}

/// A bar's value as written above it: three significant digits, k and M for large.
pub fn short(v: f64) -> String {
    let (v, suffix) = if v.abs() >= 1e6 {
        (v / 1e6, "M")
    } else if v.abs() >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let text = if v == 0.0 {
        "0".to_string()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        let places = (2 - v.abs().log10().floor() as i32).max(0) as usize;
        format!("{v:.places$}")
    };
    format!("{text}{suffix}")
}

/// Each server's colour, by its place among the peers.
const COLOURS: [RGBColor; 6] = [
    RGBColor(150, 150, 150),
    RGBColor(66, 114, 196),
    RGBColor(237, 125, 49),
    RGBColor(46, 160, 67),
    RGBColor(150, 80, 190),
    RGBColor(200, 60, 60),
];

/// Columns of panels in a chart.
const COLUMNS: usize = 4;

/// Writes every chart of RESULTS into DIR; returns the files written.
pub fn write_all(results: &Results, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    for chart in charts(results) {
        if chart.panels.is_empty() {
            continue;
        }
        let path = dir.join(chart.file);
        draw(&chart, &path).map_err(|e| anyhow::anyhow!("draw {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

fn draw(chart: &Chart, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let rows = chart.panels.len().div_ceil(COLUMNS);
    let columns = chart.panels.len().min(COLUMNS);
    let size = (300 * columns as u32, 70 + 230 * rows as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(70);
    top.draw(&Text::new(
        chart.title.clone(),
        (10, 8),
        ("sans-serif", 20).into_font(),
    ))?;
    // The legend: one colour per server.
    if let Some(first) = chart.panels.first() {
        let mut x = 10;
        for (i, (label, _)) in first.bars.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            top.draw(&Rectangle::new([(x, 42), (x + 14, 56)], colour.filled()))?;
            top.draw(&Text::new(
                label.clone(),
                (x + 20, 42),
                ("sans-serif", 14).into_font(),
            ))?;
            x += 30 + 9 * label.len() as i32;
        }
    }
    let areas = body.split_evenly((rows, columns));
    for (area, panel) in areas.iter().zip(&chart.panels) {
        draw_panel(area, panel)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), Box<dyn std::error::Error>> {
    let top = panel
        .bars
        .iter()
        .filter_map(|(_, v)| v.as_ref().ok().copied())
        .fold(0.0_f64, f64::max);
    let top = if top > 0.0 { top * 1.2 } else { 1.0 };
    let n = panel.bars.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 13))
        .margin(8)
        .x_label_area_size(4)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..n, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_labels(4)
        .y_label_formatter(&|v| short(*v))
        .label_style(("sans-serif", 10))
        .draw()?;
    let above = |text: String, x: f64, y: f64| {
        Text::new(
            text,
            (x, y),
            ("sans-serif", 11)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    };
    for (i, (_, value)) in panel.bars.iter().enumerate() {
        let x = i as f64;
        match value {
            Ok(v) => {
                let colour = COLOURS[i % COLOURS.len()];
                chart.draw_series([Rectangle::new(
                    [(x + 0.12, 0.0), (x + 0.88, *v)],
                    colour.filled(),
                )])?;
                chart.draw_series([above(short(*v), x + 0.5, *v)])?;
            }
            Err(_) => {
                chart.draw_series([above("n/a".into(), x + 0.5, top * 0.02)])?;
            }
        }
    }
    Ok(())
}
