//! A template credential's tenants as credential names
//! (`ig[account=123]`): the name `quota` shows, logs carry and every Redis
//! key of the tenant holds as its hash tag ([`crate::keys::KeySpace`]).
//! Named here, beside the credentials that have tenants; `keys` builds key
//! names from it and knows nothing of templates.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What a tenant's value keeps as written in its name: letters, digits,
/// `-`, `.` and `_`. Everything else is percent-encoded, `%` itself
/// included, so no value can end the hash tag (`}`), open another (`{`),
/// close the name early (`]`), or act as a SCAN pattern (`*`, `?`, `[`);
/// and since percent-encoding is one-to-one, two values never share keys.
const TENANT_KEEPS: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_');

/// A template credential's tenant, as a credential name: `ig[account=123]`
/// (`credential`, its template's `placeholder`, the tenant's `value`,
/// percent-encoded past letters, digits, `-`, `.` and `_`).
///
/// Why the value itself, escaped, and not a hash of it: it is one-to-one
/// by construction (a short hash is not), `quota`, logs and `redis-cli`
/// show which tenant a key is, and `quota ig` can list the tenants from
/// the keys alone (a hash could not be read back without a second key,
/// which the one-slot spend script could not write). The price is a key as
/// long as the value; fan-out values are item names, already in item keys.
pub fn tenant_name(credential: &str, placeholder: &str, value: &str) -> String {
    let escaped = utf8_percent_encode(value, TENANT_KEEPS);
    format!("{credential}[{placeholder}={escaped}]")
}

/// The tenant name `name` would be once written canonically: `name` as
/// `credential[placeholder=value]` with the value decoded and encoded
/// again (so `ig[account=a b]` and `ig[account=a%20b]` are one tenant).
/// `None` if it is not of that shape.
pub fn parse_tenant(name: &str) -> Option<(&str, &str, String)> {
    let (credential, rest) = name.split_once('[')?;
    let (placeholder, value) = rest.strip_suffix(']')?.split_once('=')?;
    let value = percent_decode_str(value).decode_utf8().ok()?;
    Some((credential, placeholder, value.into_owned()))
}
