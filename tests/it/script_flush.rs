//! Promise: `SCRIPT FLUSH` (or a Redis restart that loses the script cache)
//! never fails a spend: EVALSHA falls back to EVAL on NOSCRIPT, and the
//! count stays exact while another client flushes the cache over and over.
//! (By FCALL the spend core does not use the script cache; its library's
//! flush is `function_library.rs`'s.)

use quota_worker::config::Config;

use crate::function_library::{config, spend_while_flushing};
use crate::support::{self, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spends_survive_script_flush_with_exact_count() {
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    spend_while_flushing(&server, &limiter, &["SCRIPT", "FLUSH"]).await;
}

#[test]
fn cli_spend_after_script_flush() {
    // A fresh process meets an empty cache too (EVALSHA first, then EVAL).
    let server = RedisServer::start();
    let cfg = config();
    for _ in 0..3 {
        let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
        let out = cfg.run_on(&server, &["spend", "one", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
        assert_eq!(support::json(&out)["allowed"], true);
    }
}

// The same tests with the spend core by EVALSHA (a Redis without functions),
// where SCRIPT FLUSH is what it must survive.
crate::evalsha_too!(
    spends_survive_script_flush_with_exact_count,
    cli_spend_after_script_flush,
);
