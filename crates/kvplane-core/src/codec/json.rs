//! JSON text helpers for the answers kvplane writes (u64 values stay exact integers).

use std::fmt::Write;

pub fn write_str(out: &mut String, s: &str) {
  out.push('"');
  for c in s.chars() {
    match c {
      '"' => out.push_str("\\\""),
      '\\' => out.push_str("\\\\"),
      '\n' => out.push_str("\\n"),
      '\r' => out.push_str("\\r"),
      '\t' => out.push_str("\\t"),
      c if (c as u32) < 0x20 => {
        let _ = write!(out, "\\u{:04x}", c as u32);
      }
      c => out.push(c),
    }
  }
  out.push('"');
}

/// A float as JSON: shortest round-trip form; non-finite values (not JSON) become `null`.
pub fn write_f64(out: &mut String, v: f64) {
  if v.is_finite() {
    let _ = write!(out, "{v:?}");
  } else {
    out.push_str("null");
  }
}

pub fn write_opt_str(out: &mut String, s: Option<&str>) {
  match s {
    Some(s) => write_str(out, s),
    None => out.push_str("null"),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn escapes_strings_and_keeps_floats_exact() {
    let mut s = String::new();
    write_str(&mut s, "a\"b\\c\n\u{1}é");
    assert_eq!(s, r#""a\"b\\c\n\u0001é""#);
    let mut f = String::new();
    write_f64(&mut f, 1732000000.123456);
    assert_eq!(f.parse::<f64>().unwrap(), 1732000000.123456);
  }
}
