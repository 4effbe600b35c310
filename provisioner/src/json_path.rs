//! Reading a JSON document into its typed (`serde` derived) shape, with the path of the value
//! that is wrong in every error: `ips[0].address`, `plugins[1].mtu`.
//!
//! A derived struct also reads from a list of its fields in order (`[null, "eth0"]`); no
//! document writes one so, and [`Object`] (with [`from_object`], [`objects`],
//! [`object_or_default`]) takes a struct only from a JSON object.

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Where a document does not have its shape, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathError {
    /// The path from the document's root (`ips[0].address`); empty for the root itself.
    pub path: String,
    /// What is wrong with the value there.
    pub reason: String,
}

impl PathError {
    /// The path as seen from a document that holds this one at `root` (`prevResult`,
    /// `plugins[0]`).
    pub(crate) fn path_under(&self, root: &str) -> String {
        join(root, &self.path)
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

/// A `T` written as a JSON object, and only so.
pub(crate) struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_map(ObjectVisitor(PhantomData)).map(Object)
    }
}

/// A list of objects, `null` read as an empty list (a `deserialize_with` helper).
pub(crate) fn objects<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    let list = Option::<Vec<Object<T>>>::deserialize(d)?.unwrap_or_default();
    Ok(list.into_iter().map(|Object(t)| t).collect())
}

/// An object, `null` read as `T::default()` (a `deserialize_with` helper).
pub(crate) fn object_or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<Object<T>>::deserialize(d)?.map_or_else(T::default, |Object(t)| t))
}

/// [`from_value`] of a document that must be an object.
pub(crate) fn from_object<'de, T: Deserialize<'de>>(value: &'de Value) -> Result<T, PathError> {
    from_value(value).map(|Object(t)| t)
}

/// `T` read out of `value`; the error names the path of the first value that does not fit.
/// A missing field is named itself (`ips[0].address: is required`), not its object.
pub(crate) fn from_value<'de, T: Deserialize<'de>>(value: &'de Value) -> Result<T, PathError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = match err.path().to_string() {
            root if root == "." => String::new(),
            path => path,
        };
        let reason = err.into_inner().to_string();
        match reason
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            Some(field) => PathError {
                path: join(&path, field),
                reason: "is required".to_owned(),
            },
            None => PathError { path, reason },
        }
    })
}

/// `inner` under `outer`: `outer.inner`, `outer[0]`, or the one that is not empty.
fn join(outer: &str, inner: &str) -> String {
    if outer.is_empty() {
        inner.to_owned()
    } else if inner.is_empty() || inner.starts_with('[') {
        format!("{outer}{inner}")
    } else {
        format!("{outer}.{inner}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[expect(dead_code, reason = "only the errors of reading it are looked at")]
    struct Doc {
        list: Vec<Item>,
    }

    #[derive(Debug, Deserialize)]
    #[expect(dead_code, reason = "only the errors of reading it are looked at")]
    struct Item {
        name: String,
    }

    fn error(value: &Value) -> PathError {
        from_object::<Doc>(value).expect_err("malformed")
    }

    #[test]
    fn errors_name_the_path() {
        let e = error(&json!({"list": [{"name": "a"}, {"name": 7}]}));
        assert_eq!(e.path, "list[1].name");
        assert!(e.reason.contains("expected a string"), "{}", e.reason);
        assert_eq!(e.path_under("plugins[0]"), "plugins[0].list[1].name");
        let e = error(&json!([]));
        assert_eq!(e.path, "");
        assert_eq!(e.path_under("prevResult"), "prevResult");
    }

    #[test]
    fn a_struct_is_read_only_from_an_object() {
        let e = from_object::<Doc>(&json!([[{"name": "a"}]])).expect_err("a list");
        assert_eq!(e.to_string(), "invalid type: sequence, expected an object");
        #[derive(Debug, Deserialize)]
        struct Objects {
            #[serde(deserialize_with = "objects")]
            list: Vec<Item>,
        }
        let e = from_object::<Objects>(&json!({"list": [["a"]]})).expect_err("a list");
        assert_eq!(
            e.to_string(),
            "list[0]: invalid type: sequence, expected an object"
        );
        let read = from_object::<Objects>(&json!({"list": null})).expect("null is empty");
        assert!(read.list.is_empty());
    }

    #[test]
    fn a_missing_field_is_named_itself() {
        let e = error(&json!({"list": [{}]}));
        assert_eq!(
            (e.path.as_str(), e.reason.as_str()),
            ("list[0].name", "is required")
        );
        let e = error(&json!({}));
        assert_eq!(
            (e.path.as_str(), e.reason.as_str()),
            ("list", "is required")
        );
    }
}
