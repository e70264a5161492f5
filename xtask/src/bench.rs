//! `cargo xtask bench [CRATE] [-- CRITERION ARGS]`: the criterion benches of every crate
//! that has them, or of one (`cache` or `met-cache`).
//!
//! The bench targets come from `cargo metadata`, so a new `[[bench]]` is picked up without
//! touching this file. Each crate runs as `cargo bench -p CRATE --bench NAME ...`: naming
//! the targets keeps the library's libtest harness out, which would reject criterion's
//! flags. Targets with `required-features` (the CUDA benches of `met-kernels`) are skipped
//! with a note saying how to run them, since they need a GPU machine. Arguments after `--`
//! go to criterion (`-- --warm-up-time 1 --measurement-time 2`, or a filter such as
//! `-- match_prefix`).

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, root, run};

/// One workspace crate's bench targets.
struct BenchCrate {
    package: String,
    /// Targets that build with the default features.
    targets: Vec<String>,
    /// Targets that need features, with them.
    gated: Vec<(String, Vec<String>)>,
}

/// Runs `cargo xtask bench`.
pub fn bench(args: &[String]) -> Result<()> {
    let (ours, criterion) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let wanted = match ours {
        [] => None,
        [name] => Some(name.as_str()),
        _ => bail!("usage: cargo xtask bench [CRATE] [-- CRITERION ARGS]"),
    };
    let crates = bench_crates()?;
    let selected: Vec<&BenchCrate> = match wanted {
        None => crates.iter().collect(),
        Some(name) => {
            let found = crates.iter().find(|c| c.package == name || c.package.strip_prefix("met-") == Some(name));
            let names: Vec<&str> = crates.iter().map(|c| c.package.as_str()).collect();
            vec![found.with_context(|| format!("no crate `{name}` with benches (crates with benches: {names:?})"))?]
        }
    };
    for krate in selected {
        for (target, features) in &krate.gated {
            let features = features.join(",");
            let package = &krate.package;
            eprintln!(
                "xtask: skipping {package} bench `{target}`: it needs features {features} (on a machine \
                 where they run: cargo bench -p {package} --features {features} --bench {target})"
            );
        }
        if krate.targets.is_empty() {
            continue;
        }
        let mut cmd = cargo();
        cmd.args(["bench", "-p", &krate.package]);
        for target in &krate.targets {
            cmd.args(["--bench", target]);
        }
        run(cmd.arg("--").args(criterion))?;
    }
    Ok(())
}

/// The workspace crates that have bench targets, in `cargo metadata`'s order.
fn bench_crates() -> Result<Vec<BenchCrate>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let metadata: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let packages = metadata["packages"].as_array().context("cargo metadata without packages")?;
    Ok(packages.iter().filter_map(bench_crate).collect())
}

/// A package's bench targets, or `None` when it has none.
fn bench_crate(package: &Value) -> Option<BenchCrate> {
    let mut krate =
        BenchCrate { package: package["name"].as_str()?.to_owned(), targets: Vec::new(), gated: Vec::new() };
    for target in package["targets"].as_array()? {
        if !target["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bench")) {
            continue;
        }
        let Some(name) = target["name"].as_str() else { continue };
        let features: Vec<String> = target["required-features"]
            .as_array()
            .map(|f| f.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        if features.is_empty() {
            krate.targets.push(name.to_owned());
        } else {
            krate.gated.push((name.to_owned(), features));
        }
    }
    (!krate.targets.is_empty() || !krate.gated.is_empty()).then_some(krate)
}
