//! `cargo xtask packages`: the host libraries as a host author installs them, into
//! target/packages/: the pure Python wheel (`py3-none-any`, which finds `leash` on PATH), a
//! platform wheel carrying each `leash` binary (`py3-none-manylinux_2_31_x86_64`, `..._aarch64`),
//! the `leash-client` npm tarball, and a platform npm package per binary
//! (`leash-client-linux-x64`, `leash-client-linux-arm64`), the way esbuild ships its binaries.
//!
//! The binaries are those `cargo xtask dist` staged (target/dist/leash-VERSION-ARCH-linux/
//! bin/leash), each that exists; `--binary` names others (the scenario test packs its own
//! build: tests/tests/host_packages.rs). The wheels are built by the library's own build backend
//! (hatchling, from the hosts' pinned Python environment) through clients/python/hatch_build.py;
//! the platform npm packages are made here from one template, [`platform_manifest`].
//!
//! The platform packages are named as exact-version optional dependencies only in the packed
//! `leash-client`: the source's package.json leaves them out, so that installing the clone
//! (`npm install ./clients/node`) never asks the registry for names that are not published.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{cross::Arch, dist, hosts, status, workspace_root};

/// The build hook's variables (clients/python/hatch_build.py).
const WHEEL_BINARY_ENV: &str = "LEASH_WHEEL_BINARY";
const WHEEL_PLATFORM_ENV: &str = "LEASH_WHEEL_PLATFORM";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Make the platform packages around this `leash` binary instead of the staged ones (its
    /// architecture read from its ELF header; its wheel tagged with the glibc it needs, 2.31 at
    /// the least). May be given once per architecture.
    #[arg(long, value_name = "PATH")]
    pub binary: Vec<PathBuf>,
    /// Where to put the packages (made if missing; the packages of an earlier run are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A binary to package, and what it is.
struct Binary {
    path: PathBuf,
    arch: Arch,
    /// The wheel's platform tag: `manylinux_X_Y_ARCH`, X.Y the glibc it needs.
    platform: String,
}

impl Binary {
    fn read(path: &Path) -> Result<Self> {
        let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let arch = Arch::of_elf(&bytes).with_context(|| {
            format!(
                "{} is not a Linux binary for x86_64 or aarch64",
                path.display()
            )
        })?;
        // The glibc floor the dist build guarantees, or newer if this binary needs newer (a
        // development build): the tag must never promise more than the binary keeps.
        let (major, minor) = dist::glibc_floor(path, arch)?.max(dist::GLIBC_FLOOR);
        Ok(Self {
            path: path.to_owned(),
            arch,
            platform: format!("manylinux_{major}_{minor}_{}", arch.name()),
        })
    }
}

pub(crate) fn packages(options: &Options) -> Result<()> {
    let root = workspace_root();
    let out = options
        .out
        .clone()
        .unwrap_or_else(|| root.join("target/packages"));
    let binaries = binaries(&options.binary)?;
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    remove_earlier_packages(&out)?;
    let node = NodePackage::read(&root.join("clients/node"))?;

    let python = hosts::ensure_python_packages(&[hosts::HATCHLING])?;
    build_wheel(&python, &out, None)?;
    for binary in &binaries {
        build_wheel(&python, &out, Some(binary))?;
    }

    let staging = out.join(".staging");
    let _ = fs::remove_dir_all(&staging);
    let packed = (|| {
        node.pack_main(&staging.join("leash-client"), &out)?;
        for binary in &binaries {
            pack_platform(
                &node,
                binary,
                &staging.join(binary.arch.npm_package()),
                &out,
            )?;
        }
        Ok::<_, anyhow::Error>(())
    })();
    let _ = fs::remove_dir_all(&staging);
    packed?;

    let mut made: Vec<PathBuf> = fs::read_dir(&out)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| is_package(path))
        .collect();
    made.sort();
    for path in &made {
        let size = fs::metadata(path)?.len();
        println!("packages: {} ({})", path.display(), human_size(size));
    }
    if binaries.is_empty() {
        println!(
            "packages: no platform packages: no binary staged by `cargo xtask dist` (and none \
             given with --binary)"
        );
    }
    Ok(())
}

/// `size` in MiB, or KiB below one MiB.
fn human_size(size: u64) -> String {
    const KIB: f64 = 1024.0;
    let size = size as f64;
    if size < KIB * KIB {
        format!("{:.1} KiB", size / KIB)
    } else {
        format!("{:.1} MiB", size / (KIB * KIB))
    }
}

/// The binaries named, else each one `cargo xtask dist` staged; at most one per architecture.
fn binaries(named: &[PathBuf]) -> Result<Vec<Binary>> {
    let paths: Vec<PathBuf> = if named.is_empty() {
        let version = dist::version()?;
        Arch::ALL
            .iter()
            .map(|arch| {
                workspace_root().join(format!(
                    "target/dist/leash-{version}-{}-linux/bin/leash",
                    arch.name()
                ))
            })
            .filter(|path| path.is_file())
            .collect()
    } else {
        named.to_vec()
    };
    let binaries = paths
        .iter()
        .map(|path| Binary::read(path))
        .collect::<Result<Vec<_>>>()?;
    for arch in Arch::ALL {
        if binaries.iter().filter(|b| b.arch == arch).count() > 1 {
            bail!("two binaries for {}: one per architecture", arch.name());
        }
    }
    Ok(binaries)
}

/// What this task writes: the wheels and the tarballs.
fn is_package(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    (name.starts_with("leash_client-") && name.ends_with(".whl"))
        || (name.starts_with("leash-client-") && name.ends_with(".tgz"))
}

fn remove_earlier_packages(out: &Path) -> Result<()> {
    for entry in fs::read_dir(out)? {
        let path = entry?.path();
        if is_package(&path) {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// The pure wheel (`binary` None), or the platform wheel carrying `binary`: hatchling builds
/// it from clients/python, the hook told which binary and platform (or nothing).
fn build_wheel(python: &Path, out: &Path, binary: Option<&Binary>) -> Result<()> {
    let mut build = Command::new(python);
    build
        .args([
            "-m",
            "hatchling",
            "build",
            "--target",
            "wheel",
            "--directory",
        ])
        .arg(out)
        .current_dir(workspace_root().join("clients/python"))
        // Nothing written into the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove(WHEEL_BINARY_ENV)
        .env_remove(WHEEL_PLATFORM_ENV);
    if let Some(binary) = binary {
        build
            .env(WHEEL_BINARY_ENV, &binary.path)
            .env(WHEEL_PLATFORM_ENV, &binary.platform);
    }
    status(&mut build).context("building a wheel of clients/python")
}

/// clients/node/package.json, and the files it names.
struct NodePackage {
    dir: PathBuf,
    manifest: Value,
}

impl NodePackage {
    fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("package.json");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let manifest: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(Self {
            dir: dir.to_owned(),
            manifest,
        })
    }

    fn field(&self, name: &str) -> Result<&str> {
        self.manifest[name]
            .as_str()
            .with_context(|| format!("clients/node/package.json has no {name:?}"))
    }

    /// `leash-client`, packed from a copy whose package.json names the platform packages as
    /// exact-version optional dependencies.
    fn pack_main(&self, staging: &Path, out: &Path) -> Result<()> {
        fs::create_dir_all(staging)?;
        let files = self.manifest["files"]
            .as_array()
            .context("clients/node/package.json has no \"files\"")?;
        for file in files {
            let name = file.as_str().context("a file name")?;
            copy_tree(&self.dir.join(name), &staging.join(name))?;
        }
        fs::write(
            staging.join("package.json"),
            self.with_optional_dependencies()?,
        )
        .context("writing package.json")?;
        npm_pack(staging, out)
    }

    /// package.json's text with `optionalDependencies` added at its end. The text is edited,
    /// not re-serialized: the order of "exports" conditions matters ("types" first), and
    /// serde_json here sorts an object's keys.
    fn with_optional_dependencies(&self) -> Result<String> {
        if self.manifest.get("optionalDependencies").is_some() {
            bail!(
                "clients/node/package.json names optionalDependencies: they are added when \
                 packing, so that installing the clone never asks the registry for them"
            );
        }
        let version = self.field("version")?;
        let text = fs::read_to_string(self.dir.join("package.json"))?;
        let end = text
            .trim_end()
            .strip_suffix('}')
            .context("package.json ends with `}`")?;
        let entries: Vec<String> = Arch::ALL
            .iter()
            .map(|arch| format!("    \"{}\": \"{version}\"", arch.npm_package()))
            .collect();
        let edited = format!(
            "{},\n  \"optionalDependencies\": {{\n{}\n  }}\n}}\n",
            end.trim_end(),
            entries.join(",\n")
        );
        let parsed: Value = serde_json::from_str(&edited).context("the edited package.json")?;
        if parsed["optionalDependencies"].as_object().map(|o| o.len()) != Some(Arch::ALL.len()) {
            bail!("the edited package.json lacks its optionalDependencies:\n{edited}");
        }
        Ok(edited)
    }
}

/// The template of every platform package: the binary at bin/leash, installed by npm only on
/// its os, cpu and libc, at the version of the `leash-client` that names it.
fn platform_manifest(node: &NodePackage, arch: Arch) -> Result<Value> {
    Ok(json!({
        "name": arch.npm_package(),
        "version": node.field("version")?,
        "description": format!(
            "The leash binary for Linux on {}: an optional dependency of leash-client, which \
             spawns through it",
            arch.name()
        ),
        "license": node.field("license")?,
        "os": ["linux"],
        "cpu": [arch.npm_cpu()],
        "libc": ["glibc"],
        "files": ["bin/leash", "README.md"],
        // Yarn's Plug'n'Play would otherwise keep the binary inside a zip archive.
        "preferUnplugged": true,
    }))
}

fn pack_platform(node: &NodePackage, binary: &Binary, staging: &Path, out: &Path) -> Result<()> {
    let manifest = platform_manifest(node, binary.arch)?;
    let manifest = serde_json::to_string_pretty(&manifest)? + "\n";
    fs::create_dir_all(staging.join("bin"))?;
    let target = staging.join("bin/leash");
    fs::copy(&binary.path, &target)
        .with_context(|| format!("copying {}", binary.path.display()))?;
    set_mode(&target, 0o755)?;
    let readme = format!(
        "# {name}\n\nThe `leash` binary ({platform}, leash {version}) for \
         [leash-client](https://www.npmjs.com/package/leash-client), which installs this package \
         as an optional dependency where `os` and `cpu` match and spawns through \
         `bin/leash`. Not meant to be installed on its own.\n",
        name = binary.arch.npm_package(),
        platform = binary.platform,
        version = node.field("version")?,
    );
    fs::write(staging.join("README.md"), readme)?;
    fs::write(staging.join("package.json"), manifest).context("writing package.json")?;
    npm_pack(staging, out)
}

fn npm_pack(dir: &Path, out: &Path) -> Result<()> {
    hosts::ensure_node()?;
    status(
        Command::new("npm")
            .args(["pack", "--silent", "--pack-destination"])
            .arg(out)
            .current_dir(dir),
    )
    .with_context(|| format!("npm pack in {}", dir.display()))
}

/// Copies a file or a directory (its files' executable bits kept).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if from.is_dir() {
        fs::create_dir_all(to)?;
        for entry in fs::read_dir(from)? {
            let name = entry?.file_name();
            copy_tree(&from.join(&name), &to.join(&name))?;
        }
        return Ok(());
    }
    fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_packages_are_the_names_the_library_resolves() {
        // clients/node/src/locate.js: `leash-client-${process.platform}-${process.arch}`.
        let locate = fs::read_to_string(workspace_root().join("clients/node/src/locate.js"))
            .expect("clients/node/src/locate.js");
        assert!(locate.contains("`leash-client-${process.platform}-${process.arch}`"));
        assert_eq!(Arch::X86_64.npm_package(), "leash-client-linux-x64");
        assert_eq!(Arch::Aarch64.npm_package(), "leash-client-linux-arm64");
        let node = NodePackage::read(&workspace_root().join("clients/node")).unwrap();
        let manifest = platform_manifest(&node, Arch::Aarch64).unwrap();
        assert_eq!(manifest["cpu"], json!(["arm64"]));
        assert_eq!(manifest["os"], json!(["linux"]));
        assert_eq!(manifest["version"], node.manifest["version"]);
        // The source names no platform package (a clone's install must not ask the registry);
        // the packed one names each, at its own version, and keeps the order of "exports".
        let packed: Value =
            serde_json::from_str(&node.with_optional_dependencies().unwrap()).expect("JSON");
        let version = &node.manifest["version"];
        assert_eq!(
            packed["optionalDependencies"],
            json!({"leash-client-linux-x64": version, "leash-client-linux-arm64": version})
        );
        let text = node.with_optional_dependencies().unwrap();
        assert!(text.find("\"types\": \"./index.d.ts\"") < text.find("\"default\""));
    }
}
