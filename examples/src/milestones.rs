//! Milestone timelines: the line format the recovery tests and `recovery-demo --timeline` print,
//! read back generically (any milestone names, any number of runs and series), and drawn as an
//! SVG plot (`timeline-plot`; the figure of BENCHMARKS.md "The whole recovery on a node").
//!
//! # The format
//!
//! One milestone per line; every other line is ignored, so a whole test log can be read:
//!
//! ```text
//! milestone +  7962 ms: kube-apiserver container running
//! milestone +16.7 s: kube-apiserver answers localhost-recovery
//! milestone master-1 +  8120 ms: kube-apiserver container running
//! ```
//!
//! `milestone`, an optional series (one word without spaces: a node's name, for a timeline with
//! several nodes), `+`, the time since the run's start (a decimal number, spaces allowed before
//! it) and its unit (`ms` or `s`), `:`, the milestone's name (the rest of the line). Lines may
//! carry leading spaces. A run is the lines up to the point where a (series, name) seen in it
//! comes again: a test that repeats its scenario (`E2E_NODE_RUNS=3`) prints each milestone once
//! per run, so its runs need no marker.

use std::fmt::Write as _;
use std::time::Duration;

/// One milestone of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Milestone {
    /// The series (a node), if the timeline has several.
    pub series: Option<String>,
    /// What happened.
    pub name: String,
    /// Since the run's start.
    pub at: Duration,
}

impl Milestone {
    /// The milestone's line in the format above (milliseconds, right-aligned as the tests print
    /// them).
    pub fn line(&self) -> String {
        let series = self
            .series
            .as_ref()
            .map_or_else(String::new, |s| format!("{s} "));
        format!(
            "milestone {series}+{:>6} ms: {}",
            self.at.as_millis(),
            self.name
        )
    }

    /// The milestone of `line`, if it is one.
    pub fn parse(line: &str) -> Option<Milestone> {
        let rest = line.trim_start().strip_prefix("milestone ")?;
        let (head, name) = rest.split_once(": ")?;
        let (series, time) = head.split_once('+')?;
        let series = match series.trim() {
            "" => None,
            word if !word.contains(char::is_whitespace) => Some(word.to_owned()),
            _ => return None,
        };
        let time = time.trim();
        let (number, scale) = if let Some(ms) = time.strip_suffix("ms") {
            (ms, 1e-3)
        } else {
            (time.strip_suffix('s')?, 1.0)
        };
        let seconds = number.trim().parse::<f64>().ok()? * scale;
        let name = name.trim();
        (seconds.is_finite() && seconds >= 0.0 && !name.is_empty()).then(|| Milestone {
            series,
            name: name.to_owned(),
            at: Duration::from_secs_f64(seconds),
        })
    }
}

/// The runs of `text`: its milestone lines, split where a (series, name) repeats.
pub fn runs(text: &str) -> Vec<Vec<Milestone>> {
    let mut runs: Vec<Vec<Milestone>> = Vec::new();
    let mut current: Vec<Milestone> = Vec::new();
    for milestone in text.lines().filter_map(Milestone::parse) {
        let repeated = current
            .iter()
            .any(|m| m.series == milestone.series && m.name == milestone.name);
        if repeated {
            runs.push(std::mem::take(&mut current));
        }
        current.push(milestone);
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// One row of the plot: a (series, name) and its time in each run that has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub series: Option<String>,
    pub name: String,
    pub times: Vec<Duration>,
}

impl Row {
    /// The median of the runs (the lower middle one for an even count).
    pub fn median(&self) -> Duration {
        let mut sorted = self.times.clone();
        sorted.sort();
        sorted[(sorted.len() - 1) / 2]
    }
}

/// The rows of `runs`, ordered by median time (then by first appearance).
pub fn rows(runs: &[Vec<Milestone>]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for milestone in runs.iter().flatten() {
        match rows
            .iter_mut()
            .find(|r| r.series == milestone.series && r.name == milestone.name)
        {
            Some(row) => row.times.push(milestone.at),
            None => rows.push(Row {
                series: milestone.series.clone(),
                name: milestone.name.clone(),
                times: vec![milestone.at],
            }),
        }
    }
    // A stable sort keeps the first-appearance order of equal medians.
    rows.sort_by_key(Row::median);
    rows
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 16.0;
const RIGHT: f64 = 84.0;
const ROW: f64 = 34.0;
/// One colour per series (the first for a timeline without series).
const COLOURS: [&str; 6] = [
    "#1f6fb4", "#d9641e", "#2f9a48", "#b8322f", "#7d56a8", "#7a5a4a",
];

/// `rows` as an SVG document: one row per milestone, its name above a bar from the start to its
/// median, a dot per run and the median's value; a time axis; one colour per series, with a
/// legend when there are several.
pub fn svg(title: &str, rows: &[Row]) -> String {
    let plot = Plot::new(rows);
    let mut out = String::new();
    plot.head(&mut out, title, rows);
    plot.grid(&mut out);
    for (index, row) in rows.iter().enumerate() {
        plot.row(&mut out, index, row);
    }
    out.push_str("</svg>\n");
    out
}

/// The plot's geometry: its series, time scale and vertical layout.
struct Plot<'a> {
    series: Vec<Option<&'a str>>,
    /// The grid step and the axis' end, in seconds.
    step: f64,
    end: f64,
    /// The first row's top, the axis' line, the document's height.
    top: f64,
    axis: f64,
    height: f64,
}

impl<'a> Plot<'a> {
    fn new(rows: &'a [Row]) -> Plot<'a> {
        let series = rows.iter().fold(Vec::new(), |mut seen, row| {
            if !seen.contains(&row.series.as_deref()) {
                seen.push(row.series.as_deref());
            }
            seen
        });
        let longest = rows
            .iter()
            .flat_map(|r| &r.times)
            .max()
            .map_or(1.0, Duration::as_secs_f64);
        let step = tick_step(longest);
        let legend = if series.len() > 1 { 20.0 } else { 0.0 };
        let top = 44.0 + legend;
        let axis = top + ROW * rows.len() as f64 + 6.0;
        Plot {
            series,
            step,
            end: (longest / step).ceil().max(1.0) * step,
            top,
            axis,
            height: axis + 44.0,
        }
    }

    /// The x of a time.
    fn x(&self, seconds: f64) -> f64 {
        LEFT + (WIDTH - LEFT - RIGHT) * seconds / self.end
    }

    fn colour(&self, series: Option<&str>) -> &'static str {
        let index = self.series.iter().position(|s| *s == series).unwrap_or(0);
        COLOURS[index % COLOURS.len()]
    }

    /// The document's start, the title, the caption and (several series) the legend.
    fn head(&self, out: &mut String, title: &str, rows: &[Row]) {
        let height = self.height;
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
        );
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
            escape(title)
        );
        let runs = rows.iter().map(|r| r.times.len()).max().unwrap_or(0);
        let caption = format!(
            "{runs} run{}: a dot per run, the bar to the median; seconds from the start",
            if runs == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="38" fill="#555">{}</text>"##,
            escape(&caption)
        );
        if self.series.len() < 2 {
            return;
        }
        let mut at = LEFT;
        for name in &self.series {
            let label = name.unwrap_or("(none)");
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                at + 4.0,
                self.top - 16.0,
                self.colour(*name),
                at + 12.0,
                self.top - 12.0,
                escape(label)
            );
            at += 24.0 + 7.5 * label.len() as f64;
        }
    }

    /// The vertical grid lines, their labels and the axis' name.
    fn grid(&self, out: &mut String) {
        let (top, axis) = (self.top, self.axis);
        let mut tick = 0.0;
        while tick <= self.end + self.step / 2.0 {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{axis}" stroke="#ddd"/><text x="{0:.1}" y="{1:.1}" text-anchor="middle" fill="#555">{2}</text>"##,
                self.x(tick),
                axis + 16.0,
                tick_label(tick, self.step)
            );
            tick += self.step;
        }
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">seconds</text>"##,
            self.x(self.end / 2.0),
            axis + 34.0
        );
    }

    /// One milestone: its name (the whole of it and its times as a tooltip), the bar to its
    /// median, the spread of the runs, a dot per run, the median's mark and value.
    fn row(&self, out: &mut String, index: usize, row: &Row) {
        let y = self.top + ROW * index as f64;
        let c = self.colour(row.series.as_deref());
        let name = match &row.series {
            Some(s) => format!("{s}: {}", row.name),
            None => row.name.clone(),
        };
        let median = row.median().as_secs_f64();
        let seconds: Vec<f64> = row.times.iter().map(Duration::as_secs_f64).collect();
        let low = seconds.iter().copied().fold(f64::INFINITY, f64::min);
        let high = seconds.iter().copied().fold(0.0, f64::max);
        let runs: Vec<String> = seconds.iter().map(|t| seconds_label(*t)).collect();
        let _ = writeln!(
            out,
            r#"<g><title>{}</title><text x="{LEFT}" y="{:.1}">{}</text>"#,
            escape(&format!(
                "{name}: median {}, runs {}",
                seconds_label(median),
                runs.join(", ")
            )),
            y + 13.0,
            escape(&shortened(&name))
        );
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="6" fill="{c}" opacity="0.25"/>"#,
            self.x(0.0),
            y + 19.0,
            (self.x(median) - self.x(0.0)).max(1.0)
        );
        if high > low {
            let _ = writeln!(
                out,
                r#"<line x1="{:.1}" y1="{2:.1}" x2="{:.1}" y2="{2:.1}" stroke="{c}" stroke-width="1.5"/>"#,
                self.x(low),
                self.x(high),
                y + 22.0
            );
        }
        for time in &seconds {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}" fill-opacity="0.6"/>"#,
                self.x(*time),
                y + 22.0
            );
        }
        let _ = writeln!(
            out,
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="{c}" stroke-width="2.5"/><text x="{3:.1}" y="{4:.1}">{5}</text></g>"#,
            self.x(median),
            y + 16.0,
            y + 28.0,
            self.x(high) + 8.0,
            y + 26.0,
            seconds_label(median)
        );
    }
}

/// Names longer than a row's width end in `…` (the whole name is the row's tooltip).
fn shortened(name: &str) -> String {
    const MAX: usize = 125;
    if name.chars().count() <= MAX {
        name.to_owned()
    } else {
        name.chars().take(MAX - 1).chain(['…']).collect()
    }
}

/// A grid step of 1, 2 or 5 × 10ⁿ seconds giving at most 10 steps up to `longest`.
fn tick_step(longest: f64) -> f64 {
    let mut step = 10f64.powf((longest.max(1e-3) / 10.0).log10().floor());
    for factor in [1.0, 2.0, 5.0, 10.0] {
        if longest / (step * factor) <= 10.0 {
            step *= factor;
            break;
        }
    }
    step
}

/// A grid label: as many decimals as the step has (`50 s`, `0.2 s`).
fn tick_label(seconds: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{seconds:.decimals$} s")
}

/// Seconds, with the precision their size deserves.
fn seconds_label(seconds: f64) -> String {
    if seconds == 0.0 {
        "0".to_owned()
    } else if seconds < 10.0 {
        format!("{seconds:.2} s")
    } else if seconds < 100.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{seconds:.0} s")
    }
}

/// Text for SVG content and attributes.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_tests_lines_parse_and_other_lines_are_skipped() {
        let log = "\
[kubelet] starting\n\
milestone +  7962 ms: kube-apiserver container running\n\
milestone +  15152 ms: the kubelet's CSR approved: by us (watched alongside)\n\
  milestone node-2 +16.5 s: synced\n\
milestone two words +1 s: not a series\n\
milestone +x ms: not a time\n\
run 1: [7962] ms\n";
        let found: Vec<Milestone> = log.lines().filter_map(Milestone::parse).collect();
        assert_eq!(
            found,
            [
                Milestone {
                    series: None,
                    name: "kube-apiserver container running".into(),
                    at: ms(7962)
                },
                Milestone {
                    series: None,
                    name: "the kubelet's CSR approved: by us (watched alongside)".into(),
                    at: ms(15152)
                },
                Milestone {
                    series: Some("node-2".into()),
                    name: "synced".into(),
                    at: ms(16500)
                },
            ]
        );
    }

    #[test]
    fn a_line_reads_back_as_its_milestone() {
        for m in [
            Milestone {
                series: None,
                name: "a: b".into(),
                at: ms(12),
            },
            Milestone {
                series: Some("master-0".into()),
                name: "x".into(),
                at: ms(123_456),
            },
        ] {
            assert_eq!(Milestone::parse(&m.line()), Some(m));
        }
    }

    #[test]
    fn runs_split_where_a_milestone_repeats_and_rows_order_by_median() {
        let log = "milestone + 10 ms: a\nmilestone + 30 ms: b\nmilestone node-1 + 5 ms: a\n\
                   milestone + 12 ms: a\nmilestone + 20 ms: b\n\
                   milestone + 14 ms: a\nmilestone + 25 ms: b\nmilestone + 1 ms: c\n";
        let runs = runs(log);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), [3, 2, 3]);
        let rows = rows(&runs);
        let summary: Vec<(Option<&str>, &str, Duration, usize)> = rows
            .iter()
            .map(|r| {
                (
                    r.series.as_deref(),
                    r.name.as_str(),
                    r.median(),
                    r.times.len(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (None, "c", ms(1), 1),
                (Some("node-1"), "a", ms(5), 1),
                (None, "a", ms(12), 3),
                (None, "b", ms(25), 3),
            ]
        );
    }

    fn rows_of(text: &str) -> Vec<Row> {
        rows(&runs(text))
    }

    #[test]
    fn the_plot_has_a_row_per_milestone_escaped_and_placed_by_its_time() {
        let rows = rows(&runs(
            "milestone +1000 ms: first <a&b>\nmilestone +60 s: last\nmilestone node-1 +30 s: mid\n",
        ));
        let svg = svg("t \"q\"", &rows);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(">first &lt;a&amp;b&gt;</text>"), "{svg}");
        assert!(svg.contains("t &quot;q&quot;"));
        assert!(svg.contains(">node-1: mid</text>"));
        let long = "x".repeat(200);
        let svg_long = super::svg("t", &rows_of(&format!("milestone +1 s: {long}\n")));
        assert!(svg_long.contains(&format!(">{}…</text>", "x".repeat(124))));
        assert!(svg_long.contains(&format!("<title>{long}: median")));
        // Two series: a legend naming both.
        assert!(svg.contains(">(none)</text>") && svg.contains(">node-1</text>"));
        // x grows with time: the median marks of the three rows, in row order.
        let marks: Vec<f64> = svg
            .lines()
            .filter(|l| l.contains("stroke-width=\"2.5\""))
            .map(|l| {
                let x = l.split("x1=\"").nth(1).unwrap();
                x[..x.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(marks.len(), 3);
        assert!(marks[0] < marks[1] && marks[1] < marks[2], "{marks:?}");
        assert!(
            (marks[2] - (WIDTH - RIGHT)).abs() < 1.0,
            "60 s ends the axis: {marks:?}"
        );
    }

    #[test]
    fn grid_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(tick_step(366.0), 50.0);
        assert_eq!(tick_step(23.4), 5.0);
        assert_eq!(tick_step(1.2), 0.2);
        assert_eq!(tick_step(100.0), 10.0);
        assert_eq!(tick_label(150.0, 50.0), "150 s");
        assert_eq!(tick_label(0.4, 0.2), "0.4 s");
        assert_eq!(tick_label(0.05, 0.01), "0.05 s");
    }
}
