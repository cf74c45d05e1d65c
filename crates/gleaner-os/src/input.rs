//! Bad user input: the shared [`BadInput`] error (defined in `gleaner_policy::input`, re-exported
//! here for the OS layer's callers) and parsers of values given on command lines.

pub use gleaner_policy::input::BadInput;

/// The address a metrics endpoint listens on, from `--metrics-addr` (named `what`): a port
/// alone means loopback (`9464` is `127.0.0.1:9464`); `IP:PORT` is taken as given, so
/// serving other machines is always something the user wrote out.
pub fn metrics_addr(what: &str, text: &str) -> Result<std::net::SocketAddr, BadInput> {
    let bad = || BadInput::new(what, text, "PORT (served on 127.0.0.1) or IP:PORT, e.g. 9464 or 127.0.0.1:9464");
    match text.trim().parse::<u16>() {
        Ok(port) => Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => text.trim().parse().map_err(|_| bad()),
    }
}

/// A warning to print when a metrics endpoint listens beyond this machine, `None` on loopback.
pub fn metrics_exposure(addr: std::net::SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback())
        .then(|| format!("metrics on {addr} are reachable from other machines (give a port alone, or 127.0.0.1:PORT, to keep them local)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_port_alone_is_loopback_and_other_addresses_are_as_written() {
        assert_eq!(metrics_addr("--metrics-addr", "9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(metrics_addr("--metrics-addr", "[::1]:9464").unwrap().to_string(), "[::1]:9464");
        let all = metrics_addr("--metrics-addr", "0.0.0.0:9464").unwrap();
        assert!(metrics_exposure(all).is_some_and(|w| w.contains("0.0.0.0:9464") && w.contains("reachable from other machines")));
        assert_eq!(metrics_exposure(metrics_addr("m", "9464").unwrap()), None);
        for bad in ["localhost", "", "99999", "1.2.3.4"] {
            let e = metrics_addr("metrics_addr", bad).unwrap_err();
            assert_eq!(e.what, "metrics_addr");
            assert!(e.to_string().contains("PORT (served on 127.0.0.1)"), "{e}");
        }
    }
}
