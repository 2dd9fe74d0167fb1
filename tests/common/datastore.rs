//! Which datastore the integration tests run cetera on, chosen with
//! CETERA_TEST_BACKEND = sqlite (the default) | postgres | mysql. Every server
//! a test starts gets a database of its own, dropped when the test ends.

use std::path::Path;

/// A datastore kind the suite can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestBackend {
    /// A SQLite file in the test's temporary directory.
    Sqlite,
    /// A fresh database on the local PostgreSQL.
    Postgres,
    /// A fresh database on the local MySQL/MariaDB.
    Mysql,
}

/// The backend chosen for this run.
pub fn test_backend() -> TestBackend {
    match std::env::var("CETERA_TEST_BACKEND").as_deref() {
        Ok("postgres") => TestBackend::Postgres,
        Ok("mysql") => TestBackend::Mysql,
        Ok("sqlite") | Err(_) => TestBackend::Sqlite,
        Ok(other) => panic!("CETERA_TEST_BACKEND={other}: expected sqlite, postgres or mysql"),
    }
}

/// The PostgreSQL server the tests use unless CETERA_TEST_POSTGRES_URL names another
/// (docker-compose.yml's serves it).
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// The MySQL/MariaDB server the tests use unless CETERA_TEST_MYSQL_URL names another
/// (docker-compose.yml's serves it).
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306";

fn postgres_base() -> String {
    std::env::var("CETERA_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_string())
}

fn mysql_base() -> String {
    std::env::var("CETERA_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_string())
}

/// A database for one server; cetera creates it on first start, and it is
/// dropped with this value.
pub struct FreshDatabase {
    /// The `--endpoint` to give cetera.
    pub endpoint: String,
    backend: TestBackend,
    name: String,
}

impl FreshDatabase {
    /// A new database of the chosen kind; SQLite files go in `dir`.
    pub fn new(dir: &Path) -> FreshDatabase {
        FreshDatabase::of(test_backend(), dir)
    }

    /// A new database of `backend`, whatever CETERA_TEST_BACKEND says; an
    /// SQLite file goes in `dir` (one per directory).
    pub fn of(backend: TestBackend, dir: &Path) -> FreshDatabase {
        let name = format!("cetera_it_{:016x}", rand::random::<u64>());
        let endpoint = match backend {
            TestBackend::Sqlite => format!("sqlite://{}", dir.join("state.db").display()),
            TestBackend::Postgres => format!(
                "{}/{name}?sslmode=disable",
                postgres_base().trim_end_matches('/')
            ),
            TestBackend::Mysql => format!("{}/{name}", mysql_base().trim_end_matches('/')),
        };
        FreshDatabase {
            endpoint,
            backend,
            name,
        }
    }

    /// The SQLite file, for tests that look at it; None on other backends.
    pub fn sqlite_path(&self) -> Option<&str> {
        self.endpoint.strip_prefix("sqlite://")
    }

    /// Whether the database server for `backend` accepts connections (SQLite
    /// always does).
    pub fn reachable(backend: TestBackend) -> bool {
        let base = match backend {
            TestBackend::Sqlite => return true,
            TestBackend::Postgres => postgres_base(),
            TestBackend::Mysql => mysql_base(),
        };
        let host_port = base
            .split("://")
            .nth(1)
            .and_then(|rest| rest.rsplit('@').next())
            .map(|rest| {
                rest.split(['/', '?'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_default();
        std::net::TcpStream::connect(host_port.as_str()).is_ok()
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let (backend, name) = (self.backend, self.name.clone());
        if backend == TestBackend::Sqlite {
            return;
        }
        // Drop runs outside any runtime guarantee; use a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                match backend {
                    TestBackend::Postgres => {
                        let url = format!("{}/postgres", postgres_base().trim_end_matches('/'));
                        let (client, connection) =
                            tokio_postgres::connect(&url, tokio_postgres::NoTls)
                                .await
                                .ok()?;
                        tokio::spawn(connection);
                        client
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .await
                            .ok()
                    }
                    TestBackend::Mysql => {
                        use mysql_async::prelude::Queryable;
                        let opts = mysql_async::Opts::from_url(&mysql_base()).ok()?;
                        let mut conn = mysql_async::Conn::new(opts).await.ok()?;
                        conn.query_drop(format!("DROP DATABASE IF EXISTS {name}"))
                            .await
                            .ok()?;
                        conn.disconnect().await.ok()
                    }
                    TestBackend::Sqlite => None,
                }
            })
        });
        let _ = dropped.join();
    }
}
