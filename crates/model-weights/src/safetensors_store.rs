//! Hugging Face safetensors checkpoints, memory-mapped: one file or a sharded index.
//!
//! Each shard is mapped once and its JSON header parsed once at open; the store keeps the
//! maps next to a name → (shard, dtype, shape, byte range) table and slices the maps
//! itself, so no struct borrows from another. [`WeightStore::host`] hands out those slices
//! without copying.
//!
//! Invariants, checked at open so that later reads cannot fail on the file: every byte
//! range lies inside its shard, ranges tile the data section (the `safetensors` crate's
//! validation), and a loadable tensor's range is exactly `elements × dtype size` bytes.
//! Tensors in other dtypes (I64, U8, F64, F8, ...) are listed by [`WeightStore::names`],
//! have no [`WeightStore::info`], and fail in [`WeightStore::host`] with an error naming
//! them, so a checkpoint that merely carries one unused is still usable.
//!
//! Layout follows transformers' `from_pretrained`: `model.safetensors`, else
//! `model.safetensors.index.json` whose `weight_map` sends each name to a shard file.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::fmt;
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use met_kernels::{DType, HostTensor};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};
use serde::Deserialize;

use crate::{TensorInfo, WeightError, WeightStore};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Bytes of the little-endian header length that opens every file.
const LEN_BYTES: usize = 8;

/// A safetensors checkpoint, memory-mapped.
pub struct SafetensorsStore {
    /// The file opened, or the index file of a sharded checkpoint.
    source: PathBuf,
    sharded: bool,
    shards: Vec<Shard>,
    /// Every tensor of every shard, by name.
    tensors: BTreeMap<String, Stored>,
}

/// One mapped file.
struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Where one tensor's bytes are and how to read them.
#[derive(Debug, Clone)]
struct Stored {
    shard: usize,
    /// The element type, or the file's name for one met cannot load.
    dtype: Result<DType, String>,
    shape: Vec<usize>,
    /// Byte range within the shard's whole file (header included).
    range: Range<usize>,
}

/// What a path resolved to.
enum Layout {
    Single(PathBuf),
    Sharded(PathBuf),
}

impl SafetensorsStore {
    /// Opens a checkpoint: a directory with `model.safetensors`, or with
    /// `model.safetensors.index.json` + shards, or a directory with exactly one other
    /// `*.safetensors` file (or exactly one other `*.safetensors.index.json`), or a path
    /// to a `.safetensors` file or to an `.index.json` file.
    ///
    /// # Errors
    /// [`WeightError::Io`] when a file cannot be read or mapped,
    /// [`WeightError::NoCheckpoint`] when a directory holds nothing to open,
    /// [`WeightError::Format`] for a malformed file, [`WeightError::Index`] for a bad index
    /// or missing shard. Every error names the file at fault.
    pub fn open(path: &Path) -> Result<Self, WeightError> {
        match resolve(path)? {
            Layout::Single(file) => {
                let (shard, tensors) = open_shard(&file, 0)?;
                Ok(Self { source: file, sharded: false, shards: vec![shard], tensors })
            }
            Layout::Sharded(index) => open_sharded(&index),
        }
    }

    /// The shard files, in the order they were mapped.
    #[must_use]
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The mapped bytes of `name` when it is stored as `F8_E4M3`, one byte an element.
    fn float8_bytes(&self, name: &str) -> Option<&[u8]> {
        let stored = self.tensors.get(name)?;
        let bytes = &self.shards[stored.shard].map[stored.range.clone()];
        let fits = stored.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) == Some(bytes.len());
        (stored.dtype.as_ref().err()?.as_str() == "F8_E4M3" && fits).then_some(bytes)
    }
}

impl WeightStore for SafetensorsStore {
    fn describe(&self) -> String {
        if self.sharded {
            let dir = self.source.parent().unwrap_or(Path::new("."));
            format!("safetensors in {} ({} shards)", dir.display(), self.shards.len())
        } else {
            format!("safetensors file {}", self.source.display())
        }
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let stored = self.tensors.get(name)?;
        let dtype = stored.dtype.clone().ok()?;
        Some(TensorInfo { name: name.to_string(), dtype, shape: stored.shape.clone() })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let stored = self
            .tensors
            .get(name)
            .ok_or_else(|| WeightError::Missing { name: name.to_string(), store: self.describe() })?;
        let dtype =
            stored.dtype.clone().map_err(|dtype| WeightError::UnsupportedDtype { name: name.to_string(), dtype })?;
        let bytes = &self.shards[stored.shard].map[stored.range.clone()];
        Ok(HostTensor::from_bytes(dtype, &stored.shape, Cow::Borrowed(bytes))?)
    }

    fn float8_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.float8_bytes(name).map(|_| self.tensors[name].shape.clone())
    }

    fn float8(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.float8_bytes(name).map(Cow::Borrowed)
    }
}

impl fmt::Debug for SafetensorsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SafetensorsStore({}, {} tensors)", self.describe(), self.tensors.len())
    }
}

// --- finding the files --------------------------------------------------------------------

/// Decides which file(s) `path` means.
fn resolve(path: &Path) -> Result<Layout, WeightError> {
    let meta = fs::metadata(path).map_err(io_error(path))?;
    if !meta.is_dir() {
        let is_index = path.to_string_lossy().ends_with(".index.json");
        return Ok(if is_index { Layout::Sharded(path.into()) } else { Layout::Single(path.into()) });
    }
    if path.join(SINGLE_FILE).is_file() {
        return Ok(Layout::Single(path.join(SINGLE_FILE)));
    }
    if path.join(INDEX_FILE).is_file() {
        return Ok(Layout::Sharded(path.join(INDEX_FILE)));
    }
    let indexes = files_ending_with(path, ".safetensors.index.json")?;
    if let [index] = &indexes[..] {
        return Ok(Layout::Sharded(index.clone()));
    }
    let files = files_ending_with(path, ".safetensors")?;
    match (&files[..], indexes.len()) {
        ([file], 0) => Ok(Layout::Single(file.clone())),
        (_, 0) => Err(WeightError::NoCheckpoint {
            path: path.into(),
            msg: format!(
                "expected {SINGLE_FILE}, {INDEX_FILE}, or exactly one *.safetensors file; \
                 found {} *.safetensors files",
                files.len()
            ),
        }),
        _ => Err(WeightError::NoCheckpoint {
            path: path.into(),
            msg: format!("found {} *.safetensors.index.json files; pass one", indexes.len()),
        }),
    }
}

/// The regular files in `dir` whose names end with `suffix`, sorted.
fn files_ending_with(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>, WeightError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.is_file() && path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

// --- sharded checkpoints ------------------------------------------------------------------

/// The part of `model.safetensors.index.json` that matters here.
#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

/// Opens every shard an index names and checks the index against their headers.
///
/// Tensors a shard holds but the index does not mention are kept (preflight will call them
/// unexpected) unless two shards both hold one; a mentioned tensor is read from the shard
/// the index names, which must hold it.
fn open_sharded(index: &Path) -> Result<SafetensorsStore, WeightError> {
    let bad_index = |msg: String| WeightError::Index { path: index.into(), msg };
    let text = fs::read_to_string(index).map_err(io_error(index))?;
    let parsed: IndexFile =
        serde_json::from_str(&text).map_err(|e| bad_index(format!("not a safetensors index: {e}")))?;
    let map = parsed.weight_map;
    let mut files: Vec<&String> = map.values().collect();
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(bad_index("the weight_map is empty".into()));
    }

    let dir = index.parent().unwrap_or(Path::new("."));
    let mut shards = Vec::with_capacity(files.len());
    let mut tensors: BTreeMap<String, Stored> = BTreeMap::new();
    for (i, file) in files.iter().enumerate() {
        let path = dir.join(file);
        if !path.is_file() {
            return Err(bad_index(format!("shard {} does not exist", path.display())));
        }
        let (shard, found) = open_shard(&path, i)?;
        for (name, stored) in found {
            if map.get(&name).is_some_and(|owner| owner != *file) {
                continue;
            }
            match tensors.entry(name) {
                MapEntry::Vacant(slot) => {
                    slot.insert(stored);
                }
                MapEntry::Occupied(slot) => {
                    let other = &shards[slot.get().shard];
                    return Err(bad_index(format!(
                        "`{}` is in both {} and {}, and the index names neither",
                        slot.key(),
                        Shard::display(other),
                        path.display()
                    )));
                }
            }
        }
        shards.push(shard);
    }
    for (name, file) in &map {
        if !tensors.contains_key(name) {
            return Err(bad_index(format!("`{name}` is mapped to {file}, which does not hold it")));
        }
    }
    Ok(SafetensorsStore { source: index.into(), sharded: true, shards, tensors })
}

// --- one file -----------------------------------------------------------------------------

impl Shard {
    fn display(&self) -> String {
        self.path.display().to_string()
    }
}

/// Maps one file and reads its header; `index` is the shard number recorded per tensor.
fn open_shard(path: &Path, index: usize) -> Result<(Shard, BTreeMap<String, Stored>), WeightError> {
    let file = File::open(path).map_err(io_error(path))?;
    let len = file.metadata().map_err(io_error(path))?.len();
    if len < LEN_BYTES as u64 {
        return Err(format_error(path, format!("the file is {len} bytes, too short for the 8-byte header length")));
    }
    // SAFETY: the map is read-only and lives as long as the store. Like every mmap-based
    // loader, this assumes nobody truncates or rewrites checkpoint files while they are
    // being served; such a change is outside what a process can guard against.
    let map = unsafe { Mmap::map(&file) }.map_err(io_error(path))?;
    let tensors = parse_header(path, &map, index)?;
    Ok((Shard { path: path.into(), map }, tensors))
}

/// Parses and validates the header of a whole safetensors file held in `bytes`.
fn parse_header(path: &Path, bytes: &[u8], shard: usize) -> Result<BTreeMap<String, Stored>, WeightError> {
    let Some((len, rest)) = bytes.split_first_chunk::<LEN_BYTES>() else {
        return Err(format_error(path, "the file is too short for the 8-byte header length".into()));
    };
    let header_len = u64::from_le_bytes(*len);
    let room = rest.len() as u64;
    if header_len > room {
        return Err(format_error(
            path,
            format!("the header length {header_len} runs past the end of the file ({room} bytes follow it)"),
        ));
    }
    let (header_len, meta) = SafeTensors::read_metadata(bytes).map_err(|e| format_error(path, explain(e)))?;
    let data_start = LEN_BYTES + header_len;

    let mut tensors = BTreeMap::new();
    for (name, info) in meta.tensors() {
        let (start, end) = info.data_offsets;
        let range = data_start.saturating_add(start)..data_start.saturating_add(end);
        if range.start > range.end || range.end > bytes.len() {
            return Err(format_error(path, format!("the data of `{name}` runs past the end of the file")));
        }
        let dtype = to_dtype(info.dtype);
        if let Ok(dtype) = dtype {
            let want = info.shape.iter().try_fold(dtype.size_in_bytes(), |n, &d| n.checked_mul(d));
            if want != Some(range.len()) {
                return Err(format_error(
                    path,
                    format!("`{name}` has {} bytes for a {dtype} tensor of shape {:?}", range.len(), info.shape),
                ));
            }
        }
        tensors.insert(name, Stored { shard, dtype, shape: info.shape.clone(), range });
    }
    Ok(tensors)
}

/// The met element type of a stored one, or the stored name when met cannot load it.
fn to_dtype(dtype: Dtype) -> Result<DType, String> {
    match dtype {
        Dtype::F32 => Ok(DType::F32),
        Dtype::F16 => Ok(DType::F16),
        Dtype::BF16 => Ok(DType::BF16),
        other => Err(other.to_string()),
    }
}

/// A header error from the `safetensors` crate, in words that point at the cause.
fn explain(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            "the tensor data does not end where the file ends (truncated, or trailing bytes)".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("`{name}` has data offsets that overlap, leave a gap, or run backwards")
        }
        SafeTensorError::TensorInvalidInfo => "a tensor's byte range does not match its shape and dtype".into(),
        SafeTensorError::HeaderTooLarge => "the header is larger than 100 MB".into(),
        other => other.to_string(),
    }
}

fn format_error(path: &Path, msg: String) -> WeightError {
    WeightError::Format { path: path.into(), msg }
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> WeightError + '_ {
    move |source| WeightError::Io { path: path.into(), source }
}
