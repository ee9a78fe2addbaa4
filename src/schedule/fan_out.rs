//! A tick's fan-out: one task per combination of the job's `fan_out` values.

use crate::config::Job;
use crate::queue::{Origin, TaskArgs};

/// Every fan-out combination of `job`, in a stable order.
fn fan_out(job: &Job) -> Vec<Vec<(String, String)>> {
    let mut items: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (key, values) in &job.fan_out {
        items = items
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push((key.clone(), v.clone()));
                    next
                })
            })
            .collect();
    }
    items
}

/// The tasks of one tick of `job` at `tick_ms`.
pub fn tick_tasks(job: &Job, tick_ms: i64, origin: Origin) -> Vec<TaskArgs> {
    fan_out(job)
        .into_iter()
        .enumerate()
        .map(|(i, item)| TaskArgs::first(&job.name, tick_ms, i as u64, item, origin))
        .collect()
}
