//! Problems found in settings: where ([`ConfigError::field`], a dotted
//! path such as `vips[1].backends[0].weight`) and what, every one of a
//! file together ([`ConfigErrors`]); values echoed cut short
//! ([`excerpt`]). A leaf: it imports nothing of the crate, so every
//! settings module (and the announcers) can report through it.

use std::{fmt, path::Path, str::FromStr};

use serde::{Deserializer, de};

/// A value from the file as it is echoed in an error: in backquotes, cut
/// to its first 64 characters (a 10 MB value must not come back whole).
pub fn excerpt(value: &str) -> String {
    const SHOWN: usize = 64;
    match value.char_indices().nth(SHOWN) {
        None => format!("`{value}`"),
        Some((end, _)) => format!("`{}…` ({} bytes)", &value[..end], value.len()),
    }
}

/// An error message cut to a readable length, keeping its end (where
/// serde_yaml says the line and column).
pub(crate) fn cut_message(message: String) -> String {
    const HEAD: usize = 200;
    const TAIL: usize = 60;
    let chars = message.chars().count();
    if chars <= HEAD + TAIL + 5 {
        return message;
    }
    let head: String = message.chars().take(HEAD).collect();
    let tail: String = message.chars().skip(chars - TAIL).collect();
    format!("{head} … {tail}")
}

/// One problem in a configuration: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `vips[1].backends[0].weight`; empty
    /// when serde could not say.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Every problem found in one configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    /// The file, if the configuration came from one.
    pub source_name: Option<String>,
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source_name {
            Some(name) => write!(f, "invalid configuration {name}:")?,
            None => write!(f, "invalid configuration:")?,
        }
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    pub(crate) fn one(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            source_name: None,
            errors: vec![ConfigError {
                field: field.into(),
                message: message.into(),
            }],
        }
    }

    pub(crate) fn named(mut self, name: &Path) -> Self {
        self.source_name = Some(name.display().to_string());
        self
    }
}

/// Splits serde_yaml's "path: message at line L column C" into a field and
/// a message (which keeps the position).
pub(crate) fn serde_error(text: &str) -> ConfigError {
    match text.split_once(": ") {
        Some((field, message))
            if !field.contains(' ') && !field.is_empty() && field != "invalid type" =>
        {
            ConfigError {
                field: field.into(),
                message: message.into(),
            }
        }
        _ => ConfigError {
            field: String::new(),
            message: text.into(),
        },
    }
}

/// Deserializes a `FromStr` type from a string, failing inside the
/// deserializer so that serde_yaml reports the field's path and line.
pub(crate) fn from_str_field<'de, D, T>(d: D, expecting: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    struct V<T>(&'static str, std::marker::PhantomData<T>);
    impl<T: FromStr<Err = String>> de::Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            v.parse().map_err(E::custom)
        }
    }
    d.deserialize_str(V(expecting, std::marker::PhantomData))
}

/// A problem at `field` (a path relative to the section that checks).
pub fn problem(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// Puts `section.` in front of each problem's path.
pub fn prefixed(section: &str, errors: Vec<ConfigError>) -> Vec<ConfigError> {
    errors
        .into_iter()
        .map(|e| ConfigError {
            field: if e.field.is_empty() {
                section.to_string()
            } else if e.field.starts_with('[') {
                format!("{section}{}", e.field)
            } else {
                format!("{section}.{}", e.field)
            },
            message: e.message,
        })
        .collect()
}
