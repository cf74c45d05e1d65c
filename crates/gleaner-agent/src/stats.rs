//! Stats declared once, as sched-ext's `scx_stats` declares them: each number the agent
//! exports is one [`Stat`], which gives its Prometheus name, type and help text, its label in
//! `gleaner status`, and how it is read from the status. [`stats!`] declares a struct of stats
//! whose fields are also the JSON fields, documented by the same help text:
//!
//! ```text
//!  stats! { pub struct Totals {
//!      periods: u64 => Counter("periods", "Control periods") print "periods";
//!  } }
//!     -> Totals.periods          (the JSON field "periods", documented "Control periods")
//!     -> Totals::STATS[..]       (gleaner_periods_total, its HELP and TYPE lines)
//!     -> "periods 11"            (its part of the line `gleaner status` prints)
//! ```
//!
//! Numbers the status derives (the active vCPUs from their set, families by vCPU) are [`Stat`]s
//! of the status itself, in the tables beside its type ([`crate::status`]); [`register`]
//! writes any table into a Prometheus registry and [`line`] prints it.

use std::fmt;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How Prometheus reads a stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (written with the `_total` suffix).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One value: counts are written as integers, the rest as floats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Count(u64),
    Float(f64),
}

impl Value {
    /// Nanoseconds as the seconds Prometheus expects.
    pub fn seconds(ns: u64) -> Self {
        Self::Float(ns as f64 / 1e9)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Float(x) => write!(f, "{x:.3}"),
        }
    }
}

/// One value of a stat, with the values of its family's labels (none for a single value).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<String>,
    pub value: Value,
}

/// What a stat reads now: `None` when it is not exported now (the part of the status it
/// comes from is absent).
pub type Reading = Option<Vec<Sample>>;

/// A single value, always exported.
pub fn one(value: Value) -> Reading {
    Some(vec![Sample { labels: Vec::new(), value }])
}

/// One stat of a `T`.
pub struct Stat<T> {
    /// The Prometheus name after the `gleaner_` prefix (counters get `_total` when written).
    pub name: &'static str,
    pub kind: Kind,
    /// The Prometheus help text (and, for a [`stats!`] field, its documentation).
    pub help: &'static str,
    /// The label names of a family, one value per label set; empty for a single value.
    pub labels: &'static [&'static str],
    /// Its label in `gleaner status` (`None`: not printed).
    pub print: Option<&'static str>,
    pub read: fn(&T) -> Reading,
}

impl<T> fmt::Debug for Stat<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stat").field("name", &self.name).field("kind", &self.kind).field("labels", &self.labels).finish_non_exhaustive()
    }
}

/// Declares a struct of stats (module documentation): each field is `name: type =>
/// Kind("prometheus_name", "help") [print "label"];`, read as a count, or with `seconds`
/// after the help as nanoseconds written in seconds. The struct gets the given attributes and
/// `pub` fields documented by their help; `STATS` lists them in declaration order.
macro_rules! stats {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $field:ident: $ty:ty => $kind:ident($prom:literal, $help:literal $(, $conv:ident)?) $(print $label:literal)?; )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( #[doc = $help] pub $field: $ty, )*
        }

        impl $name {
            /// Every stat of the struct, in declaration order.
            pub const STATS: &'static [$crate::stats::Stat<$name>] = &[
                $( $crate::stats::Stat {
                    name: $prom,
                    kind: $crate::stats::Kind::$kind,
                    help: $help,
                    labels: &[],
                    print: $crate::stats::stats!(@print $($label)?),
                    read: |t: &$name| $crate::stats::one($crate::stats::stats!(@value $($conv)? t.$field)),
                }, )*
            ];
        }
    };
    (@print) => { None };
    (@print $label:literal) => { Some($label) };
    (@value $e:expr) => { $crate::stats::Value::Count($e) };
    (@value seconds $e:expr) => { $crate::stats::Value::seconds($e) };
}
pub(crate) use stats;

/// Registers every stat of `stats` that reads a value now, in order.
pub fn register<T>(reg: &mut Registry, stats: &[Stat<T>], t: &T) {
    for s in stats {
        let Some(samples) = (s.read)(t) else { continue };
        if s.labels.is_empty() {
            if let Some(x) = samples.first() {
                register_one(reg, s, x.value);
            }
        } else {
            register_family(reg, s, &samples);
        }
    }
}

fn register_one<T>(reg: &mut Registry, s: &Stat<T>, v: Value) {
    match (s.kind, v) {
        (Kind::Counter, Value::Count(n)) => {
            let c: Counter = Counter::default();
            c.inc_by(n);
            reg.register(s.name, s.help, c);
        }
        (Kind::Counter, Value::Float(x)) => {
            let c: Counter<f64, AtomicU64> = Counter::default();
            c.inc_by(x);
            reg.register(s.name, s.help, c);
        }
        (Kind::Gauge, Value::Count(n)) => {
            let g: Gauge = Gauge::default();
            g.set(i64::try_from(n).unwrap_or(i64::MAX));
            reg.register(s.name, s.help, g);
        }
        (Kind::Gauge, Value::Float(x)) => {
            let g: Gauge<f64, AtomicU64> = Gauge::default();
            g.set(x);
            reg.register(s.name, s.help, g);
        }
    }
}

type Labels = Vec<(String, String)>;

/// A family: one metric per label set, of the type its first value has (floats when empty).
fn register_family<T>(reg: &mut Registry, s: &Stat<T>, samples: &[Sample]) {
    let labels = |x: &Sample| -> Labels { s.labels.iter().map(|n| (*n).to_string()).zip(x.labels.iter().cloned()).collect() };
    let count = |v: Value| match v {
        Value::Count(n) => n,
        Value::Float(x) => gleaner_policy::num::saturating_u64(x),
    };
    let float = |v: Value| match v {
        Value::Count(n) => n as f64,
        Value::Float(x) => x,
    };
    let floats = !matches!(samples.first(), Some(Sample { value: Value::Count(_), .. }));
    match (s.kind, floats) {
        (Kind::Gauge, true) => {
            let f: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
            for x in samples {
                f.get_or_create(&labels(x)).set(float(x.value));
            }
            reg.register(s.name, s.help, f);
        }
        (Kind::Gauge, false) => {
            let f: Family<Labels, Gauge> = Family::default();
            for x in samples {
                f.get_or_create(&labels(x)).set(i64::try_from(count(x.value)).unwrap_or(i64::MAX));
            }
            reg.register(s.name, s.help, f);
        }
        (Kind::Counter, true) => {
            let f: Family<Labels, Counter<f64, AtomicU64>> = Family::default();
            for x in samples {
                f.get_or_create(&labels(x)).inc_by(float(x.value));
            }
            reg.register(s.name, s.help, f);
        }
        (Kind::Counter, false) => {
            let f: Family<Labels, Counter> = Family::default();
            for x in samples {
                f.get_or_create(&labels(x)).inc_by(count(x.value));
            }
            reg.register(s.name, s.help, f);
        }
    }
}

/// The printed stats of `stats` as one line: `label value` each, two spaces apart.
pub fn line<T>(stats: &[Stat<T>], t: &T) -> String {
    let mut parts = Vec::new();
    for s in stats {
        let (Some(label), Some(samples)) = (s.print, (s.read)(t)) else { continue };
        if let Some(x) = samples.first() {
            parts.push(format!("{label} {}", x.value));
        }
    }
    parts.join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    stats! {
        #[derive(Debug, Default)]
        struct Two {
            periods: u64 => Counter("periods", "Control periods") print "periods";
            cpu_ns: u64 => Gauge("cpu_seconds", "CPU time", seconds);
        }
    }

    #[test]
    fn a_declared_field_is_its_stat() {
        let t = Two { periods: 11, cpu_ns: 1_500_000_000 };
        assert_eq!(
            Two::STATS.iter().map(|s| (s.name, s.kind, s.help)).collect::<Vec<_>>(),
            [("periods", Kind::Counter, "Control periods"), ("cpu_seconds", Kind::Gauge, "CPU time")]
        );
        assert_eq!((Two::STATS[1].read)(&t), one(Value::Float(1.5)));
        assert_eq!(line(Two::STATS, &t), "periods 11");
        let mut reg = Registry::with_prefix("x");
        register(&mut reg, Two::STATS, &t);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("# TYPE x_periods counter\nx_periods_total 11\n"), "{text}");
        assert!(text.contains("x_cpu_seconds 1.5\n"), "{text}");
    }
}
