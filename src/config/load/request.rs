//! `[job.request]`, and the check every template of a job goes through: each
//! `{placeholder}` must have a value, and `{secret}` goes only where it is
//! sent to the upstream, never into a file name.

use super::Loader;
use crate::config::defaults as d;
use crate::config::raw::RawRequest;
use crate::config::{FieldPath, RequestTemplate, Source, Template};

/// The placeholders a job's templates may use: its fan-out keys and
/// `fan_out_from` columns, `{job}` and `{date}`, and in the request (not in
/// file names) `{secret}`, `{since}` and `{since_epoch}`.
pub(super) struct Placeholders<'a> {
    fan_out: Vec<&'a str>,
    /// A `fan_out_from` whose columns could not be read (reported): any
    /// name may be one of them, so none is reported again.
    unknown_columns: bool,
}

/// Placeholders the request may use and file names may not: the secret,
/// and the item's `{since}` (which changes every run).
const REQUEST_ONLY: [&str; 3] = ["secret", "since", "since_epoch"];

impl<'a> Placeholders<'a> {
    /// A job's: its `fan_out_from` columns, then its `fan_out` keys.
    pub(super) fn of(columns: &'a [String], fan_out: &'a [(String, Vec<String>)]) -> Self {
        let keys = fan_out.iter().map(|(k, _)| k.as_str());
        Placeholders {
            fan_out: columns.iter().map(String::as_str).chain(keys).collect(),
            unknown_columns: false,
        }
    }

    /// Also any name: the job's `fan_out_from` failed to load (reported).
    pub(super) fn with_unknown_columns(mut self, unknown: bool) -> Self {
        self.unknown_columns = unknown;
        self
    }

    fn has(&self, name: &str, secret_ok: bool) -> bool {
        (self.unknown_columns && name != "secret")
            || self.fan_out.contains(&name)
            || name == "job"
            || name == "date"
            || (secret_ok && REQUEST_ONLY.contains(&name))
    }

    /// Why `name` may not be used here.
    fn why_not(&self, name: &str, secret_ok: bool) -> String {
        if name == "secret" {
            return "{secret} may not appear here: it would leak the key into file names".into();
        }
        if REQUEST_ONLY.contains(&name) {
            return format!("{{{name}}} may only appear in the request");
        }
        let mut have: Vec<String> = self.fan_out.iter().map(|k| format!("{{{k}}}")).collect();
        have.extend(["{job}", "{date}"].map(String::from));
        if secret_ok {
            have.extend(REQUEST_ONLY.map(|n| format!("{{{n}}}")));
        }
        format!(
            "placeholder {{{name}}} has no value (available: {})",
            have.join(", ")
        )
    }
}

impl Loader<'_> {
    /// Parses the template written at `at` and checks its placeholders.
    pub(super) fn template(
        &mut self,
        src: &Source,
        at: &FieldPath,
        written: &str,
        places: &Placeholders<'_>,
        secret_ok: bool,
    ) -> Option<Template> {
        let t = match Template::parse(written) {
            Ok(t) => t,
            Err(e) => {
                self.error(src, at, format!("bad template {written:?}: {e}"));
                return None;
            }
        };
        for ph in t.placeholders() {
            if !places.has(ph, secret_ok) {
                self.error(src, at, places.why_not(ph, secret_ok));
            }
        }
        Some(t)
    }

    /// `[NAME.request]`: method, URL, query, headers and body; every value
    /// a template that may send `{secret}`.
    pub(super) fn request(
        &mut self,
        src: &Source,
        base: &FieldPath,
        req: &RawRequest,
        places: &Placeholders<'_>,
    ) -> Option<RequestTemplate> {
        let url = self.template(src, &base.join("url"), &req.url, places, true);
        let query = self.template_table(src, &base.join("query"), &req.query, places);
        let headers = self.template_table(src, &base.join("headers"), &req.headers, places);
        let body = req
            .body
            .as_ref()
            .and_then(|b| self.template(src, &base.join("body"), b, places, true));
        if let Some(url) = &url {
            self.check_url(src, &base.join("url"), url, &req.url);
        }
        let method = req.method.as_deref().map(str::to_ascii_uppercase);
        let method = self.pick_or(src, &base.join("method"), method.as_deref(), d::METHOD);
        for (k, v) in &req.headers {
            let at = base.join("headers").join(k.as_str());
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                let msg = format!("invalid header name {k:?}");
                self.error(src, &at, msg);
            }
            // The template's own text must make a sendable value (a CR or
            // LF in it never would); placeholder values are checked per
            // request, before anything is spent.
            let sample = Template::parse(v).map(|t| t.render(|_| Some("x")));
            if sample.is_ok_and(|s| reqwest::header::HeaderValue::from_str(&s).is_err()) {
                self.error(
                    src,
                    &at,
                    "invalid header value: control characters (CR, LF, NUL, ...) cannot be sent in a header",
                );
            }
        }
        Some(RequestTemplate {
            method,
            url: url?,
            query,
            headers,
            body,
        })
    }

    /// `query` or `headers`: name → template, in config order.
    fn template_table(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: &indexmap::IndexMap<String, String>,
        places: &Placeholders<'_>,
    ) -> Vec<(String, Template)> {
        raw.iter()
            .filter_map(|(k, v)| {
                let t = self.template(src, &base.join(k.as_str()), v, places, true)?;
                Some((k.clone(), t))
            })
            .collect()
    }

    /// The URL, every placeholder filled with a sample, must be http(s).
    fn check_url(&mut self, src: &Source, at: &FieldPath, url: &Template, written: &str) {
        let sample = url.render(|_| Some("x"));
        match reqwest::Url::parse(&sample) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
            Ok(u) => {
                let msg = format!("scheme {:?} is not http or https", u.scheme());
                self.error(src, at, msg);
            }
            Err(e) => self.error(src, at, format!("invalid URL {written:?}: {e}")),
        }
    }
}
