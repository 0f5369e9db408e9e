//! The OTLP scanner against the serde decode: the fixtures and samples, every attribute shape, and the differential
//! property test on damaged lines.

use super::fast;
use super::schema::{AnyValue, KeyValue, Request};

/// What a decoded line says, as text, to compare two decodes.
fn outline(r: &Request) -> String {
    fn value(v: &AnyValue) -> String {
        format!(
            "{:?}/{:?}/{:?}/{:?}/{:?}/{:?}/{:?}",
            v.string_value.map(|s| s.0),
            v.bool_value,
            v.int_value,
            v.double_value,
            v.array_value
                .as_ref()
                .map(|a| a.values.iter().map(value).collect::<Vec<_>>()),
            v.kvlist_value.as_ref().map(|k| k
                .values
                .iter()
                .map(|e| (e.key.0, value(&e.value)))
                .collect::<Vec<_>>()),
            v.bytes_value.map(|s| s.0),
        )
    }
    fn attrs(a: &[KeyValue]) -> String {
        format!(
            "{:?}",
            a.iter()
                .map(|e| (e.key.0, value(&e.value)))
                .collect::<Vec<_>>()
        )
    }
    let mut out = String::new();
    for rs in &r.resource_spans {
        out += &format!("{:?}\n", rs.resource.as_ref().map(|r| attrs(&r.attributes)));
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                out += &format!(
                    "{} {} {:?} {} {} {} {:?} {:?}\n",
                    s.trace_id.0,
                    s.span_id.0,
                    s.parent_span_id.map(|p| p.0),
                    s.name.0,
                    s.start_time_unix_nano,
                    s.end_time_unix_nano,
                    attrs(&s.attributes),
                    s.status
                        .as_ref()
                        .map(|st| (st.code, st.message.map(|m| m.0))),
                );
            }
        }
    }
    out
}

/// The scanner must read what real exports hold (else every line pays for a pass that gives up) and build what
/// the serde decode builds.
#[test]
fn the_scanner_reads_the_fixtures_and_samples_as_the_serde_decode_does() {
    let lines = include_str!("../../tests/fixtures/otel.jsonl")
        .lines()
        .chain(include_str!("../../samples/otel.jsonl").lines())
        .filter(|l| !l.trim().is_empty());
    let mut n = 0;
    for (i, line) in lines.enumerate() {
        let fast =
            fast::request(line).unwrap_or_else(|_| panic!("the scanner gave up on line {i}"));
        let serde: Request = serde_json::from_str(line).expect("valid");
        assert_eq!(outline(&fast), outline(&serde), "line {i}");
        n += 1;
    }
    assert!(n >= 10, "{n}");
}

/// Attributes written the way exporters write them (matched as text) and every other way serde reads them
/// (read key by key) build the same values, and shapes serde rejects are given up on.
#[test]
fn attributes_in_every_shape_read_as_serde_reads_them() {
    let long = format!("\\\"{}\\\"", "x".repeat(200));
    let attrs = [
        r#"{"key":"a","value":{"stringValue":"chat"}}"#.to_string(),
        r#"{"key":"a","value":{"stringValue":"with \"escapes\" \u00e9"}}"#.to_string(),
        format!(r#"{{"key":"m","value":{{"stringValue":"[{long}]"}}}}"#),
        format!(r#"{{"key":"m","value":{{"stringValue":"[{long},{long}]"}}}}"#),
        r#"{"key":"n","value":{"intValue":"443"}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":-7}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":"0007"}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":"9223372036854775807"}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":" 12 "}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":"+5"}}"#.to_string(),
        r#"{"key":"n","value":{"intValue":"-5"}}"#.to_string(),
        r#"{"key":"b","value":{"boolValue":true}}"#.to_string(),
        r#"{"key":"b","value":{"boolValue":false}}"#.to_string(),
        r#"{"key":"d","value":{"doubleValue":0.25}}"#.to_string(),
        r#"{"key":"s","value":{"stringValue":null}}"#.to_string(),
        r#"{"key":"b","value":{"boolValue":null}}"#.to_string(),
        r#"{ "key" : "w" , "value" : { "stringValue" : "spaced" } }"#.to_string(),
        r#"{"value":{"stringValue":"first"},"key":"v"}"#.to_string(),
        r#"{"key":"e","value":{}}"#.to_string(),
        r#"{"key":"e"}"#.to_string(),
        r#"{"key":"x","value":{"stringValue":"a","other":1}}"#.to_string(),
        r#"{"key":"x","value":{"stringValue":"a"},"other":[1]}"#.to_string(),
        r#"{"key":"k\u0065y","value":{"stringValue":"escaped key"}}"#.to_string(),
        r#"{"key":"arr","value":{"arrayValue":{"values":[{"stringValue":"a"},{"intValue":"1"}]}}}"#.to_string(),
        r#"{"key":"kv","value":{"kvlistValue":{"values":[{"key":"in","value":{"boolValue":true}}]}}}"#
            .to_string(),
    ];
    let line = |attrs: &str| {
        format!(
            r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"t","spanId":"s","startTimeUnixNano":"1","attributes":[{attrs}]}}]}}]}}]}}"#
        )
    };
    let all = line(&attrs.join(","));
    let serde: Request = serde_json::from_str(&all).expect("valid");
    let fast = fast::request(&all).unwrap_or_else(|_| panic!("the scanner gave up"));
    assert_eq!(outline(&fast), outline(&serde));
    for a in &attrs {
        let one = line(a);
        let serde: Request = serde_json::from_str(&one).expect("valid");
        let fast = fast::request(&one).unwrap_or_else(|_| panic!("the scanner gave up on {a}"));
        assert_eq!(outline(&fast), outline(&serde), "{a}");
    }
    for bad in [
        r#"{"key":"n","value":{"intValue":"x"}}"#,
        r#"{"key":"n","value":{"intValue":1.5}}"#,
        r#"{"key":"n","value":{"intValue":"9223372036854775808"}}"#,
        r#"{"key":"n","value":{"intValue":"99999999999999999999"}}"#,
        r#"{"key":"n","value":{"intValue":""}}"#,
        r#"{"key":"b","value":{"boolValue":"true"}}"#,
        r#"{"key":"s","value":{"stringValue":5}}"#,
        r#"{"key":"s","value":{"stringValue":"a","stringValue":"b"}}"#,
        r#"{"key":5,"value":{"stringValue":"a"}}"#,
        r#"{"key":"s","value":{"stringValue":"a"}"#,
    ] {
        let l = line(bad);
        assert!(fast::request(&l).is_err(), "{bad}");
        assert!(serde_json::from_str::<Request>(&l).is_err(), "{bad}");
    }
}

/// The fast path's contract, checked differentially on every fixture and sample line, whole and damaged at
/// random: the scanner either gives up or decodes exactly what serde decodes from the same text (never looser).
mod differential {
    use super::*;
    use crate::mutate::{differential, lines};
    use proptest::prelude::*;

    #[test]
    fn the_scanner_gives_up_or_decodes_what_serde_decodes() {
        let (compared, tried) = differential(
            &lines(&[
                include_str!("../../tests/fixtures/otel.jsonl"),
                include_str!("../../samples/otel.jsonl"),
            ]),
            1000,
            |text| {
                let Ok(fast) = fast::request(text) else {
                    return Ok(false);
                };
                let serde = serde_json::from_str::<Request>(text);
                prop_assert!(
                    serde.is_ok(),
                    "the scanner read what serde rejects: {}",
                    text
                );
                prop_assert_eq!(outline(&fast), outline(&serde.expect("checked")));
                Ok(true)
            },
        );
        assert!(
            compared * 5 >= tried,
            "the scanner read only {compared} of {tried} damaged records"
        );
    }
}
