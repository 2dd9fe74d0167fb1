//! Plain HTTP/1.1 requests, for the servers' metrics and health endpoints.

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
