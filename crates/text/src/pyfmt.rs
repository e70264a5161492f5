//! Python's spelling of template values: `json.dumps` for `tojson`, and `str()` for what
//! `{{ ... }}` prints.
//!
//! Hub chat templates are written against Jinja2 in Python, and transformers renders them
//! there; minijinja spells some values differently (`none` for `None`, `true` for `True`,
//! `["a"]` for `['a']`, and its `tojson` escapes `<`, `>`, `&` and `'` for HTML). A prompt
//! that differs by one character from what the model was trained on is a different prompt,
//! so these functions follow CPython:
//!
//! - [`to_json`] is transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
//!   indent=None, separators=None, sort_keys=False)` with those keywords overridable. Keys keep
//!   insertion order (the request's order), floats print as Python's `repr`.
//! - [`write_python_str`] is `str(x)`: `None`, `True`, `1.0`, `['a', {'b': None}]`.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// The options of `json.dumps` that templates pass to `tojson`.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonStyle {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub(crate) ensure_ascii: bool,
    /// Pretty-print with this indent string; `None` for one line.
    pub(crate) indent: Option<String>,
    /// `(item_separator, key_separator)`; defaults depend on `indent` as in Python.
    pub(crate) separators: Option<(String, String)>,
    /// Sort map keys.
    pub(crate) sort_keys: bool,
}

/// `json.dumps(value, ...)` as CPython writes it.
///
/// # Errors
/// A value JSON cannot hold (undefined, a function, a map key that is a list).
pub(crate) fn to_json(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let (item_sep, key_sep) = match &style.separators {
        Some((item, key)) => (item.as_str(), key.as_str()),
        None if style.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut writer = JsonWriter { style, item_sep, key_sep, out: String::new() };
    writer.value(value, 0)?;
    Ok(writer.out)
}

struct JsonWriter<'a> {
    style: &'a JsonStyle,
    item_sep: &'a str,
    key_sep: &'a str,
    out: String,
}

impl JsonWriter<'_> {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.out.push_str(&number(value, true)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(('[', ']'), items.len(), depth, |w, i| w.value(&items[i], depth + 1))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.style.sort_keys {
                    keys.sort();
                }
                self.container(('{', '}'), keys.len(), depth, |w, i| {
                    w.key(&keys[i])?;
                    w.out.push_str(w.key_sep);
                    w.value(&value.get_item(&keys[i])?, depth + 1)
                })?;
            }
            kind => {
                let msg = format!("Object of type {kind} is not JSON serializable");
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        }
        Ok(())
    }

    /// `[...]` or `{...}` with `len` elements written by `element`.
    fn container(
        &mut self,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        mut element: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                self.out.push_str(self.item_sep);
            }
            self.newline(depth + 1);
            element(self, i)?;
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.style.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    /// A map key: Python turns non-string scalars into strings, and rejects the rest.
    fn key(&mut self, key: &Value) -> Result<(), Error> {
        match key.kind() {
            ValueKind::String => self.string(key.as_str().unwrap_or_default()),
            ValueKind::Number => self.string(&number(key, true)),
            ValueKind::Bool => self.string(if key.is_true() { "true" } else { "false" }),
            ValueKind::None => self.string("null"),
            kind => {
                let msg = format!("keys must be str, int, float, bool or None, not {kind}");
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if c < ' ' => {
                    let _ = write!(self.out, "\\u{:04x}", u32::from(c));
                }
                c if self.style.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// An integer as digits, a float as Python's `repr` (`1.0`, `1e-05`, `1e+16`); `json`
/// spells the non-finite floats `NaN`/`Infinity`, `str()` spells them `nan`/`inf`.
fn number(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    match (x.is_nan(), x.is_infinite(), json) {
        (true, _, true) => "NaN".into(),
        (true, _, false) => "nan".into(),
        (_, true, true) => if x > 0.0 { "Infinity" } else { "-Infinity" }.into(),
        (_, true, false) => if x > 0.0 { "inf" } else { "-inf" }.into(),
        _ => python_float_repr(x),
    }
}

/// CPython's `float.__repr__`: the shortest digits that round-trip, in positional notation
/// for decimal exponents in -4..16 and scientific notation (two exponent digits at least)
/// outside it.
pub(crate) fn python_float_repr(x: f64) -> String {
    // Rust's `{:e}` gives the same shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}e{exp_sign}{:02}", exponent.unsigned_abs());
    }
    if exponent < 0 {
        let zeros = "0".repeat(exponent.unsigned_abs() as usize - 1);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exponent as usize + 1;
    if digits.len() <= int_len {
        format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

/// Writes `str(value)` as Python prints it in a Jinja2 `{{ ... }}`.
pub(crate) fn write_python_str(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_python_repr(out, value),
    }
}

/// Writes `repr(value)`: strings quoted, containers recursively.
fn write_python_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(value, false)),
        ValueKind::String => write_python_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(out, &key);
                out.push_str(": ");
                write_python_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr(s)` for a Python string: single quotes unless the text has one and no double
/// quote; unprintable characters escaped.
fn write_python_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if u32::from(c) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push(quote);
}

/// An approximation of `str.isprintable`: not a control, separator (other than space) or
/// common format character.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    let format = matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}');
    !(c.is_control() || c.is_whitespace() || format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (-0.0, "-0.0"),
            (1.2345e300, "1.2345e+300"),
            (21.5, "21.5"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn json_matches_python_dumps() {
        let value = Value::from(minijinja::value::Serde(serde_json::json!({
            "b": [1, 2.0, null, true], "a": "é\"<&>'\n\u{1}", "e": {}, "l": []
        })));
        let compact = to_json(&value, &JsonStyle::default()).unwrap();
        assert_eq!(compact, r#"{"b": [1, 2.0, null, true], "a": "é\"<&>'\n\u0001", "e": {}, "l": []}"#);
        let style =
            JsonStyle { indent: Some("  ".into()), sort_keys: true, ensure_ascii: true, ..JsonStyle::default() };
        let pretty = to_json(&value, &style).unwrap();
        let want = "{\n  \"a\": \"\\u00e9\\\"<&>'\\n\\u0001\",\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"e\": {},\n  \"l\": []\n}";
        assert_eq!(pretty, want);
        let emoji = to_json(&Value::from("😊"), &JsonStyle { ensure_ascii: true, ..JsonStyle::default() }).unwrap();
        assert_eq!(emoji, r#""\ud83d\ude0a""#);
        assert!(to_json(&Value::UNDEFINED, &JsonStyle::default()).is_err());
    }

    #[test]
    fn str_matches_python() {
        let value =
            Value::from(minijinja::value::Serde(serde_json::json!({"a": [null, true, 1.0, "it's"], "b": "x\ty"})));
        let mut out = String::new();
        write_python_str(&mut out, &value);
        assert_eq!(out, r#"{'a': [None, True, 1.0, "it's"], 'b': 'x\ty'}"#);
        let mut out = String::new();
        write_python_str(&mut out, &Value::from(false));
        assert_eq!(out, "False");
    }
}
