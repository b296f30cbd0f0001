//! An `idem serve` process inside a host, on fixed ports of the host's own address:
//! started, killed with `SIGKILL`, paused with `SIGSTOP` and resumed, restarted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Child;

use crate::net::Host;

/// The admin token every gateway of a run is started with: the admin listener's record
/// listing, which the checker reads, is closed without one.
pub const ADMIN_TOKEN: &str = "nemesis-admin-token-0123456789abcdef";

/// The port a gateway listens on, on its host's address.
pub const PORT: u16 = 8080;
/// The port of its admin listener.
pub const ADMIN_PORT: u16 = 9090;

/// A gateway process; killed on drop.
#[derive(Debug)]
pub struct Gateway {
    host: Host,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Gateway {
    /// Starts `BINARY serve ARGS…` inside `host`, listening on its address, logging
    /// to `log` (appended to across restarts), and waits until it accepts
    /// connections.
    pub async fn start(
        host: Host,
        binary: PathBuf,
        args: Vec<String>,
        log: PathBuf,
    ) -> Result<Gateway, String> {
        let mut gw = Gateway {
            host,
            binary,
            args,
            log,
            child: None,
        };
        gw.launch().await?;
        Ok(gw)
    }

    async fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut cmd = self.host.command(&self.binary);
        cmd.arg("serve")
            .args(["--listen", &self.addr().to_string()])
            .args(["--admin", &self.admin().to_string()])
            .args(&self.args)
            .env("IDEM_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("IDEM_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("IDEM_LOG", "info")
            .env("IDEM_ADMIN_TOKEN", ADMIN_TOKEN);
        let mut child = cmd.spawn().map_err(|e| format!("idem: {e}"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "the gateway exited ({status}):\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            if tokio::time::Instant::now() > deadline {
                return Err("the gateway did not listen within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
        Ok(())
    }

    /// Where it listens (reached from the root namespace through the veth).
    pub fn addr(&self) -> SocketAddr {
        (self.host.ip, PORT).into()
    }

    /// Where its admin listener is.
    pub fn admin(&self) -> SocketAddr {
        (self.host.ip, ADMIN_PORT).into()
    }

    /// The host it runs in.
    pub fn host(&self) -> &Host {
        &self.host
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .status();
        }
    }

    /// Stops it (`SIGSTOP`): it holds its connections and does nothing, as a process in
    /// a long stop-the-world pause or a frozen VM.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets it run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills it with `SIGKILL`, and reaps it.
    pub async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts it again with the same arguments (after [`kill9`](Self::kill9)).
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill9().await;
        self.launch().await
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A stopped process would ignore SIGTERM; SIGKILL does not wait for SIGCONT.
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }
}
