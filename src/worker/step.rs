//! One page step as data: what came back ([`Answer`]: the spend's
//! refusal, the upstream's reply, the sink's answer, ...) and what it leads
//! to ([`Action`]), chosen by [`decide`], a pure function of the answer,
//! where the run is (its `Cursor`, read only) and the job's [`Rules`]: no
//! Redis, no HTTP, no clock, no state of its own. `run` keeps the run's
//! progress, gathers the answer and carries the action out.
//!
//! A new kind of answer is one more [`Answer`] (or `fetch::Reply`) variant
//! and one more arm in [`decide`], with its unit test below.

use std::time::Duration;

use serde_json::Value;

use super::account::Applied;
use super::spend::{Refusal, RefusedBy};
use crate::config::{Job, fmt_duration};
use crate::decode::Altered;
use crate::fetch::paging::{Cursor, Next, Onward, Stored, Validators, onward};
use crate::fetch::{Reply, Request};
use crate::outcome::OutcomeKind;
use crate::quota::QuotaError;
use crate::sink::{SinkError, Written};

/// How long a task whose limiter could not answer (fail-closed) waits
/// before it comes back; not a failure.
const LIMITER_DOWN_WAIT: Duration = Duration::from_secs(5);

/// What [`decide`] reads besides the answer and where the run is: the
/// job's rules for this run.
pub(super) struct Rules<'a> {
    pub(super) job: &'a Job,
    /// The endpoint's `throttle_block`: how long a refusal that came with
    /// no block of its own waits.
    pub(super) throttle_block: Duration,
    /// The validators of the item's last complete run, sent with page 1
    /// (a 304 keeps them).
    pub(super) validators: Option<Validators>,
    /// The task's real failures before this copy (`TaskArgs::failures`).
    pub(super) failures: u32,
}

impl Rules<'_> {
    /// The last page this run may fetch: `max_pages` from the page it
    /// started at.
    pub(super) fn last_page(&self, at: &Cursor) -> u32 {
        at.last_page(self.job.max_pages())
    }
}

/// What happened in one step, before anything is decided.
pub(super) enum Answer {
    /// The checkpoint is past `max_pages` (lowered since): nothing to fetch.
    PastLastPage,
    /// The request could not be built (a control character in an item, an
    /// unsendable header, a next page on another origin): nothing spent.
    Unbuildable(String),
    /// The sink can take no page here, not even into the spool: nothing
    /// spent.
    SinkNotReady(SinkError),
    /// The quota said no.
    Refused(Refusal),
    /// The limiter could not answer and the endpoint is `fail-closed`.
    LimiterDown(QuotaError),
    /// The upstream answered; `blocked`: the block its accounting applied.
    Replied {
        reply: Reply,
        blocked: Option<Applied>,
    },
    /// The sink's answer to a page, and where the page said the next is.
    Written {
        written: Result<Written, SinkError>,
        next: Next,
    },
}

/// What a step leads to; `run` carries it out.
#[must_use]
#[derive(Debug)]
pub(super) enum Action {
    /// Write the page to the sink, then decide on the sink's answer
    /// ([`Answer::Written`]). `validators`: the page's, kept when it is
    /// page 1 of a conditional endpoint's run.
    Write {
        body: Value,
        next: Next,
        validators: Validators,
        /// Its records that differ from what was sent, counted once
        /// written.
        altered: Altered,
    },
    /// Go on with the next page (`token`: its cursor or next URL); the
    /// checkpoint moves to it.
    Next { token: Option<Stored> },
    /// Send the redirect's next hop, for the same page (this hop's units
    /// stay spent: it was an answer).
    Follow(Box<Request>),
    /// The task ends.
    End(End),
}

/// How a task ends.
#[derive(Debug)]
pub(super) enum End {
    /// The run is complete: the checkpoint goes; `{since}` and page 1's
    /// validators stay for the item's next run (a 304 keeps the ones it
    /// was sent with).
    Complete {
        why: &'static str,
        status: Option<u16>,
        not_modified: bool,
    },
    /// `done` at `max_pages` with `continue = true`: this task ends and
    /// hands the run on; the item's next run goes on at the next page
    /// (`token`), from a checkpoint.
    HandOn { token: Option<Stored>, why: String },
    /// `failed`. The checkpoint stays (`keep_checkpoint`: the sink could
    /// not take the page, or the attempts are used up: the next run
    /// resumes) or goes (the response is to blame: repeating it would fail
    /// the same way). `refund`: the request never left, its units go back.
    Fail {
        status: Option<u16>,
        why: String,
        refund: bool,
        keep_checkpoint: bool,
    },
    /// The quota (ours or the upstream's) says wait: the checkpoint stays,
    /// the task ends now (`defer`, or `momentary`: a copy comes back after
    /// `wait`).
    Wait {
        kind: OutcomeKind,
        wait: Duration,
        status: Option<u16>,
        why: String,
        /// A concurrent window's refusal: the wait (at most 1 s) ends when
        /// a request in flight is answered, so a copy comes back after it
        /// whatever `on_quota_exhausted` says, no attempt counted.
        momentary: bool,
    },
    /// A real failure, retried: the checkpoint stays and a copy comes back
    /// after `again_in` (a failure counted against the attempts).
    Retry {
        status: Option<u16>,
        why: String,
        refund: bool,
        again_in: Duration,
    },
    /// The limiter could not answer (fail-closed): the checkpoint stays and
    /// a copy comes back after `wait`, not counted as a failure.
    Later { wait: Duration, why: String },
}

impl End {
    /// Whether the step's request never left, so its units go back.
    pub(super) fn refunds(&self) -> bool {
        matches!(
            self,
            End::Fail { refund: true, .. } | End::Retry { refund: true, .. }
        )
    }
}

/// What `answer` leads to, for a run at `at` under `rules`.
pub(super) fn decide(answer: Answer, at: &Cursor, rules: &Rules<'_>) -> Action {
    match answer {
        Answer::PastLastPage => complete("max_pages reached"),
        Answer::Unbuildable(why) => fail(None, format!("request not sent: {why}")),
        Answer::SinkNotReady(e) => stuck(at, &e),
        Answer::Refused(r) => Action::End(End::Wait {
            kind: OutcomeKind::QuotaExhausted,
            wait: r.wait,
            status: None,
            why: r.why.to_owned(),
            momentary: r.by == RefusedBy::InFlight,
        }),
        Answer::LimiterDown(e) => Action::End(End::Later {
            wait: LIMITER_DOWN_WAIT,
            why: format!("limiter unavailable ({e}); endpoint is fail-closed, nothing sent"),
        }),
        Answer::Replied { reply, blocked } => replied(reply, blocked, rules),
        Answer::Written { written, next } => written_(written, next, at, rules),
    }
}

/// One arm per kind of upstream answer.
fn replied(reply: Reply, blocked: Option<Applied>, rules: &Rules<'_>) -> Action {
    match reply {
        Reply::Ok {
            body,
            next,
            validators,
            altered,
            ..
        } => Action::Write {
            body,
            next,
            validators,
            altered,
        },
        // Nothing changed since the item's last complete run: this run is
        // complete too, with nothing written; its validators stay.
        Reply::NotModified { status } => Action::End(End::Complete {
            why: "not modified: the upstream answered 304 to the conditional request",
            status: Some(status),
            not_modified: true,
        }),
        // Issue 24, item 6: a 304 to a request that asked for nothing
        // conditional says nothing about this page (its records were never
        // seen): the run is not complete, and its checkpoint (at this page)
        // and `{since}` stay as they are.
        Reply::UnaskedNotModified { status } => Action::End(End::Fail {
            status: Some(status),
            why: "304 without a conditional request".to_owned(),
            refund: false,
            keep_checkpoint: true,
        }),
        Reply::Throttled { status } => throttled(status, blocked, rules),
        Reply::Unreached { detail } => retry(
            rules,
            None,
            format!("upstream unreachable (units refunded): {detail}"),
            true,
        ),
        Reply::TimedOut { detail } => {
            retry(rules, None, format!("no complete answer: {detail}"), false)
        }
        // Its units are kept (it may have been charged) unless the
        // upstream said what it charged (settled in `account`).
        Reply::ServerError { status } => retry(
            rules,
            Some(status),
            format!("upstream answered {status}"),
            false,
        ),
        Reply::ClientError { status, detail } => fail(
            Some(status),
            format!("upstream answered {status}: {detail}"),
        ),
        Reply::BadBody { status, detail } => fail(Some(status), format!("bad response: {detail}")),
        Reply::Redirect { next, .. } => Action::Follow(next),
        Reply::RedirectRefused { status, why } => fail(Some(status), why),
        Reply::TooLarge { status, limit } => fail(
            Some(status),
            format!(
                "response body over max_body {}; reading stopped there",
                crate::fetch::fmt_size(limit)
            ),
        ),
        Reply::Unsent { detail } => Action::End(End::Fail {
            status: None,
            why: format!("request not sent (units refunded): {detail}"),
            refund: true,
            keep_checkpoint: false,
        }),
    }
}

/// The upstream refused this request: its accounting blocked the
/// credential for every spender (`blocked`), so the task waits as a
/// quota's "no" does. A refusal always comes with a block
/// (`accounting::Verdict`); if one ever does not, it waits `throttle_block`.
fn throttled(status: u16, blocked: Option<Applied>, rules: &Rules<'_>) -> Action {
    let (wait, why) = match blocked {
        Some(b) => {
            let said = b.detail.map(|d| format!(" ({d})")).unwrap_or_default();
            let what = match (&b.resource, b.token_wide) {
                (_, true) => "every resource of the credential".to_owned(),
                (Some(r), false) => format!("resource {r} of the credential"),
                (None, false) => "credential".to_owned(),
            };
            // Throttles in a row double the block (min_block x 2^(n-1)).
            let streak = match b.streak {
                0 | 1 => String::new(),
                n => format!(", throttle {n} in a row"),
            };
            let why = format!(
                "upstream answered {status}{said}; {what} blocked for {} ({}){streak}",
                fmt_duration(b.blocked),
                b.reason
            );
            (b.blocked, why)
        }
        None => {
            let wait = rules.throttle_block;
            let why = format!("upstream answered {status}; waiting {}", fmt_duration(wait));
            (wait, why)
        }
    };
    Action::End(End::Wait {
        kind: OutcomeKind::UpstreamThrottled,
        wait,
        status: Some(status),
        why,
        momentary: false,
    })
}

/// The sink's answer to a fetched page: what comes after it (`onward`, by
/// the job's pagination style), and whether this run may fetch it.
fn written_(
    written: Result<Written, SinkError>,
    next: Next,
    at: &Cursor,
    rules: &Rules<'_>,
) -> Action {
    let written = match written {
        Ok(w) => w,
        // Refused for good (kept, holding the item): the task fails and the
        // run is not complete, so `{since}` and the validators stay; the
        // checkpoint stays at this page, fetched again only once an
        // operator acts (`spool retry`) or a reload changes the job.
        Err(e @ SinkError::Rejected { .. }) => {
            return Action::End(End::Fail {
                status: Some(200),
                why: e.task_reason(),
                refund: false,
                keep_checkpoint: true,
            });
        }
        // The response's fault: the task fails, the other items go on.
        Err(e) if e.fails_the_task() => return fail(Some(200), e.task_reason()),
        // Neither written nor spooled: fetching it again now would only
        // spend again, so the run waits for an operator.
        Err(e) => return stuck(at, &e),
    };
    let pagination = rules.job.pagination.as_ref();
    let token = match onward(pagination.map(|p| &p.style), next, written.on_page) {
        Ok(Onward::To(token)) => token,
        Ok(Onward::Last) => return complete("all pages fetched"),
        Err(why) => return fail(Some(200), format!("bad response: {why}")),
    };
    if token.is_some() && token == at.token {
        // The same page again, for ever: each one spent.
        let why = "cursor repeated: the upstream pointed at the page it just answered";
        return fail(Some(200), why.into());
    }
    if at.page < rules.last_page(at) {
        return Action::Next { token };
    }
    if pagination.is_some_and(|p| p.continues) {
        // This run is done; the item's next one goes on from here.
        let why = format!(
            "max_pages reached; the item's next run goes on at page {}",
            at.page + 1
        );
        return Action::End(End::HandOn { token, why });
    }
    complete("max_pages reached")
}

fn complete(why: &'static str) -> Action {
    Action::End(End::Complete {
        why,
        status: None,
        not_modified: false,
    })
}

/// A failure the response itself caused (a 4xx such as a stale page
/// token, a body that does not decode): retrying would repeat it, so the
/// checkpoint goes and the next run starts over.
fn fail(status: Option<u16>, why: String) -> Action {
    Action::End(End::Fail {
        status,
        why,
        refund: false,
        keep_checkpoint: false,
    })
}

/// The sink can take no page (not even into the spool): `failed` with the
/// checkpoint kept at this page, so it is fetched again only once the sink
/// or the spool can be written, never retried before.
fn stuck(at: &Cursor, e: &SinkError) -> Action {
    let why = match e {
        // A page refused for good holds the item: the error says until when.
        SinkError::Held { .. } => {
            format!("sink: {e}; then the item resumes at page {}", at.page)
        }
        _ => format!(
            "sink: {e}; nothing more is fetched for this job here until its sink or spool can be written, then the item resumes at page {}",
            at.page
        ),
    };
    Action::End(End::Fail {
        status: None,
        why,
        refund: false,
        keep_checkpoint: true,
    })
}

/// A real failure: retried with backoff, or `failed` when the attempts
/// are used up. Either way the checkpoint stays, so the next run resumes.
fn retry(rules: &Rules<'_>, status: Option<u16>, why: String, refund: bool) -> Action {
    let failures = rules.failures + 1;
    let attempts = rules.job.retry.attempts;
    if failures >= attempts.get() {
        return Action::End(End::Fail {
            status,
            why: format!("{why}; attempts used up ({failures} of {attempts})"),
            refund,
            keep_checkpoint: true,
        });
    }
    let again_in = rules.job.retry.backoff_for(failures);
    let why = format!(
        "{why}; attempt {} of {attempts} in {}",
        failures + 1,
        fmt_duration(again_in)
    );
    Action::End(End::Retry {
        status,
        why,
        refund,
        again_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::quota::BlockReason;

    /// A job of 3 pages at most, cursor at `/next`, 3 attempts with a 1 s
    /// backoff; `extra` adds lines to its `[j.pagination]` table.
    fn job(extra: &str) -> Job {
        job_paged(&format!(
            "cursor = \"/next\"\nparam = \"after\"\nmax_pages = 3\n{extra}"
        ))
    }

    /// A job with 3 attempts 1 s apart, its `[j.pagination]` table
    /// `pagination`.
    fn job_paged(pagination: &str) -> Job {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.toml");
        std::fs::create_dir(dir.path().join("jobs")).expect("jobs");
        std::fs::write(
            &config,
            r#"jobs = "jobs/*.toml"
[credentials.c]
secret_env = "K"
windows = [{ units = 10, per = "1h" }]
[endpoints.e]
credential = "c"
cost = 1
"#,
        )
        .expect("config");
        std::fs::write(
            dir.path().join("jobs/j.toml"),
            format!(
                r#"[j]
schedule = "0 * * * * *"
endpoint = "e"
retry = {{ attempts = 3, backoff = "1s", max_backoff = "1m" }}
[j.request]
url = "http://127.0.0.1:1/items"
[j.pagination]
{pagination}
[j.sink]
kind = "jsonl"
path = "out.jsonl"
records = "/items"
"#
            ),
        )
        .expect("job");
        let env = |name: &str| (name == "K").then(|| "secret".to_owned());
        let config = Config::load_with_env(&config, &env).expect("config loads");
        config.jobs["j"].clone()
    }

    fn rules(job: &Job) -> Rules<'_> {
        Rules {
            job,
            throttle_block: Duration::from_secs(60),
            validators: None,
            failures: 0,
        }
    }

    fn at(page: u32, token: Option<&str>) -> Cursor {
        Cursor {
            page,
            token: token.map(|t| Stored::new(t.to_owned())),
            first: 1,
        }
    }

    fn replied(reply: Reply) -> Answer {
        Answer::Replied {
            reply,
            blocked: None,
        }
    }

    fn page_written(on_page: usize, next: Next) -> Answer {
        Answer::Written {
            written: Ok(Written {
                on_page,
                stored: on_page,
            }),
            next,
        }
    }

    fn next_at(token: &str) -> Next {
        Next::At(Stored::new(token.to_owned()))
    }

    #[test]
    fn a_page_is_written_before_anything_else_is_decided() {
        let job = job("");
        let body = serde_json::json!({"items": [1]});
        let answer = replied(Reply::Ok {
            body: body.clone(),
            next: next_at("p2"),
            validators: Validators::default(),
            status: 200,
            altered: Altered::default(),
        });
        match decide(answer, &at(1, None), &rules(&job)) {
            Action::Write { body: b, next, .. } => {
                assert_eq!(b, body);
                assert_eq!(next, next_at("p2"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_written_page_with_a_next_one_goes_on_to_it() {
        let job = job("");
        let a = decide(page_written(2, next_at("p2")), &at(1, None), &rules(&job));
        assert!(
            matches!(&a, Action::Next { token: Some(t) } if *t == Stored::new("p2".into())),
            "{a:?}"
        );
    }

    #[test]
    fn the_last_page_completes_the_run_done() {
        let job = job("");
        let a = decide(page_written(2, Next::End), &at(2, Some("p2")), &rules(&job));
        assert!(
            matches!(
                a,
                Action::End(End::Complete {
                    why: "all pages fetched",
                    status: None,
                    not_modified: false
                })
            ),
            "{a:?}"
        );
        // At max_pages with more to come: complete too, without `continue`...
        let a = decide(
            page_written(2, next_at("p4")),
            &at(3, Some("p3")),
            &rules(&job),
        );
        assert!(
            matches!(
                a,
                Action::End(End::Complete {
                    why: "max_pages reached",
                    ..
                })
            ),
            "{a:?}"
        );
        // ... and handed to the item's next run with it.
        let job = job_continue();
        let a = decide(
            page_written(2, next_at("p4")),
            &at(3, Some("p3")),
            &rules(&job),
        );
        match a {
            Action::End(End::HandOn { token, why }) => {
                assert_eq!(token, Some(Stored::new("p4".into())));
                assert_eq!(
                    why,
                    "max_pages reached; the item's next run goes on at page 4"
                );
            }
            other => panic!("{other:?}"),
        }
        // A checkpoint past a lowered max_pages.
        let a = decide(Answer::PastLastPage, &at(5, Some("p5")), &rules(&job));
        assert!(
            matches!(
                a,
                Action::End(End::Complete {
                    why: "max_pages reached",
                    ..
                })
            ),
            "{a:?}"
        );
    }

    fn job_continue() -> Job {
        job("continue = true")
    }

    #[test]
    fn a_repeated_cursor_or_a_bad_one_fails_and_drops_the_checkpoint() {
        let job = job("");
        let a = decide(
            page_written(1, next_at("p2")),
            &at(2, Some("p2")),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(200), why, keep_checkpoint: false, .. }) if why.starts_with("cursor repeated")),
            "{a:?}"
        );
        let bad = Next::Bad("the cursor at /next is an object".into());
        let a = decide(page_written(1, bad), &at(1, None), &rules(&job));
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(200), why, keep_checkpoint: false, .. }) if why == "bad response: the cursor at /next is an object"),
            "{a:?}"
        );
    }

    /// Issue 32: a page-number run ends where the answer's flag says no
    /// page follows, without the empty page that would end it otherwise;
    /// a flag that is not a boolean fails the task naming its pointer.
    #[test]
    fn a_flag_ends_a_counted_run_and_a_bad_one_fails_it() {
        let job =
            job_paged("style = \"page\"\nparam = \"page\"\nmore = \"/has_more\"\nmax_pages = 5");
        let a = decide(page_written(2, Next::Counted), &at(1, None), &rules(&job));
        assert!(matches!(a, Action::Next { token: None }), "{a:?}");
        let a = decide(page_written(2, Next::End), &at(2, None), &rules(&job));
        assert!(
            matches!(
                a,
                Action::End(End::Complete {
                    why: "all pages fetched",
                    ..
                })
            ),
            "{a:?}"
        );
        let bad = Next::Bad(r#"the more flag at "/has_more" is a string, not a boolean"#.into());
        let a = decide(page_written(2, bad), &at(2, None), &rules(&job));
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(200), why, keep_checkpoint: false, .. })
                if why == r#"bad response: the more flag at "/has_more" is a string, not a boolean"#),
            "{a:?}"
        );
    }

    #[test]
    fn a_304_completes_the_run_not_modified() {
        let job = job("");
        let a = decide(
            replied(Reply::NotModified { status: 304 }),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(
                a,
                Action::End(End::Complete {
                    status: Some(304),
                    not_modified: true,
                    ..
                })
            ),
            "{a:?}"
        );
    }

    /// Issue 24, item 6: a 304 to a request that sent no conditional
    /// header ended the run `done` and moved `{since}` a day.
    #[test]
    fn a_304_without_a_conditional_request_fails_and_keeps_the_checkpoint() {
        let job = job("");
        let a = decide(
            replied(Reply::UnaskedNotModified { status: 304 }),
            &at(2, Some("p2")),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(304), why, refund: false, keep_checkpoint: true })
                if why == "304 without a conditional request"),
            "{a:?}"
        );
    }

    /// Issue 24, item 7: a GraphQL answer with errors and no data is a bad
    /// answer (fetch makes it one), never a page.
    #[test]
    fn a_graphql_answer_without_data_fails() {
        let job = job("");
        let a = decide(
            replied(Reply::BadBody {
                status: 200,
                detail: "GraphQL answer has errors and no data: NOT_FOUND: x".into(),
            }),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(200), why, keep_checkpoint: false, .. })
                if why == "bad response: GraphQL answer has errors and no data: NOT_FOUND: x"),
            "{a:?}"
        );
    }

    #[test]
    fn a_throttled_answer_waits_for_the_block_its_accounting_applied() {
        let job = job("");
        let blocked = Applied {
            blocked: Duration::from_secs(90),
            reason: BlockReason::TooManyRequests,
            detail: None,
            resource: None,
            token_wide: false,
            streak: 1,
        };
        let a = decide(
            Answer::Replied {
                reply: Reply::Throttled { status: 429 },
                blocked: Some(blocked),
            },
            &at(2, Some("p2")),
            &rules(&job),
        );
        match a {
            Action::End(End::Wait {
                kind,
                wait,
                status,
                why,
                momentary: false,
            }) => {
                assert_eq!(kind, OutcomeKind::UpstreamThrottled);
                assert_eq!((wait, status), (Duration::from_secs(90), Some(429)));
                assert_eq!(
                    why,
                    "upstream answered 429; credential blocked for 1m 30s (429)"
                );
            }
            other => panic!("{other:?}"),
        }
        // Without a block (never expected): the endpoint's throttle_block.
        let a = decide(
            replied(Reply::Throttled { status: 429 }),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(a, Action::End(End::Wait { wait, .. }) if wait == Duration::from_secs(60)),
            "{a:?}"
        );
    }

    /// Issue 24, items 1 and 5: a block names its resource when the
    /// credential has several (a search block is not the credential's),
    /// says when it is token-wide, and counts throttles in a row (each one
    /// doubles the block).
    #[test]
    fn a_throttle_says_which_resource_it_blocked_and_its_streak() {
        let job = job("");
        let answer = |resource: Option<&str>, token_wide: bool, streak: u32| Answer::Replied {
            reply: Reply::Throttled { status: 403 },
            blocked: Some(Applied {
                blocked: Duration::from_secs(46),
                reason: BlockReason::HeadersAtZero,
                detail: Some("rate limit exceeded".into()),
                resource: resource.map(str::to_owned),
                token_wide,
                streak,
            }),
        };
        let why = |a: Action| match a {
            Action::End(End::Wait {
                kind, wait, why, ..
            }) => {
                assert_eq!(
                    (kind, wait),
                    (OutcomeKind::UpstreamThrottled, Duration::from_secs(46))
                );
                why
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            why(decide(
                answer(Some("search"), false, 1),
                &at(1, None),
                &rules(&job)
            )),
            "upstream answered 403 (rate limit exceeded); resource search of the credential blocked for 46s (headers_at_zero)"
        );
        assert_eq!(
            why(decide(
                answer(Some("core"), true, 3),
                &at(1, None),
                &rules(&job)
            )),
            "upstream answered 403 (rate limit exceeded); every resource of the credential blocked for 46s (headers_at_zero), throttle 3 in a row"
        );
        assert_eq!(
            why(decide(answer(None, false, 2), &at(1, None), &rules(&job))),
            "upstream answered 403 (rate limit exceeded); credential blocked for 46s (headers_at_zero), throttle 2 in a row"
        );
    }

    #[test]
    fn a_quota_reason_waits_with_the_upstreams_words() {
        let job = job("");
        let blocked = Applied {
            blocked: Duration::from_secs(3600),
            reason: BlockReason::QuotaReason,
            detail: Some("quotaExceeded".into()),
            resource: None,
            token_wide: false,
            streak: 1,
        };
        let a = decide(
            Answer::Replied {
                reply: Reply::Throttled { status: 403 },
                blocked: Some(blocked),
            },
            &at(1, None),
            &rules(&job),
        );
        match a {
            Action::End(End::Wait { kind, why, .. }) => {
                assert_eq!(kind, OutcomeKind::UpstreamThrottled);
                assert_eq!(
                    why,
                    "upstream answered 403 (quotaExceeded); credential blocked for 1h (quota_reason)"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_spend_waits_quota_exhausted() {
        let job = job("");
        let refusal = Refusal {
            by: RefusedBy::Window,
            wait: Duration::from_secs(42),
            why: "spend rejected by a quota window",
        };
        let a = decide(Answer::Refused(refusal), &at(2, Some("p2")), &rules(&job));
        assert!(
            matches!(&a, Action::End(End::Wait { kind: OutcomeKind::QuotaExhausted, wait, status: None, why, momentary: false })
                if *wait == Duration::from_secs(42) && why == "spend rejected by a quota window"),
            "{a:?}"
        );
        // A concurrent window's refusal: momentary, whatever the job says.
        let refusal = Refusal {
            by: RefusedBy::InFlight,
            wait: Duration::from_millis(700),
            why: "as many requests in flight as a concurrent window allows",
        };
        let a = decide(Answer::Refused(refusal), &at(2, Some("p2")), &rules(&job));
        assert!(
            matches!(&a, Action::End(End::Wait { kind: OutcomeKind::QuotaExhausted, wait, momentary: true, .. })
                if *wait == Duration::from_millis(700)),
            "{a:?}"
        );
        let a = decide(
            Answer::LimiterDown(QuotaError::Timeout(Duration::from_secs(1))),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(a, Action::End(End::Later { wait, .. }) if wait == LIMITER_DOWN_WAIT),
            "{a:?}"
        );
    }

    #[test]
    fn a_5xx_is_retried_with_backoff_until_the_attempts_are_used_up() {
        let job = job("");
        let mut r = rules(&job);
        let a = decide(
            replied(Reply::ServerError { status: 503 }),
            &at(2, None),
            &r,
        );
        match a {
            Action::End(End::Retry {
                status,
                why,
                refund,
                again_in,
            }) => {
                assert_eq!((status, refund), (Some(503), false));
                assert_eq!(again_in, Duration::from_secs(1));
                assert_eq!(why, "upstream answered 503; attempt 2 of 3 in 1s");
            }
            other => panic!("{other:?}"),
        }
        r.failures = 2;
        let a = decide(
            replied(Reply::ServerError { status: 503 }),
            &at(2, None),
            &r,
        );
        assert!(
            matches!(&a, Action::End(End::Fail { status: Some(503), keep_checkpoint: true, refund: false, why })
                if why == "upstream answered 503; attempts used up (3 of 3)"),
            "{a:?}"
        );
        let a = decide(
            replied(Reply::TimedOut {
                detail: "read timed out".into(),
            }),
            &at(2, None),
            &rules(&job),
        );
        assert!(
            matches!(a, Action::End(End::Retry { refund: false, .. })),
            "{a:?}"
        );
    }

    #[test]
    fn an_unreachable_upstream_is_refunded_and_retried() {
        let job = job("");
        let a = decide(
            replied(Reply::Unreached {
                detail: "connection refused".into(),
            }),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Retry { status: None, refund: true, why, .. })
                if why.starts_with("upstream unreachable (units refunded): connection refused")),
            "{a:?}"
        );
        let a = decide(
            replied(Reply::Unsent {
                detail: "builder error".into(),
            }),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(
                a,
                Action::End(End::Fail {
                    refund: true,
                    keep_checkpoint: false,
                    ..
                })
            ),
            "{a:?}"
        );
    }

    #[test]
    fn a_bad_body_or_a_client_error_fails_and_drops_the_checkpoint() {
        let job = job("");
        for reply in [
            Reply::BadBody {
                status: 200,
                detail: "expected value".into(),
            },
            Reply::ClientError {
                status: 400,
                detail: "bad page token".into(),
            },
            Reply::TooLarge {
                status: 200,
                limit: 1024,
            },
            Reply::RedirectRefused {
                status: 302,
                why: "to another origin".into(),
            },
        ] {
            let a = decide(replied(reply), &at(2, Some("p2")), &rules(&job));
            assert!(
                matches!(
                    a,
                    Action::End(End::Fail {
                        status: Some(_),
                        refund: false,
                        keep_checkpoint: false,
                        ..
                    })
                ),
                "{a:?}"
            );
        }
        let a = decide(
            Answer::Unbuildable("bad url".into()),
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { status: None, why, .. }) if why == "request not sent: bad url"),
            "{a:?}"
        );
    }

    #[test]
    fn a_sink_that_refuses_the_page_fails_and_keeps_the_checkpoint() {
        let job = job("");
        let refused = || SinkError::Io {
            path: "out.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        let a = decide(
            Answer::Written {
                written: Err(refused()),
                next: next_at("p3"),
            },
            &at(2, Some("p2")),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { keep_checkpoint: true, status: None, why, .. })
                if why.starts_with("sink: cannot write out.jsonl") && why.ends_with("resumes at page 2")),
            "{a:?}"
        );
        let a = decide(Answer::SinkNotReady(refused()), &at(1, None), &rules(&job));
        assert!(
            matches!(
                a,
                Action::End(End::Fail {
                    keep_checkpoint: true,
                    ..
                })
            ),
            "{a:?}"
        );
        // Records the response does not hold: the response is to blame.
        let bad = SinkError::BadRecords {
            pointer: "/items".into(),
            problem: "is missing".into(),
        };
        let a = decide(
            Answer::Written {
                written: Err(bad),
                next: Next::End,
            },
            &at(1, None),
            &rules(&job),
        );
        assert!(
            matches!(
                a,
                Action::End(End::Fail {
                    keep_checkpoint: false,
                    status: Some(200),
                    ..
                })
            ),
            "{a:?}"
        );
    }

    /// Issue 37: a page the sink refused for good is not written and the run
    /// is not complete: the task fails with the checkpoint kept (so
    /// `{since}` and the validators stay), naming the error; a task whose
    /// item such a page holds fails before spending, saying until when.
    #[test]
    fn a_page_refused_for_good_fails_the_task_and_keeps_the_checkpoint() {
        let job = job("");
        let rejected = SinkError::Rejected {
            job: "j".into(),
            cause: Box::new(SinkError::NeverWritable {
                path: "x".into(),
                source: std::io::Error::from(std::io::ErrorKind::InvalidFilename),
            }),
            kept: Ok("state/spool/%rejected/j/1-a-b.json".into()),
            scope: crate::sink::Scope::Item,
        };
        let a = decide(
            Answer::Written {
                written: Err(rejected),
                next: next_at("p3"),
            },
            &at(2, Some("p2")),
            &rules(&job),
        );
        assert!(
            matches!(&a, Action::End(End::Fail { keep_checkpoint: true, status: Some(200), why, .. })
                if why.starts_with("the sink refused this page for good: ")
                    && why.contains("kept in state/spool/%rejected/j/1-a-b.json")
                    && why.contains("quota-worker spool retry j")),
            "{a:?}"
        );
        let held = SinkError::Held {
            job: "j".into(),
            scope: crate::sink::Scope::Item,
            error: "ERROR: bad (SQLSTATE 22P05)".into(),
            file: "k.json".into(),
        };
        let a = decide(Answer::SinkNotReady(held), &at(3, Some("p3")), &rules(&job));
        assert!(
            matches!(&a, Action::End(End::Fail { keep_checkpoint: true, status: None, why, .. })
                if why.starts_with("sink: held: the sink refused a page of this item for good (ERROR: bad (SQLSTATE 22P05))")
                    && why.ends_with("then the item resumes at page 3")),
            "{a:?}"
        );
    }
}
