//! The live part of `cargo xtask test`: `met serve` on the default model, driven by the
//! official `openai` and `anthropic` Python clients (`crates/server/tests/live/`: the
//! OpenAI API in `test_openai.py`, bad input and hostile clients in `test_errors.py`,
//! engine faults in `test_faults.py`, many clients and a soak in `test_load.py`, what agents
//! send in `test_agents.py`, LoRA adapters in `test_lora.py`; all but `test_agents.py`
//! share `live_common.py`).
//!
//! Each suite is a unittest script, run in a process of its own with the same arguments
//! (`-k NAME` picks tests in every suite); a suite that a filter leaves empty is no failure.
//!
//! The client lives in a virtualenv outside the clone (`$MET_HOME/venv-live`), reinstalled
//! only when `requirements.txt` changes. The server gets a free port, a random API key and
//! a log file under the target directory; once `/health` answers 200 the suites run, then
//! the server gets SIGTERM while a stream is in flight: the stream must finish and the
//! server exit 0 within a bound. The suites' results and the shutdown's all decide the
//! outcome. A [`Server`] kills its process when dropped, so no
//! failure path leaves one behind.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::root;

/// The suites, run one after the other against the same server.
const SUITES: [&str; 6] = [
    "crates/server/tests/live/test_openai.py",
    "crates/server/tests/live/test_lora.py",
    "crates/server/tests/live/test_errors.py",
    "crates/server/tests/live/test_faults.py",
    "crates/server/tests/live/test_load.py",
    "crates/server/tests/live/test_agents.py",
];
const REQUIREMENTS: &str = "crates/server/tests/live/requirements.txt";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the live suite against `met` (a built binary); `args` go to unittest.
pub fn run(met: &Path, args: &[String]) -> Result<()> {
    let python = virtualenv()?;
    let log = met.parent().and_then(Path::parent).unwrap_or(met).join("live-test").join("met-serve.log");
    let key = format!("met-live-{:016x}{:016x}", random_u64(), random_u64());
    let port = free_port()?;
    let mut server = Server::start(met, port, &key, &log)?;
    server.wait_ready(READY_TIMEOUT)?;

    let suites: Vec<Result<ExitStatus>> = SUITES
        .iter()
        .map(|suite| {
            let started = Instant::now();
            let mut cmd = Command::new(&python);
            cmd.arg(suite)
                .args(args)
                .current_dir(root())
                .env("MET_BASE_URL", format!("http://127.0.0.1:{port}"))
                .env("MET_API_KEY", &key)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONUNBUFFERED", "1");
            eprintln!("xtask: {cmd:?}");
            let status = cmd.status().with_context(|| format!("starting {cmd:?}"));
            eprintln!("xtask: {suite} took {:.1} s", started.elapsed().as_secs_f64());
            status
        })
        .collect();
    // SIGTERM while a stream is running: it must still end normally before the exit.
    let in_flight = InFlight::start(port, &key);
    let shutdown = server.stop(SHUTDOWN_TIMEOUT);
    let drained = in_flight.and_then(InFlight::finish);

    let mut failures = Vec::new();
    for (suite, status) in SUITES.iter().zip(suites) {
        match status {
            Ok(status) if status.success() => {}
            // unittest's "no tests ran": a `-k` filter that picks none of this suite's tests.
            Ok(status) if !args.is_empty() && status.code() == Some(5) => {}
            Ok(status) => failures.push(format!("the live suite {suite} failed ({status})")),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    failures.extend(drained.err().map(|e| format!("draining on SIGTERM: {e:#}")));
    failures.extend(shutdown.err().map(|e| format!("{e:#}")));
    if !failures.is_empty() {
        server.print_log_tail();
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// A streaming completion of a fixed length, started before the server is told to stop.
struct InFlight {
    stream: TcpStream,
    received: Vec<u8>,
}

impl InFlight {
    const TOKENS: usize = 32;

    /// Sends the request and waits for its first event, so it is running.
    fn start(port: u16, key: &str) -> Result<Self> {
        let body = format!(
            r#"{{"prompt": "Once upon a time", "max_tokens": {}, "ignore_eos": true, "stream": true}}"#,
            Self::TOKENS
        );
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).context("connecting to met serve")?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        write!(
            stream,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut this = Self { stream, received: Vec::new() };
        while !String::from_utf8_lossy(&this.received).contains("data:") {
            if this.read()? == 0 {
                bail!("the stream ended before its first event: {}", String::from_utf8_lossy(&this.received));
            }
        }
        Ok(this)
    }

    fn read(&mut self) -> Result<usize> {
        let mut buf = [0u8; 4096];
        let n = self.stream.read(&mut buf).context("reading the stream")?;
        self.received.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    /// Reads the stream to its end: every token, a finish reason and `[DONE]`.
    fn finish(mut self) -> Result<()> {
        while self.read()? > 0 {}
        let text = String::from_utf8_lossy(&self.received);
        if !text.starts_with("HTTP/1.1 200")
            || !text.contains(r#""finish_reason":"length""#)
            || !text.contains("data: [DONE]")
        {
            bail!("the stream did not end with all {} tokens and [DONE]:\n{text}", Self::TOKENS);
        }
        Ok(())
    }
}

/// The virtualenv's Python, the suite's requirements installed.
fn virtualenv() -> Result<PathBuf> {
    let home = met_config::met_home().context("neither MET_HOME nor HOME is set")?;
    let venv = home.join("venv-live");
    let python = venv.join(if cfg!(windows) { "Scripts/python.exe" } else { "bin/python" });
    if !python.is_file() {
        create_virtualenv(&venv)?;
    }
    let requirements = std::fs::read(root().join(REQUIREMENTS)).with_context(|| format!("reading {REQUIREMENTS}"))?;
    let digest: String = Sha256::digest(&requirements).iter().map(|b| format!("{b:02x}")).collect();
    let stamp = venv.join("met-requirements.sha256");
    let installed = std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == digest)
        && quiet(Command::new(&python).args(["-c", "import anthropic, jsonschema, openai"]));
    if !installed {
        let mut pip = Command::new(&python);
        pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet", "-r"]).arg(REQUIREMENTS);
        eprintln!("xtask: {pip:?}");
        let status = pip.current_dir(root()).status().with_context(|| format!("starting {pip:?}"))?;
        if !status.success() {
            bail!("{pip:?} failed ({status}): is PyPI reachable?");
        }
        std::fs::write(&stamp, digest)?;
    }
    Ok(python)
}

fn create_virtualenv(venv: &Path) -> Result<()> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if !quiet(Command::new(&python).arg("--version")) {
        bail!("`{python}` not found: the live tests need Python 3 with venv and pip (or set PYTHON)");
    }
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "venv", "--clear"]).arg(venv);
    eprintln!("xtask: {cmd:?}");
    if !cmd.status().is_ok_and(|s| s.success()) {
        let _ = std::fs::remove_dir_all(venv);
        bail!(
            "`{python} -m venv` failed: the live tests need Python's venv module with pip \
             (Debian/Ubuntu: apt install python3-venv)"
        );
    }
    Ok(())
}

/// Whether `cmd` runs and succeeds, its output discarded.
fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A running `met serve`, killed when dropped unless it was stopped.
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(met: &Path, port: u16, key: &str, log: &Path) -> Result<Self> {
        std::fs::create_dir_all(log.parent().expect("has a parent"))?;
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(met);
        // Qwen3's reasoning parser only reads answers that open with `<think>`, which the
        // default model never writes unless a test's grammar makes it.
        // Exact CPU dots: the suites compare answers with transformers' text, which the
        // default int8 dots may leave at near-tied steps (`default_model_int8.rs`).
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--api-key", key])
            .args(["--reasoning-parser", "qwen3", "--quant-dots", "exact"])
            // Adapters for `test_lora.py`, which unloads each one it loads; with none loaded
            // every request runs as without the flag.
            .args(["--enable-lora", "--max-loras", "2"])
            .env("MET_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("MET_API_KEY")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        eprintln!("xtask: {cmd:?} (log: {})", log.display());
        let child = cmd.spawn().with_context(|| format!("starting {}", met.display()))?;
        Ok(Self { child, port, log: log.to_path_buf() })
    }

    /// Waits for `GET /health` to answer 200.
    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.print_log_tail();
                bail!("met serve exited during startup ({status})");
            }
            if health(self.port).is_some_and(|code| code == 200) {
                eprintln!("xtask: met serve ready after {:.1} s", started.elapsed().as_secs_f64());
                return Ok(());
            }
            if started.elapsed() > timeout {
                self.print_log_tail();
                bail!("met serve did not answer GET /health with 200 within {} s", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM, then the server must exit 0 within `timeout`.
    fn stop(&mut self, timeout: Duration) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("met serve died during the live suite ({status})");
        }
        terminate(&mut self.child)?;
        let started = Instant::now();
        let status: ExitStatus = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > timeout {
                bail!("met serve did not exit within {} s of SIGTERM", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        eprintln!("xtask: met serve exited {:.1} s after SIGTERM ({status})", started.elapsed().as_secs_f64());
        if !status.success() {
            bail!("met serve exited with {status} after SIGTERM, expected 0");
        }
        Ok(())
    }

    fn print_log_tail(&self) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        eprintln!("xtask: last {} lines of {}:", tail.len(), self.log.display());
        for line in tail {
            eprintln!("    {line}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends SIGTERM (`kill -TERM`; no libc needed). Elsewhere, kills outright.
fn terminate(child: &mut Child) -> Result<()> {
    if cfg!(unix) {
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().context("running kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed ({status})", child.id());
        }
        Ok(())
    } else {
        child.kill().context("stopping met serve")
    }
}

/// The status code of `GET /health`, or `None` when nothing answers yet.
fn health(port: u16) -> Option<u16> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
