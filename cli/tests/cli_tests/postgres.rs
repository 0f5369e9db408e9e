//! The test PostgreSQL, shared by the modules that need one: a fresh database per test, and a relay in front of
//! the server that can freeze or cut the link, as a network between machines does.

use std::time::Duration;

/// A fresh database on the PostgreSQL named by `TOOLTUNE_TEST_POSTGRES_URL` (required, as in the store's tests):
/// its URL, and the admin URL and name to drop it with.
pub(crate) async fn fresh_postgres() -> (String, String, String) {
    use sqlx::Connection;
    let admin = std::env::var("TOOLTUNE_TEST_POSTGRES_URL").expect(
        "TOOLTUNE_TEST_POSTGRES_URL must name a PostgreSQL server: run the tests through scripts/test, which starts one",
    );
    let name = format!(
        "tooltune_workers_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut c)
        .await
        .expect("create test database");
    let (base, _) = admin.rsplit_once('/').expect("URL with a database path");
    (format!("{base}/{name}"), admin, name)
}

/// A TCP relay in front of the test PostgreSQL with two faults. A freeze stops forwarding and keeps every
/// socket open, and holds new connections open without forwarding them: packets dropped without a reset, as on a
/// broken route between machines, which no socket error reports (only the client's own time limits notice). A
/// cut closes every connection through it and each new one as soon as it is accepted: a link that drops.
/// `restore` lets connections through again (frozen ones are closed then: they did not survive).
pub(crate) struct Relay {
    /// `db` with the relay's address in place of the server's.
    pub(crate) url: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Sockets of frozen connections, kept open until the freeze ends.
    parked: std::sync::Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>>,
}

impl Relay {
    pub(crate) async fn start(db: &str) -> Relay {
        use std::sync::atomic::Ordering;
        // postgres://user@host:port/name
        let after_scheme = db.split_once("://").expect("a URL").1;
        let authority = after_scheme.split('/').next().expect("authority");
        let server = authority
            .rsplit_once('@')
            .map_or(authority, |(_, h)| h)
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("relay port");
        let addr = listener.local_addr().expect("relay address");
        let relay = Relay {
            url: db.replacen(&server, &addr.to_string(), 1),
            cut: Default::default(),
            frozen: Default::default(),
            live: Default::default(),
            parked: Default::default(),
        };
        let (cut, frozen, live, parked) = (
            relay.cut.clone(),
            relay.frozen.clone(),
            relay.live.clone(),
            relay.parked.clone(),
        );
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if cut.load(Ordering::SeqCst) {
                    continue;
                }
                if frozen.load(Ordering::SeqCst) {
                    parked.lock().expect("relay lock").push(inbound);
                    continue;
                }
                let (server, frozen, parked) = (server.clone(), frozen.clone(), parked.clone());
                let task = tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&server).await else {
                        return;
                    };
                    let freeze = async {
                        while !frozen.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    };
                    let froze = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        () = freeze => true,
                    };
                    if froze {
                        parked
                            .lock()
                            .expect("relay lock")
                            .extend([inbound, outbound]);
                    }
                });
                live.lock().expect("relay lock").push(task.abort_handle());
            }
        });
        relay
    }

    pub(crate) fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.frozen
            .store(false, std::sync::atomic::Ordering::SeqCst);
        for t in self.live.lock().expect("relay lock").drain(..) {
            t.abort();
        }
        self.parked.lock().expect("relay lock").clear();
    }

    pub(crate) fn restore(&self) {
        self.cut();
        // Past the cut, new connections go through again.
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Drops a database made by [`fresh_postgres`] (best effort: a test's verdict does not depend on its cleanup).
pub(crate) async fn drop_postgres(admin: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut c)
            .await;
    }
}
