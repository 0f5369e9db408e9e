//! Who may do what: the bearer token of write endpoints, the `Host` check of a loopback server (against DNS
//! rebinding) and the `Origin` check of writes (against cross-site requests from a browser), plus the security
//! headers of every response.

use crate::{AppState, WebError};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::fmt;

/// The bearer token write endpoints require. Comes from the environment only; never printed (its `Debug` shows
/// stars) and compared in constant time.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// The shortest token accepted: a guessable token on a public address is no protection.
    pub const MIN_LEN: usize = 16;

    /// Wraps a token, refusing one that is too short or holds characters a header cannot carry.
    pub fn new(secret: String) -> Result<Token, WebError> {
        if secret.chars().count() < Self::MIN_LEN {
            return Err(WebError::Config(format!(
                "TOOLTUNE_TOKEN is too short: use at least {} characters",
                Self::MIN_LEN
            )));
        }
        if !secret.chars().all(|c| c.is_ascii_graphic()) {
            return Err(WebError::Config(
                "TOOLTUNE_TOKEN must be printable ASCII without spaces".into(),
            ));
        }
        Ok(Token(secret))
    }

    /// Reads `name` from the environment: `Ok(None)` when unset or empty.
    pub fn from_env(name: &str) -> Result<Option<Token>, WebError> {
        match std::env::var(name) {
            Ok(s) if !s.is_empty() => Token::new(s).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        let mut diff = a.len() ^ b.len();
        for (i, x) in a.iter().enumerate() {
            diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

/// Whether a `Host` header (name or address, optional port) names this machine's loopback interface.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1]:port
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host)
    };
    let name = name.to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// The `host[:port]` part of an `Origin` header, `None` for `null` or a malformed value.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.split('/').next().unwrap_or(rest))
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks one request against the rules in the module docs.
fn check(state: &AppState, method: &Method, headers: &HeaderMap) -> Result<(), WebError> {
    let host = header_str(headers, header::HOST).unwrap_or("");
    if state.cfg.bind.ip().is_loopback() && !is_loopback_host(host) {
        return Err(WebError::Forbidden(format!(
            "this server answers loopback names only, not `{host}`"
        )));
    }
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !writes {
        return Ok(());
    }
    if let Some(origin) = header_str(headers, header::ORIGIN) {
        let same = origin_authority(origin).is_some_and(|a| a.eq_ignore_ascii_case(host));
        if !same {
            return Err(WebError::Forbidden(
                "cross-origin writes are refused".into(),
            ));
        }
    }
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return Err(WebError::Forbidden("cross-site writes are refused".into()));
    }
    if let Some(token) = &state.cfg.token {
        let presented = header_str(headers, header::AUTHORIZATION)
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !presented.is_some_and(|p| token.matches(p)) {
            return Err(WebError::Unauthorized);
        }
    }
    Ok(())
}

/// The middleware: refuses what [`check`] refuses, and adds security headers to every response.
pub(crate) async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut response = match check(&state, req.method(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    };
    let h = response.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Scripts only from our own static file: text from traces can never run, even if escaping had a hole.
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
             object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
        ));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:80",
            "127.1.2.3",
            "app.localhost:3000",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["evil.example", "10.0.0.1:80", "", "localhost.evil.example"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn origins() {
        assert_eq!(
            origin_authority("http://127.0.0.1:5000"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(origin_authority("null"), None);
    }

    #[test]
    fn tokens() {
        assert!(Token::new("short".into()).is_err());
        assert!(Token::new("has a space in it!!".into()).is_err());
        let t = Token::new("0123456789abcdef".into()).expect("token");
        assert!(t.matches("0123456789abcdef"));
        assert!(!t.matches("0123456789abcdeF"));
        assert!(!t.matches("0123456789abcdef0"));
        assert!(!t.matches(""));
        assert_eq!(format!("{t:?}"), "Token(***)");
    }
}
