//! The report of a run and its four renderings: `text`, `markdown`, `json`, `junit`.

use std::fmt::Write as _;

use serde::Serialize;

use super::client::Exchange;
use super::probes::probe::count;
use super::probes::{ProbeReport, Status};

/// The shape version of the JSON report; it changes only when a field is removed or
/// changes meaning (fields may be added).
pub const JSON_FORMAT: &str = "idem-check/1";

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`JSON_FORMAT`].
    pub format: &'static str,
    /// The warning printed first: the run created real resources.
    pub warning: String,
    /// The method and URL checked.
    pub target: TargetShown,
    /// The `--profile` the refusals were judged by.
    pub profile: &'static str,
    /// The verdict in one plain sentence (see [`bottom_line`]).
    pub bottom_line: String,
    /// Whether every applicable probe passed (the exit status is 0 then).
    pub passed: bool,
    /// Requests sent in all, the hung-up one included.
    pub requests_sent: u32,
    /// Probes per verdict.
    pub summary: Counts,
    /// The probes, in the order they ran.
    pub probes: Vec<ProbeReport>,
}

/// The method and URL of a run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetShown {
    /// The method.
    pub method: String,
    /// The URL.
    pub url: String,
}

/// Probes per verdict.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    /// Probes that passed.
    pub pass: usize,
    /// Probes that failed.
    pub fail: usize,
    /// Probes that did not apply.
    pub not_applicable: usize,
}

impl Report {
    /// The report of `probes` run against `method url`.
    pub fn new(method: &str, url: &str, requests_sent: u32, probes: Vec<ProbeReport>) -> Report {
        let mut summary = Counts::default();
        for p in &probes {
            match p.status {
                Status::Pass => summary.pass += 1,
                Status::Fail => summary.fail += 1,
                Status::NotApplicable => summary.not_applicable += 1,
            }
        }
        Report {
            format: JSON_FORMAT,
            warning: warning(url),
            target: TargetShown {
                method: method.to_owned(),
                url: url.to_owned(),
            },
            profile: "ietf",
            bottom_line: bottom_line(&probes),
            passed: summary.fail == 0,
            requests_sent,
            summary,
            probes,
        }
    }

    fn totals(&self) -> String {
        format!(
            "{}: {} passed, {} failed, {} not applicable; {} sent",
            count(self.probes.len(), "probe", "probes"),
            self.summary.pass,
            self.summary.fail,
            self.summary.not_applicable,
            count(self.requests_sent as usize, "request", "requests")
        )
    }
}

/// The verdict in one plain sentence, for someone who has never heard of idempotency
/// keys: the API ignores the key, or idempotency holds, or which guarantee broke.
pub fn bottom_line(probes: &[ProbeReport]) -> String {
    if probes.iter().any(|p| p.id == "replay" && p.executed_again) {
        return "this API ignores `Idempotency-Key`: every retry creates a new resource".to_owned();
    }
    let failed: Vec<&ProbeReport> = probes.iter().filter(|p| p.status == Status::Fail).collect();
    let Some(first) = failed.first() else {
        return if probes.iter().any(|p| p.status == Status::Pass) {
            "idempotency holds for every probe that applied".to_owned()
        } else {
            "nothing was tested: no probe applied".to_owned()
        };
    };
    let finished = !first.checks.iter().any(|c| c.name == "probe completed");
    let mut line = if finished {
        match first.id {
            "replay" => "a retry with the same key is not answered from the record".to_owned(),
            "concurrent_duplicates" => {
                "parallel requests with one key, in flight together, are not handled as one"
                    .to_owned()
            }
            "lost_answer" => {
                "a retry after a lost answer does not get the execution that happened".to_owned()
            }
            "payload_mismatch" => {
                "a key reused with another payload is not refused as it should be".to_owned()
            }
            "keys" => "malformed or missing keys are not refused as they should be".to_owned(),
            "equivalent_json" => {
                "the same body in other bytes is taken for another request".to_owned()
            }
            "tenants" => "one tenant's key reaches another tenant's answer".to_owned(),
            "replayed_headers" => {
                "a replay carries headers it must not (Set-Cookie or Date)".to_owned()
            }
            "mcp_replay_id" => {
                "a tool call's replay answers with another request's id, so the client waits \
                 for its own"
                    .to_owned()
            }
            "mcp_envelope" => {
                "a tool call is told apart by its envelope, not its arguments".to_owned()
            }
            other => format!("the {other} probe failed"),
        }
    } else {
        format!("the {} probe could not finish", first.name)
    };
    if failed.len() > 1 {
        line.push_str(&format!(
            " (and {})",
            count(failed.len() - 1, "more failed probe", "more failed probes")
        ));
    }
    line
}

/// The warning a run starts with.
pub fn warning(url: &str) -> String {
    format!(
        "idem check sends real requests to {url}: every probe creates resources there \
         (charges, orders, …). Point it at a staging API, never at production."
    )
}

/// The `text` report: the bottom line, a line per probe saying what it tests and its
/// verdict, the failed probes' checks; with `verbose`, every probe's checks and every
/// exchange.
pub fn text(r: &Report, verbose: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Bottom line: {}.", r.bottom_line);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "idem check {} {} (--profile {})",
        r.target.method, r.target.url, r.profile
    );
    let _ = writeln!(out);
    for p in &r.probes {
        let _ = writeln!(
            out,
            "{:18}{} — {}",
            format!("[{}]", p.status.label()),
            p.name,
            p.tests
        );
        let _ = writeln!(out, "{:18}{}", "", one_line(&p.summary));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}: {}.",
        if r.passed { "PASSED" } else { "FAILED" },
        r.totals()
    );
    let shown = r
        .probes
        .iter()
        .filter(|p| verbose || p.status == Status::Fail);
    for p in shown {
        let _ = writeln!(out);
        let _ = writeln!(out, "--- {} ({})", p.name, p.status.label());
        for c in &p.checks {
            let _ = writeln!(
                out,
                "  [{}] {}: {}",
                c.status.label(),
                c.name,
                one_line(&c.detail)
            );
        }
        if verbose {
            for e in &p.exchanges {
                let _ = writeln!(out);
                for line in exchange_lines(e) {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
    }
    let exchanges: usize = r.probes.iter().map(|p| p.exchanges.len()).sum();
    if !verbose && exchanges > 0 {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "The {} behind these verdicts: --verbose, or --format markdown or json.",
            count(
                exchanges,
                "request and its answer",
                "requests and their answers"
            )
        );
    }
    out
}

/// An exchange as lines: `> ` for the request, `< ` for the answer, `! ` for an error.
fn exchange_lines(e: &Exchange) -> Vec<String> {
    let mut lines = vec![match &e.timing {
        Some(t) => match t.answered_us {
            Some(a) => format!(
                "# {} (in flight {:.1} ms to {:.1} ms)",
                e.label,
                t.sent_us as f64 / 1000.0,
                a as f64 / 1000.0
            ),
            None => format!(
                "# {} (sent at {:.1} ms)",
                e.label,
                t.sent_us as f64 / 1000.0
            ),
        },
        None => format!("# {}", e.label),
    }];
    lines.push(format!("> {} {}", e.request.method, e.request.url));
    for (n, v) in &e.request.headers {
        lines.push(format!("> {n}: {}", visible(v)));
    }
    if !e.request.body.is_empty() {
        lines.push(">".to_owned());
        for l in e.request.body.lines() {
            lines.push(format!("> {l}"));
        }
    }
    if let Some(res) = &e.response {
        lines.push(format!("< {}", res.status));
        for (n, v) in &res.headers {
            lines.push(format!("< {n}: {}", visible(v)));
        }
        if !res.body.is_empty() {
            lines.push("<".to_owned());
            for l in res.body.lines() {
                lines.push(format!("< {l}"));
            }
        }
    }
    if let Some(err) = &e.error {
        lines.push(format!("! {err}"));
    }
    lines
}

/// A header value with its control characters shown as escapes (a tab in a key, say).
fn visible(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn one_line(s: &str) -> String {
    visible(&s.replace(['\r', '\n'], " "))
}

/// The `markdown` report, to paste into a pull request: the warning, a summary table,
/// and each probe's checks and evidence in a collapsed section.
pub fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## idem check: {}",
        md_inline(&format!("{} {}", r.target.method, r.target.url))
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "**Bottom line:** {}.", md_cell(&r.bottom_line));
    let _ = writeln!(out);
    let _ = writeln!(out, "> **Warning:** {}", md_cell(&r.warning));
    let _ = writeln!(out);
    let _ = writeln!(out, "| Probe | Result | Summary |");
    let _ = writeln!(out, "|---|---|---|");
    for p in &r.probes {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            md_cell(p.name),
            md_status(p.status),
            md_cell(&p.summary)
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "**{}**: {}.",
        if r.passed { "Passed" } else { "Failed" },
        md_cell(&r.totals())
    );
    for p in &r.probes {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "<details><summary>{}: {} — {}</summary>",
            html(p.name),
            p.status.label(),
            html(p.tests)
        );
        let _ = writeln!(out);
        for c in &p.checks {
            let _ = writeln!(
                out,
                "- {} {}: {}",
                md_status(c.status),
                md_cell(&c.name),
                md_cell(&c.detail)
            );
        }
        for e in &p.exchanges {
            let _ = writeln!(out);
            let block = exchange_lines(e).join("\n");
            let fence = fence_for(&block);
            let _ = writeln!(out, "{fence}http\n{block}\n{fence}");
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "</details>");
    }
    out
}

fn md_status(s: Status) -> &'static str {
    match s {
        Status::Pass => "✅ pass",
        Status::Fail => "❌ fail",
        Status::NotApplicable => "➖ not applicable",
    }
}

/// Text safe in a Markdown table cell or list item: no line breaks, no `|`, no HTML, no
/// emphasis, links or code spans of its own.
pub fn md_cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in one_line(s).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' => out.push_str("&#124;"),
            '`' => out.push_str("&#96;"),
            '\\' | '*' | '_' | '[' | ']' | '#' | '~' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Text as a Markdown code span, whatever backticks it holds.
fn md_inline(s: &str) -> String {
    let s = one_line(s);
    let longest = longest_run(&s, '`');
    let ticks = "`".repeat(longest + 1);
    if longest == 0 {
        format!("{ticks}{s}{ticks}")
    } else {
        format!("{ticks} {s} {ticks}")
    }
}

/// A code fence longer than any run of backticks in `block`, so the block cannot end it.
pub fn fence_for(block: &str) -> String {
    "`".repeat(longest_run(block, '`').max(2) + 1)
}

fn longest_run(s: &str, ch: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in s.chars() {
        if c == ch {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// Text safe in HTML (and so in XML) character data and attribute values.
fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Text safe in XML 1.0: escaped, and the characters XML cannot hold at all (control
/// characters other than tab and line ends, U+FFFE, U+FFFF) shown as `\u{…}` escapes.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let allowed = matches!(c, '\t' | '\n' | '\r')
            || (' '..='\u{D7FF}').contains(&c)
            || ('\u{E000}'..='\u{FFFD}').contains(&c)
            || c >= '\u{10000}';
        if allowed {
            out.push_str(&html(&c.to_string()));
        } else {
            out.push_str(&c.escape_unicode().to_string());
        }
    }
    out
}

/// The `json` report: [`Report`] as one JSON object (see the crate README for the shape).
pub fn json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).unwrap_or_else(|e| {
        serde_json::json!({ "format": JSON_FORMAT, "error": e.to_string() }).to_string()
    });
    s.push('\n');
    s
}

/// The `junit` report: one `<testcase>` per probe, a failed probe's `<failure>` holding
/// its checks and evidence, a probe that did not apply `<skipped>`.
pub fn junit(r: &Report) -> String {
    let mut out = String::new();
    let total_ms: u64 = r.probes.iter().map(|p| p.duration_ms).sum();
    let suite = format!("idem check {} {}", r.target.method, r.target.url);
    let _ = writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        out,
        r#"<testsuites name="idem check" tests="{}" failures="{}" skipped="{}" time="{}">"#,
        r.probes.len(),
        r.summary.fail,
        r.summary.not_applicable,
        seconds(total_ms)
    );
    let _ = writeln!(
        out,
        r#"  <testsuite name="{}" tests="{}" failures="{}" errors="0" skipped="{}" time="{}">"#,
        xml(&suite),
        r.probes.len(),
        r.summary.fail,
        r.summary.not_applicable,
        seconds(total_ms)
    );
    for p in &r.probes {
        let _ = write!(
            out,
            r#"    <testcase classname="idem.check" name="{}" time="{}">"#,
            xml(p.id),
            seconds(p.duration_ms)
        );
        match p.status {
            Status::Pass => {}
            Status::NotApplicable => {
                let _ = write!(
                    out,
                    r#"<skipped message="{}"/>"#,
                    xml(&one_line(&p.summary))
                );
            }
            Status::Fail => {
                let mut body = String::new();
                for c in &p.checks {
                    let _ = writeln!(body, "[{}] {}: {}", c.status.label(), c.name, c.detail);
                }
                for e in &p.exchanges {
                    body.push('\n');
                    body.push_str(&exchange_lines(e).join("\n"));
                    body.push('\n');
                }
                let _ = write!(
                    out,
                    "\n      <failure message=\"{}\" type=\"idempotency\">{}</failure>\n    ",
                    xml(&one_line(&p.summary)),
                    xml(&body)
                );
            }
        }
        let _ = writeln!(out, "</testcase>");
    }
    let _ = writeln!(out, "    <system-out>{}</system-out>", xml(&r.warning));
    let _ = writeln!(out, "  </testsuite>");
    let _ = writeln!(out, "</testsuites>");
    out
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

#[cfg(test)]
mod tests;
