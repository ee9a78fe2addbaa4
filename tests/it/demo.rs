//! Promise (issue 35 item 3): `quota-worker demo` serves the status page on
//! a free loopback port and prints its address at start. While the demo
//! runs, the page (in a real browser too) shows its credential's window
//! and its jobs, each job's items' state is at `/api/state/JOB`, and the
//! demo, stopped by Ctrl-C, still ends with its summary and 0 quota errors
//! at the upstream. A screenshot is
//! saved as `target/demo-status-page.png`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::browser::Chromium;
use crate::support::http::http_get;
use crate::support::process::Proc;
use crate::support::wait_until;

/// The port in the demo's "status page: http://127.0.0.1:PORT/ ..." line.
fn status_port(lines: &[String]) -> Option<u16> {
    let line = lines.iter().find(|l| l.starts_with("status page: "))?;
    let rest = line.strip_prefix("status page: http://127.0.0.1:")?;
    rest[..rest.find('/')?].parse().ok()
}

#[test]
fn the_demo_serves_its_status_page_on_a_free_loopback_port() {
    let out = tempfile::tempdir().expect("tempdir");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo.toml");
    let out_dir = out.path().join("out").display().to_string();
    let mut demo = Proc::start_at(
        "demo",
        &config,
        &["demo", "--for", "120s", "--out", &out_dir],
        &[],
    );
    let mut port = None;
    let said = wait_until(Duration::from_secs(30), || {
        port = status_port(&demo.stdout_lines());
        port.is_some()
    });
    assert!(
        said,
        "no status page address printed:\n{}\n{}",
        demo.stdout(),
        demo.log()
    );
    let port = port.expect("port");
    let (code, page) = http_get(port, "/").expect("GET /");
    assert_eq!(code, 200, "{page}");
    for want in [
        "data-credential=\"yt-demo\"",
        "data-job=\"trending\"",
        "data-job=\"search\"",
    ] {
        assert!(page.contains(want), "the page lacks {want:?}:\n{page}");
    }
    // A tick of `trending` (every 5 s) has run its 8 items by then.
    let mut state = Value::Null;
    let ran = wait_until(Duration::from_secs(12), || {
        state = http_get(port, "/api/state/trending")
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
            .unwrap_or(Value::Null);
        state["items"]
            .as_array()
            .is_some_and(|items| items.len() == 8 && items.iter().all(|i| i["outcome"].is_string()))
    });
    assert!(ran, "the trending items' state: {state:#}");

    if let Some(browser) = Chromium::find() {
        let url = format!("http://127.0.0.1:{port}/");
        let dom = browser.dump_dom(&url);
        assert!(dom.contains("data-job=\"trending\""), "{dom}");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let shot = tmp.parent().unwrap_or(tmp).join("demo-status-page.png");
        browser.screenshot(&url, &shot);
        eprintln!("screenshot: {}", shot.display());
    }

    // Ctrl-C ends it early, with its summary.
    demo.signal(libc::SIGINT);
    let status = demo.wait_exit(Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{}\n{}",
        demo.stdout(),
        demo.log()
    );
    assert!(
        demo.stdout().contains("upstream quota errors: 0"),
        "{}",
        demo.stdout()
    );
}
