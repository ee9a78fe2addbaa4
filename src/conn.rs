//! Connecting to Redis: one `ConnectionManager` per process, which reconnects
//! by itself in the background.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::RedisUrl;

fn manager_config(timeout: Duration, retries: usize) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(retries)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(2))
}

/// Connects to `url`. Each command times out after `timeout`, each connection
/// attempt too; a failed connection is retried `retries` times with
/// exponential backoff before this gives up.
pub async fn connect(
    url: &RedisUrl,
    timeout: Duration,
    retries: usize,
) -> Result<ConnectionManager, redis::RedisError> {
    let client = redis::Client::open(url.expose())?;
    ConnectionManager::new_with_config(client, manager_config(timeout, retries)).await
}

/// Like [`connect`], but connects on first use: an unreachable Redis surfaces
/// as the first command's error, where the caller's policy handles it.
pub fn connect_lazy(
    url: &RedisUrl,
    timeout: Duration,
    retries: usize,
) -> Result<ConnectionManager, redis::RedisError> {
    let client = redis::Client::open(url.expose())?;
    ConnectionManager::new_lazy_with_config(client, manager_config(timeout, retries))
}
