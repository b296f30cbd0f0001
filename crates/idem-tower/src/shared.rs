//! [`Shared`]: what every service made by one layer shares, in a file of its own so
//! that the stages reach it without going through the layer's builder.

use std::sync::Arc;

use crate::config::Config;
use crate::in_flight::InFlight;

/// What every service made by one layer shares.
pub(crate) struct Shared<St: ?Sized> {
    pub(crate) config: Config,
    pub(crate) in_flight: InFlight,
    pub(crate) store: Arc<St>,
}

impl<St: ?Sized> Clone for Shared<St> {
    fn clone(&self) -> Self {
        Shared {
            config: self.config.clone(),
            in_flight: self.in_flight.clone(),
            store: self.store.clone(),
        }
    }
}
