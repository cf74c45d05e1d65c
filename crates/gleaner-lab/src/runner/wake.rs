//! The wakeup costs a guest measured (`setup.wakeup`: Table 2 settings A, B, C), where, and under which halt-poll setting.

use serde::{Deserialize, Serialize};

use crate::experiment::Scenario;
use crate::keys::HaltPoll;

/// Where a guest's wakeup costs were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WakePlace {
    /// The sizing guest, alone on the pCPUs.
    #[serde(rename = "alone")]
    Alone,
    /// The measured guest's first boot, next to VM B (`oc`).
    #[serde(rename = "with co-runner")]
    WithCoRunner,
    /// VM A next to VM B (`oc2`).
    #[serde(rename = "next to VM B")]
    NextToVmB,
}

impl WakePlace {
    pub const ALL: [WakePlace; 3] = [WakePlace::Alone, WakePlace::WithCoRunner, WakePlace::NextToVmB];

    /// The words it is written as (in documents and reports).
    pub fn label(self) -> &'static str {
        match self {
            WakePlace::Alone => "alone",
            WakePlace::WithCoRunner => "with co-runner",
            WakePlace::NextToVmB => "next to VM B",
        }
    }

    /// Where the measured guest of `scenario` takes its wakeup measurement.
    pub fn of(scenario: Scenario) -> Self {
        match scenario {
            Scenario::Uc => WakePlace::Alone,
            Scenario::Oc => WakePlace::WithCoRunner,
            Scenario::Oc2 => WakePlace::NextToVmB,
        }
    }
}

impl std::fmt::Display for WakePlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Where a wakeup measurement was taken and under which host halt-poll setting (`None`: the
/// sizing guest, which runs once per experiment). Written as one string, `alone` or
/// `with co-runner, halt_poll 0`, as results documents have always had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WakeContext {
    pub place: WakePlace,
    pub halt_poll: Option<HaltPoll>,
}

const HALT_POLL_SEP: &str = ", halt_poll ";

impl std::fmt::Display for WakeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.halt_poll {
            Some(hp) => write!(f, "{}{HALT_POLL_SEP}{hp}", self.place),
            None => write!(f, "{}", self.place),
        }
    }
}

impl From<WakeContext> for String {
    fn from(c: WakeContext) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for WakeContext {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let (place, halt_poll) = match s.split_once(HALT_POLL_SEP) {
            Some((p, hp)) => (p, Some(hp.parse::<HaltPoll>()?)),
            None => (s.as_str(), None),
        };
        let place = WakePlace::ALL.into_iter().find(|w| w.label() == place).ok_or_else(|| {
            let allowed: Vec<String> = WakePlace::ALL.iter().map(|w| format!("'{w}'")).collect();
            format!("wake cost context '{s}': allowed {} (optionally followed by '{HALT_POLL_SEP}SETTING')", allowed.join(", "))
        })?;
        Ok(WakeContext { place, halt_poll })
    }
}

/// Wakeup latencies measured in a guest (setup step `setup.wakeup`), and where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WakeCosts {
    pub context: WakeContext,
    pub guest: String,
    pub settings: Vec<gleaner_bench::wakeup::SettingResult>,
}

pub(super) fn wake_costs(context: WakeContext, guest: &str, stdout: &str) -> Option<WakeCosts> {
    let doc: gleaner_measure::report::WakeupDoc = gleaner_measure::report::from_output(stdout).ok()?;
    let mut settings = doc.settings;
    for s in &mut settings {
        s.samples_ns.clear();
    }
    Some(WakeCosts { context, guest: guest.into(), settings })
}
