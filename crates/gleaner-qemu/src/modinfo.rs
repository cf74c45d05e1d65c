//! Reads the `depends=` entry of a kernel module's `.modinfo` section and orders modules so
//! each is loaded after its dependencies. The Debian package does not ship `modules.dep`
//! (depmod runs at install time, and the lab never installs the package).

use std::collections::{BTreeMap, BTreeSet};

/// The module names listed in `depends=` inside the module image (empty if none).
///
/// Returns `None` when the image carries no `.modinfo` strings at all (not a module).
pub fn depends(image: &[u8]) -> Option<Vec<String>> {
    let has_modinfo = find(image, b"\0name=").is_some() || find(image, b"\0vermagic=").is_some();
    let Some(pos) = find(image, b"\0depends=") else {
        return has_modinfo.then(Vec::new);
    };
    let start = pos + b"\0depends=".len();
    let end = image[start..].iter().position(|&b| b == 0).map_or(image.len(), |e| start + e);
    let list = String::from_utf8_lossy(&image[start..end]);
    Some(list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.replace('-', "_")).collect())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Orders `wanted` and all their transitive dependencies so dependencies come first.
///
/// `deps` maps a module name to its direct dependencies; a dependency missing from the map is
/// reported as an error (the package lacks it).
pub fn load_order(wanted: &[&str], deps: &BTreeMap<String, Vec<String>>) -> Result<Vec<String>, String> {
    fn visit(
        m: &str,
        deps: &BTreeMap<String, Vec<String>>,
        done: &mut BTreeSet<String>,
        active: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        if done.contains(m) {
            return Ok(());
        }
        if !active.insert(m.to_string()) {
            return Err(format!("dependency cycle at module {m}"));
        }
        let d = deps.get(m).ok_or_else(|| format!("module {m} not found"))?;
        for x in d {
            visit(x, deps, done, active, out)?;
        }
        active.remove(m);
        done.insert(m.to_string());
        out.push(m.to_string());
        Ok(())
    }
    let mut done = BTreeSet::new();
    let mut active = BTreeSet::new();
    let mut out = Vec::new();
    for w in wanted {
        visit(w, deps, &mut done, &mut active, &mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_depends_list() {
        let img = b"\x7fELF....\0license=GPL\0depends=9pnet,netfs,fscache\0retpoline=Y\0name=9p\0";
        assert_eq!(depends(img).unwrap(), vec!["9pnet", "netfs", "fscache"]);
    }

    #[test]
    fn empty_depends_and_malformed() {
        assert_eq!(depends(b"\0depends=\0name=virtio\0").unwrap(), Vec::<String>::new());
        assert_eq!(depends(b"\0name=virtio\0").unwrap(), Vec::<String>::new());
        assert_eq!(depends(b"not a module at all"), None);
        assert_eq!(depends(b""), None);
    }

    #[test]
    fn orders_dependencies_first() {
        let mut deps = BTreeMap::new();
        deps.insert("9p".to_string(), vec!["9pnet".to_string(), "netfs".to_string()]);
        deps.insert("9pnet".to_string(), vec![]);
        deps.insert("netfs".to_string(), vec![]);
        deps.insert("9pnet_virtio".to_string(), vec!["9pnet".to_string(), "virtio".to_string()]);
        deps.insert("virtio".to_string(), vec![]);
        let order = load_order(&["9pnet_virtio", "9p"], &deps).unwrap();
        assert_eq!(order, vec!["9pnet", "virtio", "9pnet_virtio", "netfs", "9p"]);
        assert!(load_order(&["nope"], &deps).is_err());
        deps.insert("a".to_string(), vec!["b".to_string()]);
        deps.insert("b".to_string(), vec!["a".to_string()]);
        assert!(load_order(&["a"], &deps).unwrap_err().contains("cycle"));
    }
}
