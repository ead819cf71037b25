//! ZMTP 3.0 as a SUB peer speaks it (RFC 23/ZMTP, NULL mechanism): the greeting, the READY
//! command, the subscription message and frames. Pure byte handling; the I/O is in `link`.

use std::fmt;

/// A frame continues the message.
pub const MORE: u8 = 0x01;
/// The size is 8 bytes, not 1.
pub const LONG: u8 = 0x02;
/// A command, not a message frame.
pub const COMMAND: u8 = 0x04;

/// The greeting's length: signature (10), version (2), mechanism (20), as-server (1), filler (31).
pub const GREETING_LEN: usize = 64;

/// Why a peer's bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmtpError(pub String);

impl fmt::Display for ZmtpError {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str(&self.0)
  }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ZmtpError> {
  Err(ZmtpError(msg.into()))
}

/// This side's greeting: ZMTP 3.0, NULL mechanism, client. Announcing 3.0 keeps the peer to the
/// message form of subscriptions and without heartbeats, which is all a SUB needs.
pub fn greeting() -> [u8; GREETING_LEN] {
  let mut g = [0u8; GREETING_LEN];
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3;
  g[11] = 0;
  g[12..16].copy_from_slice(b"NULL");
  g
}

/// Checks a peer's greeting: ZMTP 3.x with the NULL mechanism.
pub fn check_greeting(g: &[u8; GREETING_LEN]) -> Result<(), ZmtpError> {
  if g[0] != 0xff || g[9] & 0x01 != 0x01 {
    return err("the peer is not a ZMTP 3 socket (bad signature)");
  }
  if g[10] < 3 {
    return err(format!(
      "the peer speaks ZMTP {}.{}; 3.x is needed",
      g[10], g[11]
    ));
  }
  let mech = &g[12..32];
  let end = mech.iter().position(|&b| b == 0).unwrap_or(mech.len());
  if &mech[..end] != b"NULL" {
    return err(format!(
      "the peer asks for the {} mechanism; only NULL is spoken",
      String::from_utf8_lossy(&mech[..end])
    ));
  }
  Ok(())
}

/// A frame's header for a body of `len` bytes.
pub fn frame_header(flags: u8, len: usize, out: &mut Vec<u8>) {
  if len <= 255 {
    out.push(flags);
    out.push(len as u8);
  } else {
    out.push(flags | LONG);
    out.extend_from_slice(&(len as u64).to_be_bytes());
  }
}

/// The READY command announcing `socket_type`.
pub fn ready(socket_type: &str, out: &mut Vec<u8>) {
  let mut body = Vec::with_capacity(32);
  body.push(5);
  body.extend_from_slice(b"READY");
  body.push(11);
  body.extend_from_slice(b"Socket-Type");
  body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
  body.extend_from_slice(socket_type.as_bytes());
  frame_header(COMMAND, body.len(), out);
  out.extend_from_slice(&body);
}

/// The message subscribing to `topic` (ZMTP 3.0's form: a frame `0x01` + topic).
pub fn subscribe(topic: &[u8], out: &mut Vec<u8>) {
  frame_header(0, topic.len() + 1, out);
  out.push(1);
  out.extend_from_slice(topic);
}

/// A command's name and body.
pub fn command(body: &[u8]) -> Result<(&[u8], &[u8]), ZmtpError> {
  let n = *body
    .first()
    .ok_or_else(|| ZmtpError("empty command".into()))? as usize;
  if body.len() < 1 + n {
    return err("truncated command name");
  }
  Ok((&body[1..1 + n], &body[1 + n..]))
}

/// The `Socket-Type` a READY command's body announces; an ERROR command's reason as an error.
pub fn peer_socket_type(body: &[u8]) -> Result<String, ZmtpError> {
  let (name, mut rest) = command(body)?;
  if name == b"ERROR" {
    let reason = rest.get(1..).unwrap_or_default();
    return err(format!(
      "the peer refused: {}",
      String::from_utf8_lossy(reason)
    ));
  }
  if name != b"READY" {
    return err(format!(
      "expected READY, got {}",
      String::from_utf8_lossy(name)
    ));
  }
  while !rest.is_empty() {
    let n = rest[0] as usize;
    if rest.len() < 1 + n + 4 {
      return err("truncated READY property");
    }
    let key = &rest[1..1 + n];
    let vlen = u32::from_be_bytes(rest[1 + n..5 + n].try_into().unwrap()) as usize;
    if rest.len() < 5 + n + vlen {
      return err("truncated READY property value");
    }
    let value = &rest[5 + n..5 + n + vlen];
    if key.eq_ignore_ascii_case(b"Socket-Type") {
      return Ok(String::from_utf8_lossy(value).into_owned());
    }
    rest = &rest[5 + n + vlen..];
  }
  err("READY without a Socket-Type")
}

/// A frame at the start of `buf`: its flags, its body and the bytes it takes; `None` if it is
/// not whole there (or larger than `max`).
pub fn buffered_frame(buf: &[u8], max: usize) -> Option<(u8, &[u8], usize)> {
  let flags = *buf.first()?;
  let (len, head) = if flags & LONG != 0 {
    (u64::from_be_bytes(buf.get(1..9)?.try_into().ok()?), 9)
  } else {
    (*buf.get(1)? as u64, 2)
  };
  if len > max as u64 {
    return None;
  }
  let end = head + len as usize;
  Some((flags, buf.get(head..end)?, end))
}

/// A live message `[topic, 8-byte seq, payload]` whole at the start of `buf`: the bytes it takes,
/// its seq and payload. `None` for anything else (not whole yet, a command, another shape): the
/// reader then takes it the usual way.
pub fn buffered_message(buf: &[u8], max: usize) -> Option<(usize, u64, &[u8])> {
  let (f1, _, a) = buffered_frame(buf, max)?;
  let (f2, seq, b) = buffered_frame(&buf[a..], max)?;
  let (f3, payload, c) = buffered_frame(&buf[a + b..], max)?;
  let msg = |f: u8, more: bool| f & COMMAND == 0 && (f & MORE != 0) == more;
  if !(msg(f1, true) && msg(f2, true) && msg(f3, false)) || seq.len() != 8 {
    return None;
  }
  Some((a + b + c, u64::from_be_bytes(seq.try_into().ok()?), payload))
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn greeting_round_trip() {
    assert_eq!(check_greeting(&greeting()), Ok(()));
    let mut g = greeting();
    g[10] = 2;
    assert!(check_greeting(&g).is_err());
    let mut g = greeting();
    g[12..17].copy_from_slice(b"PLAIN");
    assert!(check_greeting(&g).unwrap_err().0.contains("PLAIN"));
  }

  #[test]
  fn ready_announces_the_socket_type() {
    let mut out = Vec::new();
    ready("PUB", &mut out);
    assert_eq!(out[0], COMMAND);
    assert_eq!(out[1] as usize, out.len() - 2);
    assert_eq!(peer_socket_type(&out[2..]).unwrap(), "PUB");
  }

  #[test]
  fn error_command_is_an_error() {
    let mut body = vec![5];
    body.extend_from_slice(b"ERROR");
    body.push(6);
    body.extend_from_slice(b"denied");
    assert!(peer_socket_type(&body).unwrap_err().0.contains("denied"));
  }

  #[test]
  fn finds_whole_messages_in_a_buffer() {
    let mut buf = Vec::new();
    for (flags, body) in [
      (MORE, &b"kv"[..]),
      (MORE, &7u64.to_be_bytes()[..]),
      (0, &[9u8; 300][..]),
    ] {
      frame_header(flags, body.len(), &mut buf);
      buf.extend_from_slice(body);
    }
    let whole = buf.len();
    buf.extend_from_slice(&[MORE, 2]);
    let (used, seq, payload) = buffered_message(&buf, 1 << 20).unwrap();
    assert_eq!((used, seq, payload), (whole, 7, &[9u8; 300][..]));
    // Cut anywhere, it is not whole.
    for cut in 0..whole {
      assert_eq!(buffered_message(&buf[..cut], 1 << 20), None);
    }
    // Over the bound, or a two-frame message: not taken here.
    assert_eq!(buffered_message(&buf, 100), None);
    let mut two = Vec::new();
    frame_header(MORE, 0, &mut two);
    frame_header(0, 8, &mut two);
    two.extend_from_slice(&[0; 8]);
    assert_eq!(buffered_message(&two, 1 << 20), None);
  }

  #[test]
  fn long_frames_use_eight_bytes() {
    let mut out = Vec::new();
    frame_header(MORE, 300, &mut out);
    assert_eq!(out[0], MORE | LONG);
    assert_eq!(u64::from_be_bytes(out[1..9].try_into().unwrap()), 300);
  }
}
