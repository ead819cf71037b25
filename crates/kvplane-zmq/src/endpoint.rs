//! The endpoints a link connects to: `tcp://HOST:PORT` and `ipc://PATH`, as ZMQ writes them.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
  Tcp { host: String, port: u16 },
  Ipc { path: String },
}

impl Endpoint {
  /// Parses an endpoint; `None` for transports a link does not speak (`inproc://`, `*` binds).
  pub fn parse(s: &str) -> Option<Endpoint> {
    if let Some(path) = s.strip_prefix("ipc://") {
      return (!path.is_empty()).then(|| Endpoint::Ipc {
        path: path.to_string(),
      });
    }
    let rest = s.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host == "*" {
      return None;
    }
    let port = port.parse().ok().filter(|&p| p != 0)?;
    Some(Endpoint::Tcp {
      host: host.to_string(),
      port,
    })
  }
}

impl fmt::Display for Endpoint {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match self {
      Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
      Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
      Endpoint::Ipc { path } => write!(f, "ipc://{path}"),
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn parses_what_zmq_writes() {
    assert_eq!(
      Endpoint::parse("tcp://127.0.0.1:5557"),
      Some(Endpoint::Tcp {
        host: "127.0.0.1".into(),
        port: 5557
      })
    );
    assert_eq!(
      Endpoint::parse("tcp://[::1]:5557"),
      Some(Endpoint::Tcp {
        host: "::1".into(),
        port: 5557
      })
    );
    assert_eq!(
      Endpoint::parse("ipc:///tmp/kv"),
      Some(Endpoint::Ipc {
        path: "/tmp/kv".into()
      })
    );
    assert_eq!(Endpoint::parse("tcp://*:5557"), None);
    assert_eq!(Endpoint::parse("inproc://kv"), None);
    assert_eq!(Endpoint::parse("tcp://host:port"), None);
    assert_eq!(
      Endpoint::parse("tcp://[::1]:5557").unwrap().to_string(),
      "tcp://[::1]:5557"
    );
  }
}
