//! Restarting a private PostgreSQL server ([`PgServer`]) as a crash would, for tests of
//! what a store that goes away and comes back does to its clients.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::{
    PgServer, START_DEADLINE, chown, postgres_bin, server_user, wait_listening, watchdog,
};

/// Starts the `postgres` server of `dir/data`, its log appended to `dir/postgres.log`.
pub(crate) fn spawn_postgres(
    bin: &Path,
    dir: &Path,
    user: Option<(u32, u32)>,
) -> Result<Child, String> {
    let log = dir.join("postgres.log");
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| e.to_string())?;
    chown(&log, user)?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D").arg(dir.join("data")).current_dir(dir);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("postgres: {e}"))
}

impl PgServer {
    /// Stops the server at once, as a crash would (`SIGQUIT`, PostgreSQL's immediate
    /// shutdown: no checkpoint, every connection dropped), starts it again on the same
    /// data and port, and waits until it accepts connections: it recovers from its WAL.
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = Command::new("kill")
            .args(["-QUIT", &self.server.id().to_string()])
            .status();
        let start = Instant::now();
        while !matches!(self.server.try_wait(), Ok(Some(_))) {
            if start.elapsed() > START_DEADLINE {
                let _ = self.server.kill();
                let _ = self.server.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.server = spawn_postgres(&postgres_bin()?, &self.dir, server_user()?)?;
        let watchdog = watchdog(Some(self.server.id()), &self.dir)?;
        let mut old = std::mem::replace(&mut self.watchdog, watchdog);
        let _ = old.kill();
        let _ = old.wait();
        wait_listening(
            &mut self.server,
            self.port,
            "postgres",
            &self.dir.join("postgres.log"),
        )
    }
}
