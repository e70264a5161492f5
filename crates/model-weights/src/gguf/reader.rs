//! Parsing a GGUF file: header, metadata, tensor infos, and the data section's layout.
//!
//! Layout (GGUF v2/v3, little-endian, as in ggml's `docs/gguf.md`): the magic `GGUF`, a
//! u32 version, u64 tensor and metadata counts, the metadata entries (u64-length string
//! key, u32 value type, value), the tensor infos (name, u32 dim count, u64 dims innermost
//! first, u32 ggml type, u64 offset into the data section), padding to
//! `general.alignment` (default 32), then the tensor data.
//!
//! Invariants, all checked at open so that later reads are plain slices: every length is
//! checked against the bytes that remain *before* anything is allocated from it (a count
//! of `n` entries needs at least `n × (smallest entry)` bytes), arrays nest at most
//! [`MAX_DEPTH`] deep, metadata keys and tensor names are unique valid UTF-8, element
//! counts do not overflow, a quantised tensor's rows are whole blocks, and every
//! tensor's bytes are aligned, inside the file and disjoint from every other tensor's.
//! Parsing never panics: any input is a file or a [`WeightError`] naming it.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{GgmlType, GgufValue};
use crate::WeightError;

const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// How deep arrays of arrays may nest; deeper is rejected rather than recursed into.
const MAX_DEPTH: usize = 8;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: usize = 4;
/// The fewest bytes a metadata entry takes: key length, value type, a one-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// The fewest bytes a tensor info takes: name length, dim count, type, offset.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;
/// Elements reserved up front for an array, however long it claims to be.
const MAX_PREALLOC: usize = 1 << 16;

/// One tensor as the file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: innermost (contiguous) first, the reverse of a PyTorch shape.
    pub dims: Vec<usize>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
    /// Absolute byte range within the file (validated at open).
    range: Range<usize>,
}

impl GgufTensorInfo {
    /// Number of elements (1 for a tensor without dimensions).
    #[must_use]
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Number of bytes of data.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.range.len()
    }

    /// The shape outermost first (Hugging Face / PyTorch order).
    #[must_use]
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: usize,
    data_start: usize,
}

impl GgufFile {
    /// Maps and parses a GGUF file (versions 2 and 3).
    ///
    /// # Errors
    /// [`WeightError::Io`] when the file cannot be read or mapped; [`WeightError::Format`]
    /// naming the file (and the key or tensor at fault) for a wrong magic, an unsupported
    /// version, a truncated or corrupt header, an unknown value or ggml type, or tensor
    /// data outside the file.
    pub fn open(path: &Path) -> Result<Self, WeightError> {
        let io = |source| WeightError::Io { path: path.into(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < MAGIC.len() as u64 {
            return Err(format_error(path, format!("the file is {len} bytes, too short to be a GGUF file")));
        }
        // SAFETY: the map is read-only and lives as long as the `GgufFile`. Like every
        // mmap-based loader, this assumes nobody truncates or rewrites model files while
        // they are being served; such a change is outside what a process can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = parse(&map).map_err(|msg| format_error(path, msg))?;
        let by_name = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Self {
            path: path.into(),
            map,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    #[must_use]
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata entry, by key.
    #[must_use]
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The metadata value of `key`, if present.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensors, in file order.
    #[must_use]
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor called `name` (GGUF name), if present.
    #[must_use]
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of the tensor called `name` (GGUF name), borrowed from the map.
    #[must_use]
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| &self.map[t.range.clone()])
    }

    /// The bytes of tensor number `index` (file order).
    ///
    /// # Panics
    /// If `index` is out of range.
    pub(crate) fn data_at(&self, index: usize) -> &[u8] {
        &self.map[self.tensors[index].range.clone()]
    }

    /// Alignment of the data section and of each tensor (`general.alignment`, default 32).
    #[must_use]
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section from the start of the file.
    #[must_use]
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// `general.architecture`.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when the key is absent or not a string.
    pub fn architecture(&self) -> Result<&str, WeightError> {
        self.get_str("general.architecture")
    }

    /// The unsigned integer at `key` (any integer type holding a non-negative value).
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key when it is absent or not such a value.
    pub fn get_u64(&self, key: &str) -> Result<u64, WeightError> {
        self.typed(key, "an unsigned integer", GgufValue::as_u64)
    }

    /// The number at `key` (a float, or an integer converted).
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key when it is absent or not a number.
    pub fn get_f64(&self, key: &str) -> Result<f64, WeightError> {
        self.typed(key, "a number", GgufValue::as_f64)
    }

    /// The string at `key`.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key when it is absent or not a string.
    pub fn get_str(&self, key: &str) -> Result<&str, WeightError> {
        self.typed(key, "a string", GgufValue::as_str)
    }

    /// The bool at `key`.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key when it is absent or not a bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, WeightError> {
        self.typed(key, "a bool", GgufValue::as_bool)
    }

    /// The array at `key`.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key when it is absent or not an array.
    pub fn get_array(&self, key: &str) -> Result<&[GgufValue], WeightError> {
        self.typed(key, "an array", GgufValue::as_array)
    }

    /// The unsigned integer at `key`, or `None` when the key is absent.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when the key is present with another kind of value.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, WeightError> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    /// The number at `key`, or `None` when the key is absent.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when the key is present with another kind of value.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, WeightError> {
        self.get(key).map(|_| self.get_f64(key)).transpose()
    }

    /// The string at `key`, or `None` when the key is absent.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when the key is present with another kind of value.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, WeightError> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    /// A [`WeightError::Metadata`] about `key` of this file.
    #[must_use]
    pub fn metadata_error(&self, key: &str, msg: impl Into<String>) -> WeightError {
        WeightError::Metadata { path: self.path.clone(), key: key.into(), msg: msg.into() }
    }

    fn typed<'a, T>(&'a self, key: &str, kind: &str, f: impl Fn(&'a GgufValue) -> Option<T>) -> Result<T, WeightError> {
        let value = self.get(key).ok_or_else(|| self.metadata_error(key, "missing"))?;
        f(value)
            .ok_or_else(|| self.metadata_error(key, format!("expected {kind}, found {} {value}", value.type_name())))
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GgufFile({}, v{}, {} metadata keys, {} tensors)",
            self.path.display(),
            self.version,
            self.metadata.len(),
            self.tensors.len()
        )
    }
}

// --- parsing ------------------------------------------------------------------------------

/// What [`parse`] finds in a whole file.
struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: usize,
    data_start: usize,
}

/// Parses and validates a whole GGUF file held in `bytes`; errors are messages for
/// [`WeightError::Format`].
fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.take(4).map_err(|e| format!("magic: {e}"))?;
    if magic != MAGIC {
        return Err(format!("not a GGUF file: it starts with {magic:?}, not {:?}", MAGIC));
    }
    let version = read_version(&mut c)?;
    let tensor_count = c.count(MIN_TENSOR_INFO_BYTES).map_err(|e| format!("tensor count: {e}"))?;
    let kv_count = c.count(MIN_KV_BYTES).map_err(|e| format!("metadata count: {e}"))?;
    let metadata = read_metadata(&mut c, kv_count)?;
    let alignment = read_alignment(&metadata)?;
    let mut tensors = Vec::with_capacity(tensor_count.min(MAX_PREALLOC));
    for i in 0..tensor_count {
        tensors.push(read_tensor_info(&mut c, i)?);
    }
    let data_start = c.pos.checked_next_multiple_of(alignment).ok_or("the data section starts past usize::MAX")?;
    locate_tensors(&mut tensors, data_start, alignment, bytes.len())?;
    Ok(Parsed { version, metadata, tensors, alignment, data_start })
}

fn read_version(c: &mut Cursor<'_>) -> Result<u32, String> {
    let version = c.u32().map_err(|e| format!("version: {e}"))?;
    match version {
        2 | 3 => Ok(version),
        1 => Err("GGUF version 1 is not supported (met reads versions 2 and 3); \
                  re-convert the model with a current llama.cpp"
            .into()),
        v if matches!(v.swap_bytes(), 2 | 3) => Err(format!(
            "this is a big-endian GGUF file (version {}); met reads little-endian files only",
            v.swap_bytes()
        )),
        v => Err(format!("unsupported GGUF version {v} (met reads versions 2 and 3)")),
    }
}

fn read_metadata(c: &mut Cursor<'_>, count: usize) -> Result<BTreeMap<String, GgufValue>, String> {
    let mut metadata = BTreeMap::new();
    for i in 0..count {
        let key = c.utf8_string().map_err(|e| format!("key of metadata entry {i}: {e}"))?;
        let value = c.u32().and_then(|t| c.value(t, 0)).map_err(|e| format!("metadata `{key}`: {e}"))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
    }
    Ok(metadata)
}

fn read_alignment(metadata: &BTreeMap<String, GgufValue>) -> Result<usize, String> {
    const KEY: &str = "general.alignment";
    let Some(value) = metadata.get(KEY) else { return Ok(DEFAULT_ALIGNMENT) };
    match value.as_u64().and_then(|a| usize::try_from(a).ok()) {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(format!("metadata `{KEY}`: {} {value} is not a power of two", value.type_name())),
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, i: usize) -> Result<GgufTensorInfo, String> {
    let name = c.utf8_string().map_err(|e| format!("name of tensor {i}: {e}"))?;
    let at = |e: String| format!("tensor `{name}`: {e}");
    let n_dims = c.u32().map_err(at)? as usize;
    if n_dims > MAX_DIMS {
        return Err(at(format!("{n_dims} dimensions (ggml allows at most {MAX_DIMS})")));
    }
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        let d = c.u64().map_err(at)?;
        dims.push(
            usize::try_from(d)
                .ok()
                .filter(|&d| i64::try_from(d).is_ok())
                .ok_or_else(|| at(format!("dimension {d} is too large")))?,
        );
    }
    let type_id = c.u32().map_err(at)?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| at(format!("unknown ggml type id {type_id}")))?;
    let offset = c.u64().map_err(at)?;
    let elements = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| at(format!("{dims:?} has too many elements")))?;
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(ggml_type.block_size()) {
        return Err(at(format!(
            "rows of {row} elements are not whole {ggml_type} blocks of {}",
            ggml_type.block_size()
        )));
    }
    let len = ggml_type.bytes_for(elements).ok_or_else(|| at(format!("{dims:?} is too large for {ggml_type}")))?;
    Ok(GgufTensorInfo { name, dims, ggml_type, offset, range: 0..len })
}

/// Turns each tensor's length (held in `range`) into its absolute byte range, checking
/// alignment and bounds, then checks names are unique and ranges disjoint.
fn locate_tensors(
    tensors: &mut [GgufTensorInfo],
    data_start: usize,
    alignment: usize,
    file_len: usize,
) -> Result<(), String> {
    for t in tensors.iter_mut() {
        t.range = place(t, data_start, alignment, file_len)?;
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("tensor `{}` appears twice", w[0]));
    }
    let mut order: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| !t.range.is_empty()).collect();
    order.sort_by_key(|t| t.range.start);
    match order.windows(2).find(|w| w[0].range.end > w[1].range.start) {
        Some(w) => Err(format!("the data of tensors `{}` and `{}` overlap", w[0].name, w[1].name)),
        None => Ok(()),
    }
}

/// The absolute byte range of `t`, whose `range` holds its length so far.
fn place(t: &GgufTensorInfo, data_start: usize, alignment: usize, file_len: usize) -> Result<Range<usize>, String> {
    let len = t.range.len();
    if !t.offset.is_multiple_of(alignment as u64) {
        return Err(format!("tensor `{}`: offset {} is not a multiple of the alignment {alignment}", t.name, t.offset));
    }
    let start = usize::try_from(t.offset).ok().and_then(|o| o.checked_add(data_start));
    match start.and_then(|s| Some(s..s.checked_add(len)?)) {
        Some(range) if range.end <= file_len => Ok(range),
        _ => Err(format!(
            "tensor `{}` ({len} bytes of {} at data offset {}) runs past the end of the file \
             ({file_len} bytes, data section from byte {data_start})",
            t.name, t.ggml_type, t.offset
        )),
    }
}

/// A bounds-checked little-endian reader; every read fails with a message instead of panicking.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!("truncated: {n} bytes needed at byte {}, {} left in the file", self.pos, self.left()));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// A u64 count of items of at least `min_bytes` each, checked against the bytes left.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.left() / min_bytes => Ok(n),
            _ => Err(format!(
                "truncated or corrupt: {n} items of at least {min_bytes} bytes cannot fit in the {} bytes left",
                self.left()
            )),
        }
    }

    fn bytes_of_string(&mut self) -> Result<&'a [u8], String> {
        let len = self.u64()?;
        match usize::try_from(len) {
            Ok(len) if len <= self.left() => self.take(len),
            _ => Err(format!(
                "truncated: a string of {len} bytes at byte {} runs past the end of the file ({} bytes left)",
                self.pos,
                self.left()
            )),
        }
    }

    fn utf8_string(&mut self) -> Result<String, String> {
        let raw = self.bytes_of_string()?;
        String::from_utf8(raw.to_vec()).map_err(|e| format!("not valid UTF-8: {e}"))
    }

    /// A value of GGUF value type `type_id`, arrays nesting `depth` deep so far.
    fn value(&mut self, type_id: u32, depth: usize) -> Result<GgufValue, String> {
        Ok(match type_id {
            0 => GgufValue::U8(u8::from_le_bytes(self.array()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()? {
                [0] => GgufValue::Bool(false),
                [1] => GgufValue::Bool(true),
                [b] => return Err(format!("bool byte {b} is neither 0 nor 1")),
            },
            8 => GgufValue::String(String::from_utf8_lossy(self.bytes_of_string()?).into_owned()),
            9 => GgufValue::Array(self.array_value(depth)?),
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown value type {other}")),
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<Vec<GgufValue>, String> {
        if depth >= MAX_DEPTH {
            return Err(format!("arrays nest more than {MAX_DEPTH} deep"));
        }
        let elem_type = self.u32()?;
        let min_bytes = min_value_bytes(elem_type).ok_or_else(|| format!("unknown array element type {elem_type}"))?;
        let n = self.count(min_bytes)?;
        let mut out = Vec::with_capacity(n.min(MAX_PREALLOC));
        for i in 0..n {
            out.push(self.value(elem_type, depth + 1).map_err(|e| format!("element {i}: {e}"))?);
        }
        Ok(out)
    }
}

/// The fewest bytes a value of type `type_id` takes, or `None` for an unknown type.
fn min_value_bytes(type_id: u32) -> Option<usize> {
    match type_id {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        8 | 10..=12 => Some(8),
        9 => Some(4 + 8),
        _ => None,
    }
}

fn format_error(path: &Path, msg: String) -> WeightError {
    WeightError::Format { path: path.into(), msg }
}
