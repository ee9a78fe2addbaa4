//! The queue's Lua scripts, one file per `lua/<name>.lua`: each names the
//! script's KEYS and ARGV in a typed arguments value, lays them out in the
//! positions the script's header gives, and reads its reply into a type
//! (the header is the contract's one half, the file here its other), as
//! apalis-redis's `src/queries/`.

pub(crate) mod enqueue;
pub(crate) mod fan_out;
pub(crate) mod fan_out_take;
pub(crate) mod feed;
pub(crate) mod finish;
pub(crate) mod known;
pub(crate) mod rotate;
pub(crate) mod trim;
