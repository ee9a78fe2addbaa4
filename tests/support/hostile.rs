//! A hostile upstream on loopback, for the hardening tests (issue 9): it
//! redirects anywhere, loops, answers with huge, endless and echoing bodies
//! and absurd headers, and records every request it receives (method, target
//! as sent, headers, body). A second instance plays "the foreign host" that
//! nothing may ever reach. Each runs on its own runtime and stops on `Drop`.
//!
//! Routes (the path decides; query parameters are percent-decoded):
//!
//! | path | answer |
//! |---|---|
//! | `/redirect/{code}?to=URL` | `code` with `Location: URL` |
//! | `/loop` | 302 to `/loop`, for ever |
//! | `/hop/{n}` | 302 to `/hop/{n-1}`; `/hop/0` is 200 with one record |
//! | `/big/{bytes}` | 200, `Content-Length: bytes`, that many bytes |
//! | `/chunked/{bytes}` | 200, chunked, that many bytes |
//! | `/endless` | 200, chunked, never ends |
//! | `/echo/{status}` | `status`, the body repeats the request (target, headers, body) |
//! | `/throttle?ra=V` | 429 with `Retry-After: V` |
//! | `/cost?v=V` | 200 with one record and `x-quota-cost: V` |
//! | `/cursor` | 200 with one record and `nextPageToken: "same"`, always |
//! | `/canned/{name}` | what [`Hostile::answer`] set for `name` (status, headers, body as bytes) |
//! | `/auth?key=K` | 200 with one record echoing `K` if [`Hostile::accept_tokens`] holds it, else 401 |
//! | anything else | 200 with one record |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target as sent: path and query, still percent-encoded.
    pub target: String,
    /// Every header, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Seen {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The target's path.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The target's query pairs, decoded.
    pub fn query(&self) -> Vec<(String, String)> {
        let url = reqwest::Url::parse(&format!("http://x{}", self.target)).expect("target");
        url.query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// An answer set in advance: status, headers, body.
#[derive(Debug, Clone)]
struct Canned {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

type Answers = Arc<Mutex<HashMap<String, Canned>>>;

/// What the handler shares with the test.
#[derive(Clone)]
struct Shared {
    seen: Log,
    answers: Answers,
    tokens: Tokens,
}

/// The tokens `/auth` accepts.
type Tokens = Arc<Mutex<Vec<String>>>;

/// A running hostile upstream.
pub struct Hostile {
    addr: SocketAddr,
    seen: Log,
    answers: Answers,
    tokens: Tokens,
    rt: Option<tokio::runtime::Runtime>,
}

const CHUNK: usize = 64 * 1024;

impl Hostile {
    /// Starts one on a free 127.0.0.1 port.
    pub fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let seen: Log = Arc::default();
        let answers: Answers = Arc::default();
        let tokens: Tokens = Arc::default();
        let state = Shared {
            seen: seen.clone(),
            answers: answers.clone(),
            tokens: tokens.clone(),
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        rt.spawn(async move {
            let app = axum::Router::new().fallback(handle).with_state(state);
            let _ = axum::serve(listener, app).await;
        });
        Hostile {
            addr,
            seen,
            answers,
            tokens,
            rt: Some(rt),
        }
    }

    /// Makes `/auth` accept exactly `tokens` (a token not among them: 401).
    pub fn accept_tokens(&self, tokens: &[&str]) {
        *self.tokens.lock().expect("tokens") = tokens.iter().map(|t| (*t).to_owned()).collect();
    }

    /// Makes `/canned/{name}` answer `status` with `headers` (values as
    /// bytes, sent as they are) and `body`.
    pub fn answer(
        &self,
        name: &str,
        status: u16,
        headers: &[(&str, &[u8])],
        body: impl Into<Vec<u8>>,
    ) {
        let canned = Canned {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
            body: Bytes::from(body.into()),
        };
        self.answers
            .lock()
            .expect("answers")
            .insert(name.to_owned(), canned);
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.seen.lock().expect("log").len()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        // Open streams (an endless body) end with the runtime.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn query(req_target: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(&format!("http://x{req_target}")).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn one_record(id: &str) -> String {
    serde_json::json!({ "items": [{ "id": id }] }).to_string()
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `bytes` bytes of `x`, in chunks; `None` for no end.
fn stream(bytes: Option<u64>) -> Body {
    let chunk = Bytes::from(vec![b'x'; CHUNK]);
    let chunks = futures::stream::unfold(bytes, move |left| {
        let chunk = chunk.clone();
        async move {
            match left {
                Some(0) => None,
                Some(n) => {
                    let take = n.min(CHUNK as u64);
                    Some((
                        Ok::<_, std::io::Error>(chunk.slice(..take as usize)),
                        Some(n - take),
                    ))
                }
                None => Some((Ok(chunk), None)),
            }
        }
    });
    Body::from_stream(chunks)
}

async fn handle(State(shared): State<Shared>, req: Request) -> Response {
    let method = req.method().to_string();
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let seen = Seen {
        method,
        target: target.clone(),
        headers,
        body,
    };
    shared.seen.lock().expect("log").push(seen.clone());

    let path = seen.path().to_owned();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (first, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match first {
        "redirect" => {
            let code = rest.parse::<u16>().unwrap_or(302);
            let to = query(&target, "to").unwrap_or_else(|| "/".into());
            Response::builder()
                .status(code)
                .header(header::LOCATION, to)
                .body(Body::from("moved"))
                .expect("response")
        }
        "loop" => Response::builder()
            .status(302)
            .header(header::LOCATION, "/loop")
            .body(Body::empty())
            .expect("response"),
        "hop" => match rest.parse::<u32>().unwrap_or(0) {
            0 => json(StatusCode::OK, one_record("end")),
            n => Response::builder()
                .status(302)
                .header(header::LOCATION, format!("/hop/{}", n - 1))
                .body(Body::empty())
                .expect("response"),
        },
        "big" => {
            let n = rest.parse::<u64>().unwrap_or(0);
            let mut resp = Response::new(stream(Some(n)));
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            resp
        }
        "chunked" => Response::new(stream(Some(rest.parse::<u64>().unwrap_or(0)))),
        "endless" => Response::new(stream(None)),
        "echo" => {
            let status =
                StatusCode::from_u16(rest.parse().unwrap_or(404)).unwrap_or(StatusCode::NOT_FOUND);
            let mut text = format!("you asked for {} {}\n", seen.method, seen.target);
            for (k, v) in &seen.headers {
                text.push_str(&format!("{k}: {v}\n"));
            }
            text.push_str(&seen.body);
            (status, text).into_response()
        }
        "throttle" => {
            let ra = query(&target, "ra").unwrap_or_default();
            let mut resp = (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
            if let Ok(v) = HeaderValue::from_str(&ra) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            resp
        }
        "cost" => {
            let mut resp = json(StatusCode::OK, one_record("cost"));
            if let Some(v) = query(&target, "v").and_then(|v| HeaderValue::from_str(&v).ok()) {
                resp.headers_mut().insert("x-quota-cost", v);
            }
            resp
        }
        "canned" => {
            let canned = shared.answers.lock().expect("answers").get(rest).cloned();
            let Some(c) = canned else {
                return (StatusCode::NOT_FOUND, "nothing canned here").into_response();
            };
            let mut resp = Response::new(Body::from(c.body));
            *resp.status_mut() = StatusCode::from_u16(c.status).expect("status");
            for (k, v) in c.headers {
                let name = header::HeaderName::from_bytes(k.as_bytes()).expect("header name");
                resp.headers_mut()
                    .append(name, HeaderValue::from_bytes(&v).expect("header value"));
            }
            resp
        }
        "auth" => {
            let key = query(&target, "key").unwrap_or_default();
            if shared.tokens.lock().expect("tokens").contains(&key) {
                let body = serde_json::json!({ "items": [{ "id": "auth", "token": key }] });
                json(StatusCode::OK, body.to_string())
            } else {
                json(
                    StatusCode::UNAUTHORIZED,
                    r#"{"message":"Bad credentials"}"#.to_owned(),
                )
            }
        }
        "cursor" => json(
            StatusCode::OK,
            serde_json::json!({ "items": [{ "id": "1" }], "nextPageToken": "same" }).to_string(),
        ),
        _ => json(StatusCode::OK, one_record(&path)),
    }
}
