//! Who may share the machine. The integration tests run in one binary, on
//! as many threads as there are cores, and most of them wait on processes
//! and sockets, so they share a machine well. Two kinds must not meet:
//!
//! - [`heavy`] tests load the machine for seconds on end (a 10,000-task
//!   fan-out, hundreds of processes, 100k-entry windows written by Lua);
//! - [`timing`] tests assert how soon something happens (a pickup within
//!   2 s, watchdog pings under 900 ms apart, a burst before a window's
//!   boundary, a daemon running before its first cron tick).
//!
//! A heavy test runs beside no other heavy or timing test; timing tests run
//! beside each other (as they did when each file was its own binary). A
//! test takes its guard in its first line and holds it to its end; the other
//! tests take nothing and run beside anything.
//!
//! The guard is a read or write lock on nothing: it orders whole tests and
//! is held across `.await` on purpose. Nothing inside a test takes it, so
//! it cannot deadlock the test's runtime.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static MACHINE: RwLock<()> = RwLock::new(());

/// Held for the length of a test: see the module's doc. Its fields are
/// never read: holding them is the point.
#[must_use = "the guard orders tests only while it lives"]
pub struct Guard {
    _heavy: Option<RwLockWriteGuard<'static, ()>>,
    _timing: Option<RwLockReadGuard<'static, ()>>,
}

/// A test that loads the machine: no other heavy or timing test runs
/// meanwhile.
pub fn heavy() -> Guard {
    // A test that panicked while holding the guard poisons the lock; the
    // machine is fine for the next one.
    let held = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    Guard {
        _heavy: Some(held),
        _timing: None,
    }
}

/// A test whose assertions are about time: no heavy test runs meanwhile.
pub fn timing() -> Guard {
    let held = MACHINE.read().unwrap_or_else(|e| e.into_inner());
    Guard {
        _heavy: None,
        _timing: Some(held),
    }
}
