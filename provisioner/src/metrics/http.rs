//! The HTTP endpoints: `GET /metrics` (the Prometheus text format), `/healthz` and `/readyz`,
//! on each `--metrics-addr`. Every listener serves at most [`MAX_HTTP_CONNECTIONS`] connections
//! at once, each for a bounded time: a flood of connections to one address (the node's, which
//! the cluster reaches) costs the daemon a bounded number of file descriptors and never takes
//! the slots of another (loopback, where the kubelet probes).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::Metrics;

/// The port of a `--metrics-addr` given as an address alone.
pub const DEFAULT_PORT: u16 = 9640;
/// Connections one listener serves at once; a connection beyond them is closed at once.
pub const MAX_HTTP_CONNECTIONS: usize = 64;
/// Time a client has to send its request head, and then to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read.
const MAX_HEAD: usize = 2048;
/// Pause after a failed accept (no fd left for now), instead of spinning on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A `--metrics-addr` value: `IP:PORT`, `[IPv6]:PORT`, or an address alone (port
/// [`DEFAULT_PORT`]), so that a downward-API `$(NODE_IP)` of either family fits.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>()
        .or_else(|_| {
            text.parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
        })
        .map_err(|_| format!("{text:?} is neither IP:PORT nor an IP address"))
}

/// Serves `GET /metrics`, `/healthz` (200 while the process serves) and `/readyz` (200 while
/// `provisioner_ready` is 1, else 503) on `addr` until the task is dropped. `refresh` runs before
/// each scrape to copy values that live elsewhere (readiness, tracer counters) into the metrics.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    refresh: Arc<dyn Fn(&Metrics) + Send + Sync>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        %addr,
        loopback = addr.ip().is_loopback(),
        "serving metrics on http://{addr}/metrics"
    );
    let slots = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // A connection reset before it was accepted, or no fd left for now: the endpoint
            // keeps serving.
            Err(err) => {
                tracing::warn!(%addr, error = %err, "metrics endpoint: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Beyond the cap the connection is closed unanswered: its fd is held for no longer
        // than this accept.
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%addr, "metrics endpoint: connection limit reached, closing one");
            continue;
        };
        let metrics = Arc::clone(&metrics);
        let refresh = Arc::clone(&refresh);
        tokio::spawn(async move {
            answer(&mut stream, &metrics, refresh.as_ref()).await;
            drop(slot);
        });
    }
}

/// Reads one request head and writes its answer, each within [`IO_TIMEOUT`].
async fn answer(
    stream: &mut tokio::net::TcpStream,
    metrics: &Metrics,
    refresh: &(dyn Fn(&Metrics) + Send + Sync),
) {
    let Ok(Ok(head)) = tokio::time::timeout(IO_TIMEOUT, read_head(stream)).await else {
        return;
    };
    let request = String::from_utf8_lossy(&head);
    let path = request
        .strip_prefix("GET ")
        .and_then(|rest| rest.split([' ', '?']).next())
        .unwrap_or("");
    let response = match path {
        "/metrics" => {
            refresh(metrics);
            http_response("200 OK", "text/plain; version=0.0.4", &metrics.encode())
        }
        // Alive: the process answers, ready or not ("not ready" is a normal state of a node
        // without a pod CIDR yet, not a reason to restart it).
        "/healthz" => http_response("200 OK", "text/plain", "ok\n"),
        "/readyz" if metrics.ready.get() == 1 => http_response("200 OK", "text/plain", "ready\n"),
        "/readyz" => http_response(
            "503 Service Unavailable",
            "text/plain",
            "not ready (`provisioner status` says why)\n",
        ),
        _ => http_response("404 Not Found", "text/plain", ""),
    };
    let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(response.as_bytes())).await;
}

/// The request's head (up to the blank line, at most [`MAX_HEAD`] bytes): a client may send its
/// request line in several segments.
async fn read_head(stream: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; MAX_HEAD];
    let mut len = 0;
    while len < head.len() && !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut head[len..]).await? {
            0 => break,
            n => len += n,
        }
    }
    head.truncate(len);
    Ok(head)
}

fn http_response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_head_sent_in_pieces_is_read_whole() -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let client = tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await?;
            stream.write_all(b"GET /rea").await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            stream.write_all(b"dyz HTTP/1.1\r\nHost: x\r\n\r\n").await
        });
        let (mut stream, _) = listener.accept().await?;
        let head = read_head(&mut stream).await?;
        client.await.map_err(std::io::Error::other)??;
        assert_eq!(head, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        Ok(())
    }

    #[test]
    fn an_address_alone_takes_the_default_port() {
        assert_eq!(
            parse_addr("10.0.0.5"),
            Ok(SocketAddr::from(([10, 0, 0, 5], DEFAULT_PORT)))
        );
        assert_eq!(
            parse_addr("fd00::5").map(|a| a.to_string()),
            Ok("[fd00::5]:9640".to_owned())
        );
        assert_eq!(parse_addr("127.0.0.1:9641").map(|a| a.port()), Ok(9641));
        assert_eq!(
            parse_addr("[fd00::5]:80").map(|a| a.to_string()),
            Ok("[fd00::5]:80".to_owned())
        );
        assert!(parse_addr("node-1:9640").is_err());
        assert!(parse_addr("").is_err());
    }

    /// Connections beyond the cap are closed unanswered while those within it are held; once
    /// they go, the endpoint answers again.
    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_at_once() -> std::io::Result<()> {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = probe.local_addr()?;
        drop(probe);
        let metrics = Arc::new(Metrics::new());
        let server = tokio::spawn(serve(addr, metrics, Arc::new(|_: &Metrics| {})));
        let mut connect = None;
        for _ in 0..50 {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => {
                    connect = Some(s);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let first = connect.ok_or_else(|| std::io::Error::other("the endpoint never listened"))?;
        let mut held = vec![first];
        for _ in 1..MAX_HTTP_CONNECTIONS {
            held.push(tokio::net::TcpStream::connect(addr).await?);
        }
        // Let the server take them all.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut extra = tokio::net::TcpStream::connect(addr).await?;
        extra.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await?;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(1), extra.read_to_end(&mut answer))
            .await
            .map_err(|_| std::io::Error::other("a connection beyond the cap was held"))?;
        assert!(
            read.is_err() || answer.is_empty(),
            "answered beyond the cap: {:?}",
            String::from_utf8_lossy(&answer)
        );
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut again = tokio::net::TcpStream::connect(addr).await?;
        again.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await?;
        let mut answer = String::new();
        again.read_to_string(&mut answer).await?;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        server.abort();
        Ok(())
    }
}
