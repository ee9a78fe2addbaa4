//! The Redis URL: kept whole for connecting, displayed only redacted.

use std::fmt;

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
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // redis://user:password@host → redis://user:***@host
        match (self.0.find("://"), self.0.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &self.0[scheme + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                write!(f, "{}{}:***{}", &self.0[..scheme + 3], user, &self.0[at..])
            }
            _ => f.write_str(&self.0),
        }
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
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
}
