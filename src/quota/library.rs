//! The spend core's Lua, assembled from the files of `lua/spend/` (their
//! order is in `lua/spend/core.lua`'s header) in two forms that share every
//! line of the window arithmetic:
//!
//! - the function library Redis 7 loads ([`library`]: `FUNCTION LOAD`, one
//!   function per operation, `FCALL qw_<version>_spend …`), whose name
//!   carries its version so that two versions of quota-worker run side by
//!   side during a rolling deploy;
//! - the one script of the same operations ([`SCRIPT`]: `EVALSHA`, the
//!   operation in `ARGV[1]`), which Redis 6 (or a user without `FUNCTION`)
//!   runs instead, and which `quota-worker keys --script` prints for other
//!   programs. The claim with its spend has a script of its own
//!   ([`CLAIM_SCRIPT`]).
//!
//! Both take the same KEYS and ARGV (`lua/spend/core.lua`'s header).

use std::sync::LazyLock;

use crate::conn::{Function, Library, Lua};

/// A module of the spend core after core.lua: files that fill one table
/// (`Log`, a window kind, `Line`, `Ring`, `Ops`). `eager`: defined in a
/// block of their own when the text runs (what a file keeps to itself goes
/// out of scope at its end) — the library, which runs its text once, at
/// `FUNCTION LOAD`. `lazy`: a branch of `fill`, run when a call first reads
/// from the table (`lazy` in core.lua) — the one script, which runs its
/// whole text on every call: defining every function of every module there
/// cost more than the spend itself (BENCHMARKS.md, "Issue 33").
macro_rules! module {
    (eager, $table:literal, $($file:literal),+) => {
        concat!("do\n", $(include_str!($file)),+, "end\n")
    };
    (lazy, $table:literal, $($file:literal),+) => {
        concat!("elseif T == ", $table, " then\n", $(include_str!($file)),+)
    };
}

/// The operations' text: the contract and shared names, the id log, the
/// window kinds, the waiting line, the history, the operations. In the
/// one-script form the modules are the branches of one function, `fill`
/// (one closure a call, whose own closures copy their upvalues from it
/// rather than each walking the list of the top level's open upvalues, as
/// Lua 5.1 makes a closure defined at the top level do).
macro_rules! operations {
    (eager) => {
        concat!(include_str!("../../lua/spend/core.lua"), modules!(eager))
    };
    (lazy) => {
        concat!(
            include_str!("../../lua/spend/core.lua"),
            "fill = function(T)\nif T == nil then\n",
            modules!(lazy),
            "end\nend\nlazy()\n"
        )
    };
}

/// The files after core.lua, as modules.
macro_rules! modules {
    ($how:ident) => {
        concat!(
            module!(
                $how,
                "Log",
                "../../lua/spend/log.lua",
                "../../lua/spend/adjust.lua"
            ),
            module!($how, "Sliding", "../../lua/spend/sliding.lua"),
            module!($how, "Bucket", "../../lua/spend/bucket.lua"),
            module!($how, "Fixed", "../../lua/spend/fixed.lua"),
            module!($how, "Concurrent", "../../lua/spend/concurrent.lua"),
            module!($how, "Line", "../../lua/spend/line.lua"),
            module!($how, "Ring", "../../lua/spend/ring.lua"),
            module!($how, "Ops", "../../lua/spend/ops.lua"),
        )
    };
}

/// The item claim that spends in the same call (`Ops.claim`).
macro_rules! claim {
    () => {
        module!(
            eager,
            "Ops",
            "../../lua/item_lock.lua",
            "../../lua/spend/claim.lua"
        )
    };
}

/// The one script of the spend operations (`EVALSHA`, the operation in
/// `ARGV[1]`): what Redis 6 runs, and what `keys --script` prints.
pub const SCRIPT: &str = concat!(
    operations!(lazy),
    include_str!("../../lua/spend/script.lua")
);

/// The claim with the first page's spend as one script (`lua/spend/claim.lua`).
pub(crate) const CLAIM_SCRIPT: &str = concat!(
    operations!(lazy),
    claim!(),
    "return Ops.claim(KEYS, ARGV)\n"
);

static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let body = concat!(
        operations!(eager),
        claim!(),
        include_str!("../../lua/spend/functions.lua")
    );
    match test_version() {
        Some(v) => Library::new("qw", &format!("{body}-- test version {v}\n")),
        None => Library::new("qw", body),
    }
});

/// A test-only knob: a daemon started with `QUOTA_WORKER_TEST_LIBRARY=<v>`
/// adds `-- test version <v>` to its library's text, so that its version
/// name differs and it loads and calls a library of its own beside the
/// others' — two versions side by side, as during a rolling deploy, from one
/// binary (`tests/it/function_library.rs`). Letters, digits, `-` and `_`,
/// at most 32; anything else is ignored. Not for production: the code is the
/// same, only the name differs.
const TEST_VERSION: &str = "QUOTA_WORKER_TEST_LIBRARY";

fn test_version() -> Option<String> {
    let v = std::env::var(TEST_VERSION).ok()?;
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    (!v.is_empty() && v.len() <= 32 && v.chars().all(ok)).then_some(v)
}

static SCRIPT_LUA: LazyLock<Lua> = LazyLock::new(|| Lua::new(SCRIPT));
static CLAIM_LUA: LazyLock<Lua> = LazyLock::new(|| Lua::new(CLAIM_SCRIPT));

/// The function library (`qw_<version>`).
pub fn library() -> &'static Library {
    &LIBRARY
}

/// The one script of the spend operations, as [`crate::conn::Lua`] runs it.
pub fn script() -> &'static Lua {
    &SCRIPT_LUA
}

/// The library's functions, by operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Spend units from every window (`ARGV[1]` "spend").
    Spend,
    /// Settle a spend to its actual cost.
    Settle,
    /// Block the credential (its resource) for a while.
    Block,
    /// Read every window's usage.
    Peek,
    /// Record drift the upstream reports.
    Sync,
    /// Forget every window's drift.
    Undrift,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 6] = [
        Op::Spend,
        Op::Settle,
        Op::Block,
        Op::Peek,
        Op::Sync,
        Op::Undrift,
    ];

    /// Its name: `ARGV[1]`, and the function's name after the library's.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Spend => "spend",
            Op::Settle => "settle",
            Op::Block => "block",
            Op::Peek => "peek",
            Op::Sync => "sync",
            Op::Undrift => "undrift",
        }
    }

    /// Its function in the library (run as [`SCRIPT`] where Redis runs no
    /// functions).
    pub fn function(self) -> &'static Function {
        static FUNCTIONS: LazyLock<Vec<Function>> = LazyLock::new(|| {
            Op::ALL
                .iter()
                .map(|op| library().function(op.as_str(), script()))
                .collect()
        });
        &FUNCTIONS[self as usize]
    }
}

/// The claim with the first page's spend (`lua/spend/claim.lua`).
pub(crate) fn claim() -> &'static Function {
    static CLAIM: LazyLock<Function> = LazyLock::new(|| library().function("claim", &CLAIM_LUA));
    &CLAIM
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library is what FUNCTION LOAD takes: its name line first, a
    /// versioned name, and a function per operation and the claim.
    #[test]
    fn the_library_names_its_version_and_its_functions() {
        let lib = library();
        assert!(lib.name().starts_with("qw_") && lib.name().len() == 15);
        let first = lib.source().lines().next().unwrap_or_default();
        assert_eq!(first, format!("#!lua name={}", lib.name()));
        for op in Op::ALL {
            assert_eq!(
                op.function().name(),
                format!("{}_{}", lib.name(), op.as_str())
            );
            assert!(
                lib.source()
                    .contains(&format!("(LIBRARY .. '_{}',", op.as_str()))
            );
        }
        assert!(lib.source().contains("(LIBRARY .. '_claim', Ops.claim)"));
    }

    /// Both forms hold the same files' text, and no Lua file of the spend
    /// core is a long one (issue 33: ~400 lines at most).
    #[test]
    fn both_forms_share_the_operations() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/spend");
        for entry in std::fs::read_dir(dir).expect("lua/spend") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            let lines = text.lines().count();
            assert!(lines <= 420, "{} has {lines} lines", path.display());
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let (in_script, in_claim, in_library) = match name {
                "script.lua" => (true, false, false),
                "functions.lua" => (false, false, true),
                "claim.lua" => (false, true, true),
                _ => (true, true, true),
            };
            assert_eq!(SCRIPT.contains(&text), in_script, "{name} in the script");
            assert_eq!(
                CLAIM_SCRIPT.contains(&text),
                in_claim,
                "{name} in the claim"
            );
            assert_eq!(
                library().source().contains(&text),
                in_library,
                "{name} in the library"
            );
        }
        assert!(library().source().contains(operations!(eager)));
        assert!(SCRIPT.starts_with(operations!(lazy)));
    }
}
