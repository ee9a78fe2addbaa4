//! `lua/known.lua`: a daemon says which jobs it has loaded and that it is
//! alive (`queue::known` reads what it writes).

use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;

static KNOWN: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/known.lua")));

/// `lua/known.lua`'s arguments.
pub(crate) struct Known<'a> {
    /// KEYS[1] the known jobs (hash), KEYS[2] the live daemons (hash).
    keys: [String; 2],
    /// ARGV[1]: the daemon's id.
    id: &'a str,
    /// ARGV[2]: its entry's life (zero: remove it).
    life: Duration,
    /// ARGV[3]: how long both hashes live without a write.
    keep: Duration,
    /// ARGV[4]: what it loaded (JSON).
    loaded: &'a str,
    /// ARGV[5]: also forget jobs no daemon has had for `keep`.
    prune: bool,
    /// ARGV[6…]: its jobs.
    jobs: Vec<&'a str>,
}

impl<'a> Known<'a> {
    /// Daemon `id` is alive for `life`, with `jobs` loaded (`loaded`
    /// describes them).
    pub(crate) fn announce(
        keys: &KeySpace,
        id: &'a str,
        life: Duration,
        keep: Duration,
        loaded: &'a str,
        jobs: Vec<&'a str>,
        prune: bool,
    ) -> Self {
        Known {
            keys: [keys.known_jobs(), keys.daemons()],
            id,
            life: life.max(Duration::from_millis(1)),
            keep,
            loaded,
            prune,
            jobs,
        }
    }

    /// Daemon `id` stops: its entry goes (the jobs it had stay known, with
    /// the time it last had them).
    pub(crate) fn withdraw(keys: &KeySpace, id: &'a str) -> Self {
        Known {
            keys: [keys.known_jobs(), keys.daemons()],
            id,
            life: Duration::ZERO,
            keep: Duration::ZERO,
            loaded: "",
            prune: false,
            jobs: Vec::new(),
        }
    }

    /// Runs the script: Redis time, ms.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<i64> {
        let mut call = KNOWN.call();
        call.key(&self.keys[0]).key(&self.keys[1]);
        call.arg(self.id)
            .arg(self.life.as_millis() as u64)
            .arg(self.keep.as_millis() as u64)
            .arg(self.loaded)
            .arg(if self.prune { "1" } else { "0" });
        for job in &self.jobs {
            call.arg(*job);
        }
        call.invoke(conn).await
    }
}
