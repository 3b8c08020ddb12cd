//! One measured value that may be missing for a known reason.
//!
//! A GPU, a host or a server answers many small questions; each answer is independent.
//! A query the hardware does not support must read "n/a" (never 0, which would be a lie
//! in a chart or a summary), and a query that failed must carry its message without
//! stopping the others.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A value, "not supported here" (shown as `n/a`), or an error with its message.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading<T> {
    /// The query answered.
    Value(T),
    /// The device, driver or target does not offer this quantity.
    NotSupported,
    /// The query failed; the message says why.
    Error(String),
}

impl<T> Reading<T> {
    /// The value, if the query answered.
    pub fn value(&self) -> Option<&T> {
        match self {
            Reading::Value(v) => Some(v),
            _ => None,
        }
    }

    /// Transforms the value, keeping `n/a` and errors as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reading<U> {
        match self {
            Reading::Value(v) => Reading::Value(f(v)),
            Reading::NotSupported => Reading::NotSupported,
            Reading::Error(e) => Reading::Error(e),
        }
    }

    /// Formats the value with `f`, or `n/a` / `err` for the other cases (for one-line displays).
    pub fn show(&self, f: impl FnOnce(&T) -> String) -> String {
        match self {
            Reading::Value(v) => f(v),
            Reading::NotSupported => "n/a".to_string(),
            Reading::Error(_) => "err".to_string(),
        }
    }
}

impl<T: Copy> Reading<T> {
    /// The value by copy, if the query answered.
    pub fn get(&self) -> Option<T> {
        self.value().copied()
    }
}

impl<T: fmt::Display> fmt::Display for Reading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reading::Value(v) => v.fmt(f),
            Reading::NotSupported => f.write_str("n/a"),
            Reading::Error(e) => write!(f, "error: {e}"),
        }
    }
}

/// JSON shape: the bare value, the string `"n/a"`, or `{"error": "..."}`.
impl<T: Serialize> Serialize for Reading<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Reading::Value(v) => v.serialize(serializer),
            Reading::NotSupported => serializer.serialize_str("n/a"),
            Reading::Error(e) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("error", e)?;
                map.end()
            }
        }
    }
}

/// The string `"n/a"` and nothing else (how [`Reading::NotSupported`] is written).
struct NotApplicable;

impl<'de> Deserialize<'de> for NotApplicable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        if s == "n/a" {
            Ok(NotApplicable)
        } else {
            Err(serde::de::Error::custom("not \"n/a\""))
        }
    }
}

/// The three JSON shapes, tried in this order: `{"error": …}`, `"n/a"`, a value. A string
/// reading whose value is literally `n/a` reads back as not supported, which it shows as.
#[derive(Deserialize)]
#[serde(untagged)]
enum Wire<T> {
    Error { error: String },
    NotSupported(NotApplicable),
    Value(T),
}

/// Reads what [`Serialize`] wrote, e.g. a sample printed by `mxtune monitor --json` on
/// another host.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Reading<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Wire::<T>::deserialize(deserializer)? {
            Wire::Error { error } => Reading::Error(error),
            Wire::NotSupported(NotApplicable) => Reading::NotSupported,
            Wire::Value(v) => Reading::Value(v),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_of_every_shape() {
        let cases: Vec<Reading<u32>> = vec![
            Reading::Value(7),
            Reading::NotSupported,
            Reading::Error("NVML: timeout".into()),
        ];
        for r in cases {
            let json = serde_json::to_string(&r).unwrap();
            let back: Reading<u32> = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r, "{json}");
        }
        let s: Reading<String> = serde_json::from_str("\"P0\"").unwrap();
        assert_eq!(s, Reading::Value("P0".into()));
        let v: Reading<Vec<String>> = serde_json::from_str("[]").unwrap();
        assert_eq!(v, Reading::Value(vec![]));
        assert!(serde_json::from_str::<Reading<u32>>("\"x\"").is_err());
    }
}
