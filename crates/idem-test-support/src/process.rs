//! The child processes of the private servers: a free port, a watchdog that outlives
//! nothing, a bounded stop, waiting until one listens, commands run as a given user.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to accept connections.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(60);

/// A port free on 127.0.0.1 now.
pub(crate) fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// A shell that, once this process is gone, stops `pid` if any (`SIGINT`, then
/// `SIGKILL`) and deletes `dir`: a killed test never runs `Drop`, and statics never
/// drop.
pub(crate) fn watchdog(pid: Option<u32>, dir: &Path) -> Result<Child, String> {
    let stop = pid.map_or(String::new(), |pid| {
        format!("kill -INT {pid} 2>/dev/null; sleep 3; kill -9 {pid} 2>/dev/null; ")
    });
    once_gone(&format!("{stop}rm -rf '{}'", dir.display()))
}

/// A shell that runs `script` once this process is gone.
pub(crate) fn once_gone(script: &str) -> Result<Child, String> {
    let script = format!(
        "while kill -0 {parent} 2>/dev/null; do sleep 1; done; {script}",
        parent = std::process::id(),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))
}

/// Sends `signal` (`INT`, `STOP`, `CONT`…) to `pid` with `kill`.
pub(crate) fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -{signal} {pid}: {status}"))
}

/// Stops `child` with `SIGINT` (PostgreSQL's fast shutdown), waiting a bounded time
/// before killing it.
pub(crate) fn stop(child: &mut Child) {
    let _ = signal(child.id(), "INT");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until something accepts connections on `127.0.0.1:port`, or `child` exits.
pub(crate) fn wait_listening(
    child: &mut Child,
    port: u16,
    what: &str,
    log: &Path,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} exited ({status}): {log}"));
        }
        if start.elapsed() > START_DEADLINE {
            return Err(format!("{what} does not accept connections on {port}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` as `user` (if any) and fails with its output unless it succeeds.
pub(crate) fn run_as(mut cmd: Command, user: Option<(u32, u32)>, what: &str) -> Result<(), String> {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Hands `path` (recursively) to `user`.
pub(crate) fn chown(path: &Path, user: Option<(u32, u32)>) -> Result<(), String> {
    let Some((uid, gid)) = user else {
        return Ok(());
    };
    let mut cmd = Command::new("chown");
    cmd.arg("-R").arg(format!("{uid}:{gid}")).arg(path);
    run_as(cmd, None, "chown")
}
