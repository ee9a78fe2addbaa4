//! Where the Redis master is, asked again at every (re)connection: the
//! host of `[redis] url` (a managed Redis's name, which moves to the new
//! primary at a failover, is resolved again each time), or the master the
//! sentinels of `[redis] sentinels` name under `master_name`.
//!
//! Either way a connection counts as one to the master only when the server
//! says it is one (`HELLO`'s `role`, or `ROLE` on a Redis before 6): a
//! demoted master that came back as a replica, or a name that still points
//! at the old primary, is not connected to.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult, Value};

use crate::config::{RedisConfig, RedisUrl};

/// How long asking the sentinels for the master may take, all of them
/// together (each connection to one waits at most a second, each answer
/// half a second: redis-rs's defaults for them).
const ASK_SENTINELS: Duration = Duration::from_secs(5);

/// Where the master is.
#[derive(Clone)]
pub enum Master {
    /// The host of a URL: one server, or a name that follows the primary.
    Url(RedisUrl),
    /// Whatever the sentinels name.
    Sentinel(Arc<Sentinels>),
}

/// The sentinels of `[redis] sentinels`, and how to log in to the master
/// they name (from the host-less `[redis] url`).
pub struct Sentinels {
    /// redis-rs's client of the sentinels, made at first use: it asks each
    /// in turn (three at once), skips one that does not answer or does not
    /// know the name, and checks the master it names with `ROLE`. It keeps
    /// a connection to each sentinel, hence `&mut` and the lock.
    client: tokio::sync::Mutex<Option<Sentinel>>,
    name: String,
    /// How to log in to the master; an error only if the config loader
    /// let a URL through that it should have refused (a bug), said at
    /// every attempt.
    node: Result<SentinelNodeConnectionInfo, String>,
    /// The sentinels; displayed redacted.
    urls: Vec<RedisUrl>,
    /// The master's database, which the connection reports.
    db: i64,
}

impl Master {
    /// Where `redis`'s master is, or `None` for the embedded Redis (no
    /// `url`, no `sentinels`).
    pub fn of(redis: &RedisConfig) -> Option<Master> {
        if redis.sentinels.is_empty() {
            return redis.url.clone().map(Master::Url);
        }
        let mut db = 0;
        let node = match redis.url.as_ref().map(RedisUrl::master_settings) {
            None => Ok(SentinelNodeConnectionInfo::default()),
            Some(Err(e)) => Err(e),
            Some(Ok(s)) => {
                db = s.redis.db();
                let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(s.redis);
                Ok(match s.tls {
                    Some(tls) => node.set_tls_mode(tls),
                    None => node,
                })
            }
        };
        Some(Master::Sentinel(Arc::new(Sentinels {
            client: tokio::sync::Mutex::new(None),
            name: redis.master_name.clone().unwrap_or_default(),
            node,
            urls: redis.sentinels.clone(),
            db,
        })))
    }

    /// The database the connection selects.
    pub(crate) fn db(&self) -> i64 {
        match self {
            Master::Url(url) => redis::IntoConnectionInfo::into_connection_info(url.expose())
                .map_or(0, |i| i.redis_settings().db()),
            Master::Sentinel(s) => s.db,
        }
    }

    /// Finds the master and connects to it: the connection, and the
    /// master's address (`host:port` or a socket path, never a password).
    pub(crate) async fn open(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, String)> {
        let client = match self {
            Master::Url(url) => Client::open(url.expose())?,
            Master::Sentinel(s) => s.ask().await?,
        };
        let at = client.get_connection_info().addr().to_string();
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        match role(&mut conn).await? {
            Role::Replica => Err(not_master(self, &at)),
            Role::Master | Role::Unknown => Ok((conn, at)),
        }
    }
}

impl Sentinels {
    /// A client for the master the sentinels name now.
    async fn ask(&self) -> RedisResult<Client> {
        let node = self.node.as_ref().map_err(|e| {
            RedisError::from((ErrorKind::InvalidClientConfig, "[redis] url", e.clone()))
        })?;
        let ask = async {
            let mut client = self.client.lock().await;
            let client = match &mut *client {
                Some(c) => c,
                none => none.insert(Sentinel::build(
                    self.urls.iter().map(RedisUrl::expose).collect(),
                )?),
            };
            client.async_master_for(&self.name, Some(node)).await
        };
        match tokio::time::timeout(ASK_SENTINELS, ask).await {
            Ok(r) => r,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no sentinel named the master within {ASK_SENTINELS:?}"),
            ))),
        }
    }
}

impl fmt::Display for Master {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Master::Url(url) => write!(f, "{url}"),
            Master::Sentinel(s) => {
                let shown: Vec<String> = s.urls.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "the master \"{}\" of sentinels [{}]",
                    s.name,
                    shown.join(", ")
                )
            }
        }
    }
}

impl fmt::Debug for Master {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Master({self})")
    }
}

/// What a server says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// It takes writes.
    Master,
    /// A replica (a demoted master, or a name that has not moved yet).
    Replica,
    /// It would not say (a user that may not run `HELLO` or `ROLE`): taken
    /// for the master; a write it refuses (`READONLY`) still drops it.
    Unknown,
}

/// Asks `conn`'s server what it is: `HELLO` (Redis 6+, `@connection`, which
/// any user that may `PING` may run) and, where it is unknown, `ROLE`.
pub(crate) async fn role(conn: &mut MultiplexedConnection) -> RedisResult<Role> {
    let hello: Value = redis::cmd("HELLO").query_async(conn).await.or_else(|e| {
        if e.kind() == ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            || e.code() == Some("NOPERM")
        {
            Ok(Value::Nil)
        } else {
            Err(e)
        }
    })?;
    if let Some(role) = field(&hello, "role") {
        return Ok(parse_role(&role));
    }
    match redis::cmd("ROLE").query_async::<Value>(conn).await {
        Ok(Value::Array(parts)) => Ok(parts
            .first()
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .map_or(Role::Unknown, |r| parse_role(&r))),
        Ok(_) => Ok(Role::Unknown),
        Err(e) if e.kind() == ErrorKind::Io || e.is_timeout() => Err(e),
        Err(_) => Ok(Role::Unknown),
    }
}

fn parse_role(role: &str) -> Role {
    match role {
        "master" => Role::Master,
        "slave" | "replica" => Role::Replica,
        _ => Role::Unknown,
    }
}

/// The value of `name` in `HELLO`'s answer: a flat list of names and
/// values (RESP2) or a map (RESP3).
fn field(reply: &Value, name: &str) -> Option<String> {
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| kv.first().and_then(text).as_deref() == Some(name))
            .and_then(|kv| kv.get(1).and_then(text)),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// The error for a server that is not the master (yet, or any more).
fn not_master(master: &Master, at: &str) -> RedisError {
    let what = match master {
        Master::Url(_) => format!("the Redis at {at} is a replica, not the master"),
        Master::Sentinel(s) => format!(
            "the sentinels named {at} as the master of \"{}\", and it says it is a replica",
            s.name
        ),
    };
    RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_names_the_role_in_either_protocol() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("proto"),
            Value::Int(2),
            bulk("role"),
            bulk("replica"),
        ]);
        assert_eq!(field(&resp2, "role").as_deref(), Some("replica"));
        let resp3 = Value::Map(vec![(bulk("role"), bulk("master"))]);
        assert_eq!(field(&resp3, "role").as_deref(), Some("master"));
        assert_eq!(field(&Value::Nil, "role"), None);
        assert_eq!(parse_role("slave"), Role::Replica);
        assert_eq!(parse_role("sentinel"), Role::Unknown);
    }

    #[test]
    fn a_sentinel_master_shows_its_sentinels_redacted() {
        let redis = RedisConfig {
            url: Some(RedisUrl::new("redis://:hunter2@/3")),
            key_prefix: "qw".into(),
            timeout: Duration::from_secs(1),
            unsafe_eviction: Default::default(),
            quota_nodes: vec![],
            quota_replicas: 0,
            sentinels: vec![RedisUrl::new("redis://u:sentinelpw@10.0.0.1:26379")],
            master_name: Some("qw".into()),
            queue_replicas: 0,
        };
        let m = Master::of(&redis).expect("not embedded");
        let shown = m.to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("sentinelpw"),
            "{shown}"
        );
        assert!(
            shown.contains("10.0.0.1:26379") && shown.contains("\"qw\""),
            "{shown}"
        );
        assert_eq!(m.db(), 3);
    }
}
