//! CDF charts are written as PNG and SVG (needs fonts-dejavu-core).

use gleaner_bench::plot::{cdf, check_path, Curve};

#[test]
fn png_and_svg_cdfs_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let curves = vec![
        Curve { label: "B".into(), values: (1..500).map(|i| 20.0 + f64::from(i) * 0.1).collect() },
        Curve { label: "C".into(), values: (1..500).map(|i| 40.0 + f64::from(i) * 0.5).collect() },
    ];
    for name in ["cdf.png", "cdf.svg"] {
        let p = dir.path().join(name);
        cdf(&p, "test", "latency (us)", &curves).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let bytes = std::fs::read(&p).unwrap();
        assert!(bytes.len() > 1000, "{name} is only {} bytes", bytes.len());
        if name.ends_with(".png") {
            assert_eq!(&bytes[1..4], b"PNG");
        } else {
            assert!(String::from_utf8_lossy(&bytes).contains("<svg"));
        }
    }
    assert!(check_path(std::path::Path::new("x.pdf")).is_err());
}
