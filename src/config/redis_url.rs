//! The Redis URL: kept whole for connecting, displayed only redacted, and
//! checked at load time against the forms redis-rs connects with.

use std::fmt;

/// The schemes redis-rs 1.8 connects with (`redis::parse_redis_url`): TCP,
/// TLS, and a Unix socket, each also under Valkey's name.
pub(super) const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "unix",
    "redis+unix",
    "valkey",
    "valkeys",
    "valkey+unix",
];

/// What an invalid URL's error suggests.
const ACCEPTED: &str = "write redis://[USER:PASSWORD@]HOST[:PORT][/DB], rediss://... for TLS, \
or unix:///PATH/TO/redis.sock[?db=N&pass=PASSWORD] (redis+unix://, valkey://, valkeys:// \
and valkey+unix:// also work)";

/// Query parameters shown as written: the ones redis-rs reads that are not
/// a password. Every other value is masked, so a password under a name we
/// did not foresee (`password=`, `pa%73s=`) never prints.
const SHOWN_PARAMS: &[&str] = &["db", "user", "protocol"];

/// A Redis URL. It may hold a password, so it only displays redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(pub(super) String);

impl RedisUrl {
    /// The URL itself, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        RedisUrl(url.into())
    }

    /// Whether redis-rs can connect with it. The error shows the URL
    /// redacted and the forms that are accepted.
    pub fn check(&self) -> Result<(), String> {
        let why = match self.0.split_once("://") {
            None => "not a URL".to_owned(),
            Some((scheme, _)) if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => {
                format!("unknown scheme {scheme:?}")
            }
            // Its errors name what is wrong (a missing host, a bad database
            // number) and never repeat the URL.
            Some(_) => match redis::Client::open(self.expose()) {
                Ok(c) => match user_without_password(c.get_connection_info().redis_settings()) {
                    None => return Ok(()),
                    Some(why) => why,
                },
                Err(e) => e.to_string(),
            },
        };
        Err(format!("invalid Redis URL \"{self}\": {why}; {ACCEPTED}"))
    }

    /// What a URL without a host says about a master that sentinels name
    /// (`redis://:PASSWORD@/0`, `rediss://USER:PASSWORD@/2`): how to log
    /// in to it, and whether over TLS (`rediss://`; `#insecure` skips the
    /// certificate check). A URL with a host, or one redis-rs cannot read,
    /// is an error that shows it redacted.
    pub fn master_settings(&self) -> Result<MasterSettings, String> {
        use redis::IntoConnectionInfo;
        const FORM: &str = "with [redis] sentinels, url holds only the master's user, password, database and TLS, \
and no host (the sentinels say where the master is): write redis://[USER]:PASSWORD@/DB, or rediss://... for TLS";
        let bad = |why: &str| format!("invalid Redis URL \"{self}\": {why}; {FORM}");
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return Err(bad("not a URL"));
        };
        let scheme_lc = scheme.to_ascii_lowercase();
        if !["redis", "rediss", "valkey", "valkeys"].contains(&scheme_lc.as_str()) {
            return Err(bad(&format!(
                "scheme {scheme:?} cannot name a master over TCP"
            )));
        }
        // The userinfo ends at the last '@' (as `redact` reads it).
        let (userinfo, after) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        if !(after.is_empty() || after.starts_with(['/', '?', '#'])) {
            return Err(bad("it names a host"));
        }
        // redis-rs reads URLs with a host only: one stands in for it.
        let placeholder = match userinfo {
            Some(u) => format!("{scheme}://{u}@sentinel-master{after}"),
            None => format!("{scheme}://sentinel-master{after}"),
        };
        let info = placeholder
            .as_str()
            .into_connection_info()
            .map_err(|e| bad(&e.to_string()))?;
        let tls = match info.addr() {
            redis::ConnectionAddr::TcpTls { insecure, .. } => Some(if *insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            }),
            _ => None,
        };
        if let Some(why) = user_without_password(info.redis_settings()) {
            return Err(bad(&why));
        }
        Ok(MasterSettings {
            redis: info.redis_settings().clone(),
            tls,
        })
    }
}

/// Why a URL that names a user and no password cannot be used as written:
/// Redis logs a user in only with a password (`AUTH user password`, or
/// `HELLO 3 AUTH`), so redis-rs sends no login at all and the connection
/// runs as the `default` user, with whatever that user may do: not the
/// user the operator named. `None` when the URL names no user, or both.
fn user_without_password(info: &redis::RedisConnectionInfo) -> Option<String> {
    let user = info.username()?;
    info.password().is_none().then(|| {
        format!(
            "it names user {user:?} and no password, so Redis would not log that user in and the \
connection would run as the default user; give the password (redis://{user}:PASSWORD@HOST; \
a user with nopass takes any password)"
        )
    })
}

/// How to log in to a master that sentinels name ([`RedisUrl::master_settings`]).
#[derive(Clone, Debug)]
pub struct MasterSettings {
    /// User, password, database, protocol.
    pub redis: redis::RedisConnectionInfo,
    /// TLS, if any.
    pub tls: Option<redis::TlsMode>,
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// `url` with every password masked, in every form redis-rs reads one:
/// `redis://user:PASSWORD@host` (also `rediss://`, `valkey://`), and
/// `unix:///path/redis.sock?pass=PASSWORD` (also `redis+unix://`); and in
/// forms it does not read but people write (`?password=`). It works on the
/// text, so a URL too broken to parse is masked too; where it cannot tell, it
/// masks more rather than less.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // The userinfo ends at the last '@': a password may hold '/', '?' or '@'
    // unencoded, and cutting later masks more, never less.
    let rest = match rest.rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!("{}:***{}", &rest[..colon], &rest[at..]),
            // No scheme: not a URL, so the part before '@' may be anything.
            None if scheme.is_empty() => format!("***{}", &rest[at..]),
            None => rest.to_owned(),
        },
        None => rest.to_owned(),
    };
    format!("{scheme}{}", mask_query(&rest))
}

/// `path?db=1&pass=x#frag` → `path?db=1&pass=***#frag`.
fn mask_query(s: &str) -> String {
    let Some((before, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if !SHOWN_PARAMS.contains(&k) => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{before}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_url_hides_password() {
        let u = RedisUrl::new("redis://user:hunter2@10.0.0.1:6379/0");
        assert_eq!(u.to_string(), "redis://user:***@10.0.0.1:6379/0");
        assert!(!format!("{u:?}").contains("hunter2"));
        assert_eq!(
            RedisUrl::new("redis://127.0.0.1/").to_string(),
            "redis://127.0.0.1/"
        );
    }

    #[test]
    fn every_form_is_redacted() {
        // Regression (issue 9): the socket forms were printed verbatim.
        for (url, shown) in [
            (
                "rediss://:hunter2@h:6380/1#insecure",
                "rediss://:***@h:6380/1#insecure",
            ),
            ("valkey://u:hun:ter2@h", "valkey://u:***@h"),
            (
                "redis://u:hunter2@h/0?protocol=resp3",
                "redis://u:***@h/0?protocol=resp3",
            ),
            (
                "unix:///run/r.sock?db=2&pass=hunter2",
                "unix:///run/r.sock?db=2&pass=***",
            ),
            (
                "redis+unix:///r.sock?user=u&pass=hunter2",
                "redis+unix:///r.sock?user=u&pass=***",
            ),
            (
                "valkey+unix:///r.sock?password=hunter2",
                "valkey+unix:///r.sock?password=***",
            ),
            ("unix:///r.sock?pa%73s=hunter2", "unix:///r.sock?pa%73s=***"),
            ("unix:///r.sock?pass=hunter2@x", "unix:///r.sock?pass=***"),
            ("redis://u:hunt/er?2@h", "redis://u:***@h"),
            ("u:hunter2@h:6379", "u:***@h:6379"),
            ("hunter2@h:6379", "***@h:6379"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ] {
            assert_eq!(RedisUrl::new(url).to_string(), shown, "{url}");
        }
    }

    #[test]
    fn a_malformed_url_lists_the_accepted_forms() {
        for url in [
            "http://h:6379",
            "localhost:6379",
            "redis://",
            "redis://h/notadb",
            "unix://",
        ] {
            let err = RedisUrl::new(url).check().unwrap_err();
            for form in ["redis://", "rediss://", "unix://", "redis+unix://"] {
                assert!(err.contains(form), "{url}: {err}");
            }
        }
        let err = RedisUrl::new("http://:hunter2@h").check().unwrap_err();
        assert!(err.contains("unknown scheme \"http\""), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        for url in [
            "redis://127.0.0.1:6379/0",
            "REDIS://h",
            "rediss://u:p@h:6380",
            "unix:///run/redis.sock?db=1",
            "redis+unix:///run/redis.sock",
            "valkey://h",
        ] {
            assert_eq!(RedisUrl::new(url).check(), Ok(()), "{url}");
        }
    }

    #[test]
    fn a_user_without_a_password_is_refused() {
        // redis-rs sends no AUTH for it: the connection would be `default`'s.
        for url in [
            "redis://ingest@127.0.0.1:6379",
            "rediss://ingest@h/2",
            "unix:///run/redis.sock?user=ingest",
        ] {
            let err = RedisUrl::new(url).check().unwrap_err();
            assert!(
                err.contains("names user \"ingest\" and no password"),
                "{url}: {err}"
            );
            assert!(err.contains("default user"), "{err}");
        }
        let err = RedisUrl::new("redis://ingest@/0")
            .master_settings()
            .unwrap_err();
        assert!(
            err.contains("names user \"ingest\" and no password"),
            "{err}"
        );
        for url in ["redis://ingest:pw@h", "redis://:pw@h", "redis://h"] {
            assert_eq!(RedisUrl::new(url).check(), Ok(()), "{url}");
        }
        assert!(
            RedisUrl::new("redis://ingest:pw@/0")
                .master_settings()
                .is_ok()
        );
    }
}
