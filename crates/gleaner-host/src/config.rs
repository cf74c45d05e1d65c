//! The host agent's configuration file (TOML): quanta per type (written by
//! `gleaner host calibrate`) and the cursor thresholds.

use std::path::{Path, PathBuf};

use anyhow::Context;
use gleaner_policy::aql::{Limits, Quanta};
use serde::{Deserialize, Serialize};

/// Where `calibrate` writes and `run` reads by default.
pub const DEFAULT_PATH: &str = "/etc/gleaner/host.toml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub quanta: Quanta,
    #[serde(default)]
    pub limits: Limits,
    /// The measurements the quanta come from (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<crate::calibrate::Calibration>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self { quanta: Quanta::paper(), limits: Limits::default(), calibration: None }
    }
}

/// Where the configuration came from, for the output.
#[derive(Debug, Clone, Serialize)]
pub struct Loaded {
    pub config: HostConfig,
    /// `None`: built-in defaults (the paper's quanta).
    pub path: Option<PathBuf>,
}

impl HostConfig {
    /// `path` if given (must exist), else the default path if it exists, else the paper's values.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Loaded> {
        let (p, must) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must => return Ok(Loaded { config: HostConfig::default(), path: None }),
            Err(e) => return Err(e).with_context(|| format!("cannot read config {}", p.display())),
        };
        let config = Self::parse(&text, &p)?;
        Ok(Loaded { config, path: Some(p) })
    }

    /// Parses and validates the TOML text of the file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<HostConfig, gleaner_os::BadInput> {
        let config: HostConfig =
            toml::from_str(text).map_err(|e| gleaner_os::BadInput::new("config file", path.display(), format!("valid TOML: {e}")))?;
        config.quanta.validate().map_err(|e| gleaner_os::BadInput::new("config file", path.display(), e.to_string()))?;
        Ok(config)
    }

    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let text = toml::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_valid_malformed_empty_missing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("host.toml");
        let mut c = HostConfig::default();
        c.quanta.llco_ns = Some(10_000_000);
        c.save(&p).unwrap();
        assert_eq!(HostConfig::load(Some(&p)).unwrap().config, c);
        std::fs::write(&p, "[quanta]\nio_int_ns = \"x\"\n").unwrap();
        let e = format!("{:#}", HostConfig::load(Some(&p)).unwrap_err());
        assert!(e.contains("host.toml"), "{e}");
        std::fs::write(&p, "").unwrap();
        assert!(HostConfig::load(Some(&p)).is_err());
        // out of the slice range
        std::fs::write(&p, "[quanta]\nio_int_ns = 1\ncon_spin_ns = 1000000\nllcf_ns = 90000000\ndefault_ns = 30000000\n").unwrap();
        let e = HostConfig::load(Some(&p)).unwrap_err();
        assert!(e.chain().any(|c| c.is::<gleaner_os::BadInput>()), "{e:#}");
        assert!(HostConfig::load(Some(&d.path().join("nope.toml"))).is_err());
    }
}
