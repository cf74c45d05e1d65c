//! The lab's kernel cache: a Debian `linux-image-*-amd64` package downloaded with
//! `apt-get download` (never installed), unpacked with `dpkg-deb -x`, reduced to what a guest
//! needs: the compressed and the extracted uncompressed kernel (`vmlinux` boots about twice as
//! fast under TCG), the config, and the few modules needed to mount the host's filesystem over
//! 9p (`virtio_pci`, `9pnet_virtio`, `9p` and their dependencies, in load order).
//!
//! ```text
//! <cache>/kernels/<kver>/vmlinuz  vmlinux  config  meta.json
//!                        modules/<name>.ko   modules.order
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::modinfo;

/// Modules the guest init loads (with their dependencies) before mounting the root.
pub const GUEST_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// The Debian metapackage that names the current kernel package.
pub const DEFAULT_META_PACKAGE: &str = "linux-image-amd64";

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed: {detail}")]
    Command { cmd: String, detail: String },
    #[error("no kernel in the lab cache {dir}: run `gleaner lab fetch-kernel` (needs apt-get, dpkg-deb and a done `apt-get update`)")]
    NoKernel { dir: PathBuf },
    #[error("kernel {version} not in the lab cache {dir} (have: {have})")]
    NoSuchKernel { version: String, dir: PathBuf, have: String },
    #[error("{path}: {what}")]
    Bad { path: PathBuf, what: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io { path: path.to_path_buf(), source }
}

/// Where the cache lives: `--cache-dir`, else `$GLEANER_LAB_CACHE`, else
/// `/var/cache/gleaner-lab` when running as root, else `$XDG_CACHE_HOME/gleaner-lab`
/// (or `~/.cache/gleaner-lab`).
pub fn resolve_cache_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("GLEANER_LAB_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/cache/gleaner-lab");
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(p).join("gleaner-lab");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/gleaner-lab")
}

/// Provenance of a cached kernel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelMeta {
    pub version: String,
    pub package: String,
    #[serde(default)]
    pub package_version: String,
    /// True when `vmlinux` was extracted from `vmlinuz` (faster boot).
    #[serde(default)]
    pub vmlinux: bool,
    #[serde(default)]
    pub fetched_unix_s: u64,
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub dir: PathBuf,
    pub meta: KernelMeta,
    /// Modules in load order (names; files are `modules/<name>.ko`).
    pub modules: Vec<String>,
}

impl Kernel {
    /// The image QEMU gets with `-kernel`: `vmlinux` when extracted, else `vmlinuz`.
    pub fn image(&self) -> PathBuf {
        if self.meta.vmlinux && self.dir.join("vmlinux").is_file() {
            self.dir.join("vmlinux")
        } else {
            self.dir.join("vmlinuz")
        }
    }

    pub fn module_path(&self, name: &str) -> PathBuf {
        self.dir.join("modules").join(format!("{name}.ko"))
    }

    /// Loads a cached kernel directory, checking every file the guest needs is there.
    pub fn load(dir: &Path) -> Result<Self, CacheError> {
        let meta_path = dir.join("meta.json");
        let text = fs::read_to_string(&meta_path).map_err(io(&meta_path))?;
        let meta: KernelMeta = serde_json::from_str(&text).map_err(|e| CacheError::Bad { path: meta_path.clone(), what: e.to_string() })?;
        let order_path = dir.join("modules.order");
        let order = fs::read_to_string(&order_path).map_err(io(&order_path))?;
        let modules: Vec<String> = order.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
        if modules.is_empty() {
            return Err(CacheError::Bad { path: order_path, what: "empty module list".into() });
        }
        let k = Self { dir: dir.to_path_buf(), meta, modules };
        for p in std::iter::once(k.image()).chain(k.modules.iter().map(|m| k.module_path(m))) {
            if !p.is_file() {
                return Err(CacheError::Bad { path: p, what: "missing (re-run fetch-kernel)".into() });
            }
        }
        Ok(k)
    }
}

/// The cached kernels, newest version last.
pub fn list_kernels(cache: &Path) -> Vec<Kernel> {
    let dir = cache.join("kernels");
    let mut out: Vec<Kernel> = fs::read_dir(&dir).into_iter().flatten().flatten().filter_map(|e| Kernel::load(&e.path()).ok()).collect();
    out.sort_by_key(|k| version_key(&k.meta.version));
    out
}

fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse().ok()).collect()
}

/// The kernel to boot: the named version, or the newest cached one.
pub fn find_kernel(cache: &Path, version: Option<&str>) -> Result<Kernel, CacheError> {
    let all = list_kernels(cache);
    match version {
        None => all.into_iter().last().ok_or_else(|| CacheError::NoKernel { dir: cache.to_path_buf() }),
        Some(v) => {
            let have = all.iter().map(|k| k.meta.version.clone()).collect::<Vec<_>>().join(", ");
            all.into_iter().find(|k| k.meta.version == v).ok_or_else(|| CacheError::NoSuchKernel {
                version: v.to_string(),
                dir: cache.to_path_buf(),
                have: if have.is_empty() { "none".into() } else { have },
            })
        }
    }
}

fn run(cmd: &mut Command) -> Result<String, CacheError> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| CacheError::Command { cmd: shown.clone(), detail: e.to_string() })?;
    if !out.status.success() {
        return Err(CacheError::Command { cmd: shown, detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()) });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The concrete kernel package a metapackage depends on (`linux-image-amd64` ->
/// `linux-image-6.1.0-56-amd64`), with its version.
pub fn resolve_package(meta: &str) -> Result<(String, String), CacheError> {
    let text = run(Command::new("apt-cache").args(["show", "--no-all-versions", meta]))?;
    parse_apt_show(&text).ok_or_else(|| CacheError::Command {
        cmd: format!("apt-cache show {meta}"),
        detail: "no linux-image-* in Depends (run `apt-get update`?)".into(),
    })
}

/// From `apt-cache show` output: the first `linux-image-*` dependency, or the package
/// itself when it is already a concrete kernel package (has no such dependency).
pub fn parse_apt_show(text: &str) -> Option<(String, String)> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
    let package = field("Package:")?;
    let version = field("Version:").unwrap_or_default();
    if let Some(dep) = field("Depends:") {
        for alt in dep.split([',', '|']) {
            let name = alt.split_whitespace().next().unwrap_or("");
            if name.starts_with("linux-image-") {
                return Some((name.to_string(), version));
            }
        }
    }
    (package.starts_with("linux-image-") && package != DEFAULT_META_PACKAGE).then_some((package, version))
}

/// Downloads, unpacks and reduces a kernel package into the cache. `say` gets one line per step.
pub fn fetch_kernel(cache: &Path, package: Option<&str>, say: &mut dyn FnMut(&str)) -> Result<Kernel, CacheError> {
    let kernels = cache.join("kernels");
    fs::create_dir_all(&kernels).map_err(io(&kernels))?;
    let meta_pkg = package.unwrap_or(DEFAULT_META_PACKAGE);
    say(&format!("resolving {meta_pkg} with apt-cache show"));
    let (pkg, pkg_version) = resolve_package(meta_pkg)?;
    let work = tempfile::Builder::new().prefix(".fetch-").tempdir_in(cache).map_err(io(cache))?;
    let unpacked = download_and_unpack(&pkg, work.path(), say)?;
    let out = work.path().join("kernel");
    let (vmlinuz, version, config) = copy_boot_files(&unpacked, &out)?;
    copy_guest_modules(&unpacked, &version, &config, &out)?;
    let has_vmlinux = write_vmlinux(&vmlinuz, &out, say)?;
    let meta = KernelMeta {
        version: version.clone(),
        package: pkg,
        package_version: pkg_version,
        vmlinux: has_vmlinux,
        fetched_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    };
    let meta_path = out.join("meta.json");
    fs::write(&meta_path, serde_json::to_string_pretty(&meta).unwrap_or_default()).map_err(io(&meta_path))?;
    let dest = kernels.join(&version);
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(io(&dest))?;
    }
    fs::rename(&out, &dest).map_err(io(&dest))?;
    drop(work); // removes the 400 MB unpacked tree and the .deb
    say(&format!("kernel {version} cached in {}", dest.display()));
    Kernel::load(&dest)
}

/// Downloads package `pkg` into `work` and unpacks it there; returns the unpacked tree.
fn download_and_unpack(pkg: &str, work: &Path, say: &mut dyn FnMut(&str)) -> Result<PathBuf, CacheError> {
    say(&format!("apt-get download {pkg} (into {})", work.display()));
    run(Command::new("apt-get").arg("download").arg(pkg).current_dir(work))?;
    let deb = fs::read_dir(work)
        .map_err(io(work))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| CacheError::Bad { path: work.into(), what: "apt-get download left no .deb".into() })?;
    let unpacked = work.join("root");
    say(&format!("dpkg-deb -x {}", deb.display()));
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    Ok(unpacked)
}

/// Copies the package's vmlinuz (and config, if any) into `out`, creating `out/modules`;
/// returns the vmlinuz, the kernel version and where the package's config is.
fn copy_boot_files(unpacked: &Path, out: &Path) -> Result<(PathBuf, String, PathBuf), CacheError> {
    let boot = unpacked.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .map_err(io(&boot))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .ok_or_else(|| CacheError::Bad { path: boot.clone(), what: "no vmlinuz-* in package".into() })?;
    let version = vmlinuz.file_name().and_then(|n| n.to_str()).unwrap_or("").trim_start_matches("vmlinuz-").to_string();
    let mods_out = out.join("modules");
    fs::create_dir_all(&mods_out).map_err(io(&mods_out))?;
    copy(&vmlinuz, &out.join("vmlinuz"))?;
    let config = boot.join(format!("config-{version}"));
    if config.is_file() {
        copy(&config, &out.join("config"))?;
    }
    Ok((vmlinuz, version, config))
}

/// Copies [`GUEST_MODULES`] and their dependencies (those not built in) into `out/modules`,
/// decompressed, with `out/modules.order` listing them in load order.
fn copy_guest_modules(unpacked: &Path, version: &str, config: &Path, out: &Path) -> Result<(), CacheError> {
    let mod_root = unpacked.join("lib/modules").join(version).join("kernel");
    let mod_root = if mod_root.is_dir() { mod_root } else { unpacked.join("usr/lib/modules").join(version).join("kernel") };
    let index = module_index(&mod_root)?;
    let (deps, images) = needed_modules(&index, config, &mod_root)?;
    let order = modinfo::load_order(GUEST_MODULES, &deps).map_err(|what| CacheError::Bad { path: mod_root.clone(), what })?;
    let mods_out = out.join("modules");
    let mut order_text = String::new();
    for m in &order {
        if let Some(image) = images.get(m) {
            let p = mods_out.join(format!("{m}.ko"));
            fs::write(&p, image).map_err(io(&p))?;
            order_text.push_str(m);
            order_text.push('\n');
        }
    }
    let order_path = out.join("modules.order");
    fs::write(&order_path, order_text).map_err(io(&order_path))
}

/// Every module under `mod_root`, by name (`-` read as `_`).
fn module_index(mod_root: &Path) -> Result<BTreeMap<String, PathBuf>, CacheError> {
    let mut index: BTreeMap<String, PathBuf> = BTreeMap::new();
    walk(mod_root, &mut |p| {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        for suffix in [".ko", ".ko.xz", ".ko.zst", ".ko.gz"] {
            if let Some(stem) = n.strip_suffix(suffix) {
                index.insert(stem.replace('-', "_"), p.to_path_buf());
            }
        }
    })?;
    Ok(index)
}

/// Each module's dependencies, by name.
type ModuleDeps = BTreeMap<String, Vec<String>>;

/// The dependencies of [`GUEST_MODULES`], resolved lazily (only the modules needed are read),
/// and the decompressed image of each that is not built into the kernel.
fn needed_modules(
    index: &BTreeMap<String, PathBuf>,
    config: &Path,
    mod_root: &Path,
) -> Result<(ModuleDeps, BTreeMap<String, Vec<u8>>), CacheError> {
    let mut deps: ModuleDeps = BTreeMap::new();
    let mut todo: Vec<String> = GUEST_MODULES.iter().map(|s| s.to_string()).collect();
    let mut images: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Some(m) = todo.pop() {
        if deps.contains_key(&m) {
            continue;
        }
        let Some(path) = index.get(&m) else {
            // Built into the kernel (=y): nothing to load.
            if is_builtin(config, &m) {
                deps.insert(m, vec![]);
                continue;
            }
            return Err(CacheError::Bad { path: mod_root.to_path_buf(), what: format!("module {m} not in package") });
        };
        let image = decompress_module(path)?;
        let d = modinfo::depends(&image).ok_or_else(|| CacheError::Bad { path: path.clone(), what: "no .modinfo".into() })?;
        todo.extend(d.iter().cloned());
        deps.insert(m.clone(), d);
        images.insert(m, image);
    }
    Ok((deps, images))
}

/// Writes the uncompressed kernel extracted from `vmlinuz` to `out/vmlinux`; false (said)
/// when it cannot be extracted.
fn write_vmlinux(vmlinuz: &Path, out: &Path, say: &mut dyn FnMut(&str)) -> Result<bool, CacheError> {
    say("extracting the uncompressed vmlinux from vmlinuz");
    let raw = fs::read(vmlinuz).map_err(io(vmlinuz))?;
    Ok(match extract_vmlinux(&raw) {
        Some(elf) => {
            let p = out.join("vmlinux");
            fs::write(&p, elf).map_err(io(&p))?;
            true
        }
        None => {
            say("could not extract vmlinux; guests boot the compressed vmlinuz (slower)");
            false
        }
    })
}

fn is_builtin(config: &Path, module: &str) -> bool {
    // Good enough for the handful of modules we need: virtio core options.
    let key = match module {
        "virtio" => "CONFIG_VIRTIO=y",
        "virtio_ring" => "CONFIG_VIRTIO=y",
        "virtio_pci" => "CONFIG_VIRTIO_PCI=y",
        "9pnet" => "CONFIG_NET_9P=y",
        "9pnet_virtio" => "CONFIG_NET_9P_VIRTIO=y",
        "9p" => "CONFIG_9P_FS=y",
        "netfs" => "CONFIG_NETFS_SUPPORT=y",
        "fscache" => "CONFIG_FSCACHE=y",
        _ => return false,
    };
    fs::read_to_string(config).is_ok_and(|c| c.lines().any(|l| l == key))
}

fn copy(from: &Path, to: &Path) -> Result<(), CacheError> {
    fs::copy(from, to).map(|_| ()).map_err(io(from))
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<(), CacheError> {
    for e in fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, f)?;
        } else {
            f(&p);
        }
    }
    Ok(())
}

fn decompress_module(path: &Path) -> Result<Vec<u8>, CacheError> {
    let name = path.to_string_lossy();
    let prog = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else if name.ends_with(".gz") {
        "gzip"
    } else {
        return fs::read(path).map_err(io(path));
    };
    let out = Command::new(prog)
        .arg("-dc")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CacheError::Command { cmd: format!("{prog} -dc {name}"), detail: e.to_string() })?;
    if !out.status.success() {
        return Err(CacheError::Command { cmd: format!("{prog} -dc {name}"), detail: out.status.to_string() });
    }
    Ok(out.stdout)
}

/// Finds the compressed payload inside a bzImage by its magic and decompresses it with the
/// matching tool (the kernel's `scripts/extract-vmlinux` approach). Returns the ELF image.
pub fn extract_vmlinux(bz: &[u8]) -> Option<Vec<u8>> {
    const MAGICS: &[(&[u8], &str)] = &[
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
        (&[0x1f, 0x8b, 0x08], "gzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
        (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
    ];
    for (magic, prog) in MAGICS {
        let mut from = 0;
        // Try the first few occurrences; the first one is almost always right.
        for _ in 0..4 {
            let Some(pos) = bz[from..].windows(magic.len()).position(|w| w == *magic) else { break };
            let at = from + pos;
            if let Some(elf) = decompress_stream(prog, &bz[at..]) {
                if elf.starts_with(b"\x7fELF") {
                    return Some(elf);
                }
            }
            from = at + 1;
        }
    }
    None
}

fn decompress_stream(prog: &str, data: &[u8]) -> Option<Vec<u8>> {
    let mut child = Command::new(prog).arg("-dc").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let mut stdin = child.stdin.take()?;
    let data = data.to_vec();
    // Trailing bytes after the stream make the tool complain; the output is still complete.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let mut out = Vec::new();
    child.stdout.take()?.read_to_end(&mut out).ok()?;
    let _ = child.wait();
    let _ = writer.join();
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_show_metapackage_resolves_dependency() {
        let text = "Package: linux-image-amd64\nVersion: 6.1.192-2\nDepends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\n";
        assert_eq!(parse_apt_show(text), Some(("linux-image-6.1.0-56-amd64".into(), "6.1.192-2".into())));
    }

    #[test]
    fn apt_show_concrete_package_and_malformed() {
        let text = "Package: linux-image-6.1.0-56-amd64\nVersion: 6.1.192-2\nDepends: kmod, linux-base (>= 4.3~)\n";
        assert_eq!(parse_apt_show(text).unwrap().0, "linux-image-6.1.0-56-amd64");
        assert_eq!(parse_apt_show("Package: linux-image-amd64\nDepends: kmod\n"), None);
        assert_eq!(parse_apt_show("garbage"), None);
        assert_eq!(parse_apt_show(""), None);
    }

    #[test]
    fn extract_vmlinux_finds_gzip_payload_after_junk() {
        let mut elf = b"\x7fELF".to_vec();
        elf.extend(std::iter::repeat_n(7u8, 5000));
        let mut gz =
            Command::new("gzip").arg("-c").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("gzip is needed by this test");
        gz.stdin.take().unwrap().write_all(&elf).unwrap();
        let compressed = gz.wait_with_output().unwrap().stdout;
        let mut bz = b"MZ setup code, not compressed".to_vec();
        bz.extend(&compressed);
        bz.extend(b"trailing junk");
        assert_eq!(extract_vmlinux(&bz).unwrap(), elf);
        assert_eq!(extract_vmlinux(b"no payload here"), None);
        assert_eq!(extract_vmlinux(b""), None);
    }

    #[test]
    fn version_ordering() {
        assert!(version_key("6.1.0-56-amd64") > version_key("6.1.0-9-amd64"));
        assert!(version_key("6.12.0-1-amd64") > version_key("6.1.0-56-amd64"));
    }

    #[test]
    fn missing_kernel_is_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        let e = find_kernel(d.path(), None).unwrap_err().to_string();
        assert!(e.contains("fetch-kernel"), "{e}");
        let e = find_kernel(d.path(), Some("1.2.3")).unwrap_err().to_string();
        assert!(e.contains("1.2.3") && e.contains("none"), "{e}");
    }
}
