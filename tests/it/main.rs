//! The integration tests: one binary, one module per promise, all on the
//! one support library in `tests/support` (real `redis-server`s, the real
//! simulator, the real binary). Linked once; its tests run side by side on
//! as many threads as there are cores. docs/testing.md says where a new
//! test goes.

#[path = "../support/mod.rs"]
mod support;

// The spend: windows, costs, exactness, and the Lua script's edge cases.
mod bucket_window;
mod claim_spend;
mod clock_step_back;
mod cluster;
mod concurrent_window;
mod drift;
mod duplicate_request;
mod fixed_boundary;
mod fixed_window_dst;
mod function_library;
mod idle_eviction;
mod key_expiry;
mod multi_window;
mod reserve;
mod retry_after_exact;
mod retry_after_settled;
mod script_flush;
mod settle_block;
mod shadow_windows;
mod spend_contention;
mod waiting_line;
mod weighted_spend;

// The command line and the configuration.
mod check_report;
mod cli_usage;
mod config_errors;
mod endpoint_buckets;
mod keys_installed;
mod keys_second_client;
mod quota_report;
mod redis_permissions;
mod redis_unavailable;
mod tenant_cli;

// The pipeline: ticks, tasks, the queue and apalis, outcomes, sinks.
mod accounting;
mod accounting_github;
mod accounting_ietf;
mod accounting_meta;
mod accounting_shopify;
mod exact_records;
mod fairness;
mod fan_out_from;
mod fan_out_from_postgres;
mod fan_out_large;
mod graphql_paging;
mod incremental;
mod outcome_logs;
mod pagination_styles;
mod pipeline_e2e;
mod postgres_sink;
mod queue_limits;
mod queue_pitfalls;
mod quota_exhausted;
mod resources;
mod retries;
mod rolling_deploy;
mod sink;
mod sink_refused;
mod sink_unwritable;
mod spool_per_item;
mod sqlite_key_per_item;
mod sqlite_two_daemons;
mod templates;
mod trigger;
mod trigger_exit_codes;
mod upstream_throttle;

// Daemons as processes: several at once, restarts, signals, embedded Redis.
mod concurrency_daemons;
mod embedded;
mod failover;
mod lock_fence;
mod multi_daemon;
mod recovery;
mod run_exit_codes;
mod shutdown;

// Operations: systemd, metrics and health, logs, secrets, a hostile upstream.
mod alert_rules;
mod credential_command;
mod decoded_body;
mod demo;
mod hardening;
mod health;
mod install;
mod item_state;
mod listener_limits;
mod logs;
mod manual_jobs;
mod metrics;
mod notify;
mod reload;
mod secret_spellings;
mod secrets;
mod status_page;
mod units;
mod watchdog;

// The simulated upstream the other tests rely on.
mod simulator;
