//! The `settings!` macro, from which everything `idem serve` does with a setting
//! follows: one declaration of it (in [`super::settings`]) gives its flag, variable,
//! file key, type and help text ([`ServeArgs`](super::ServeArgs), read by clap and
//! serde), how it layers over the file ([`ServeArgs::over`](super::ServeArgs::over)),
//! what it resolves to and how ([`GatewayConfig`](super::GatewayConfig) and
//! [`from_args`](super::GatewayConfig::from_args)), its line in `check-config`'s
//! output, and whether a reload applies it ([`SETTINGS`](super::SETTINGS)).
//!
//! A declaration is a field of `ServeArgs` followed by what the macro needs besides:
//!
//! ```text
//! /// Help text [default: 24h].
//! #[arg(long, env = "IDEM_TTL", …)]
//! pub ttl: Option<Duration>, live
//!     => ttl: Duration = |a| positive("ttl", a.ttl, DEFAULT_TTL),
//!     print |c, _| duration(c.ttl);
//! ```
//!
//! - `as "key"` after the type: the file's key, when it is not the field's name;
//! - the reload class: `live`, `restart` or `start` (see [`Reload`]);
//! - `=> field: Type = resolver`: the field of `GatewayConfig` it resolves into, made
//!   by `resolver` from the layered settings (a setting resolved with others names
//!   their field alone, `=> tls`, and is resolved by theirs);
//! - `print`: its line in the file's form, from the configuration and the settings (a
//!   value, or `Err(note)` for a `# key: note` comment).

/// When a change to a setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// A reload (SIGHUP, `POST /reload`) puts it in force for new requests.
    Live,
    /// A reload keeps the running value and names the setting; a restart applies it.
    /// A running gateway cannot change its listeners and their TLS files (certificates
    /// are read again on SIGHUP, from the same paths), the store and how it is opened
    /// and sealed, the tenant secret and scope mode (changing either would make every
    /// retry of a stored key a new execution), the admin token, the trace exporter,
    /// and the limits fixed per connection.
    Restart,
    /// Read once at start from the command line or the environment, never from the
    /// file (`--config`, `--passthrough`, `IDEM_TENANT_SECRET`).
    Start,
}

/// One setting as declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Its field of [`ServeArgs`](super::ServeArgs), which names its flag.
    pub field: &'static str,
    /// Its key in the file and in `check-config`'s output.
    pub key: &'static str,
    /// When a change to it takes effect.
    pub reload: Reload,
    /// The field of [`GatewayConfig`](super::GatewayConfig) it resolves into, if any.
    pub resolves_into: Option<&'static str>,
}

impl Setting {
    /// The setting under this key in the file, if there is one.
    pub fn keyed(key: &str) -> Option<&'static Setting> {
        super::SETTINGS
            .iter()
            .find(|s| s.key == key && s.reload != Reload::Start)
    }
}

/// How one setting given in a layer (the command line, the environment) stands over
/// the same setting in the layer beneath (the file).
pub(crate) trait Layered {
    /// `self` over `under`.
    fn over(self, under: Self) -> Self;
}

/// A value: the upper one when given.
impl<T> Layered for Option<T> {
    fn over(self, under: Self) -> Self {
        self.or(under)
    }
}

/// A switch: on when either layer turns it on (a flag cannot be turned off).
impl Layered for bool {
    fn over(self, under: Self) -> Self {
        self || under
    }
}

/// Tables (`[[route]]`, `[[tenant]]`): the upper layer's when it has any.
impl<T> Layered for Vec<T> {
    fn over(self, under: Self) -> Self {
        if self.is_empty() { under } else { self }
    }
}

/// The value `resolver` makes of the layered settings: a function, so that a
/// declaration's closure takes its argument's type from here.
pub(super) fn resolve<T, A>(
    args: &A,
    resolver: impl FnOnce(&A) -> Result<T, super::ConfigError>,
) -> Result<T, super::ConfigError> {
    resolver(args)
}

/// Declares the settings as given, what they resolve to, and everything derived from
/// the two: see the [module](self).
macro_rules! settings {
    (@key $field:ident) => { stringify!($field) };
    (@key $field:ident $key:literal) => { $key };
    (@reload live) => { $crate::config::declare::Reload::Live };
    (@reload restart) => { $crate::config::declare::Reload::Restart };
    (@reload start) => { $crate::config::declare::Reload::Start };
    (@into) => { None };
    (@into $out:ident) => { Some(stringify!($out)) };
    // The field a restart-only setting resolves into keeps its running value.
    (@keep restart $to:ident $from:ident $out:ident : $outty:ty) => {
        $to.$out = $from.$out.clone();
    };
    (@keep $class:ident $to:ident $from:ident $($rest:tt)*) => {};
    (@print $lines:ident $c:ident $a:ident [$field:ident $($key:literal)?]) => {};
    (@print $lines:ident $c:ident $a:ident [$field:ident $($key:literal)?] $print:expr) => {
        $lines.push((
            settings!(@key $field $($key)?),
            $crate::config::print::line($c, $a, $print),
        ));
    };
    (
        $(#[$($meta:tt)*])*
        pub struct $args:ident;
        $(#[$($config_meta:tt)*])*
        pub struct $config:ident;
        $(
            $(#[$($field_meta:tt)*])*
            pub $field:ident: $ty:ty $(as $key:literal)?, $class:ident
                $(=> $out:ident $(: $outty:ty = $resolve:expr)?)?
                $(, print $print:expr)?;
        )*
    ) => {
        $(#[$($meta)*])*
        pub struct $args {
            $(
                $(#[$($field_meta)*])*
                $(#[serde(rename = $key)])?
                pub $field: $ty,
            )*
        }

        impl $args {
            /// These settings layered over `under`'s, each by its type's rule
            /// (`Layered`): a value given here wins, else the one given there; a switch
            /// (`require_key`, …) is on when either turns it on; routes and tenant
            /// tables, which come from the file alone, replace `under`'s only when there
            /// are any.
            pub fn over(self, under: $args) -> $args {
                $args {
                    $($field: $crate::config::declare::Layered::over(self.$field, under.$field),)*
                }
            }
        }

        /// Every setting, in the order `check-config` prints them.
        pub const SETTINGS: &[$crate::config::declare::Setting] = &[
            $($crate::config::declare::Setting {
                field: stringify!($field),
                key: settings!(@key $field $($key)?),
                reload: settings!(@reload $class),
                resolves_into: settings!(@into $($out)?),
            },)*
        ];

        $(#[$($config_meta)*])*
        pub struct $config {
            $($($(
                #[doc = concat!(
                    "[`", stringify!($args), "::", stringify!($field), "`], resolved."
                )]
                pub $out: $outty,
            )?)?)*
        }

        impl $config {
            /// Checks layered settings and fills in the defaults of those left out: each
            /// resolved as its declaration says, in their order, then checked together.
            pub fn from_args(args: $args) -> Result<$config, $crate::config::ConfigError> {
                let config = $config {
                    $($($(
                        $out: $crate::config::declare::resolve(&args, $resolve)?,
                    )?)?)*
                };
                config.check()?;
                Ok(config)
            }

            /// Puts `running`'s values back for the settings a reload cannot change, so
            /// that the generation in force and what the log says agree with what is
            /// served.
            pub(crate) fn keep_restart_only(&mut self, running: &$config) {
                let config = self;
                $(settings!(@keep $class config running $($out $(: $outty)?)?);)*
            }

            /// Each setting's line in the file's form, in the declared order.
            pub(super) fn lines(
                &self,
                args: &$args,
            ) -> Vec<(&'static str, $crate::config::print::Line)> {
                let (config, mut lines) = (self, Vec::new());
                $(settings!(@print lines config args [$field $($key)?] $($print)?);)*
                lines
            }
        }
    };
}

pub(crate) use settings;
