//! Responses shaped like the ones OSWorld's Flask server sends, and request
//! bodies read the way Flask reads them, so that unmodified OSWorld clients
//! see the same status codes, content types and bodies.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

/// `jsonify(...)`: compact JSON with sorted keys (serde_json's map is
/// ordered, as Flask's provider sorts) and Flask's trailing newline.
pub(crate) fn json(status: StatusCode, value: Value) -> Response {
    let mut body = serde_json::to_vec(&value).expect("serialize a serde_json::Value");
    body.push(b'\n');
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A view returning a plain string: Flask sends it as HTML.
pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// Werkzeug's HTML error page, as `abort(code, description)` and Flask's
/// own 400/404/405/415/500 produce.
pub(crate) fn http_error(status: StatusCode, description: &str) -> Response {
    let name = status.canonical_reason().unwrap_or("Error");
    let body = format!(
        "<!doctype html>\n<html lang=en>\n<title>{} {name}</title>\n<h1>{name}</h1>\n<p>{}</p>\n",
        status.as_u16(),
        html_escape(description)
    );
    text(status, body)
}

/// What Flask answers when a view raises outside its own `try`: the
/// original does so for request shapes it does not expect (a JSON `null`
/// body, a number where a list belongs).
pub(crate) fn internal_error() -> Response {
    http_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "The server encountered an internal error and was unable to complete your request. \
         Either the server is overloaded or there is an error in the application.",
    )
}

pub(crate) fn not_found() -> Response {
    http_error(
        StatusCode::NOT_FOUND,
        "The requested URL was not found on the server. If you entered the URL manually please \
         check your spelling and try again.",
    )
}

pub(crate) fn method_not_allowed() -> Response {
    http_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "The method is not allowed for the requested URL.",
    )
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `request.json` / `request.get_json()`: 415 unless the body is declared
/// JSON, 400 when it does not parse, and a JSON object otherwise. Bodies
/// that are valid JSON but not an object make the original's `data.get`
/// raise, hence the internal error.
pub(crate) fn json_object(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Map<String, Value>, Response> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let mime = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false);
    if !is_json {
        return Err(http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Did not attempt to load JSON data because the request Content-Type was not 'application/json'.",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(internal_error()),
        // The original runs with debug=True, where Flask reports the parse error.
        Err(e) => Err(http_error(
            StatusCode::BAD_REQUEST,
            &format!("Failed to decode JSON object: {e}"),
        )),
    }
}

/// Python truthiness of a JSON value, for flags such as `shell` and
/// `strict` that the original tests with a plain `if`.
pub(crate) fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// `str(value)` in Python, for messages that echo a request value.
pub(crate) fn py_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => py_list(items.iter().map(py_repr)),
        other => other.to_string(),
    }
}

fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => py_quote(s),
        other => py_str(other),
    }
}

/// Python's `repr()` of a list of strings, e.g. `['a', 'b']`.
pub(crate) fn py_list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

/// Python's `repr()` of a string (single quotes unless the string has one).
pub(crate) fn py_quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// `str(OSError)` in Python: `[Errno 2] No such file or directory: '/x'`.
pub(crate) fn py_os_error(e: &std::io::Error, path: &str) -> String {
    match e.raw_os_error() {
        Some(code) => format!(
            "[Errno {code}] {}: {}",
            nix::errno::Errno::from_raw(code).desc(),
            py_quote(path)
        ),
        None => e.to_string(),
    }
}

/// Python's `{:g}` for the timeouts echoed in messages.
pub(crate) fn py_g(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e16 {
        return format!("{}", v as i64);
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `send_file(path, as_attachment=True)`.
pub(crate) fn attachment(name: &str, len: u64, body: Body) -> Response {
    let disposition = if name.is_ascii() && !name.contains(['"', '\\']) {
        format!("attachment; filename={name}")
    } else {
        // Werkzeug sends an ASCII fallback plus RFC 5987 filename*.
        let enc: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!("attachment; filename*=UTF-8''{enc}")
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(guess_mime(name)),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    resp
}

/// The few types OSWorld tasks move around; clients only read the bytes.
fn guess_mime(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("mp4") => "video/mp4",
        Some("txt" | "log") => "text/plain; charset=utf-8",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("html" | "htm") => "text/html; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        h
    }

    #[test]
    fn json_body_needs_json_content_type() {
        let r = json_object(&HeaderMap::new(), &Bytes::from_static(b"{}")).unwrap_err();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let r = json_object(&headers("text/plain"), &Bytes::from_static(b"{}")).unwrap_err();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(json_object(
            &headers("application/json; charset=utf-8"),
            &Bytes::from_static(b"{}")
        )
        .is_ok());
    }

    #[test]
    fn malformed_json_is_400_and_non_objects_500() {
        let h = headers("application/json");
        let r = json_object(&h, &Bytes::from_static(b"{nope")).unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let r = json_object(&h, &Bytes::from_static(b"[1]")).unwrap_err();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let r = json_object(&h, &Bytes::from_static(b"")).unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn python_formatting() {
        assert!(truthy(Some(&json!("x"))) && !truthy(Some(&json!(0))) && !truthy(None));
        assert_eq!(py_str(&json!(null)), "None");
        assert_eq!(py_str(&json!(["a", "b'c"])), r#"['a', "b'c"]"#);
        assert_eq!(py_g(1800.0), "1800");
        assert_eq!(py_g(0.5), "0.5");
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            py_os_error(&e, "/x"),
            "[Errno 2] No such file or directory: '/x'"
        );
    }

    #[test]
    fn error_page_is_werkzeug_shaped() {
        let r = http_error(StatusCode::BAD_REQUEST, "a 'b'");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
    }
}
