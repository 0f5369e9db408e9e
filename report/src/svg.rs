//! Hand-written SVG charts of rates over a run: one line per metric through its values, a shaded band and a
//! whisker for each value's 95% interval, axes with ticks and labels. Plain SVG with no script, so it renders in
//! an HTML file opened from disk, in a page of the web service and in a screenshot alike.

use std::fmt::Write as _;
use tooltune_core::text::escape_html;

/// One value of a series: a rate at `x` with its interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Position on the horizontal axis (rollouts spent).
    pub x: f64,
    /// The rate in [0, 1], or `None` when it had no trials (then the point is left out).
    pub value: Option<f64>,
    /// Lower end of its 95% interval.
    pub low: f64,
    /// Upper end of its 95% interval.
    pub high: f64,
    /// Tooltip text shown on hover (escaped when written).
    pub label: String,
}

/// A line in a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text (escaped when written).
    pub name: String,
    /// A CSS colour such as `#1f77b4` (anything else is replaced by grey).
    pub color: String,
    /// Draw the line dashed (for a secondary metric).
    pub dashed: bool,
    /// Shade the band between the interval ends, in addition to the whiskers.
    pub band: bool,
    /// The values, in drawing order.
    pub points: Vec<Point>,
}

/// A chart's frame: its size and the words on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot (escaped when written).
    pub title: String,
    /// Horizontal axis label.
    pub x_label: String,
    /// Vertical axis label.
    pub y_label: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Extend the horizontal axis to at least this value (the run's total rollouts, so that a run's chart shows
    /// how much of its spending the evaluations cover).
    pub x_max: Option<f64>,
}

const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 52.0;
const BOTTOM: f64 = 46.0;

/// Draws `series` on a chart whose vertical axis runs from 0% to 100% and whose horizontal axis runs from 0 to the
/// largest `x` (rounded up to a readable tick). Returns one `<svg>` element.
pub fn metric_chart(chart: &Chart, series: &[Series]) -> String {
    let width = f64::from(chart.width.max(200));
    let height = f64::from(chart.height.max(150));
    let plot_w = width - LEFT - RIGHT;
    let plot_h = height - TOP - BOTTOM;
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.value.is_some() && p.x.is_finite())
        .map(|p| p.x)
        .fold(0.0_f64, f64::max)
        .max(chart.x_max.filter(|x| x.is_finite()).unwrap_or(0.0));
    let step = nice_step(if max_x > 0.0 { max_x / 5.0 } else { 1.0 });
    // One tick of room past the last point, so that its whiskers and marker stay inside the plot.
    let x_end = ((max_x / step).floor() + 1.0) * step;
    let sx = |x: f64| LEFT + (x.clamp(0.0, x_end) / x_end) * plot_w;
    let sy = |y: f64| TOP + (1.0 - y.clamp(0.0, 1.0)) * plot_h;

    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{t}\" font-family=\"sans-serif\" font-size=\"12\">\
         <title>{t}</title>",
        w = width,
        h = height,
        t = escape_html(&chart.title)
    );
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"18\" font-size=\"14\" font-weight=\"bold\" fill=\"#222\">{}</text>",
        escape_html(&chart.title)
    );
    // Horizontal grid lines and the vertical axis's labels.
    for i in 0..=4 {
        let v = f64::from(i) * 0.25;
        let y = sy(v);
        let _ = write!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\" stroke-width=\"1\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">{}%</text>",
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            i * 25
        );
    }
    // The horizontal axis, its ticks and labels.
    let base = sy(0.0);
    let _ = write!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{base:.1}\" x2=\"{:.1}\" y2=\"{base:.1}\" stroke=\"#444\" stroke-width=\"1\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{base:.1}\" stroke=\"#444\" stroke-width=\"1\"/>",
        LEFT + plot_w
    );
    let ticks = (x_end / step).round() as u32;
    for i in 0..=ticks {
        let v = f64::from(i) * step;
        let x = sx(v);
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{base:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#444\" stroke-width=\"1\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
            base + 5.0,
            base + 18.0,
            fmt_tick(v, step)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#222\">{}</text>\
         <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#222\">{}</text>",
        LEFT + plot_w / 2.0,
        height - 8.0,
        escape_html(&chart.x_label),
        TOP + plot_h / 2.0,
        escape_html(&chart.y_label)
    );
    // The legend, in one row under the title.
    let mut lx = LEFT;
    for se in series {
        let color = safe_color(&se.color);
        let dash = if se.dashed {
            " stroke-dasharray=\"5 4\""
        } else {
            ""
        };
        let _ = write!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"34\" x2=\"{:.1}\" y2=\"34\" stroke=\"{color}\" stroke-width=\"2.5\"{dash}/>\
             <text x=\"{:.1}\" y=\"38\" fill=\"#222\">{}</text>",
            lx + 22.0,
            lx + 27.0,
            escape_html(&se.name)
        );
        lx += 40.0 + 6.5 * se.name.chars().count() as f64;
    }
    let drawn: usize = series
        .iter()
        .map(|se| se.points.iter().filter(|p| p.value.is_some()).count())
        .sum();
    if drawn == 0 {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#888\">no evaluations recorded yet</text>",
            LEFT + plot_w / 2.0,
            TOP + plot_h / 2.0
        );
    }
    let n = series.len() as f64;
    for (i, se) in series.iter().enumerate() {
        // Whiskers of different series at the same x are moved apart a little so that each stays visible.
        let dx = (i as f64 - (n - 1.0) / 2.0) * 5.0;
        let color = safe_color(&se.color);
        let pts: Vec<&Point> = se
            .points
            .iter()
            .filter(|p| p.value.is_some() && p.x.is_finite())
            .collect();
        if se.band && pts.len() >= 2 {
            let mut d = String::new();
            for p in &pts {
                let _ = write!(d, "{:.1},{:.1} ", sx(p.x), sy(p.high));
            }
            for p in pts.iter().rev() {
                let _ = write!(d, "{:.1},{:.1} ", sx(p.x), sy(p.low));
            }
            let _ = write!(
                s,
                "<polygon points=\"{}\" fill=\"{color}\" fill-opacity=\"0.10\" stroke=\"none\"/>",
                d.trim_end()
            );
        }
        for p in &pts {
            let x = sx(p.x) + dx;
            let (y1, y2) = (sy(p.high), sy(p.low));
            let _ = write!(
                s,
                "<g stroke=\"{color}\" stroke-width=\"1.2\" stroke-opacity=\"0.8\">\
                 <line x1=\"{x:.1}\" y1=\"{y1:.1}\" x2=\"{x:.1}\" y2=\"{y2:.1}\"/>\
                 <line x1=\"{:.1}\" y1=\"{y1:.1}\" x2=\"{:.1}\" y2=\"{y1:.1}\"/>\
                 <line x1=\"{:.1}\" y1=\"{y2:.1}\" x2=\"{:.1}\" y2=\"{y2:.1}\"/></g>",
                x - 3.0,
                x + 3.0,
                x - 3.0,
                x + 3.0
            );
        }
        if pts.len() >= 2 {
            let mut d = String::new();
            for p in &pts {
                let _ = write!(
                    d,
                    "{:.1},{:.1} ",
                    sx(p.x) + dx,
                    sy(p.value.unwrap_or_default())
                );
            }
            let dash = if se.dashed {
                " stroke-dasharray=\"5 4\""
            } else {
                ""
            };
            let _ = write!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2.5\"{dash}/>",
                d.trim_end()
            );
        }
        for p in &pts {
            let _ = write!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\" stroke=\"#fff\" stroke-width=\"1\">\
                 <title>{}</title></circle>",
                sx(p.x) + dx,
                sy(p.value.unwrap_or_default()),
                escape_html(&p.label)
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// A tick spacing of 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    // Rollouts are whole numbers: a tick between two of them would be meaningless.
    (nice * mag).max(1.0)
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

/// The colour if it is a plain CSS colour (hex or a name), grey otherwise: a colour is written into an attribute.
fn safe_color(c: &str) -> &str {
    let hex = c.len() <= 9
        && c.starts_with('#')
        && c.len() > 1
        && c[1..].chars().all(|ch| ch.is_ascii_hexdigit());
    let name = !c.is_empty() && c.len() <= 20 && c.chars().all(|ch| ch.is_ascii_alphabetic());
    if hex || name { c } else { "#777" }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Checks that `s` is well-formed XML as far as a report needs: every tag closed in order, attribute values
    /// quoted, no raw `<` or stray `&` in text. Returns the element names in document order.
    pub(crate) fn check_well_formed(s: &str) -> Result<Vec<String>, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut names = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'<' => {
                    let end = s[i..].find('>').ok_or("unclosed tag")? + i;
                    let tag = &s[i + 1..end];
                    if let Some(name) = tag.strip_prefix('/') {
                        let open = stack.pop().ok_or(format!("stray </{name}>"))?;
                        if open != name {
                            return Err(format!("</{name}> closes <{open}>"));
                        }
                    } else {
                        let self_closing = tag.ends_with('/');
                        let body = tag.trim_end_matches('/');
                        let name: String = body
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric())
                            .collect();
                        if name.is_empty() {
                            return Err(format!("bad tag <{tag}>"));
                        }
                        // Attributes: name="value" pairs; a value holds no raw quote or `<`.
                        let mut rest = body[name.len()..].trim();
                        while !rest.is_empty() {
                            let eq = rest
                                .find("=\"")
                                .ok_or(format!("unquoted attribute in <{tag}>"))?;
                            let attr = rest[..eq].trim();
                            if attr.is_empty()
                                || !attr
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':')
                            {
                                return Err(format!("bad attribute name {attr:?} in <{tag}>"));
                            }
                            let after = &rest[eq + 2..];
                            let close = after.find('"').ok_or("unterminated attribute")?;
                            check_text(&after[..close])?;
                            rest = after[close + 1..].trim_start();
                        }
                        names.push(name.clone());
                        if !self_closing {
                            stack.push(name);
                        }
                    }
                    i = end + 1;
                }
                _ => {
                    let end = s[i..].find('<').map_or(s.len(), |j| j + i);
                    check_text(&s[i..end])?;
                    i = end;
                }
            }
        }
        if let Some(open) = stack.pop() {
            return Err(format!("<{open}> never closed"));
        }
        Ok(names)
    }

    fn check_text(t: &str) -> Result<(), String> {
        let mut rest = t;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let semi = after.find(';').ok_or(format!("stray & in {t:?}"))?;
            let entity = &after[..semi];
            let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "#39")
                || (entity.starts_with('#') && entity[1..].chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("unknown entity &{entity}; in {t:?}"));
            }
            rest = &after[semi + 1..];
        }
        if t.contains('>') {
            return Err(format!("raw > in {t:?}"));
        }
        Ok(())
    }

    fn chart() -> Chart {
        Chart {
            title: "Run <x> & \"y\"".into(),
            x_label: "rollouts spent".into(),
            y_label: "rate".into(),
            width: 600,
            height: 300,
            x_max: None,
        }
    }

    fn point(x: f64, v: f64) -> Point {
        Point {
            x,
            value: Some(v),
            low: (v - 0.2).max(0.0),
            high: (v + 0.2).min(1.0),
            label: format!("c1 <script> {v}"),
        }
    }

    #[test]
    fn a_chart_is_well_formed_and_escapes_its_text() {
        let svg = metric_chart(
            &chart(),
            &[
                Series {
                    name: "task success".into(),
                    color: "#1f77b4".into(),
                    dashed: false,
                    band: true,
                    points: vec![point(4.0, 0.25), point(11.0, 0.5), point(23.0, 0.75)],
                },
                Series {
                    name: "selection <rate>".into(),
                    color: "javascript:alert(1)".into(),
                    dashed: true,
                    band: false,
                    points: vec![point(4.0, 1.0), point(11.0, 0.5)],
                },
            ],
        );
        let names = check_well_formed(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert_eq!(names.first().map(String::as_str), Some("svg"));
        assert_eq!(names.iter().filter(|n| *n == "circle").count(), 5);
        assert_eq!(names.iter().filter(|n| *n == "polyline").count(), 2);
        assert_eq!(names.iter().filter(|n| *n == "polygon").count(), 1);
        assert!(
            !svg.contains("<script>") && !svg.contains("javascript:"),
            "{svg}"
        );
        assert!(svg.contains("Run &lt;x&gt; &amp; &quot;y&quot;"));
        // The axis ends at the first round tick past the largest x.
        assert!(
            svg.contains(">25</text>") && !svg.contains(">30</text>"),
            "{svg}"
        );
    }

    #[test]
    fn an_empty_or_single_point_chart_still_draws() {
        let empty = metric_chart(&chart(), &[]);
        check_well_formed(&empty).unwrap_or_else(|e| panic!("{e}\n{empty}"));
        assert!(empty.contains("no evaluations recorded yet"));
        let one = metric_chart(
            &chart(),
            &[Series {
                name: "s".into(),
                color: "teal".into(),
                dashed: false,
                band: true,
                points: vec![
                    point(0.0, 0.5),
                    Point {
                        value: None,
                        ..point(3.0, 0.0)
                    },
                ],
            }],
        );
        let names = check_well_formed(&one).unwrap_or_else(|e| panic!("{e}\n{one}"));
        assert_eq!(names.iter().filter(|n| *n == "circle").count(), 1);
        assert!(!names.contains(&"polyline".to_string()));
    }

    #[test]
    fn the_axis_reaches_x_max() {
        let svg = metric_chart(
            &Chart {
                x_max: Some(47.0),
                ..chart()
            },
            &[],
        );
        assert!(svg.contains(">50</text>"), "{svg}");
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.3), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(12.0), 20.0);
        assert_eq!(nice_step(41.0), 50.0);
        assert_eq!(nice_step(f64::NAN), 1.0);
    }
}
