//! The one rule for whether a file that holds secrets or records is private: who
//! besides its owner may read or write it. Every file idem reads secrets from (the
//! tenant secret, the record keys, the admin token, an HS256 secret) or writes records
//! to (a SQLite store and its `-wal` and `-shm`, the client's journal) is judged by it;
//! what each does about a file that is not private (warn, or refuse) is its own.

use std::path::Path;

/// Who besides its owner may read or write a file (its Unix mode bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Its owner alone (mode `600`, `400`, `700`).
    Owner,
    /// Its owner and its group, no one else (`640`, `660`).
    Group,
    /// Every local user may read, write or run it (`644`, `666`).
    Everyone,
}

impl Exposure {
    /// The exposure of a file of `mode`.
    pub fn of_mode(mode: u32) -> Exposure {
        if mode & 0o007 != 0 {
            Exposure::Everyone
        } else if mode & 0o070 != 0 {
            Exposure::Group
        } else {
            Exposure::Owner
        }
    }

    /// What to write in a warning or an error: who may reach the file.
    pub fn who(self) -> &'static str {
        match self {
            Exposure::Owner => "its owner alone",
            Exposure::Group => "its group",
            Exposure::Everyone => "every local user",
        }
    }
}

/// The exposure of the file at `path` and its mode (`0o644`, say); `None` where the
/// platform has no Unix modes or the file cannot be read.
pub fn exposure(path: &Path) -> Option<(Exposure, u32)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        Some((Exposure::of_mode(mode), mode))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Warns when the file at `path`, which holds `what`, may be read or written by more
/// than `allowed` (`Exposure::Owner` for a secret, `Exposure::Group` where a sidecar
/// may share it): one line naming the file, its mode, who may reach it and the fix.
pub fn warn_if_exposed(path: &Path, what: &str, allowed: Exposure) {
    if let Some((exposure, mode)) = exposure(path)
        && exposure as u8 > allowed as u8
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{mode:o}"),
            "{} can be read by {} ({what}); chmod 600 it",
            path.display(),
            exposure.who(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_judged_by_who_besides_the_owner_may_reach_the_file() {
        for (mode, exposure) in [
            (0o600, Exposure::Owner),
            (0o400, Exposure::Owner),
            (0o700, Exposure::Owner),
            (0o640, Exposure::Group),
            (0o660, Exposure::Group),
            (0o604, Exposure::Everyone),
            (0o644, Exposure::Everyone),
            (0o602, Exposure::Everyone),
        ] {
            assert_eq!(Exposure::of_mode(mode), exposure, "{mode:o}");
        }
        assert!(Exposure::Everyone as u8 > Exposure::Group as u8);
    }

    #[cfg(unix)]
    #[test]
    fn a_files_exposure_is_read_from_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(exposure(&file), Some((Exposure::Group, 0o640)));
        assert_eq!(exposure(&dir.path().join("none")), None);
    }
}
