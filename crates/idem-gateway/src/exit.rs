//! The exit statuses of the `idem` commands, the same for each (`serve`,
//! `check-config`, `keys`, `migrate`, `check`, `demo`):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done: served until stopped, the configuration checks out, the record was found, … |
//! | 1 | a failure at run time: a store or upstream that cannot be reached or refuses, no record for the key, no idem records in the store, a port already taken, `idem check` finding a fault, `idem demo` not showing what it claims |
//! | 2 | a configuration that is wrong as written: an unknown flag or setting, a value that does not parse, a store URL that cannot work (an unknown scheme or parameter, TLS settings naming no file or a mode this build lacks, an invalid namespace) |
//! | 3 | `idem check` only: nothing answers at the API's URL |
//!
//! A 2 is put right in the command or the file; a 1 on the machine or the network, and
//! the same command may then succeed.

use std::fmt;

use crate::store::OpenError;

/// A failure at run time.
pub(crate) const RUNTIME: u8 = 1;

/// A configuration that is wrong as written.
pub(crate) const CONFIG: u8 = 2;

/// The status for a store that could not be opened: [`CONFIG`] when its URL or
/// namespace is wrong as written, [`RUNTIME`] otherwise.
pub(crate) fn of_open(e: &OpenError) -> u8 {
    if e.is_configuration() {
        CONFIG
    } else {
        RUNTIME
    }
}

/// A command's failure: the status it exits with and what it says.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The exit status.
    pub(crate) code: u8,
    /// The message, for standard error.
    pub(crate) message: String,
}

impl Failure {
    /// A failure at run time.
    pub(crate) fn runtime(message: impl fmt::Display) -> Failure {
        Failure {
            code: RUNTIME,
            message: message.to_string(),
        }
    }

    /// A store that could not be opened.
    pub(crate) fn open(e: &OpenError) -> Failure {
        Failure {
            code: of_open(e),
            message: e.to_string(),
        }
    }
}

/// Text alone is a usage error: a value the operator typed that does not parse.
impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            code: CONFIG,
            message,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::from(message.to_owned())
    }
}
