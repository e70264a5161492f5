//! [`Server`] on a port of the loopback, and raw HTTP/1.1 over it: what the in-process
//! router cannot show (how the server ends, what a connection sees while it does).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use met_server::serve::{ConnectionLimits, Server};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::TestServer;

/// A [`Server`] running [`Server::run`] on its own task.
pub struct Serving {
    /// Where it listens.
    pub addr: SocketAddr,
    /// A signal's name sent here starts a drain.
    pub signals: mpsc::Sender<&'static str>,
    ended: JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// Serves this server's app on a free port of the loopback; a drain gives in-flight
    /// requests at most `drain_timeout`. The header-read timeout is a minute, so that only
    /// a drain closes an idle connection within a test.
    pub async fn serve_on_socket(&self, drain_timeout: Duration) -> Serving {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let limits = ConnectionLimits { max_connections: 64, read_timeout: Duration::from_secs(60) };
        let server = Server::start(listener, self.app.clone(), limits).unwrap();
        let addr = server.local_addr();
        let (signals, receiver) = mpsc::channel(4);
        let state = self.state.clone();
        let ended = tokio::spawn(async move { server.run(&state, drain_timeout, receiver).await });
        Serving { addr, signals, ended }
    }
}

impl Serving {
    /// What [`Server::run`] returned.
    ///
    /// # Panics
    /// It is still running after `limit`.
    pub async fn ended_within(self, limit: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(limit, self.ended).await {
            Ok(joined) => joined.unwrap(),
            Err(_) => panic!("the server was still running {limit:?} later"),
        }
    }

    /// Waits (up to 10 s) until the server no longer accepts connections.
    pub async fn wait_until_closed(&self) {
        for _ in 0..1000 {
            if TcpStream::connect(self.addr).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} still accepts connections after 10 s", self.addr);
    }
}

/// POSTs `body` as JSON on a new connection (`Connection: close`), sending only its first
/// `sent` bytes: the rest is the caller's to write.
pub async fn send_post_part(addr: SocketAddr, path: &str, body: &[u8], sent: usize) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body[..sent]).await.unwrap();
    tcp
}

/// POSTs `body` as JSON on a new connection (`Connection: close`); the answer is to be read.
pub async fn send_post(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let body = body.to_string();
    send_post_part(addr, path, body.as_bytes(), body.len()).await
}

/// Reads until the server closes the connection (at most 10 s).
pub async fn read_to_end(mut tcp: TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got)).await;
    read.expect("the server closed the connection within 10 s").unwrap();
    String::from_utf8_lossy(&got).into_owned()
}
