//! Section `exactness`: not written yet.

use crate::Ctx;
use crate::report::Section;

pub async fn run(_ctx: &Ctx) -> Section {
    Section {
        key: "exactness",
        title: "exactness".into(),
        markdown: "not measured yet\n".into(),
        data: serde_json::Value::Null,
        targets: Vec::new(),
    }
}
