//! Sets of CPU ids and the kernel's CPU list format (`0-3,5`), as used by
//! `/sys/devices/system/cpu/online`, `cpuset.cpus` and `taskset -c`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Highest CPU id accepted by [`CpuSet::parse`] plus one (the kernel's largest NR_CPUS is 8192;
/// the limit only stops a typo like `0-4000000000` from allocating gigabytes).
pub const MAX_CPUS: u32 = 65_536;

/// A set of CPU ids, ordered. Displays and (de)serializes in canonical list form: `0-3,5`.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet {
    cpus: BTreeSet<u32>,
}

/// A CPU list that is not in the kernel's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CPU list '{input}': {reason}")]
pub struct ParseCpuListError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// CPUs `0..n`.
    pub fn first_n(n: u32) -> Self {
        (0..n).collect()
    }

    /// Parses the kernel list format: comma-separated ids and inclusive ranges `a-b`
    /// (the kernel's rarely used `a-b:used/group` form is rejected). Surrounding whitespace
    /// is ignored; an empty string (or just a newline) is the empty set.
    ///
    /// Time is linear in the input plus the set's size: overlapping ranges are merged before
    /// their ids are inserted, so `0-65535` repeated does not insert 65536 ids each time.
    pub fn parse(s: &str) -> Result<CpuSet, ParseCpuListError> {
        let err = |reason: String| ParseCpuListError { input: s.to_string(), reason };
        let t = s.trim();
        let mut set = CpuSet::new();
        if t.is_empty() {
            return Ok(set);
        }
        let mut ranges = Vec::new();
        for part in t.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty element".into()));
            }
            match part.split_once('-') {
                Some((a, b)) => {
                    let a = parse_id(a).map_err(&err)?;
                    let b = parse_id(b).map_err(&err)?;
                    if a > b {
                        return Err(err(format!("range {a}-{b} is reversed")));
                    }
                    ranges.push((a, b));
                }
                None => {
                    let v = parse_id(part).map_err(&err)?;
                    ranges.push((v, v));
                }
            }
        }
        // By start: ids below `next` are in the set already (ids are < MAX_CPUS, no overflow).
        ranges.sort_unstable();
        let mut next = 0;
        for (a, b) in ranges {
            let from = a.max(next);
            if from <= b {
                set.cpus.extend(from..=b);
                next = b + 1;
            }
        }
        Ok(set)
    }

    /// Iterates CPU ids in increasing order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
        self.cpus.iter().copied()
    }
    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }
    /// True when no CPU is in the set.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
    /// True when `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.cpus.contains(&cpu)
    }
    /// Adds `cpu`; returns true if it was not there.
    pub fn insert(&mut self, cpu: u32) -> bool {
        self.cpus.insert(cpu)
    }
    /// Removes `cpu`; returns true if it was there.
    pub fn remove(&mut self, cpu: u32) -> bool {
        self.cpus.remove(&cpu)
    }
    /// Lowest CPU id.
    pub fn first(&self) -> Option<u32> {
        self.cpus.first().copied()
    }
    /// Highest CPU id.
    pub fn last(&self) -> Option<u32> {
        self.cpus.last().copied()
    }
    /// CPUs in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        self.cpus.intersection(&other.cpus).copied().collect()
    }
    /// CPUs in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        self.cpus.union(&other.cpus).copied().collect()
    }
    /// CPUs in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        self.cpus.difference(&other.cpus).copied().collect()
    }
    /// True when every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.cpus.is_subset(&other.cpus)
    }
    /// The ids as a vector, increasing.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

fn parse_id(s: &str) -> Result<u32, String> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{s}' is not a CPU id"));
    }
    let v: u32 = t.parse().map_err(|_| format!("'{s}' is too large"))?;
    if v >= MAX_CPUS {
        return Err(format!("CPU id {v} is not below {MAX_CPUS}"));
    }
    Ok(v)
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.cpus.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl FromStr for CpuSet {
    type Err = ParseCpuListError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet { cpus: iter.into_iter().collect() }
    }
}

impl Extend<u32> for CpuSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        self.cpus.extend(iter)
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = std::iter::Copied<std::collections::btree_set::Iter<'a, u32>>;
    fn into_iter(self) -> Self::IntoIter {
        self.cpus.iter().copied()
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuSet::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format_round_trip() {
        for (input, canon) in [
            ("0", "0"),
            ("0-3,5", "0-3,5"),
            ("5,0-3", "0-3,5"),
            ("0,1,2,3", "0-3"),
            ("1-1", "1"),
            ("0-3,2-5", "0-5"),
            (" 0-1\n", "0-1"),
            ("7,9,11-12,100", "7,9,11-12,100"),
        ] {
            let s = CpuSet::parse(input).unwrap();
            assert_eq!(s.to_string(), canon, "input {input:?}");
            assert_eq!(CpuSet::parse(&s.to_string()).unwrap(), s);
        }
    }

    #[test]
    fn empty_input_is_empty_set() {
        for input in ["", "\n", "  "] {
            let s = CpuSet::parse(input).unwrap();
            assert!(s.is_empty());
            assert_eq!(s.to_string(), "");
            assert_eq!(s.first(), None);
        }
    }

    #[test]
    fn malformed_lists_are_rejected() {
        for input in ["3-1", "a", "1,,2", "1-", "-1", ",", "1,", "0-7:2/4", "4:2", "+1", "1 2", "99999999999", "65536"] {
            let e = CpuSet::parse(input).unwrap_err();
            assert_eq!(e.input, input);
            assert!(e.to_string().contains("invalid CPU list"), "{e}");
        }
    }

    /// Found while fuzzing (`cpu_list` ran at 3k inputs/s on range-heavy inputs): every range's
    /// ids were inserted one by one, so a few KiB of `0-65535,0-65535,...` took seconds (4 KiB:
    /// ~10 s in the fuzz build).
    #[test]
    fn cpu_list_with_many_overlapping_ranges_is_parsed_in_linear_time() {
        let text = vec!["0-65535"; 16 * 1024].join(",");
        // The same number of parts, each a single id: the linear baseline, timed in the same
        // run (best of 3 each), so the check does not depend on this machine's speed.
        let singles = (0..16 * 1024).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let best = |t: &str| {
            (0..3)
                .map(|_| {
                    let start = std::time::Instant::now();
                    let s = CpuSet::parse(t).unwrap();
                    (start.elapsed(), s)
                })
                .min_by_key(|(d, _)| *d)
                .unwrap()
        };
        let (took, s) = best(&text);
        let (baseline, _) = best(&singles);
        assert_eq!((s.len(), s.to_string()), (65536, "0-65535".to_string()));
        // Merged: within a small factor of the singles (about 10 ms here); one insert per id
        // of every range is 65,536 times the work of a single id: tens of thousands of times
        // slower. The bound leaves a disturbed run a thousandfold.
        let ratio = took.as_secs_f64() / baseline.as_secs_f64().max(1e-6);
        assert!(ratio < 1000.0, "ranges took {took:?}, as many single ids {baseline:?}: {ratio:.0}x");
        // Overlaps, nesting, duplicates and out-of-order parts still give the union.
        assert_eq!(CpuSet::parse("8-9,0-5,2-3,5-7,1,20,12-15,13-14,20").unwrap().to_string(), "0-9,12-15,20");
    }

    #[test]
    fn set_operations() {
        let mut s: CpuSet = [3, 1, 2].into_iter().collect();
        assert_eq!(s.len(), 3);
        assert!(s.contains(2) && !s.contains(0));
        assert_eq!((s.first(), s.last()), (Some(1), Some(3)));
        assert!(s.insert(0));
        assert!(!s.insert(0));
        assert!(s.remove(3));
        assert!(!s.remove(3));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(s.iter().next_back(), Some(2));
        let t = CpuSet::parse("2-4").unwrap();
        assert_eq!(s.intersection(&t).to_string(), "2");
        assert_eq!(s.union(&t).to_string(), "0-4");
        assert_eq!(s.difference(&t).to_string(), "0-1");
        assert!(CpuSet::parse("1").unwrap().is_subset(&s));
        assert_eq!(CpuSet::first_n(4).to_string(), "0-3");
    }

    /// Pseudo-random sets (a fixed LCG, no RNG dependency) survive format -> parse, and the
    /// canonical form never has adjacent ranges that could be merged.
    #[test]
    fn random_sets_round_trip() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..500 {
            let mut s = CpuSet::new();
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = (x >> 58) as u32;
            for _ in 0..n {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                s.insert(((x >> 40) % 300) as u32);
            }
            let text = s.to_string();
            assert_eq!(CpuSet::parse(&text).unwrap(), s, "{text}");
            let ends: Vec<(u32, u32)> = text
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (p.parse().unwrap(), p.parse().unwrap()),
                })
                .collect();
            for w in ends.windows(2) {
                assert!(w[1].0 > w[0].1 + 1, "{text}: mergeable ranges");
            }
        }
    }

    #[test]
    fn serde_uses_list_string() {
        let s = CpuSet::parse("0-3,5").unwrap();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(j, "\"0-3,5\"");
        let back: CpuSet = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<CpuSet>("\"3-1\"").is_err());
    }
}
