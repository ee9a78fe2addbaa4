//! The status page's HTML: one server-rendered document with inline CSS and
//! inline SVG charts, no script and no external asset, readable with
//! JavaScript off. Written with maud, so the markup is checked when the
//! crate compiles and every value is escaped unless marked otherwise (no
//! value here is: names and fan-out items come from config and data).
//! Every link is relative, so the page works behind a path prefix.

use std::time::Duration;

use maud::{DOCTYPE, Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::model::{
    Block, CredentialStatus, JobStatus, RunsOut, Status, TickStatus, TokenStatus, WindowStatus,
};
use crate::config::fmt_duration;
use crate::item_state::command_line;

/// What the request asked of the page besides the data.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    /// `<base href>`: the path prefix a proxy serves the page under
    /// (checked, ends with `/`), when it said so.
    pub(crate) base: Option<String>,
    /// Reload every this many seconds (`?refresh=N`).
    pub(crate) refresh: Option<u64>,
}

const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1rem 2rem;color:#1b1f24;background:#fff}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.15rem;margin:1.6rem 0 .5rem;border-bottom:1px solid #d0d7de}
h3{font-size:1rem;margin:1rem 0 .3rem}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eaeef2;vertical-align:top}
th{font-weight:600;background:#f6f8fa} .num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#57606a} .bad{color:#b42318;font-weight:600} .ok{color:#1a7f37}
.shadow{font-size:.8em;padding:0 .3em;border:1px dashed #8250df;border-radius:3px;color:#8250df} .shadow-refusals{color:#8250df}
.bar{width:10rem;height:.8rem} .bar .track{fill:#eaeef2} .bar .fill{fill:#0969da} .bar .full{fill:#b42318}
.chart{width:100%;max-width:36rem;height:3rem;display:block} .chart rect{fill:#0969da} .chart .axis{stroke:#d0d7de}
.legend{display:flex;justify-content:space-between;max-width:36rem;font-size:.75rem;color:#57606a}
.blocked{background:#fff1f0;border:1px solid #f5c2c0;padding:.5rem .8rem;margin:.3rem 0;border-radius:4px}
.ticks{display:flex;gap:.25rem;flex-wrap:wrap} .tick{border:1px solid #d0d7de;border-radius:3px;padding:0 .3rem;font-size:.75rem;white-space:nowrap}
code{font-size:.85rem} nav a{margin-right:1rem}
";

fn ago_or_in(ms: u64) -> String {
    fmt_duration(Duration::from_millis(ms))
}

/// The whole document.
pub(crate) fn render(s: &Status, view: &View) -> Markup {
    let blocked: Vec<&CredentialStatus> = s
        .credentials
        .iter()
        .filter(|c| !c.blocks.is_empty())
        .collect();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(base) = &view.base { base href=(base); }
                @if let Some(n) = view.refresh { meta http-equiv="refresh" content=(n); }
                title { "quota-worker status" }
                style { (maud::PreEscaped(CSS)) }
            }
            body {
                header id="summary" {
                    h1 { "quota-worker status" }
                    p class="muted" {
                        "Read " time datetime=(s.generated_at) { (s.generated_at) } " from Redis. "
                        @if s.redis_up { span class="ok" { "Redis answered." } }
                        @else { span class="bad" { "Redis did not answer every read: some values are missing." } }
                    }
                    p {
                        "Queue (all jobs): "
                        @match &s.queue {
                            Some(q) => {
                                span id="queue-backlog" { (q.backlog) } " in the backlog, "
                                span id="queue-queued" { (q.queued) } " queued, "
                                span id="queue-in-flight" { (q.in_flight) } " running."
                            }
                            None => { span class="bad" { "unknown" } }
                        }
                    }
                    nav {
                        a href="api/status" { "JSON" }
                        @if view.refresh.is_some() { a href="./" { "Stop refreshing" } }
                        @else { a href="?refresh=15" { "Refresh every 15 s" } }
                    }
                }
                section id="blocked" {
                    h2 { "Blocked credentials" }
                    @if blocked.is_empty() { p class="muted" { "None." } }
                    @for c in &blocked {
                        @for b in &c.blocks { (block(c, b)) }
                    }
                }
                section id="credentials" {
                    h2 { "Credentials and windows" }
                    @for c in &s.credentials { (credential(c)) }
                }
                section id="jobs" {
                    h2 { "Jobs" }
                    (jobs(&s.jobs))
                }
            }
        }
    }
}

fn block(c: &CredentialStatus, b: &Block) -> Markup {
    html! {
        // A credential of one resource reads as before: the credential is
        // blocked.
        div class="blocked" data-credential=(c.name) data-resource=[several(c).then_some(&b.resource)] {
            strong { (c.name) }
            @if several(c) { " (resource " code { (b.resource) } ")" }
            " is blocked until "
            time datetime=(b.until) { (b.until) }
            " (" (ago_or_in(b.blocked_for_ms)) " from now): "
            @match &b.reason {
                Some(r) => {
                    span class="reason" { (r.why) }
                    " on endpoint " code { (r.endpoint) } "."
                }
                None => { span class="reason muted" { "reason not recorded." } }
            }
            @if let Some(k) = &b.kind { " Kind: " code class="kind" data-kind=(k) { (k) } }
        }
    }
}

fn credential(c: &CredentialStatus) -> Markup {
    html! {
        article class="credential" data-credential=(c.name) {
            h3 {
                (c.name)
                @for b in &c.blocks {
                    " " span class="bad" data-resource=[several(c).then_some(&b.resource)] {
                        "blocked"
                        @if several(c) { " " (b.resource) }
                        @if let Some(k) = &b.kind { " (" (k) ")" }
                    }
                }
            }
            @if let Some(t) = &c.token { (token(t)) }
            @if !c.readable { p class="bad" { "Its windows could not be read from Redis." } }
            @else {
                table {
                    thead { tr {
                        th { "Window" } th { "Used / limit" } th class="num" { "Remaining" }
                        th { "Frees in" } th class="num" { "Drift" } th { "Runs out" }
                        th { "Spent per 5 min, last 24 h" }
                    } }
                    tbody { @for w in &c.windows { (window(w, several(c))) } }
                }
            }
        }
    }
}

/// Its `secret_command`'s state in this daemon (each daemon keeps its own
/// token).
fn token(t: &TokenStatus) -> Markup {
    let ago = |ms: Option<u64>| ms.map(ago_or_in).unwrap_or_default();
    html! {
        p class="token" data-state=(t.state) {
            "Token (secret_command, this daemon): "
            @match t.state {
                "unused" => { span class="muted" { "not minted yet: no task has needed it since this daemon started." } }
                "running" => { "the command is running now." }
                "fresh" => {
                    span class="ok" { "minted " (ago(t.minted_ago_ms)) " ago" }
                    ", replaced in " (ago(t.renews_in_ms)) "."
                }
                "expired" => { "minted " (ago(t.minted_ago_ms)) " ago, past secret_ttl: the next task runs the command." }
                "refused" => { span class="bad" { "refused (401)" } ": the next task runs the command." }
                _ => {
                    span class="bad" { "failed " (ago(t.failed_ago_ms)) " ago" }
                    ": " span class="error" { (t.error.as_deref().unwrap_or("")) }
                    ". Tasks that need it fail; it runs again at most once a minute."
                }
            }
        }
    }
}

/// Whether the credential has several resources (GitHub's `core`,
/// `search`, ...): then its blocks and windows name theirs.
fn several(c: &CredentialStatus) -> bool {
    c.resources.len() > 1
}

fn window(w: &WindowStatus, named: bool) -> Markup {
    let pct = if w.units == 0 {
        0.0
    } else {
        (w.used as f64 / w.units as f64 * 100.0).min(100.0)
    };
    let fill = if w.remaining == 0 { "full" } else { "fill" };
    html! {
        tr class="window" data-scope=(w.scope) data-window=(w.window) data-resource=[named.then_some(&w.resource)] {
            td {
                (w.window)
                @if w.mode.is_some() { " " span class="shadow" title="mode = \"shadow\": counted, never enforced" { "shadow" } }
                br;
                @if let Some(n) = w.shadow_refusals {
                    span class="shadow-refusals" {
                        "would have refused " (n) @if n == 1 { " spend" } @else { " spends" } " in 24 h"
                    }
                    br;
                }
                span class="muted" {
                    (w.scope)
                    @if named && w.resource == crate::quota::EVERY_RESOURCE { ", every resource" }
                    @else if named { ", resource " (w.resource) }
                }
            }
            td {
                svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" {
                    title { (w.used) " of " (w.units) " units used" }
                    rect class="track" width="100" height="10" {}
                    rect class=(fill) width=(format!("{pct:.1}")) height="10" {}
                }
                br;
                span class="used" { (w.used) " / " (w.units) }
                " (" (format!("{pct:.0}")) "%)"
                @if let Some(n) = w.leases {
                    br;
                    span class="leases muted" { (n) @if n == 1 { " request" } @else { " requests" } " in flight" }
                }
            }
            td class="num remaining" { (w.remaining) }
            td { @if w.frees_in_ms == 0 { span class="muted" { "—" } } @else { (ago_or_in(w.frees_in_ms)) } }
            td class="num" {
                @match w.drift { Some(d) => { (d) } None => { span class="muted" { "—" } } }
            }
            td class="runs-out" { (runs_out(&w.runs_out)) }
            td { (chart(w)) }
        }
    }
}

fn runs_out(r: &RunsOut) -> Markup {
    html! {
        @match r {
            RunsOut::Idle => span class="muted" { "nothing spent in the last hour" },
            RunsOut::Out => span class="bad" { "out now" },
            RunsOut::ResetsFirst => span class="muted" { "resets first" },
            RunsOut::InFlight => span class="muted" { "never: units in flight come back" },
            RunsOut::NotAtThisRate => span class="muted" { "not at this rate" },
            RunsOut::At { at, in_ms } => span {
                "in " (ago_or_in(*in_ms)) br;
                time class="muted" datetime=(at) { (at) }
            },
        }
    }
}

/// Units spent per 5 minutes as bars, oldest on the left.
fn chart(w: &WindowStatus) -> Markup {
    const H: f64 = 40.0;
    let units = &w.history.units;
    let max = units.iter().copied().max().unwrap_or(0);
    let slot_min = w.history.slot_ms / 60_000;
    let n = units.len();
    html! {
        svg class="chart" viewBox=(format!("0 0 {n} {H}")) preserveAspectRatio="none" role="img" {
            title { "Units spent per " (slot_min) " minutes over the last 24 hours (most: " (max) ")" }
            line class="axis" x1="0" y1=(H) x2=(n) y2=(H) {}
            @for (i, u) in units.iter().enumerate() {
                @if *u > 0 {
                    @let h = (*u as f64 / max as f64 * H).max(0.5);
                    rect x=(i) y=(format!("{:.2}", H - h)) width="1" height=(format!("{h:.2}")) {
                        title { (u) " units, " (ago_or_in(((n - 1 - i) as u64) * w.history.slot_ms)) " ago" }
                    }
                }
            }
        }
        div class="legend" {
            span { "24 h ago" }
            span { (w.spent_last_hour) " in the last hour · most " (max) " per " (slot_min) " min" }
            span { "now" }
        }
    }
}

fn jobs(jobs: &[JobStatus]) -> Markup {
    let starved = jobs.iter().any(|j| j.starved.is_some());
    let rejected = jobs.iter().any(|j| j.rejected_pages > 0);
    html! {
        table {
            thead { tr {
                th { "Job" } th { "Schedule" } th { "Next fire" } th { "Last ticks (newest first)" }
                th class="num" { "Open tasks" } th { "Last error" }
                @if starved { th { "Starved items" } }
                @if rejected { th class="num" { "Pages refused" } }
            } }
            tbody {
                @for j in jobs {
                    tr class="job" data-job=(j.name) {
                        td {
                            strong { (j.name) } br;
                            span class="muted" { (j.endpoint) " on " (j.credential) } br;
                            a class="state" href=(state_href(&j.name, None)) title=(command_line(&["state", &j.name])) { "item state" }
                        }
                        td { code { (j.schedule) } br; span class="muted" { (j.timezone) } }
                        td { @match &j.next_fire { Some(t) => { time datetime=(t) { (t) } } None => { span class="muted" { "none" } } } }
                        td {
                            @if j.ticks.is_empty() { span class="muted" { "no tick has ended a task yet" } }
                            div class="ticks" { @for t in &j.ticks { (tick(t)) } }
                        }
                        td class="num open-tasks" { (j.open_tasks) }
                        td class="last-error" {
                            @match &j.last_error {
                                Some(e) => {
                                    span class="bad" { (e.outcome) }
                                    @if let Some(st) = e.status { " " (st) }
                                    " · " (item_link(&j.name, &e.item)) br;
                                    span class="detail" { (e.detail) } br;
                                    time class="muted" datetime=(e.at) { (e.at) }
                                }
                                None => { span class="muted" { "none" } }
                            }
                        }
                        @if starved {
                            td class="starved" {
                                @for s in j.starved.iter().flatten() {
                                    (item_link(&j.name, &s.item)) " (" (s.ticks) " ticks)" br;
                                }
                            }
                        }
                        @if rejected {
                            td class="num rejected-pages" title="pages the sink refused for good, kept in the state directory: quota-worker spool list" {
                                @if j.rejected_pages > 0 { span class="bad" { (j.rejected_pages) } } @else { "0" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Where an item's state is (`api/state/JOB?item=ITEM`, relative like
/// every link here), or every item's; the item percent-encoded (items come
/// from data). Job names are plain (config validation).
fn state_href(job: &str, item: Option<&str>) -> String {
    match item {
        None => format!("api/state/{job}"),
        Some(item) => {
            let item = utf8_percent_encode(item, NON_ALPHANUMERIC);
            format!("api/state/{job}?item={item}")
        }
    }
}

/// An item's name, linked to its state; its title the command that shows
/// the same.
fn item_link(job: &str, item: &str) -> Markup {
    html! {
        a class="item" href=(state_href(job, Some(item))) title=(command_line(&["state", job, item])) { (item) }
    }
}

fn tick(t: &TickStatus) -> Markup {
    let summary: Vec<String> = t
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .chain((t.open > 0).then(|| format!("open {}", t.open)))
        .chain((t.retried > 0).then(|| format!("retried {}", t.retried)))
        .chain((t.deferred > 0).then(|| format!("deferred {}", t.deferred)))
        .collect();
    html! {
        span class="tick" title=(t.at) {
            time datetime=(t.at) { (t.at.get(11..16).unwrap_or(&t.at)) }
            " " (summary.join(", "))
        }
    }
}
