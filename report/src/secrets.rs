//! Keeping credentials out of the report. Model specs are normally `local`, `local:fast` or
//! `openai:MODEL@BASE_URL` (the API key itself lives in an environment variable and is never stored), but a user
//! can paste a key into a URL; the report is a file people share, so anything that looks like a credential is left
//! out.

/// Whether `s` looks like it carries a credential: a key or token parameter, a bearer or authorization header, a
/// password in a URL, an OpenAI-style `sk-` key, or a long random-looking run of letters and digits.
pub fn looks_secret(s: &str) -> bool {
    let l = s.to_ascii_lowercase();
    const WORDS: [&str; 11] = [
        "api_key",
        "api-key",
        "apikey",
        "access_token",
        "token=",
        "key=",
        "secret",
        "password",
        "passwd",
        "bearer",
        "authorization",
    ];
    if WORDS.iter().any(|w| l.contains(w)) {
        return true;
    }
    if let Some((_, rest)) = s.split_once("://")
        && let Some((userinfo, _)) = rest.split_once('@')
        && !userinfo.contains('/')
        && userinfo.contains(':')
    {
        return true;
    }
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .any(|tok| {
            let sk = tok.starts_with("sk-") && tok.len() >= 20;
            let random = tok.len() >= 32
                && tok.chars().any(|c| c.is_ascii_digit())
                && tok.chars().any(|c| c.is_ascii_alphabetic());
            sk || random
        })
}

/// `spec` as is, or a placeholder when it looks like it carries a credential.
pub fn redact_spec(spec: &str) -> String {
    if looks_secret(spec) {
        "[hidden: looks like it contains a credential]".to_string()
    } else {
        spec.to_string()
    }
}

/// `text` with every whitespace-separated word that looks like a credential replaced by `[redacted]`, and the word
/// after `Bearer` or `Authorization:` too (for error messages, which may quote a URL or a header).
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let mut next_is_secret = false;
    let mut flush = |out: &mut String, word: &mut String| {
        if word.is_empty() {
            return;
        }
        if next_is_secret || looks_secret(word) {
            out.push_str("[redacted]");
        } else {
            out.push_str(word);
        }
        let l = word.to_ascii_lowercase();
        next_is_secret = l == "bearer" || l.starts_with("authorization");
        word.clear();
    };
    for c in text.chars() {
        if c.is_whitespace() {
            flush(&mut out, &mut word);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut out, &mut word);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_specs_are_shown() {
        for s in [
            "local",
            "local:fast",
            "openai:gpt-4o-mini@https://llm.example.org/v1",
            "openai:meta-llama/Llama-3.1-8B-Instruct@http://127.0.0.1:8080/v1",
        ] {
            assert!(!looks_secret(s), "{s}");
            assert_eq!(redact_spec(s), s);
        }
    }

    #[test]
    fn specs_with_credentials_are_hidden() {
        for s in [
            "openai:m@https://llm.example.org/v1?api_key=abc",
            "openai:m@https://user:hunter2@llm.example.org/v1",
            "Bearer abc",
            "openai:m@https://llm.example.org/v1?token=abc",
            "sk-proj-aaaaaaaaaaaaaaaaaaaaaaaa",
            "openai:m@https://llm.example.org/0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f",
        ] {
            assert!(looks_secret(s), "{s}");
            assert!(!redact_spec(s).contains("abc"));
        }
    }

    #[test]
    fn error_text_keeps_its_words_but_not_the_credential() {
        assert_eq!(
            redact_text("request to https://u:pw@h/v1 failed:\n401 Bearer xyz"),
            "request to [redacted] failed:\n401 [redacted] [redacted]"
        );
    }
}
