//! What a spend decided, as data: admitted, let through unchecked, or
//! refused with its retry-after and the limit that refused it; and the
//! spend core's reply turned into one.

use std::time::Duration;

use super::{Plan, QuotaError};

/// What a spend decided.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Recorded in every window.
    Allowed {
        /// Units left in the tightest window after this spend.
        remaining: u64,
    },
    /// Redis could not answer and the endpoint is `fail-open`: let through
    /// without being recorded.
    Unchecked,
    /// Not recorded anywhere.
    Rejected(Rejection),
}

impl Decision {
    /// Whether the request may go to the upstream.
    pub fn is_allowed(&self) -> bool {
        !matches!(self, Decision::Rejected(_))
    }

    /// This decision, a refusal by one of `plan`'s concurrent windows
    /// named as such ([`RejectedBy::InFlight`]).
    pub(super) fn in_flight(self, plan: &Plan) -> Self {
        match self {
            Decision::Rejected(
                r @ Rejection {
                    by: RejectedBy::Window(n),
                    ..
                },
            ) if plan
                .windows
                .get(n - 1)
                .is_some_and(|w| w.window.is_concurrent()) =>
            {
                Decision::Rejected(Rejection {
                    by: RejectedBy::InFlight(n),
                    ..r
                })
            }
            other => other,
        }
    }
}

/// What a spend decided, and which shadow windows would have refused it.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    /// What the enforced windows decided.
    pub decision: Decision,
    /// The shadow windows (`mode = "shadow"`) that would have refused this
    /// admitted spend, by their 1-based numbers as [`RejectedBy::Window`]
    /// numbers them; empty when none would have, or the spend was refused.
    pub shadow_refused: Vec<usize>,
}

/// Why and for how long a spend was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Units left in the tightest window, as it stands.
    pub remaining: u64,
    /// When a spend of the same cost would be admitted if nobody else spent.
    pub retry_after: Duration,
    /// Which limit frees last.
    pub by: RejectedBy,
}

/// The limit that refused a spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectedBy {
    /// A window, by its 1-based number (credential windows first).
    Window(usize),
    /// A concurrent window, by its 1-based number: as many requests are in
    /// flight as it allows. The wait (at most 1 s) is momentary.
    InFlight(usize),
    /// The credential is blocked after the upstream throttled it.
    Blocked,
}

impl RejectedBy {
    /// The spend script's `rejecting_window` (0 for a block).
    pub(crate) fn window_number(self) -> usize {
        match self {
            RejectedBy::Window(n) | RejectedBy::InFlight(n) => n,
            RejectedBy::Blocked => 0,
        }
    }
}

/// Turns a reply that carried a spend's into the spend's own: its values
/// as numbers, or a script error (`QuotaError::Script`).
pub(crate) fn spend_reply(values: &[String]) -> Result<Vec<i64>, QuotaError> {
    match values {
        [flag, message] if flag == "error" => Err(QuotaError::Script(message.clone())),
        _ => (values.iter())
            .map(|v| v.parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| QuotaError::Script(format!("spend returned {values:?}"))),
    }
}

pub(super) fn decision(r: &[i64]) -> Result<Decision, QuotaError> {
    // After the four: the shadow windows that would have refused
    // ([`shadow::refused`]).
    let [allowed, remaining, retry_ms, window, ..] = r else {
        return Err(QuotaError::Script(format!("spend returned {r:?}")));
    };
    let remaining = (*remaining).max(0) as u64;
    Ok(if *allowed == 1 {
        Decision::Allowed { remaining }
    } else {
        Decision::Rejected(Rejection {
            remaining,
            retry_after: Duration::from_millis((*retry_ms).max(1) as u64),
            by: if *window > 0 {
                RejectedBy::Window(*window as usize)
            } else {
                RejectedBy::Blocked
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_maps_the_script_reply() {
        assert_eq!(
            decision(&[1, 850, 0, 0]).unwrap(),
            Decision::Allowed { remaining: 850 }
        );
        let d = decision(&[0, 50, 59_932, 1]).unwrap();
        assert_eq!(
            d,
            Decision::Rejected(Rejection {
                remaining: 50,
                retry_after: Duration::from_millis(59_932),
                by: RejectedBy::Window(1)
            })
        );
        assert!(!d.is_allowed());
        let blocked = decision(&[0, 50, 5_000, 0]).unwrap();
        assert!(matches!(
            blocked,
            Decision::Rejected(Rejection {
                by: RejectedBy::Blocked,
                ..
            })
        ));
        assert!(decision(&[1, 2]).is_err());
        assert_eq!(
            decision(&[1, 7, 0, 0, 2, 3]).unwrap(),
            Decision::Allowed { remaining: 7 },
            "shadow refusals follow an admitted spend's four values"
        );
    }
}
