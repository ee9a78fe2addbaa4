//! The spend core's operations as types: one [`Operation`] per call with its
//! arguments, laid out as KEYS and ARGV in one place ([`Plan::layout`], the
//! contract's other half: `lua/spend/core.lua`'s header), and the options of
//! a spend ([`SpendOptions`]: cost, reserve, tenant, waiting line, history).

use std::time::Duration;

use super::{Op, Plan, ring};
use crate::config::Reserve;

/// One call of the spend core on a plan's windows, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation<'a> {
    /// Spend `cost` units from every window, all or nothing.
    Spend {
        /// Unique per upstream request; a retry of the same spend reuses it.
        request_id: &'a str,
        /// Units, at least 1.
        cost: u64,
        /// What every window keeps free after it.
        reserve: Reserve,
        /// The waiting lines' ticket (`""`: respects the lines but will not
        /// come back); `None`: no line (`lua/spend/line.lua`).
        ticket: Option<&'a str>,
        /// Whether it writes the status page's spend history.
        history: bool,
    },
    /// Settle a spend to what it cost (0: a refund, and its lease back).
    Settle {
        /// The spend's request id.
        request_id: &'a str,
        /// Its actual cost.
        actual: u64,
        /// Whether it writes the change to the spend history.
        history: bool,
    },
    /// Block the plan's resource for at least this long (never shortening
    /// a longer block).
    Block(Duration),
    /// Every window's usage.
    Peek,
    /// Record drift: the upstream says `left` units are left on the limit
    /// window `window` (0-based) mirrors.
    Sync {
        /// The window, 0-based as the plan lists them.
        window: usize,
        /// The units the upstream says are left.
        left: u64,
        /// When the upstream's count resets, if it said.
        resets_in: Option<Duration>,
    },
    /// Forget every window's drift.
    Undrift,
}

/// A call's KEYS and ARGV.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// KEYS.
    pub keys: Vec<String>,
    /// ARGV.
    pub args: Vec<String>,
}

impl Operation<'_> {
    /// Which function of the library runs it.
    pub fn op(&self) -> Op {
        match self {
            Operation::Spend { .. } => Op::Spend,
            Operation::Settle { .. } => Op::Settle,
            Operation::Block(_) => Op::Block,
            Operation::Peek => Op::Peek,
            Operation::Sync { .. } => Op::Sync,
            Operation::Undrift => Op::Undrift,
        }
    }
}

impl Plan {
    /// KEYS and ARGV of `operation` on these windows: block, clock, each
    /// window's keys; then, for a spend or settle that keeps the history,
    /// the rings; then, for a spend in a waiting line, each line. ARGV: the
    /// operation, its argument (request id, block ms, window number), its
    /// count (cost, actual cost, units left), the reserve, the number of
    /// windows and their specs; then the history's four arguments, then the
    /// ticket.
    pub fn layout(&self, operation: &Operation<'_>) -> Layout {
        let (arg, count, reserve) = match operation {
            Operation::Spend {
                request_id,
                cost,
                reserve,
                ..
            } => ((*request_id).to_owned(), cost.to_string(), *reserve),
            Operation::Settle {
                request_id, actual, ..
            } => ((*request_id).to_owned(), actual.to_string(), Reserve::NONE),
            // Whole ms, at least 1 (what the script takes).
            Operation::Block(d) => (
                d.as_millis().max(1).to_string(),
                String::new(),
                Reserve::NONE,
            ),
            Operation::Sync {
                window,
                left,
                resets_in,
            } => {
                let which = match resets_in {
                    // Whole ms, at least 1, below 2^53.
                    Some(d) => format!("{}:{}", window + 1, d.as_millis().clamp(1, (1 << 53) - 1)),
                    None => (window + 1).to_string(),
                };
                (which, left.to_string(), Reserve::NONE)
            }
            Operation::Peek | Operation::Undrift => (String::new(), String::new(), Reserve::NONE),
        };
        let mut keys = self.keys.clone();
        let mut args = vec![
            operation.op().as_str().to_owned(),
            arg,
            count,
            reserve.percent().to_string(),
            self.windows.len().to_string(),
        ];
        args.extend(self.windows.iter().map(|w| w.spec.clone()));
        let (history, ticket) = match operation {
            Operation::Spend {
                history, ticket, ..
            } => (*history, *ticket),
            Operation::Settle { history, .. } => (*history, None),
            _ => (false, None),
        };
        // A ticket comes after the history's arguments: a spend in a line
        // passes them (a ring count of 0 when it keeps no history).
        if history || ticket.is_some() {
            let rings = if history { &self.rings[..] } else { &[] };
            keys.extend(rings.iter().cloned());
            args.extend([
                rings.len().to_string(),
                ring::SLOT.as_millis().to_string(),
                ring::SLOTS.to_string(),
                ring::RING_TTL.as_millis().to_string(),
            ]);
        }
        if let Some(ticket) = ticket {
            keys.extend(self.lines.iter().cloned());
            args.push(ticket.to_owned());
        }
        Layout { keys, args }
    }
}

/// How a spend is made, beyond its endpoint and request id: built from
/// [`SpendOptions::new`] (the endpoint's cost, no reserve, no tenant, no
/// waiting line, the limiter's history setting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct SpendOptions<'a> {
    pub(crate) cost: Option<u64>,
    pub(crate) reserve: Reserve,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) ticket: Option<&'a str>,
    pub(crate) history: Option<bool>,
}

impl<'a> SpendOptions<'a> {
    /// The endpoint's cost, nothing else.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spends `cost` units instead of the endpoint's (`None`: its cost).
    pub fn cost(mut self, cost: impl Into<Option<u64>>) -> Self {
        self.cost = cost.into();
        self
    }

    /// Admitted only if every window keeps `reserve` of its units free
    /// after it (a job's priority reserve); `remaining` and the retry-after
    /// are those of the reduced limit.
    pub fn reserve(mut self, reserve: Reserve) -> Self {
        self.reserve = reserve;
        self
    }

    /// On one tenant (its value) of the endpoint's template credential
    /// (`None`: a plain credential). The reserve applies to the tenant's
    /// own windows.
    pub fn tenant(mut self, tenant: impl Into<Option<&'a str>>) -> Self {
        self.tenant = tenant.into();
        self
    }

    /// In the windows' waiting lines as `ticket` (`lua/spend/line.lua`): a
    /// refused spend comes back as `ticket` at the moment its retry-after
    /// names, and its turn was kept for it; `""`: it respects the lines but
    /// will not come back.
    pub fn in_line(mut self, ticket: &'a str) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// Whether it writes the status page's spend history (default: as the
    /// limiter does, [`super::Limiter::without_history`]).
    pub fn history(mut self, keep: bool) -> Self {
        self.history = Some(keep);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::quota::Quotas;

    fn plan() -> Plan {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        let text = r#"
[credentials.k]
secret_env = "K"
windows = [{ units = 10, per = "1h" }, { units = 5, kind = "concurrent" }]
[endpoints.e]
credential = "k"
cost = 1
"#;
        std::fs::write(&path, text).expect("write");
        let config = Config::load_with_env(&path, &|_: &str| None).expect("valid");
        Quotas::new(&config).endpoint("e").expect("e").plan.clone()
    }

    #[test]
    fn every_operation_is_laid_out_as_the_contract_says() {
        let p = plan();
        let spend = p.layout(&Operation::Spend {
            request_id: "r",
            cost: 3,
            reserve: Reserve::NONE,
            ticket: None,
            history: false,
        });
        assert_eq!(&spend.args[..5], ["spend", "r", "3", "0", "2"]);
        assert_eq!(spend.args.len(), 7, "no history, no line: {:?}", spend.args);
        assert_eq!(spend.keys, p.keys);

        let kept = p.layout(&Operation::Spend {
            request_id: "r",
            cost: 3,
            reserve: Reserve::NONE,
            ticket: Some("j:1:a"),
            history: true,
        });
        assert_eq!(kept.args[7..], ["1", "300000", "288", "86700000", "j:1:a"]);
        assert_eq!(
            kept.keys.len(),
            p.keys.len() + p.rings.len() + p.lines.len()
        );
        assert_eq!(p.lines.len(), 1, "the concurrent window keeps no line");

        // A line without the history: a ring count of 0, no ring keys.
        let lined = p.layout(&Operation::Spend {
            request_id: "r",
            cost: 3,
            reserve: Reserve::NONE,
            ticket: Some(""),
            history: false,
        });
        assert_eq!(lined.args[7], "0");
        assert_eq!(lined.keys.len(), p.keys.len() + p.lines.len());

        let sync = p.layout(&Operation::Sync {
            window: 0,
            left: 4,
            resets_in: Some(Duration::from_micros(1_500)),
        });
        assert_eq!(&sync.args[..3], ["sync", "1:1", "4"]);
        let block = p.layout(&Operation::Block(Duration::from_micros(10)));
        assert_eq!(&block.args[..2], ["block", "1"], "at least a whole ms");
        assert_eq!(p.layout(&Operation::Peek).args[0], "peek");
        assert_eq!(p.layout(&Operation::Undrift).keys, p.keys);
    }
}
