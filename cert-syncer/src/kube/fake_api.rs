//! An in-memory apiserver for unit tests: a `kube::Client` whose requests are answered by a
//! map of objects with the API's semantics for what the code under test uses (get, create,
//! replace with resourceVersion preconditions, Status errors), without sockets, so tests can
//! run under tokio's paused clock. The real behaviour is tested end to end against
//! kube-apiserver and mini-apiserver (`tests/`); this only makes the timing and the decisions
//! testable in isolation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

/// The shared state behind [`FakeApi::client`].
#[derive(Debug, Default)]
struct State {
    /// Object path (`/api/v1/namespaces/ns/secrets/name`) → object.
    objects: BTreeMap<String, Value>,
    next_version: u64,
    /// Every request: (method, path).
    requests: Vec<(Method, String)>,
    /// Answer every request with 500 while set (an apiserver that is down).
    failing: bool,
    /// Answer this many writes (create, replace) with 409 before accepting one.
    conflicts: usize,
    /// Requests (`METHOD path` prefixes) that are received and never answered (an apiserver
    /// that accepted the connection and hangs).
    hanging: Vec<String>,
    /// How long the answer to a write (create, replace) takes; the write itself is applied
    /// when it arrives.
    write_latency: std::time::Duration,
}

/// An in-memory apiserver. Cheap to clone: clones share the objects.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    pub fn new() -> FakeApi {
        FakeApi::default()
    }

    /// A client talking to this apiserver.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                let (method, path) = (&parts.method, parts.uri.path());
                if api.hangs(method, path) {
                    api.lock().requests.push((method.clone(), path.to_owned()));
                    std::future::pending::<()>().await;
                }
                let answer = api.answer(method, path, &body);
                let latency = api.lock().write_latency;
                if matches!(*method, Method::POST | Method::PUT) && !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(answer)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The object at `path`, if any.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// Stores `object` at `path` as if someone else wrote it (a new resourceVersion).
    pub fn put(&self, path: &str, mut object: Value) {
        let mut state = self.lock();
        state.next_version += 1;
        object["metadata"]["resourceVersion"] = json!(state.next_version.to_string());
        state.objects.insert(path.to_owned(), object);
    }

    /// Removes the object at `path`, as if someone else deleted it.
    pub fn remove(&self, path: &str) {
        self.lock().objects.remove(path);
    }

    /// Every object whose path starts with `prefix` (the Events of a namespace).
    pub fn objects_under(&self, prefix: &str) -> Vec<Value> {
        self.lock()
            .objects
            .range(prefix.to_owned()..)
            .take_while(|(path, _)| path.starts_with(prefix))
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Every request so far, as `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.lock()
            .requests
            .iter()
            .map(|(method, path)| format!("{method} {path}"))
            .collect()
    }

    /// While `failing`, every request gets a 500.
    pub fn set_failing(&self, failing: bool) {
        self.lock().failing = failing;
    }

    /// The next `n` writes get a 409 Conflict.
    pub fn conflict_next_writes(&self, n: usize) {
        self.lock().conflicts = n;
    }

    /// Requests whose `METHOD path` starts with `prefix` are received and never answered.
    pub fn hang(&self, prefix: &str) {
        self.lock().hanging.push(prefix.to_owned());
    }

    /// Writes are applied when they arrive and answered `latency` later.
    pub fn set_write_latency(&self, latency: std::time::Duration) {
        self.lock().write_latency = latency;
    }

    fn hangs(&self, method: &Method, path: &str) -> bool {
        let request = format!("{method} {path}");
        self.lock().hanging.iter().any(|p| request.starts_with(p))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn answer(&self, method: &Method, path: &str, body: &[u8]) -> Response<Full<Bytes>> {
        let mut state = self.lock();
        state.requests.push((method.clone(), path.to_owned()));
        if state.failing {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "down");
        }
        match *method {
            Method::GET => match state.objects.get(path) {
                Some(object) => json_response(StatusCode::OK, object),
                None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
            },
            Method::POST | Method::PUT => {
                let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
                };
                if state.conflicts > 0 {
                    state.conflicts -= 1;
                    return status(StatusCode::CONFLICT, "Conflict", "injected conflict");
                }
                let name = object["metadata"]["name"].as_str().map(str::to_owned);
                let item = match (method, name) {
                    (&Method::POST, Some(name)) => format!("{path}/{name}"),
                    // Events: generateName.
                    (&Method::POST, None) => {
                        format!("{path}/generated-{}", state.next_version + 1)
                    }
                    _ => path.to_owned(),
                };
                let existing = state.objects.get(&item);
                let code = if *method == Method::POST {
                    if existing.is_some() {
                        return status(StatusCode::CONFLICT, "AlreadyExists", "already exists");
                    }
                    StatusCode::CREATED
                } else {
                    let Some(existing) = existing else {
                        return status(StatusCode::NOT_FOUND, "NotFound", "not found");
                    };
                    let sent = &object["metadata"]["resourceVersion"];
                    if !sent.is_null() && *sent != existing["metadata"]["resourceVersion"] {
                        return status(StatusCode::CONFLICT, "Conflict", "the object changed");
                    }
                    StatusCode::OK
                };
                state.next_version += 1;
                object["metadata"]["resourceVersion"] = json!(state.next_version.to_string());
                state.objects.insert(item, object.clone());
                json_response(code, &object)
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "no"),
        }
    }
}

fn json_response(code: StatusCode, object: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .expect("a valid response")
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    json_response(
        code,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        }),
    )
}
