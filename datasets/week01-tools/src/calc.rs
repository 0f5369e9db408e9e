//! The calculator tool's evaluator: a recursive-descent parser for numbers, `+ - * / **` and parentheses.
//!
//! Nothing else is accepted (no names, no functions, no `%`), so an expression a model sends can never do
//! more than arithmetic. Integers stay exact (`i128`) until a division or a float operand makes the result
//! a float, so `48000 + 9500 + 12000 + 4` answers `69504`, as Python's `ast`-based evaluator in the lecture
//! does.

use std::fmt;

/// Longest expression accepted; a model has no reason to send more, and it bounds the work per call.
const MAX_LEN: usize = 2_000;
/// Deepest nesting accepted, so a pathological `((((...` cannot exhaust the stack.
const MAX_DEPTH: usize = 64;

/// A number produced by evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// An exact integer.
    Int(i128),
    /// A floating-point number (after a division, a fractional literal or a fractional power).
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            // Rust prints whole floats without a fraction ("2" for 2.0), which is what a reader expects.
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// Why an expression was refused, with the character position where that was noticed.
#[derive(Debug, Clone, PartialEq)]
pub struct CalcError(pub String);

impl fmt::Display for CalcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Evaluates an arithmetic expression.
pub fn evaluate(expr: &str) -> Result<Num, CalcError> {
    if expr.len() > MAX_LEN {
        return Err(CalcError(format!(
            "expression is {} characters long; at most {MAX_LEN} are accepted",
            expr.len()
        )));
    }
    let tokens = tokenize(expr)?;
    let mut p = Parser {
        tokens,
        pos: 0,
        depth: 0,
    };
    if p.tokens.is_empty() {
        return Err(CalcError("expression is empty".into()));
    }
    let v = p.expr()?;
    if let Some((tok, at)) = p.tokens.get(p.pos) {
        return Err(CalcError(format!(
            "unexpected {tok} at position {at}; only numbers, + - * / ** and parentheses are allowed"
        )));
    }
    if let Num::Float(x) = v
        && !x.is_finite()
    {
        return Err(CalcError("result is not a finite number".into()));
    }
    Ok(v)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(Num),
    Plus,
    Minus,
    Star,
    Slash,
    Pow,
    LParen,
    RParen,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Num(n) => write!(f, "number {n}"),
            Tok::Plus => f.write_str("'+'"),
            Tok::Minus => f.write_str("'-'"),
            Tok::Star => f.write_str("'*'"),
            Tok::Slash => f.write_str("'/'"),
            Tok::Pow => f.write_str("'**'"),
            Tok::LParen => f.write_str("'('"),
            Tok::RParen => f.write_str("')'"),
        }
    }
}

fn tokenize(s: &str) -> Result<Vec<(Tok, usize)>, CalcError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at = i + 1;
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '+' => {
                out.push((Tok::Plus, at));
                i += 1
            }
            '-' => {
                out.push((Tok::Minus, at));
                i += 1
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                out.push((Tok::Pow, at));
                i += 2
            }
            '*' => {
                out.push((Tok::Star, at));
                i += 1
            }
            '/' => {
                out.push((Tok::Slash, at));
                i += 1
            }
            '(' => {
                out.push((Tok::LParen, at));
                i += 1
            }
            ')' => {
                out.push((Tok::RParen, at));
                i += 1
            }
            '0'..='9' | '.' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                // An exponent (1e3, 2.5E-4) only when digits follow, so "2e" is reported, not half-read.
                if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                    let mut j = i + 1;
                    if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                        j += 1;
                    }
                    if j < chars.len() && chars[j].is_ascii_digit() {
                        while j < chars.len() && chars[j].is_ascii_digit() {
                            j += 1;
                        }
                        i = j;
                    }
                }
                let text: String = chars[start..i].iter().collect();
                out.push((Tok::Num(parse_number(&text, at)?), at));
            }
            ',' => {
                return Err(CalcError(format!(
                    "unexpected ',' at position {at}; write numbers without thousands separators (48000, not 48,000)"
                )));
            }
            other => {
                return Err(CalcError(format!(
                    "unexpected character {other:?} at position {at}; only numbers, + - * / ** and parentheses are allowed"
                )));
            }
        }
    }
    Ok(out)
}

fn parse_number(text: &str, at: usize) -> Result<Num, CalcError> {
    let bad = || CalcError(format!("malformed number {text:?} at position {at}"));
    if text.chars().all(|c| c.is_ascii_digit()) {
        // Integers too long for i128 are still numbers: keep them as floats rather than refusing.
        return Ok(text
            .parse::<i128>()
            .map(Num::Int)
            .unwrap_or_else(|_| Num::Float(text.parse::<f64>().unwrap_or(f64::INFINITY))));
    }
    if text == "." || text.matches('.').count() > 1 {
        return Err(bad());
    }
    text.parse::<f64>().map(Num::Float).map_err(|_| bad())
}

struct Parser {
    tokens: Vec<(Tok, usize)>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos).map(|(t, _)| t)
    }

    fn end_position(&self) -> usize {
        self.tokens.last().map(|(_, at)| at + 1).unwrap_or(1)
    }

    // expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<Num, CalcError> {
        let mut v = self.term()?;
        while let Some(op) = self.peek().cloned() {
            match op {
                Tok::Plus => {
                    self.pos += 1;
                    let r = self.term()?;
                    v = add(v, r);
                }
                Tok::Minus => {
                    self.pos += 1;
                    let r = self.term()?;
                    v = sub(v, r);
                }
                _ => break,
            }
        }
        Ok(v)
    }

    // term := unary (('*' | '/') unary)*
    fn term(&mut self) -> Result<Num, CalcError> {
        let mut v = self.unary()?;
        while let Some(op) = self.peek().cloned() {
            match op {
                Tok::Star => {
                    self.pos += 1;
                    let r = self.unary()?;
                    v = mul(v, r);
                }
                Tok::Slash => {
                    let at = self.tokens[self.pos].1;
                    self.pos += 1;
                    let r = self.unary()?;
                    v = div(v, r, at)?;
                }
                _ => break,
            }
        }
        Ok(v)
    }

    // unary := ('+' | '-') unary | power. `-2 ** 2` is -(2 ** 2), as in Python.
    fn unary(&mut self) -> Result<Num, CalcError> {
        self.enter()?;
        let v = match self.peek() {
            Some(Tok::Minus) => {
                self.pos += 1;
                neg(self.unary()?)
            }
            Some(Tok::Plus) => {
                self.pos += 1;
                self.unary()?
            }
            _ => self.power()?,
        };
        self.depth -= 1;
        Ok(v)
    }

    // power := primary ('**' unary)?  (right-associative through unary)
    fn power(&mut self) -> Result<Num, CalcError> {
        let base = self.primary()?;
        if self.peek() == Some(&Tok::Pow) {
            let at = self.tokens[self.pos].1;
            self.pos += 1;
            let exp = self.unary()?;
            return pow(base, exp, at);
        }
        Ok(base)
    }

    // primary := number | '(' expr ')'
    fn primary(&mut self) -> Result<Num, CalcError> {
        match self.tokens.get(self.pos).cloned() {
            Some((Tok::Num(n), _)) => {
                self.pos += 1;
                Ok(n)
            }
            Some((Tok::LParen, at)) => {
                self.enter()?;
                self.pos += 1;
                let v = self.expr()?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(CalcError(format!(
                        "the '(' at position {at} is never closed"
                    )));
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(v)
            }
            Some((tok, at)) => Err(CalcError(format!(
                "expected a number or '(' at position {at}, found {tok}"
            ))),
            None => Err(CalcError(format!(
                "expression ends early at position {}: a number is missing",
                self.end_position()
            ))),
        }
    }

    fn enter(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CalcError(format!(
                "expression is nested more than {MAX_DEPTH} levels deep"
            )));
        }
        Ok(())
    }
}

fn add(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x
            .checked_add(y)
            .map(Num::Int)
            .unwrap_or(Num::Float(x as f64 + y as f64)),
        _ => Num::Float(a.as_f64() + b.as_f64()),
    }
}

fn sub(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x
            .checked_sub(y)
            .map(Num::Int)
            .unwrap_or(Num::Float(x as f64 - y as f64)),
        _ => Num::Float(a.as_f64() - b.as_f64()),
    }
}

fn mul(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x
            .checked_mul(y)
            .map(Num::Int)
            .unwrap_or(Num::Float(x as f64 * y as f64)),
        _ => Num::Float(a.as_f64() * b.as_f64()),
    }
}

fn div(a: Num, b: Num, at: usize) -> Result<Num, CalcError> {
    if b.as_f64() == 0.0 {
        return Err(CalcError(format!("division by zero at position {at}")));
    }
    // Exact integer quotients stay integers so `10 / 2` answers 5, not 5.0-looking noise.
    if let (Num::Int(x), Num::Int(y)) = (a, b)
        && y != 0
        && x % y == 0
    {
        return Ok(Num::Int(x / y));
    }
    Ok(Num::Float(a.as_f64() / b.as_f64()))
}

fn neg(a: Num) -> Num {
    match a {
        Num::Int(x) => x
            .checked_neg()
            .map(Num::Int)
            .unwrap_or(Num::Float(-(x as f64))),
        Num::Float(x) => Num::Float(-x),
    }
}

fn pow(base: Num, exp: Num, at: usize) -> Result<Num, CalcError> {
    if let (Num::Int(b), Num::Int(e)) = (base, exp)
        && let Ok(e32) = u32::try_from(e)
        && let Some(v) = b.checked_pow(e32)
    {
        return Ok(Num::Int(v));
    }
    if base.as_f64() == 0.0 && exp.as_f64() < 0.0 {
        return Err(CalcError(format!(
            "zero raised to a negative power at position {at}"
        )));
    }
    let v = base.as_f64().powf(exp.as_f64());
    if v.is_nan() {
        return Err(CalcError(format!(
            "a negative number raised to a fractional power at position {at} is not a real number"
        )));
    }
    if !v.is_finite() {
        return Err(CalcError(format!(
            "the power at position {at} is too large to represent"
        )));
    }
    Ok(Num::Float(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        evaluate(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .to_string()
    }

    fn err(s: &str) -> String {
        match evaluate(s) {
            Ok(v) => panic!("{s} evaluated to {v}, expected an error"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn the_lecture_reference_sum() {
        assert_eq!(ok("48000 + 9500 + 12000 + 4"), "69504");
    }

    #[test]
    fn precedence_associativity_and_unary_minus() {
        assert_eq!(ok("3 * (4 + 5)"), "27");
        assert_eq!(ok("2 + 3 * 4"), "14");
        assert_eq!(ok("10 - 4 - 3"), "3");
        assert_eq!(ok("2 ** 3 ** 2"), "512");
        assert_eq!(ok("-2 ** 2"), "-4");
        assert_eq!(ok("(-2) ** 2"), "4");
        assert_eq!(ok("2 ** -1"), "0.5");
        assert_eq!(ok("7 / 2"), "3.5");
        assert_eq!(ok("10 / 2"), "5");
        assert_eq!(ok("1.5 * 4"), "6");
        assert_eq!(ok("1e3 + 1"), "1001");
        assert_eq!(ok("--3"), "3");
    }

    #[test]
    fn refuses_anything_but_arithmetic() {
        assert!(err("__import__('os')").contains("unexpected character '_'"));
        assert!(err("2 % 3").contains("'%'"));
        assert!(err("sqrt(4)").contains("'s'"));
        assert!(err("48,000 + 1").contains("thousands separators"));
        assert!(err("1 / 0").contains("division by zero"));
        assert!(err("1 / (2 - 2)").contains("division by zero"));
        assert!(err("(1 + 2").contains("never closed"));
        assert!(err("1 +").contains("ends early"));
        assert!(err("").contains("empty"));
        assert!(err("1 2").contains("unexpected number 2"));
        assert!(err("1..2").contains("malformed number"));
        assert!(err("(-8) ** 0.5").contains("not a real number"));
        assert!(err("10.0 ** 400").contains("too large"));
        assert!(err(&"(".repeat(100)).contains("nested"));
        assert!(err(&"1+".repeat(1500)).contains("at most"));
    }

    #[test]
    fn large_integers_overflow_to_floats_not_errors() {
        assert_eq!(ok("2 ** 100"), "1267650600228229401496703205376");
        assert!(ok("2 ** 200").starts_with("1606938044258990"));
    }
}
