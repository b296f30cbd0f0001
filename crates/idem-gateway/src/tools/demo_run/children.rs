//! The demo's two child processes (the demo API and the gateway) and its directory:
//! started, waited for until they print their addresses, killed and removed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a child may take to print its address.
pub(super) const START_DEADLINE: Duration = Duration::from_secs(30);

/// The demo's children and directory, stopped and removed on drop unless kept.
pub(super) struct Children {
    pub(super) dir: PathBuf,
    pub(super) exe: PathBuf,
    pub(super) api: Option<Child>,
    pub(super) gateway: Option<Child>,
    pub(super) restarts: u32,
    pub(super) keep: bool,
}

impl Children {
    fn stop(child: &mut Option<Child>) {
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The end of a log file, for an error message.
    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Starts `exe ARGS…` with its output in `NAME.out` and `NAME.log`, and waits for the
    /// line starting with `prefix`, whose rest is the address it listens on.
    pub(super) async fn spawn(
        &self,
        name: &str,
        args: &[&str],
        prefix: &str,
    ) -> Result<(Child, std::net::SocketAddr), String> {
        let out_path = self.dir.join(format!("{name}.out"));
        let out = std::fs::File::create(&out_path).map_err(|e| format!("{name}.out: {e}"))?;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| format!("{name}.log: {e}"))?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log);
        // The demo's own settings only: none of the caller's IDEM_* ones.
        for (k, _) in std::env::vars_os() {
            if k.to_str()
                .is_some_and(|k| k.starts_with("IDEM_") && k != "IDEM_LOG")
            {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.exe.display()))?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            if let Some(addr) = text
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|a| a.trim().parse().ok())
            {
                return Ok((child, addr));
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{name} did not start ({}):\n{}",
                    exited.map_or("no address in time".to_owned(), |s| s.to_string()),
                    self.log_tail(&format!("{name}.log"))
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(super) async fn start_gateway(
        &mut self,
        api: &str,
        listen: &str,
        store: &str,
    ) -> Result<std::net::SocketAddr, String> {
        let name = if self.restarts == 0 {
            "gateway".to_owned()
        } else {
            format!("gateway-{}", self.restarts + 1)
        };
        self.restarts += 1;
        let (child, addr) = self
            .spawn(
                &name,
                &[
                    "serve",
                    "--upstream",
                    api,
                    "--listen",
                    listen,
                    "--store",
                    store,
                ],
                "idem listening on http://",
            )
            .await?;
        self.gateway = Some(child);
        Ok(addr)
    }

    /// `kill -9` the gateway, and reap it.
    pub(super) fn kill_gateway(&mut self) {
        Children::stop(&mut self.gateway);
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        Children::stop(&mut self.gateway);
        Children::stop(&mut self.api);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
