//! Where the Redis master is, asked again at every (re)connection: the
//! host of `[redis] url` (a managed Redis's name, which moves to the new
//! primary at a failover, is resolved again each time), or the master the
//! sentinels of `[redis] sentinels` name under `master_name`.
//!
//! The sentinels also say when they fail the master over (`+switch-master`
//! on their pub/sub): every connection of the process then leaves the old
//! master at once ([`Sentinels::switches`]), instead of writing on for the
//! seconds until the sentinels demote it (writes that its demotion throws
//! away).
//!
//! Either way a connection counts as one to the master only when the server
//! says it is one (`HELLO`'s `role`, or `ROLE` on a Redis before 6): a
//! demoted master that came back as a replica, or a name that still points
//! at the old primary, is not connected to.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult, Value};

use crate::config::{MasterSettings, RedisConfig, RedisUrl};

/// How long one sentinel may take to connect and answer: one that does
/// not answer in time is skipped (they are all asked at once).
const ASK_ONE: Duration = Duration::from_millis(500);

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
    name: String,
    /// How to log in to the master (none: no `url`); an error only if the
    /// config loader let a URL through that it should have refused (a
    /// bug), said at every attempt.
    settings: Result<Option<MasterSettings>, String>,
    /// The sentinels; displayed redacted.
    urls: Vec<RedisUrl>,
    /// The master's database, which the connection reports.
    db: i64,
    /// The newest master the sentinels announced (`ip:port`), once one
    /// was ([`Sentinels::switches`]).
    switched: watch::Sender<Option<String>>,
    /// The tasks that listen for announcements run.
    listening: AtomicBool,
}

impl Master {
    /// Where `redis`'s master is, or `None` for the embedded Redis (no
    /// `url`, no `sentinels`).
    pub fn of(redis: &RedisConfig) -> Option<Master> {
        if redis.sentinels.is_empty() {
            return redis.url.clone().map(Master::Url);
        }
        let settings = redis
            .url
            .as_ref()
            .map(RedisUrl::master_settings)
            .transpose();
        let db = match &settings {
            Ok(Some(s)) => s.redis.db(),
            _ => 0,
        };
        Some(Master::Sentinel(Arc::new(Sentinels {
            name: redis.master_name.clone().unwrap_or_default(),
            settings,
            urls: redis.sentinels.clone(),
            db,
            switched: watch::Sender::new(None),
            listening: AtomicBool::new(false),
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
        match self {
            Master::Url(url) => self.connect(Client::open(url.expose())?, config).await,
            Master::Sentinel(s) => s.open(self, config).await,
        }
    }

    /// Connects with `client`, and checks that its server is the master.
    async fn connect(
        &self,
        client: Client,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, String)> {
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
    /// The master the sentinels announce at each failover (`ip:port`, as
    /// `+switch-master` says it), listening to every sentinel from the
    /// first call on (one task per sentinel, reconnecting with backoff,
    /// until the last user is gone).
    pub(crate) fn switches(self: &Arc<Self>) -> watch::Receiver<Option<String>> {
        if !self.listening.swap(true, Ordering::SeqCst) {
            for url in &self.urls {
                tokio::spawn(listen(Arc::downgrade(self), url.clone()));
            }
        }
        self.switched.subscribe()
    }

    /// A client for the master at `host:port`, logging in as `url` says.
    fn client_at(&self, host: String, port: u16) -> RedisResult<Client> {
        let settings = self.settings.as_ref().map_err(|e| {
            RedisError::from((ErrorKind::InvalidClientConfig, "[redis] url", e.clone()))
        })?;
        let addr = match settings.as_ref().and_then(|s| s.tls) {
            None => redis::ConnectionAddr::Tcp(host, port),
            Some(tls) => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: matches!(tls, redis::TlsMode::Insecure),
                tls_params: None,
            },
        };
        let mut info = redis::IntoConnectionInfo::into_connection_info(addr)?;
        if let Some(s) = settings {
            info = info.set_redis_settings(s.redis.clone());
        }
        Client::open(info)
    }

    /// The master the sentinels announced last (`+switch-master`), if they
    /// did: tried first, since a sentinel asked now may not know of the
    /// failover yet.
    fn announced(&self) -> Option<(String, u16)> {
        let at = self.switched.borrow().clone()?;
        let (host, port) = at.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    }

    /// Where the sentinels say the master is: every sentinel asked at once
    /// (`SENTINEL MASTER`), each given [`ASK_ONE`], the addresses newest
    /// first by the configuration epoch each sentinel has, without repeats.
    /// Right after a failover a sentinel that has not heard of it yet still
    /// names the old master, which still says it is the master until the
    /// sentinels demote it (about 10 s): taken first, it would have every
    /// write of a fresh process go where the demotion throws it away (seen
    /// in `failover::the_documented_sentinel_user_is_enough`: a `trigger`'s
    /// tick queued there and never ran). redis-rs's sentinel client was not
    /// used: it waits for the sentinels in the order listed (a silent first
    /// one cost its whole timeout on every lookup, past a spend's 1 s), takes
    /// the first answer, and lists every master (`SENTINEL MASTERS`).
    async fn ask(&self) -> RedisResult<Vec<(String, u16)>> {
        let mut asks: futures::stream::FuturesUnordered<_> = self
            .urls
            .iter()
            .map(|url| ask_one(url, &self.name))
            .collect();
        let mut found: Vec<(u64, String, u16)> = Vec::new();
        let mut last = None;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(named) => found.push(named),
                Err(e) => last = Some(e),
            }
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut addrs: Vec<(String, u16)> = Vec::new();
        for (_, host, port) in found {
            if !addrs.iter().any(|(h, p)| *h == host && *p == port) {
                addrs.push((host, port));
            }
        }
        if !addrs.is_empty() {
            return Ok(addrs);
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel knows the master",
            ))
        }))
    }

    /// Finds the master and connects to it: the one announced last, then
    /// each the sentinels name; the first that says it is the master.
    async fn open(
        &self,
        master: &Master,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, String)> {
        let mut last = None;
        if let Some((host, port)) = self.announced() {
            match master.connect(self.client_at(host, port)?, config).await {
                Ok(found) => return Ok(found),
                Err(e) => last = Some(e),
            }
        }
        for (host, port) in self.ask().await? {
            match master.connect(self.client_at(host, port)?, config).await {
                Ok(found) => return Ok(found),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel knows the master",
            ))
        }))
    }
}

/// Asks the sentinel at `url` where the master `name` is: its
/// configuration epoch (newer is higher), host and port.
async fn ask_one(url: &RedisUrl, name: &str) -> RedisResult<(u64, String, u16)> {
    let ask = async {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ASK_ONE))
            .set_response_timeout(Some(ASK_ONE));
        let mut conn = Client::open(url.expose())?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let reply: Value = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async(&mut conn)
            .await?;
        let host = field(&reply, "ip");
        let port = field(&reply, "port").and_then(|p| p.parse::<u16>().ok());
        let epoch = field(&reply, "config-epoch").and_then(|e| e.parse::<u64>().ok());
        match (host, port) {
            (Some(host), Some(port)) => Ok((epoch.unwrap_or(0), host, port)),
            _ => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "a sentinel does not know the master's name",
                format!("{url} does not monitor \"{name}\""),
            ))),
        }
    };
    tokio::time::timeout(ASK_ONE, ask)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the sentinel {url} did not answer within {ASK_ONE:?}"),
            )))
        })
}

/// Listens to the sentinel at `url` for `+switch-master` of our master.
async fn listen(sentinels: Weak<Sentinels>, url: RedisUrl) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(name) = sentinels.upgrade().map(|s| s.name.clone()) else {
            return;
        };
        if let Ok(mut pubsub) = subscribe(&url).await {
            backoff = Duration::from_millis(100);
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let Some(s) = sentinels.upgrade() else {
                    return;
                };
                let text: String = msg.get_payload().unwrap_or_default();
                if let Some(at) = switched_to(&text, &name) {
                    tracing::info!(master = %name, at, "the sentinels failed the master over");
                    s.switched.send_replace(Some(at));
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(super::MAX_BACKOFF);
    }
}

/// A pub/sub connection to the sentinel at `url`, subscribed to
/// `+switch-master`.
async fn subscribe(url: &RedisUrl) -> RedisResult<redis::aio::PubSub> {
    let connect = async {
        let mut pubsub = Client::open(url.expose())?.get_async_pubsub().await?;
        pubsub.subscribe("+switch-master").await?;
        Ok::<_, RedisError>(pubsub)
    };
    tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        })
}

/// The new master (`ip:port`) a `+switch-master` message names, when it is
/// about `name`: `<name> <old ip> <old port> <new ip> <new port>`.
fn switched_to(message: &str, name: &str) -> Option<String> {
    let parts: Vec<&str> = message.split(' ').collect();
    match parts.as_slice() {
        [n, _, _, ip, port] if *n == name => Some(format!("{ip}:{port}")),
        _ => None,
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
    fn a_switch_names_the_new_master_of_our_name_only() {
        let m = "qw 10.0.0.1 6379 10.0.0.2 6380";
        assert_eq!(switched_to(m, "qw").as_deref(), Some("10.0.0.2:6380"));
        assert_eq!(switched_to(m, "other"), None);
        assert_eq!(switched_to("qw 1 2", "qw"), None);
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
