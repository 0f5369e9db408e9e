//! A strict JSON scanner for the readers' fastest first pass: it walks a record's text without building anything,
//! hands out the text of the values a reader needs, and recognises a value it has already checked by comparing
//! bytes.
//!
//! Trace formats repeat themselves: every model turn of a Langfuse trace carries the whole tool list and the whole
//! message history again. serde_json has to read each copy character by character, even to skip it. Here a value
//! whose text equals one checked before (earlier in the record, or a tool list seen in an earlier record) is skipped
//! with one comparison: equal text is the same complete JSON value.
//!
//! The scanner never decides an error. It accepts only what serde_json accepts, and it gives up ([`Reject`]) on
//! anything it is not sure of: invalid JSON, but also escaped keys, surrogate escapes, numbers near the limits of
//! `f64`, nesting deeper than [`MAX_DEPTH`]. The caller then reads the record with serde_json, which either reads it
//! or names its error exactly as it always has. So the scanner may be stricter than serde_json, never looser.

use std::borrow::Cow;

/// The scanner gave up on a record: it is invalid, or holds something the scanner leaves to serde_json.
#[derive(Debug)]
pub(crate) struct Reject;

/// Deeper nesting is left to serde_json, whose own limit is 128 (counted the same way: one per array or object).
/// Staying under it means a value the scanner accepts also nests legally wherever serde_json meets it.
pub(crate) const MAX_DEPTH: usize = 100;

/// A value the scanner checked once, kept to recognise its copies: its text and how deep it nests.
#[derive(Clone, Copy)]
pub(crate) struct Known<'t> {
    pub(crate) text: &'t str,
    pub(crate) depth: usize,
}

/// A position in one record's text.
pub(crate) struct Scan<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
    /// The deepest nesting reached so far, for [`Known::depth`].
    peak: usize,
}

/// Bit `k` of the result is set when byte `i + k` of `b` is a quote, a backslash or a control character (which JSON
/// forbids unescaped in a string), for `k` in `0..16`; bytes past the end of `b` read as zero, so they are flagged
/// too. Sixteen bytes at a time, and every special byte of the block at once: the strings inside a trace's strings
/// (messages, tool definitions) have an escaped quote every few characters, and a word-at-a-time search stopped and
/// started again at each of them.
#[inline]
fn specials(b: &[u8], i: usize) -> u32 {
    match b.get(i..i + 16).and_then(|c| <&[u8; 16]>::try_from(c).ok()) {
        Some(block) => block16::specials(block),
        None => {
            let mut block = [0u8; 16];
            let rest = b.get(i..).unwrap_or_default();
            block[..rest.len()].copy_from_slice(rest);
            block16::specials(&block)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // The workspace denies unsafe code; std's SIMD intrinsics can only be called in unsafe code.
mod block16 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    /// See [`super::specials`].
    #[inline]
    pub(super) fn specials(block: &[u8; 16]) -> u32 {
        // SAFETY: SSE2 is part of the x86_64 baseline, so every x86_64 CPU has the feature `sse2` asks for.
        unsafe { sse2(block) }
    }

    #[target_feature(enable = "sse2")]
    fn sse2(block: &[u8; 16]) -> u32 {
        // SAFETY: `block` is 16 readable bytes, and an unaligned load has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(block.as_ptr().cast::<__m128i>()) };
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let slash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Unsigned `v <= 0x1f`: the larger of the two is 0x1f only then.
        let control = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x1f)), _mm_set1_epi8(0x1f));
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, slash), control)) as u32
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod block16 {
    /// See [`super::specials`].
    #[inline]
    pub(super) fn specials(block: &[u8; 16]) -> u32 {
        block.iter().enumerate().fold(0, |m, (k, &c)| {
            m | (u32::from(c == b'"' || c == b'\\' || c < 0x20) << k)
        })
    }
}

/// Sets a field once: a derived `Deserialize` rejects a repeated field.
pub(crate) fn once<T>(slot: &mut Option<T>, v: T) -> Result<(), Reject> {
    match slot {
        Some(_) => Err(Reject),
        None => {
            *slot = Some(v);
            Ok(())
        }
    }
}

/// An `Option` field: `null` is `None`, anything else what `f` reads.
pub(crate) fn opt<'a, T>(
    s: &mut Scan<'a>,
    f: impl FnOnce(&mut Scan<'a>) -> Result<T, Reject>,
) -> Result<Option<T>, Reject> {
    if s.null()? { Ok(None) } else { f(s).map(Some) }
}

/// An array, each element read by `f`.
pub(crate) fn list<'a, T>(
    s: &mut Scan<'a>,
    mut f: impl FnMut(&mut Scan<'a>) -> Result<T, Reject>,
) -> Result<Vec<T>, Reject> {
    // Lists of spans' attributes, observations and messages are mostly a few to a dozen or two long: start where
    // most end instead of at four and growing.
    let mut out = Vec::with_capacity(16);
    s.array(|s, _| {
        out.push(f(s)?);
        Ok(())
    })?;
    Ok(out)
}

/// The text of a string the scanner has already checked (between its quotes, as written): borrowed unless it has
/// escapes, then unescaped. It is not scanned again, only searched for a backslash. Gives up as [`unescape`] does.
pub(crate) fn checked_text(raw: &str) -> Result<Cow<'_, str>, Reject> {
    match memchr::memchr(b'\\', raw.as_bytes()) {
        None => Ok(Cow::Borrowed(raw)),
        Some(_) => unescape(raw).map(Cow::Owned),
    }
}

/// The text of a JSON string (between its quotes, as written), unescaped as serde_json unescapes it. Gives up on
/// surrogate escapes (which serde_json pairs or rejects), on invalid escapes, and on what a checked string cannot
/// hold (an unescaped quote or control character).
pub(crate) fn unescape(raw: &str) -> Result<String, Reject> {
    let b = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    // The escapes are found a block of sixteen bytes at a time (see [`specials`]): JSON written into a string has
    // an escaped quote every few characters, and searching afresh for each one cost more than the copying.
    let mut base = 0;
    let mut flags = specials(b, 0);
    // Where the text not yet copied begins.
    let mut i = 0;
    loop {
        if flags == 0 {
            base += 16;
            if base >= b.len() {
                break;
            }
            flags = specials(b, base);
            continue;
        }
        let at = base + flags.trailing_zeros() as usize;
        if at >= b.len() {
            break;
        }
        if b[at] != b'\\' {
            return Err(Reject);
        }
        // Runs between escapes are short: copied as a whole block of sixteen and cut back, the copy is a couple of
        // instructions instead of a call. `out` never outgrows its capacity: it holds at most the `i` bytes read.
        match raw.get(i..i + 16) {
            Some(block) if at - i <= 16 => {
                out.push_str(block);
                out.truncate(out.len() - (16 - (at - i)));
            }
            _ => out.push_str(raw.get(i..at).ok_or(Reject)?),
        }
        let (c, len) = match b.get(at + 1) {
            Some(b'"') => ('"', 2),
            Some(b'\\') => ('\\', 2),
            Some(b'/') => ('/', 2),
            Some(b'b') => ('\u{8}', 2),
            Some(b'f') => ('\u{c}', 2),
            Some(b'n') => ('\n', 2),
            Some(b'r') => ('\r', 2),
            Some(b't') => ('\t', 2),
            Some(b'u') => {
                let hex = raw.get(at + 2..at + 6).ok_or(Reject)?;
                if !hex.bytes().all(|h| h.is_ascii_hexdigit()) {
                    return Err(Reject);
                }
                let code = u32::from_str_radix(hex, 16).map_err(|_| Reject)?;
                // A surrogate is no `char`: those are left to serde_json.
                (char::from_u32(code).ok_or(Reject)?, 6)
            }
            _ => return Err(Reject),
        };
        out.push(c);
        i = at + len;
        // The escape's own bytes are not looked at again.
        let skip = i - base;
        if skip >= 16 {
            base = i;
            flags = specials(b, base);
        } else {
            flags &= u32::MAX << skip;
        }
    }
    out.push_str(raw.get(i..).ok_or(Reject)?);
    Ok(out)
}

impl<'a> Scan<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Scan {
            text,
            pos: 0,
            depth: 0,
            peak: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn skip_ws(&mut self) {
        let b = self.bytes();
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = b.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(crate) fn peek(&mut self) -> Result<u8, Reject> {
        self.skip_ws();
        self.bytes().get(self.pos).copied().ok_or(Reject)
    }

    fn eat(&mut self, c: u8) -> Result<(), Reject> {
        if self.peek()? == c {
            self.pos += 1;
            Ok(())
        } else {
            Err(Reject)
        }
    }

    /// Nothing but whitespace is left.
    pub(crate) fn end(&mut self) -> Result<(), Reject> {
        self.skip_ws();
        if self.pos == self.text.len() {
            Ok(())
        } else {
            Err(Reject)
        }
    }

    /// Consumes a `null` if one is next.
    pub(crate) fn null(&mut self) -> Result<bool, Reject> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Reject> {
        if self.bytes()[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(Reject)
        }
    }

    /// Consumes `text` if the record goes on with exactly it (no whitespace skipped): for fast paths that read a
    /// shape the way its producers write it, giving up otherwise.
    pub(crate) fn exactly(&mut self, text: &[u8]) -> bool {
        let found = self
            .bytes()
            .get(self.pos..)
            .is_some_and(|b| b.starts_with(text));
        if found {
            self.pos += text.len();
        }
        found
    }

    /// Runs a fast path that gives up with `None`, leaving the scanner where it was.
    pub(crate) fn attempt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let (pos, depth, peak) = (self.pos, self.depth, self.peak);
        let out = f(self);
        if out.is_none() {
            (self.pos, self.depth, self.peak) = (pos, depth, peak);
        }
        out
    }

    /// Counts `levels` of nesting that a fast path matched with [`exactly`](Self::exactly) (so they are never
    /// entered one by one): `None` where they nest too deep, which the general path then rejects.
    pub(crate) fn nests(&mut self, levels: usize) -> Option<()> {
        let deepest = self.depth + levels;
        if deepest > MAX_DEPTH {
            return None;
        }
        self.peak = self.peak.max(deepest);
        Some(())
    }

    /// A string (the next value must be one): its text between the quotes as written, and whether it has escapes.
    fn raw_str(&mut self) -> Result<(&'a str, bool), Reject> {
        self.eat(b'"')?;
        let start = self.pos;
        self.string_rest(start, start, false)
    }

    /// Scans a string's text from `i` (where no escape is cut in two) to its closing quote; `start` is where its text
    /// begins, `escaped` whether the part before `i` has escapes.
    fn string_rest(
        &mut self,
        start: usize,
        mut i: usize,
        mut escaped: bool,
    ) -> Result<(&'a str, bool), Reject> {
        let b = self.bytes();
        'blocks: loop {
            let mut flags = specials(b, i);
            while flags != 0 {
                let at = i + flags.trailing_zeros() as usize;
                match b.get(at) {
                    Some(b'"') => {
                        self.pos = at + 1;
                        // Quotes and backslashes are ASCII, so both ends are character boundaries.
                        return Ok((self.text.get(start..at).ok_or(Reject)?, escaped));
                    }
                    Some(b'\\') => {
                        escaped = true;
                        let next = self.escape(at + 1)?;
                        if next - i >= 16 {
                            // The escape ends in a later block: go on from its end.
                            i = next;
                            continue 'blocks;
                        }
                        // The escape's own bytes (an escaped quote or backslash) are not specials of the string.
                        flags &= u32::MAX << (next - i);
                    }
                    // A control character, or the end of the text.
                    _ => return Err(Reject),
                }
            }
            i += 16;
        }
    }

    /// A string value as written, quotes included. `like` is a string checked before (as written, quotes included)
    /// that this one probably equals, or extends the way a JSON array written into a string grows (`"[a,b]"` then
    /// `"[a,b,c]"`): the part they share is compared, not scanned.
    pub(crate) fn quoted_str(&mut self, like: Option<&str>) -> Result<&'a str, Reject> {
        self.eat(b'"')?;
        let start = self.pos - 1;
        let rest = self.bytes().get(start..).unwrap_or_default();
        let from = match like {
            Some(l) if l.len() >= 2 && rest.starts_with(l.as_bytes()) => {
                // The whole string, closing quote included.
                self.pos = start + l.len();
                return self.text.get(start..self.pos).ok_or(Reject);
            }
            // Cut before the closing `]`: no escape ends there (`]` is no escape letter or hex digit).
            Some(l)
                if l.len() > 3
                    && l.ends_with("]\"")
                    && rest.starts_with(&l.as_bytes()[..l.len() - 2]) =>
            {
                start + l.len() - 2
            }
            _ => start + 1,
        };
        // Whether the string has escapes is not asked: its readers decode it later, looking for them then.
        self.string_rest(start + 1, from, false)?;
        self.text.get(start..self.pos).ok_or(Reject)
    }

    /// Checks the escape whose letter is at `i`; returns where the string goes on. Surrogate escapes (`\ud83d`)
    /// are left to serde_json, which pairs them or rejects them.
    fn escape(&self, i: usize) -> Result<usize, Reject> {
        let b = self.bytes();
        match b.get(i) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
            Some(b'u') => {
                let hex = b.get(i + 1..i + 5).ok_or(Reject)?;
                let mut code = 0u32;
                for &h in hex {
                    code = code * 16 + char::from(h).to_digit(16).ok_or(Reject)?;
                }
                if (0xD800..=0xDFFF).contains(&code) {
                    return Err(Reject);
                }
                Ok(i + 5)
            }
            _ => Err(Reject),
        }
    }

    /// A string value, unescaped: borrowed from the record unless it has escapes.
    pub(crate) fn str(&mut self) -> Result<Cow<'a, str>, Reject> {
        let (raw, escaped) = self.raw_str()?;
        if !escaped {
            return Ok(Cow::Borrowed(raw));
        }
        unescape(raw).map(Cow::Owned)
    }

    /// An object: `f` is called with each key and must consume its value. Keys with escapes are left to
    /// serde_json (an escaped key can spell a field name), and so is serde_json's private key.
    pub(crate) fn object(
        &mut self,
        mut f: impl FnMut(&mut Self, &'a str) -> Result<(), Reject>,
    ) -> Result<(), Reject> {
        self.eat(b'{')?;
        self.enter()?;
        if self.peek()? == b'}' {
            self.pos += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            let (key, escaped) = self.raw_str()?;
            // serde_json gives its private raw-value key a meaning of its own when it decodes a `Value`.
            if escaped || key.starts_with("$serde_json::private::") {
                return Err(Reject);
            }
            self.eat(b':')?;
            f(self, key)?;
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return Err(Reject),
            }
        }
    }

    /// An array: `f` is called with each element's index and must consume the element.
    pub(crate) fn array(
        &mut self,
        mut f: impl FnMut(&mut Self, usize) -> Result<(), Reject>,
    ) -> Result<(), Reject> {
        self.eat(b'[')?;
        self.enter()?;
        if self.peek()? == b']' {
            self.pos += 1;
            self.depth -= 1;
            return Ok(());
        }
        let mut i = 0;
        loop {
            f(self, i)?;
            i += 1;
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return Err(Reject),
            }
        }
    }

    fn enter(&mut self) -> Result<(), Reject> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Reject);
        }
        self.peak = self.peak.max(self.depth);
        Ok(())
    }

    /// Checks and skips any value; returns its text.
    pub(crate) fn value(&mut self) -> Result<&'a str, Reject> {
        Ok(self.known_value()?.text)
    }

    /// [`value`](Self::value), also giving how deep the value nests, to recognise its copies later.
    pub(crate) fn known_value(&mut self) -> Result<Known<'a>, Reject> {
        self.known_with(Self::any)
    }

    /// The value `f` consumes, with how deep it nests, as [`known_value`](Self::known_value) gives it.
    pub(crate) fn known_with(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), Reject>,
    ) -> Result<Known<'a>, Reject> {
        let start = self.peek().map(|_| self.pos)?;
        let outer = self.peak;
        self.peak = self.depth;
        f(self)?;
        let depth = self.peak - self.depth;
        self.peak = self.peak.max(outer);
        Ok(Known {
            text: self.text.get(start..self.pos).ok_or(Reject)?,
            depth,
        })
    }

    fn any(&mut self) -> Result<(), Reject> {
        match self.peek()? {
            b'"' => self.raw_str().map(drop),
            b'{' => self.object(|s, _| s.any()),
            b'[' => self.array(|s, _| s.any()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(Reject),
        }
    }

    /// A number in JSON's grammar. Numbers that could leave `f64`'s range when a `Value` reads them (more than
    /// 100 digits, or an exponent of three digits or more) are left to serde_json.
    fn number(&mut self) -> Result<(), Reject> {
        let b = self.bytes();
        let mut i = self.pos;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits = |i: &mut usize| {
            let start = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - start
        };
        let int = match b.get(i) {
            Some(b'0') => {
                i += 1;
                1
            }
            Some(b'1'..=b'9') => digits(&mut i),
            _ => return Err(Reject),
        };
        let mut frac = 0;
        if b.get(i) == Some(&b'.') {
            i += 1;
            frac = digits(&mut i);
            if frac == 0 {
                return Err(Reject);
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let exp = digits(&mut i);
            if exp == 0 || exp > 2 {
                return Err(Reject);
            }
        }
        if int + frac > 100 {
            return Err(Reject);
        }
        self.pos = i;
        Ok(())
    }

    /// Skips the next value if its text is `known`'s and, at this depth, it nests legally; gives its text (in
    /// this record) if it did.
    pub(crate) fn skip_known(&mut self, known: Known<'_>) -> Option<&'a str> {
        self.skip_ws();
        let start = self.pos;
        if self.depth + known.depth <= MAX_DEPTH
            && self.bytes()[start..].starts_with(known.text.as_bytes())
        {
            self.pos += known.text.len();
            self.peak = self.peak.max(self.depth + known.depth);
            return self.text.get(start..self.pos);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the scanner accepts `text` as one value; serde_json must accept everything it accepts.
    fn accepts(text: &str) -> bool {
        let mut s = Scan::new(text);
        let ok = s.value().is_ok() && s.end().is_ok();
        if ok {
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok(),
                "scanner accepted what serde_json rejects: {text}"
            );
        }
        ok
    }

    #[test]
    fn accepts_what_serde_json_accepts() {
        for ok in [
            r#"{"a":[1,-2.5,3e10,0,-0,1E+2,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"],"b":{}}"#,
            " [ ] ",
            r#""é and ☃""#,
            "12345678901234567890123456789",
        ] {
            assert!(accepts(ok), "{ok}");
        }
    }

    #[test]
    fn rejects_invalid_json_and_what_it_leaves_to_serde_json() {
        for bad in [
            "{",
            "[1,]",
            "{\"a\" 1}",
            "01",
            "1.",
            "-",
            "1e",
            "tru",
            "nul",
            "\"a",
            "\"\t\"",
            "\"\\x\"",
            "\"\\u12\"",
            "[1] 2",
            "{\"a\":1,}",
            "\"\\ud83d\\ude00\"",
            "1e400",
            "{\"\\u0061\":1}",
        ] {
            assert!(!accepts(bad), "{bad}");
        }
        let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(accepts(&deep(MAX_DEPTH)));
        assert!(!accepts(&deep(MAX_DEPTH + 1)));
    }

    #[test]
    fn strings_unescape_as_serde_json_unescapes_them() {
        let text = r#""a\"b\\c\/d\be\ff\ng\rh\ti\u00e9j\u0000k☃\u2603""#;
        let mut s = Scan::new(text);
        let ours = s.str().expect("valid");
        assert_eq!(ours, serde_json::from_str::<String>(text).expect("valid"));
        assert!(matches!(ours, Cow::Owned(_)));
        assert!(matches!(
            Scan::new(r#""plain""#).str(),
            Ok(Cow::Borrowed("plain"))
        ));
    }

    #[test]
    fn a_string_like_an_earlier_one_is_compared_then_scanned_where_they_differ() {
        let quoted = |text: &str, like: Option<&str>| {
            let mut s = Scan::new(text);
            let out = s.quoted_str(like).map(str::to_string);
            (out.ok(), s.end().is_ok())
        };
        let history = r#""[{\"a\":1}]""#;
        let longer = r#""[{\"a\":1},{\"b\":2}]""#;
        // Equal, extended, and different after the shared part: all read as without `like`.
        for (text, like) in [
            (history, history),
            (longer, history),
            (r#""[{\"a\":1}x""#, history),
            (r#""[{\"a\":1}]]""#, history),
            (r#""[{\"a\":1}""#, history),
            (r#""[1]""#, r#""[1]""#),
            (r#""plain""#, history),
        ] {
            assert_eq!(
                quoted(text, Some(like)),
                quoted(text, None),
                "{text} like {like}"
            );
        }
        assert_eq!(
            quoted(longer, Some(history)),
            (Some(longer.to_string()), true)
        );
        // A shared part with an unfinished or invalid escape after it still fails.
        assert_eq!(quoted(r#""[{\"a\":1}\q]""#, Some(history)).0, None);
    }

    #[test]
    fn every_special_byte_of_a_block_is_flagged_and_nothing_else() {
        let special = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
        for c in 0..=255u8 {
            for k in 0..16 {
                let mut block = [b'a'; 16];
                block[k] = c;
                let want = if special(c) { 1 << k } else { 0 };
                assert_eq!(specials(&block, 0), want, "byte {c:#x} at {k}");
            }
        }
        // Past the end of the text every byte is flagged, so a scan never runs off it.
        for len in 0..16 {
            let b = vec![b'a'; len];
            assert_eq!(specials(&b, 0), u32::MAX << len & 0xffff, "{len}");
        }
    }

    #[test]
    fn strings_end_and_escapes_are_checked_wherever_they_fall_in_a_block() {
        let escapes = [r#"\""#, r"\\", r"\n", r"\u00e9", r"\u20ac", r"\/"];
        for pad in 0..40 {
            for tail in 0..20 {
                for esc in escapes {
                    let body = format!("{}{esc}{}", "a".repeat(pad), "z".repeat(tail));
                    let text = format!("\"{body}\" ,1");
                    let mut s = Scan::new(&text);
                    assert_eq!(s.raw_str().ok(), Some((body.as_str(), true)), "{text}");
                    assert_eq!(&text[s.pos..], " ,1", "{text}");
                    let decoded: String =
                        serde_json::from_str(&format!("\"{body}\"")).expect("valid");
                    assert_eq!(
                        Scan::new(&format!("\"{body}\"")).str().expect("valid"),
                        decoded
                    );
                }
                // An escape cut off by the end of the text, a bad escape, a control character: all rejected.
                for bad in [r"\", r"\u00", r"\x", "\u{1}", "\t"] {
                    let text = format!("\"{}{bad}{}\"", "a".repeat(pad), "z".repeat(tail));
                    assert!(Scan::new(&text).raw_str().is_err(), "{text:?}");
                    assert!(serde_json::from_str::<String>(&text).is_err(), "{text:?}");
                }
                // Escapes back to back, several in one block and across blocks.
                let body = format!(
                    "{}{}",
                    "a".repeat(pad),
                    escapes.concat().repeat(tail % 4 + 1)
                );
                let text = format!("\"{body}\"");
                let decoded: String = serde_json::from_str(&text).expect("valid");
                assert_eq!(Scan::new(&text).str().expect("valid"), decoded, "{text}");
                assert_eq!(unescape(&body).expect("valid"), decoded, "{text}");
                let open = format!("\"{}", "a".repeat(pad + tail));
                assert!(Scan::new(&open).raw_str().is_err(), "{open}");
            }
        }
    }

    /// Strings pieced together at random from escapes, runs of backslashes, quotes, control characters and
    /// multi-byte characters, so that every kind of byte falls at every place of a block: the scanner accepts
    /// exactly what serde_json accepts (or gives up), ends each string where serde_json does, and unescapes it
    /// the same.
    #[test]
    fn random_strings_scan_as_serde_json_reads_them() {
        let pieces = [
            "a",
            "bcdefgh",
            r#"\""#,
            r"\\",
            r"\\\\",
            r"\n",
            r"\t",
            r"\/",
            r"\u00e9",
            r"\u20AC",
            r"\ud83d\ude00",
            r"\u12",
            r"\x",
            r"\",
            "\"",
            "\u{1}",
            "\t",
            "é",
            "☃",
            "😀",
            " ",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut accepted, mut rejected) = (0, 0);
        for _ in 0..20_000 {
            let n = (next() % 24) as usize;
            let body: String = (0..n)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect();
            let text = format!("\"{body}\" ,");
            let mut stream = serde_json::Deserializer::from_str(&text).into_iter::<String>();
            let theirs = match stream.next() {
                Some(Ok(v)) => Some((v, stream.byte_offset())),
                _ => None,
            };
            let mut s = Scan::new(&text);
            match s.str() {
                Ok(ours) => {
                    let (v, end) = theirs.unwrap_or_else(|| panic!("serde_json rejects {text:?}"));
                    assert_eq!((ours.as_ref(), s.pos), (v.as_str(), end), "{text:?}");
                    accepted += 1;
                }
                // Given up on: serde_json either rejects it or it holds a surrogate escape.
                Err(Reject) => {
                    assert!(theirs.is_none() || body.contains(r"\ud83d"), "{text:?}");
                    rejected += 1;
                }
            }
        }
        assert!(
            accepted > 2_000 && rejected > 2_000,
            "{accepted} {rejected}"
        );
    }

    #[test]
    fn a_known_value_is_skipped_only_where_it_nests_legally() {
        let mut s = Scan::new("[[1],[[2]]]");
        let mut seen = Vec::new();
        s.array(|s, _| s.known_value().map(|k| seen.push(k)))
            .expect("valid");
        assert_eq!(seen[0].text, "[1]");
        assert_eq!(seen[1].depth, 2);
        let mut t = Scan::new("[[1],7]");
        t.array(|t, i| {
            if i == 0 {
                assert_eq!(t.skip_known(seen[0]), Some("[1]"));
                Ok(())
            } else {
                assert_eq!(t.skip_known(seen[0]), None);
                t.value().map(drop)
            }
        })
        .expect("valid");
        // `[[2]]` nests two deep: legal under MAX_DEPTH - 2 open arrays, not under MAX_DEPTH - 1.
        for (open, legal) in [(MAX_DEPTH - 2, true), (MAX_DEPTH - 1, false)] {
            let text = format!("{}[[2]]{}", "[".repeat(open), "]".repeat(open));
            let mut u = Scan::new(&text);
            for _ in 0..open {
                u.eat(b'[').expect("valid");
                u.enter().expect("valid");
            }
            assert_eq!(u.skip_known(seen[1]).is_some(), legal);
        }
    }

    /// The delimiting contract the shape splitter rests on, checked differentially on records of every format,
    /// whole and damaged at random: where the scanner finds a value, serde_json reads one value there too, ending at
    /// the same byte; where serde_json finds none, the scanner finds none.
    mod differential {
        use super::*;
        use crate::mutate::{differential, lines};
        use proptest::prelude::*;
        use serde::de::IgnoredAny;

        #[test]
        fn a_value_the_scanner_delimits_is_the_value_serde_reads() {
            let all = lines(&[
                include_str!("../tests/fixtures/tooltune.jsonl"),
                include_str!("../tests/fixtures/openai.jsonl"),
                include_str!("../tests/fixtures/langfuse.jsonl"),
                include_str!("../tests/fixtures/otel.jsonl"),
            ]);
            // Two records back to back, as in an array: the first value must end where serde's does.
            let pairs: Vec<String> = (0..all.len())
                .map(|i| format!("{} , {}", all[i], all[(i * 7 + 3) % all.len()]))
                .collect();
            let pairs: Vec<&str> = pairs.iter().map(String::as_str).collect();
            let (compared, tried) = differential(&pairs, 1000, |text| {
                let mut stream = serde_json::Deserializer::from_str(text).into_iter::<IgnoredAny>();
                let serde = match stream.next() {
                    Some(Ok(_)) => Some(stream.byte_offset()),
                    _ => None,
                };
                let Ok(v) = Scan::new(text).value() else {
                    return Ok(false);
                };
                let start = text.len() - text.trim_start_matches([' ', '\n', '\r', '\t']).len();
                prop_assert_eq!(Some(start + v.len()), serde, "{}", text);
                Ok(true)
            });
            assert!(
                compared * 5 >= tried,
                "the scanner delimited only {compared} of {tried} damaged texts"
            );
        }
    }
}
