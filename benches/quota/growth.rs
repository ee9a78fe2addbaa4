//! Section `growth`: not written yet.

use crate::Ctx;
use crate::report::Section;

pub async fn run(_ctx: &Ctx) -> Section {
    Section {
        key: "growth",
        title: "growth".into(),
        markdown: "not measured yet\n".into(),
        data: serde_json::Value::Null,
        targets: Vec::new(),
    }
}
