//! Closed sets of settings chosen by name (`--policy fcfs`, `--quant-dots int8`): each is an
//! enum declared once with [`named_enum!`], which gives it its names, `ALL`, `Display`,
//! `FromStr` and, with the `clap` feature, clap's `ValueEnum`, so the command line offers
//! exactly the values the code matches on and no crate compares strings.
//!
//! **Invariant:** a value's name is the one the command line, the `--config` file and the
//! logs use, and `FromStr` accepts exactly the names of `ALL`.

/// A name that is not one of a closed set's, with the names that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}` (expected one of: {expected})")]
pub struct UnknownName {
    /// What kind of setting it names (`policy`, `device`).
    pub what: &'static str,
    /// The name given.
    pub given: String,
    /// The names that exist, comma separated.
    pub expected: String,
}

/// Declares a closed set of named settings:
/// `enum Name ("what it is"$(, default Variant)?) { Variant = "name", ... }`, each variant's
/// doc comment being its help on the command line.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal, default $default:ident) { $($body:tt)+ }
    ) => {
        named_enum! { $(#[$meta])* pub enum $name ($what) { $($body)+ } }

        impl Default for $name {
            fn default() -> Self {
                Self::$default
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[doc = $doc:literal])+ $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[doc = $doc])+ $variant, )+
        }

        impl $name {
            /// Every value, in the order the command line lists them.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The name the command line, the config file and the logs use.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| $crate::UnknownName {
                    what: $what,
                    given: s.to_owned(),
                    expected: Self::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "),
                })
            }
        }

        #[cfg(feature = "clap")]
        impl clap::ValueEnum for $name {
            fn value_variants<'a>() -> &'a [Self] {
                Self::ALL
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                let help = match self {
                    $(Self::$variant => concat!($($doc, "\n"),+),)+
                };
                let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
                Some(clap::builder::PossibleValue::new(self.name()).help(help))
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    use crate::{AsyncScheduling, Policy};

    #[test]
    fn names_round_trip_and_an_unknown_one_lists_the_known() {
        for &p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let err = "lifo".parse::<Policy>().unwrap_err();
        assert_eq!(err.to_string(), "unknown policy `lifo` (expected one of: fcfs, priority)");
        assert_eq!(AsyncScheduling::ALL.len(), 3);
        assert!("On".parse::<AsyncScheduling>().is_err(), "names are exact");
    }
}
