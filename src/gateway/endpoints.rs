//! etcd's plain HTTP endpoints: `/version`, `/health`, `/metrics`, and the
//! `/livez` and `/readyz` checks of etcd 3.5.11 and later, answered as
//! etcd's etcdhttp package answers them, for the emulated version.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Method, Response, StatusCode, header};

use super::json::{plain_text, text_error};
use crate::api::ServerInfo;
use crate::backend::Backend;
use crate::proto::etcdserverpb::{AlarmType, RangeRequest};
use crate::store::Store;

/// How long a health check's read may take (etcd's request timeout).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Renders the Prometheus registry, its store gauges refreshed first.
pub type RenderMetrics =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// The endpoints' view of the server.
pub struct Endpoints<B: Backend> {
    pub(super) store: Arc<Store<B>>,
    pub(super) info: Arc<ServerInfo>,
    pub(super) render_metrics: RenderMetrics,
}

/// etcd's /version answer, its fields in its order.
#[derive(serde::Serialize)]
struct Versions<'a> {
    etcdserver: &'a str,
    etcdcluster: &'a str,
    /// The storage version, which etcd 3.6 and later add.
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<&'a str>,
}

/// etcd's /health answer.
#[derive(serde::Serialize)]
struct Health<'a> {
    health: &'a str,
    reason: &'a str,
}

/// (major, minor, patch) of a version such as `3.5.13` or `v3.6.0-rc.1`.
pub(super) fn version_numbers(version: &str) -> (u64, u64, u64) {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|part| part.parse().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// The values of `name` in a query string.
fn query_values<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = String> + 'a {
    query.split('&').filter_map(move |pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        (decode(key) == name).then(|| decode(value))
    })
}

fn has_param(query: &str, name: &str) -> bool {
    query_values(query, name).next().is_some()
}

impl<B: Backend> Endpoints<B> {
    fn emulated(&self) -> (u64, u64, u64) {
        version_numbers(&self.info.version)
    }

    /// Whether the emulated etcd serves /livez and /readyz (3.5.11 and later).
    fn has_livez(&self) -> bool {
        self.emulated() >= (3, 5, 11)
    }

    /// The answer for `path`, if it is one of these endpoints. `with_version`
    /// is false on the --listen-metrics-urls listeners, which serve only the
    /// metrics and health checks.
    pub async fn answer(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        with_version: bool,
    ) -> Option<Response<Body>> {
        let checks = self.has_livez();
        match path {
            "/version" if with_version => Some(get_only(method).unwrap_or_else(|| self.version())),
            "/health" => Some(match get_only(method) {
                Some(refused) => refused,
                None => self.health(query).await,
            }),
            "/metrics" => Some(self.metrics().await),
            "/livez" | "/readyz" if checks => {
                let kind = &path[1..];
                Some(match get_only(method) {
                    Some(refused) => refused,
                    None => self.checks(kind, None, query).await,
                })
            }
            _ if checks => {
                let (kind, check) = path.strip_prefix('/')?.split_once('/')?;
                if !check_names(kind, self.emulates_36()).contains(&check) {
                    return None;
                }
                Some(match get_only(method) {
                    Some(refused) => refused,
                    None => self.checks(kind, Some(check), query).await,
                })
            }
            _ => None,
        }
    }

    /// Whether the emulated etcd is 3.6 or later.
    fn emulates_36(&self) -> bool {
        self.emulated() >= (3, 6, 0)
    }

    /// `{"etcdserver":"3.5.13","etcdcluster":"3.5.0"}`, and from 3.6 on with
    /// the storage version, which etcd keeps at the cluster version:
    /// `{"etcdserver":"3.7.3","etcdcluster":"3.7.0","storage":"3.7.0"}`.
    fn version(&self) -> Response<Body> {
        let (major, minor, _) = self.emulated();
        let cluster = format!("{major}.{minor}.0");
        let body = Versions {
            etcdserver: &self.info.version,
            etcdcluster: &cluster,
            storage: self.emulates_36().then_some(cluster.as_str()),
        };
        let body = serde_json::to_string(&body).expect("versions serialize");
        let mut response = Response::new(Body::from(body));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    async fn metrics(&self) -> Response<Body> {
        let text = (self.render_metrics)().await;
        let mut response = Response::new(Body::from(text));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(prometheus::TEXT_FORMAT),
        );
        response
    }

    /// etcd's /health: an alarm not excluded, no leader (unless
    /// `serializable=true`, 3.5.3 and later), or a failed read make it
    /// `{"health":"false","reason":...}` with 503.
    async fn health(&self, query: &str) -> Response<Body> {
        let excluded: Vec<String> = query_values(query, "exclude")
            .filter(|a| !a.is_empty())
            .collect();
        let serializable = self.emulated() >= (3, 5, 3)
            && query_values(query, "serializable").next().as_deref() == Some("true");
        let reason = self.health_problem(&excluded, serializable).await;
        let body = Health {
            health: if reason.is_none() { "true" } else { "false" },
            reason: reason.as_deref().unwrap_or(""),
        };
        let body = serde_json::to_string(&body).expect("health serializes");
        match reason {
            None => {
                let mut response = Response::new(Body::from(body));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                response
            }
            Some(_) => text_error(StatusCode::SERVICE_UNAVAILABLE, &body),
        }
    }

    async fn health_problem(&self, excluded: &[String], serializable: bool) -> Option<String> {
        let alarms = match self.store.alarms(AlarmType::None as i32).await {
            Ok(alarms) => alarms,
            Err(error) => {
                return Some(format!(
                    "RANGE ERROR:{}",
                    tonic::Status::from(error).message()
                ));
            }
        };
        for row in alarms {
            let name = alarm_name(row.alarm);
            if excluded.contains(&name) {
                continue;
            }
            return Some(match AlarmType::try_from(row.alarm) {
                Ok(AlarmType::Nospace) => "ALARM NOSPACE".to_string(),
                Ok(AlarmType::Corrupt) => "ALARM CORRUPT".to_string(),
                _ => "ALARM UNKNOWN".to_string(),
            });
        }
        if !serializable && !self.has_leader() {
            return Some("RAFT NO LEADER".to_string());
        }
        self.read(serializable)
            .await
            .err()
            .map(|error| format!("RANGE ERROR:{error}"))
    }

    /// Whether there is a leader as etcd's health check asks: a member that
    /// has not heard from its leader for an election timeout has none, and
    /// says so at once instead of waiting for a read to time out.
    fn has_leader(&self) -> bool {
        self.info
            .cluster()
            .is_none_or(|cluster| cluster.has_leader())
    }

    /// The read a health check makes: one key, keys only.
    async fn read(&self, serializable: bool) -> Result<(), String> {
        let request = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            keys_only: true,
            limit: 1,
            serializable,
            ..Default::default()
        };
        match tokio::time::timeout(READ_TIMEOUT, self.store.range(&request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(tonic::Status::from(error).message().to_string()),
            Err(_) => Err("etcdserver: request timed out".to_string()),
        }
    }

    /// /livez, /readyz or one of their checks: `ok`, or 503 with each
    /// check's line.
    async fn checks(&self, kind: &str, only: Option<&str>, query: &str) -> Response<Body> {
        let excluded: Vec<String> = query_values(query, "exclude").collect();
        let mut failed = false;
        let mut lines = String::new();
        for &name in check_names(kind, self.emulates_36()) {
            if only.is_some_and(|only| only != name) || excluded.iter().any(|e| e == name) {
                continue;
            }
            let outcome = match name {
                "data_corruption" => self.corruption_check().await,
                "serializable_read" => self.read(true).await,
                "non_learner" => self.not_a_learner(),
                _ => {
                    if self.has_leader() {
                        self.read(false).await
                    } else {
                        Err("etcdserver: no leader".to_string())
                    }
                }
            };
            match outcome {
                Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
                Err(error) => {
                    failed = true;
                    lines.push_str(&format!("[-]{name} failed: {error}\n"));
                }
            }
        }
        if failed {
            // http.Error adds a line end to the lines, which end in one.
            return text_error(StatusCode::SERVICE_UNAVAILABLE, &lines);
        }
        let mut body = String::new();
        if has_param(query, "verbose") {
            body.push_str(&lines);
        }
        body.push_str("ok\n");
        plain_text(StatusCode::OK, body)
    }

    /// etcd 3.6's non_learner check: a learner is not ready.
    fn not_a_learner(&self) -> Result<(), String> {
        let me = self.info.identity.member_id;
        let learner = self
            .info
            .cluster()
            .is_some_and(|cluster| cluster.members().iter().any(|m| m.id == me && m.is_learner));
        if learner {
            Err("not supported for learner".to_string())
        } else {
            Ok(())
        }
    }

    async fn corruption_check(&self) -> Result<(), String> {
        let alarms = self
            .store
            .alarms(AlarmType::Corrupt as i32)
            .await
            .map_err(|error| tonic::Status::from(error).message().to_string())?;
        if alarms.is_empty() {
            Ok(())
        } else {
            Err("alarm activated: CORRUPT".to_string())
        }
    }
}

/// The checks of /livez and /readyz, in a fixed order (etcd's map order
/// varies from one answer to the next); etcd 3.6 added /readyz's
/// non_learner.
fn check_names(kind: &str, emulates_36: bool) -> &'static [&'static str] {
    match kind {
        "livez" => &["serializable_read"],
        "readyz" if emulates_36 => &[
            "data_corruption",
            "linearizable_read",
            "non_learner",
            "serializable_read",
        ],
        "readyz" => &["data_corruption", "linearizable_read", "serializable_read"],
        _ => &[],
    }
}

fn alarm_name(alarm: i32) -> String {
    AlarmType::try_from(alarm).map_or_else(|_| alarm.to_string(), |a| a.as_str_name().to_string())
}

/// Go's refusal of any method but GET on these endpoints.
fn get_only(method: &Method) -> Option<Response<Body>> {
    if method == Method::GET {
        return None;
    }
    let mut response = text_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_versions_and_queries() {
        assert_eq!(version_numbers("3.5.13"), (3, 5, 13));
        assert_eq!(version_numbers("v3.6.0-rc.1"), (3, 6, 0));
        let query = "exclude=NOSPACE&exclude=&serializable=true&verbose";
        assert_eq!(
            query_values(query, "exclude").collect::<Vec<_>>(),
            vec!["NOSPACE", ""]
        );
        assert!(has_param(query, "verbose"));
        assert!(!has_param(query, "other"));
    }
}
