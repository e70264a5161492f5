//! Checking a store against a model before any weight is uploaded.
//!
//! A checkpoint that does not fit its config should fail at startup with one message
//! naming every problem, not one at a time across restarts. [`preflight`] compares names
//! and shapes only; it never reads tensor data.
//!
//! `ignored` patterns: a pattern matches a whole tensor name, where `*` stands for any run
//! of characters (dots included) and every other character is literal. So
//! `lm_head.weight` ignores exactly that tensor, `*.rotary_emb.inv_freq` ignores it in
//! every layer, and `model.vision_tower.*` a whole sub-tree. Ignoring only silences
//! *unexpected* tensors: an expected tensor is always checked.

use std::collections::{BTreeSet, HashSet};

use crate::{PreflightReport, TensorSpec, WeightError, WeightStore};

/// Checks a store against what a model expects, reporting *every* missing, unexpected and
/// mis-shaped tensor in one error. `ignored` names tensors that may be present and are
/// not used (e.g. `lm_head.weight` in a tied checkpoint,
/// `model.layers.0.self_attn.rotary_emb.inv_freq`); each is a pattern in which `*` matches
/// any run of characters (see [`is_ignored`]).
///
/// # Errors
/// [`WeightError::Preflight`] with the full report when anything is missing, unexpected,
/// mis-shaped, or stored in a dtype that cannot be loaded.
pub fn preflight(store: &dyn WeightStore, expected: &[TensorSpec], ignored: &[&str]) -> Result<(), WeightError> {
    let present: BTreeSet<String> = store.names().into_iter().collect();
    let wanted: HashSet<&str> = expected.iter().map(|s| s.name.as_str()).collect();
    let mut report = PreflightReport { store: store.describe(), ..PreflightReport::default() };

    for spec in expected {
        if !present.contains(&spec.name) {
            report.missing.push(spec.clone());
            continue;
        }
        match store.info(&spec.name) {
            Some(info) if info.shape != spec.shape => {
                report.misshaped.push((spec.name.clone(), spec.shape.clone(), info.shape));
            }
            Some(_) => {}
            None => report.unloadable.push((spec.name.clone(), unloadable_reason(store, spec))),
        }
    }
    report.unexpected =
        present.into_iter().filter(|name| !wanted.contains(name.as_str()) && !is_ignored(name, ignored)).collect();

    report.missing.sort_by(|a, b| a.name.cmp(&b.name));
    report.misshaped.sort();
    report.unloadable.sort();
    if report.is_clean() { Ok(()) } else { Err(WeightError::Preflight(report)) }
}

/// Why a listed tensor without [`crate::TensorInfo`] cannot be loaded. Asking the store
/// for it is cheap: a store refuses such a tensor before touching its data.
fn unloadable_reason(store: &dyn WeightStore, spec: &TensorSpec) -> String {
    match store.host(&spec.name) {
        Err(e) => e.to_string(),
        Ok(_) => "the store lists it without a dtype and shape".into(),
    }
}

/// Whether `name` matches any of the `patterns`, where `*` in a pattern matches any run
/// of characters and everything else matches itself.
#[must_use]
pub fn is_ignored(name: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| glob_match(p.as_bytes(), name.as_bytes()))
}

/// Wildcard matching with `*` only, by the classic backtrack-to-last-star loop: linear
/// in practice, and never exponential.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_literals_and_stars() {
        assert!(is_ignored("lm_head.weight", &["lm_head.weight"]));
        assert!(!is_ignored("lm_head.weight.x", &["lm_head.weight"]));
        assert!(!is_ignored("model.lm_head.weight", &["lm_head.weight"]));
        let rotary = "*.rotary_emb.inv_freq";
        assert!(is_ignored("model.layers.12.self_attn.rotary_emb.inv_freq", &[rotary]));
        assert!(!is_ignored("model.layers.12.self_attn.rotary_emb.cos", &[rotary]));
        assert!(is_ignored("model.vision.a.b", &["model.vision.*"]));
        assert!(is_ignored("a.b.c", &["a*c"]));
        assert!(is_ignored("abc", &["*"]));
        assert!(is_ignored("", &["*"]));
        assert!(!is_ignored("ab", &["a*b*c"]));
        assert!(is_ignored("axbxc", &["a*b*c", "zzz"]));
        assert!(!is_ignored("anything", &[]));
    }
}
