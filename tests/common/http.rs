//! Plain HTTP/1.1 requests, for the servers' metrics and health endpoints,
//! and /metrics scrapes parsed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Status code and body of `GET path` on `address`, over plain HTTP/1.1.
pub async fn get(address: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// One scrape of /metrics, parsed: series name with sorted labels to value.
#[derive(Debug)]
pub struct Scrape(Vec<(String, BTreeMap<String, String>, f64)>);

impl Scrape {
    /// Parses Prometheus' text format (the subset the server writes: no
    /// escaped quotes or commas inside label values, no timestamps).
    pub fn parse(text: &str) -> Scrape {
        let mut series = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name_labels, value) = line.rsplit_once(' ').expect("name and value");
            let (name, labels) = match name_labels.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (name_labels, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').expect("label=value");
                    (key.to_string(), value.trim_matches('"').to_string())
                })
                .collect();
            let value = match value {
                "+Inf" => f64::INFINITY,
                value => value.parse().expect("a number"),
            };
            series.push((name.to_string(), labels, value));
        }
        Scrape(series)
    }

    /// The sum of the series called `name` whose labels include `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    /// The values of label `label` among the series called `name`, sorted.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = self
            .0
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter_map(|(_, l, _)| l.get(label).cloned())
            .collect();
        values.sort();
        values.dedup();
        values
    }

    /// `grpc_server_handled_total` of `method` with `code`.
    pub fn handled(&self, method: &str, code: &str) -> f64 {
        self.value(
            "grpc_server_handled_total",
            &[("grpc_method", method), ("grpc_code", code)],
        )
    }
}

/// GET /metrics on `address`, which must answer 200, parsed.
pub async fn scrape(address: &str) -> Scrape {
    let (status, body) = get(address, "/metrics").await.expect("scrape /metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

/// Scrapes `address` until `done` holds of a scrape, for at most `within`:
/// gauges and counters that follow events the test only caused.
pub async fn scrape_until(
    address: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&Scrape) -> bool,
) -> Scrape {
    let deadline = Instant::now() + within;
    loop {
        let scrape = scrape(address).await;
        if done(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {scrape:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
