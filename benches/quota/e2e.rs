//! Section `e2e`: not written yet.

use crate::Ctx;
use crate::report::Section;

pub async fn run(_ctx: &Ctx) -> Section {
    Section {
        key: "e2e",
        title: "e2e".into(),
        markdown: "not measured yet\n".into(),
        data: serde_json::Value::Null,
        targets: Vec::new(),
    }
}
