//! A set of interface names as small as the sets are: a namespace has one or two interfaces,
//! and each of the four [`State`](super::state::State)s kept per namespace spent a B-tree node
//! (about 280 bytes) on each of its two sets.

/// Names, sorted and unique.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NameSet(Vec<String>);

impl NameSet {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|n| n.as_str().cmp(name))
    }

    /// True when `name` was not there yet.
    pub(crate) fn insert(&mut self, name: String) -> bool {
        match self.find(&name) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, name);
                true
            }
        }
    }

    /// True when `name` was there.
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        match self.find(name) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// In sorted order.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a NameSet {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_sorted_set() {
        let mut set = NameSet::default();
        assert!(set.insert("eth1".into()));
        assert!(set.insert("eth0".into()));
        assert!(!set.insert("eth1".into()), "already there");
        assert!(set.contains("eth0") && set.contains("eth1") && !set.contains("eth2"));
        assert_eq!(set.iter().collect::<Vec<_>>(), ["eth0", "eth1"]);
        assert!(set.remove("eth0"));
        assert!(!set.remove("eth0"), "gone already");
        assert!(!set.is_empty());
        assert!(set.remove("eth1"));
        assert!(set.is_empty());
        let mut other = NameSet::default();
        other.insert("b".into());
        other.insert("a".into());
        let mut same = NameSet::default();
        same.insert("a".into());
        same.insert("b".into());
        assert_eq!(other, same, "equal whatever the insertion order");
    }
}
