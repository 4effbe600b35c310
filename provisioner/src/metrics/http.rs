//! The HTTP endpoints: `GET /metrics` (the Prometheus text format), `/healthz` and `/readyz`,
//! on each `--metrics-addr`. Every listener serves at most [`MAX_HTTP_CONNECTIONS`] connections
//! at once, each for a bounded time: a flood of connections to one address (the node's, which
//! the cluster reaches) costs the daemon a bounded number of file descriptors and never takes
//! the slots of another (loopback, where the kubelet probes). HTTP/1.1 is hyper's; the cap and
//! the time bounds are this file's.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Notify, Semaphore};

use super::Metrics;

/// Copies values that live elsewhere into the metrics before a scrape.
type Refresh = Arc<dyn Fn(&Metrics) + Send + Sync>;

/// The port of a `--metrics-addr` given as an address alone.
pub const DEFAULT_PORT: u16 = 9640;
/// Connections one listener serves at once; a connection beyond them is closed at once.
pub const MAX_HTTP_CONNECTIONS: usize = 64;
/// Time a client has to send its request head, and then to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read (hyper's smallest read buffer); a larger one is answered 431.
const MAX_HEAD: usize = 8192;
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
    refresh: Refresh,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        %addr,
        loopback = addr.ip().is_loopback(),
        "serving metrics on http://{addr}/metrics"
    );
    let slots = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
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
            answer(stream, metrics, refresh).await;
            drop(slot);
        });
    }
}

/// Serves one request on `stream`: its head must come within [`IO_TIMEOUT`] (else the
/// connection is closed unanswered), and the answer be taken within [`IO_TIMEOUT`] after it.
async fn answer(stream: tokio::net::TcpStream, metrics: Arc<Metrics>, refresh: Refresh) {
    let asked = Arc::new(Notify::new());
    let service = {
        let asked = Arc::clone(&asked);
        service_fn(move |request: Request<Incoming>| {
            asked.notify_one();
            let response = respond(&request, &metrics, refresh.as_ref());
            std::future::ready(Ok::<_, Infallible>(response))
        })
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let head = tokio::time::timeout(IO_TIMEOUT, async {
        tokio::select! {
            // Closed, or refused by hyper, before a request was served.
            _ = &mut connection => false,
            () = asked.notified() => true,
        }
    })
    .await;
    if head != Ok(true) {
        return;
    }
    if let Err(err) = tokio::time::timeout(IO_TIMEOUT, connection)
        .await
        .unwrap_or(Ok(()))
    {
        tracing::debug!(error = %err, "metrics endpoint: answer not taken");
    }
}

/// The answer to `request`.
fn respond(
    request: &Request<Incoming>,
    metrics: &Metrics,
    refresh: &(dyn Fn(&Metrics) + Send + Sync),
) -> Response<String> {
    let path = match request.method() {
        &Method::GET => request.uri().path(),
        _ => "",
    };
    match path {
        "/metrics" => {
            refresh(metrics);
            plain(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics.encode(),
            )
        }
        // Alive: the process answers, ready or not ("not ready" is a normal state of a node
        // without a pod CIDR yet, not a reason to restart it).
        "/healthz" => plain(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if metrics.ready.get() == 1 => {
            plain(StatusCode::OK, "text/plain", "ready\n".to_owned())
        }
        "/readyz" => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready (`provisioner status` says why)\n".to_owned(),
        ),
        _ => plain(StatusCode::NOT_FOUND, "text/plain", String::new()),
    }
}

fn plain(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server on a free loopback port; its address.
    async fn start(metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = probe.local_addr()?;
        drop(probe);
        tokio::spawn(serve(addr, metrics, Arc::new(|_: &Metrics| {})));
        for _ in 0..50 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(addr);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(std::io::Error::other("the endpoint never listened"))
    }

    /// What the endpoint answers to `request`, sent in `pieces` 50 ms apart.
    async fn exchange(addr: SocketAddr, pieces: &[&str]) -> std::io::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        for piece in pieces {
            stream.write_all(piece.as_bytes()).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
            .await
            .map_err(|_| std::io::Error::other("no answer within 5 s"))??;
        Ok(answer)
    }

    #[tokio::test]
    async fn each_path_is_answered_with_its_status_and_body() -> std::io::Result<()> {
        let metrics = Arc::new(Metrics::new());
        let addr = start(Arc::clone(&metrics)).await?;
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        let healthz = exchange(addr, &[&get("/healthz")]).await?;
        assert!(healthz.starts_with("HTTP/1.1 200 OK\r\n"), "{healthz}");
        assert!(healthz.ends_with("\r\n\r\nok\n"), "{healthz}");
        let lower = healthz.to_ascii_lowercase();
        assert!(lower.contains("content-length: 3\r\n"), "{healthz}");
        assert!(lower.contains("connection: close\r\n"), "{healthz}");
        let readyz = exchange(addr, &[&get("/readyz")]).await?;
        assert!(
            readyz.starts_with("HTTP/1.1 503 Service Unavailable"),
            "{readyz}"
        );
        assert!(
            readyz.ends_with("not ready (`provisioner status` says why)\n"),
            "{readyz}"
        );
        metrics.ready.set(1);
        let readyz = exchange(addr, &[&get("/readyz?verbose")]).await?;
        assert!(
            readyz.starts_with("HTTP/1.1 200 OK") && readyz.ends_with("ready\n"),
            "{readyz}"
        );
        let scrape = exchange(addr, &[&get("/metrics")]).await?;
        assert!(scrape.contains("text/plain; version=0.0.4"), "{scrape}");
        assert!(
            scrape.lines().any(|l| l == "provisioner_ready 1"),
            "{scrape}"
        );
        let other = exchange(addr, &[&get("/")]).await?;
        assert!(other.starts_with("HTTP/1.1 404 Not Found"), "{other}");
        let post = exchange(
            addr,
            &["POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n"],
        )
        .await?;
        assert!(post.starts_with("HTTP/1.1 404 Not Found"), "{post}");
        Ok(())
    }

    #[tokio::test]
    async fn a_request_head_sent_in_pieces_is_answered() -> std::io::Result<()> {
        let addr = start(Arc::new(Metrics::new())).await?;
        let answer = exchange(addr, &["GET /hea", "lthz HTTP/1.1\r\nHost: x\r\n\r\n"]).await?;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        Ok(())
    }

    #[tokio::test]
    async fn a_request_head_over_the_bound_is_refused() -> std::io::Result<()> {
        let addr = start(Arc::new(Metrics::new())).await?;
        let long = format!(
            "GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        let answer = exchange(addr, &[&long]).await?;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        Ok(())
    }

    /// A client that sends no request is closed, unanswered, once its time to send one is over.
    #[tokio::test]
    async fn a_silent_connection_is_closed_after_its_time() -> std::io::Result<()> {
        let addr = start(Arc::new(Metrics::new())).await?;
        let started = std::time::Instant::now();
        let answer = exchange(addr, &["GET /healthz HTTP/1.1\r\n"]).await?;
        let took = started.elapsed();
        assert!(answer.is_empty(), "{answer}");
        assert!(
            took >= IO_TIMEOUT - Duration::from_millis(100),
            "closed after {took:?}"
        );
        assert!(
            took < IO_TIMEOUT + Duration::from_secs(1),
            "closed after {took:?}"
        );
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
