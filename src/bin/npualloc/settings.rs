//! `--conf` values: an optional name, presets, validation before any replay.
//!
//! `--conf NAME=SETTINGS` names a column; `pytorch` (alone or leading a list) stands
//! for PyTorch's exact policy, `torch_npu` for torch_npu 2.14's; the empty string is
//! the defaults. A setting without a name is labelled by its text when that is short, else `conf N` with a legend.

use npualloc::config::{suggest, KEYS, PYTORCH_POLICY, TORCH_NPU_POLICY};
use npualloc::Config;

/// Longest settings text used as its own column label.
const MAX_LABEL: usize = 24;

/// One `--conf`: the label of its column and the settings string the allocator gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Column label and file-name suffix.
    pub label: String,
    /// Settings in PyTorch syntax, presets expanded.
    pub conf: String,
    /// The text as given, for the legend and for errors.
    pub given: String,
}

/// The presets a settings string may start with.
pub const PRESETS: [&str; 2] = ["pytorch", "torch_npu"];

/// Expands a leading `pytorch` item of a settings string into PyTorch's policy.
pub fn expand(conf: &str) -> String {
    match conf.split_once(',') {
        _ if conf.trim() == "pytorch" => PYTORCH_POLICY.to_string(),
        Some((first, rest)) if first.trim() == "pytorch" => format!("{PYTORCH_POLICY},{rest}"),
        _ if conf.trim() == "torch_npu" => TORCH_NPU_POLICY.to_string(),
        Some((first, rest)) if first.trim() == "torch_npu" => format!("{TORCH_NPU_POLICY},{rest}"),
        _ => conf.to_string(),
    }
}

/// Parses every `--conf` (the defaults when there is none) and checks each settings
/// string, so a bad one is reported as such before anything runs.
pub fn parse_all(given: &[String]) -> Result<Vec<Setting>, String> {
    let defaults = [String::new()];
    let given = if given.is_empty() {
        &defaults[..]
    } else {
        given
    };
    let mut out: Vec<Setting> = Vec::with_capacity(given.len());
    for (i, g) in given.iter().enumerate() {
        let (name, text) = match g.split_once('=') {
            Some((name, text)) => (Some(name.trim()), text),
            None => (None, g.as_str()),
        };
        let conf = expand(text);
        Config::parse(&conf).map_err(|e| format!("--conf '{g}': {e}{}", hint(name, text)))?;
        let label = match name {
            Some("") => return Err(format!("--conf '{g}': empty name before '='")),
            Some(n) => n.to_string(),
            None if text.trim().is_empty() => "default".to_string(),
            None if text.len() <= MAX_LABEL => text.trim().to_string(),
            None => format!("conf {}", i + 1),
        };
        if out.iter().any(|s| s.label == label) {
            return Err(format!(
                "--conf '{g}': the label '{label}' is used twice; name the settings (--conf NAME=SETTINGS)"
            ));
        }
        out.push(Setting {
            label,
            conf,
            given: g.clone(),
        });
    }
    Ok(out)
}

/// What a refused `--conf` probably meant: a setting written `key=value` (which reads as
/// a column named `key`), or a mistyped preset.
fn hint(name: Option<&str>, text: &str) -> String {
    let first = text.split(',').next().unwrap_or("").trim();
    if first.contains(':') {
        return String::new();
    }
    if let Some(n) = name {
        let key = KEYS
            .contains(&n)
            .then_some(n)
            .or_else(|| suggest::closest(n, KEYS));
        if let Some(key) = key {
            return format!(
                " (NAME=SETTINGS names a column: '{n}' became a column name and '{text}' its \
                 settings); did you mean --conf {key}:{text}?"
            );
        }
    }
    suggest::closest(first, PRESETS)
        .map(|p| format!("; did you mean the preset '{p}'?"))
        .unwrap_or_default()
}

/// Lines explaining labels that are not the settings text itself.
pub fn legend(settings: &[Setting]) -> Vec<String> {
    settings
        .iter()
        .filter(|s| s.label != s.given.trim() && s.label != "default")
        .map(|s| {
            let text = s.given.split_once('=').map_or(s.given.as_str(), |(_, t)| t);
            format!(
                "  {} = {}",
                s.label,
                if text.is_empty() { "(defaults)" } else { text }
            )
        })
        .collect()
}

/// `label` made safe for a file name: letters, digits, `-`, `_` and `.` kept, runs of
/// anything else become one `_`.
pub fn file_part(label: &str) -> String {
    let mut out = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn torch_npu_expands_to_its_preset() {
        assert_eq!(expand("torch_npu"), TORCH_NPU_POLICY);
        assert_eq!(
            expand("torch_npu,expandable_segments:True"),
            format!("{TORCH_NPU_POLICY},expandable_segments:True")
        );
        let s = parse_all(&given(&["torch_npu"])).unwrap();
        assert_eq!(
            (s[0].label.as_str(), s[0].conf.as_str()),
            ("torch_npu", TORCH_NPU_POLICY)
        );
    }

    #[test]
    fn labels_names_presets_and_defaults() {
        let s = parse_all(&given(&[
            "",
            "pytorch",
            "mine=max_split_size_mb:128,garbage_collection_threshold:0.8",
            "pytorch,expandable_segments:True",
        ]))
        .unwrap();
        let labels: Vec<_> = s.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["default", "pytorch", "mine", "conf 4"]);
        assert_eq!(s[1].conf, PYTORCH_POLICY);
        assert_eq!(
            s[2].conf,
            "max_split_size_mb:128,garbage_collection_threshold:0.8"
        );
        assert!(
            s[3].conf.starts_with(PYTORCH_POLICY)
                && s[3].conf.ends_with(",expandable_segments:True")
        );
        let legend = legend(&s);
        assert_eq!(legend.len(), 2, "{legend:?}");
        assert!(legend[0].starts_with("  mine = max_split_size_mb:128"));
        assert_eq!(legend[1], "  conf 4 = pytorch,expandable_segments:True");
        assert_eq!(parse_all(&[]).unwrap()[0].label, "default");
    }

    #[test]
    fn bad_settings_are_reported_as_settings() {
        let e = parse_all(&given(&["", "max_split_size_mb:abc"])).unwrap_err();
        assert!(e.starts_with("--conf 'max_split_size_mb:abc': "), "{e}");
        let e = parse_all(&given(&["=expandable_segments:True"])).unwrap_err();
        assert!(e.contains("empty name"), "{e}");
        let e = parse_all(&given(&["a=", "a=pytorch"])).unwrap_err();
        assert!(e.contains("label 'a' is used twice"), "{e}");
    }

    #[test]
    fn settings_written_as_names_and_mistyped_presets_get_a_suggestion() {
        let e = parse_all(&given(&["max_split_size_mb=128"])).unwrap_err();
        assert!(
            e.contains("NAME=SETTINGS names a column")
                && e.ends_with("did you mean --conf max_split_size_mb:128?"),
            "{e}"
        );
        let e = parse_all(&given(&["expandable_segment=True"])).unwrap_err();
        assert!(
            e.ends_with("did you mean --conf expandable_segments:True?"),
            "{e}"
        );
        let e = parse_all(&given(&["pytorh"])).unwrap_err();
        assert!(e.ends_with("did you mean the preset 'pytorch'?"), "{e}");
        let e = parse_all(&given(&["mine=torchnpu,hot_cache:False"])).unwrap_err();
        assert!(e.ends_with("did you mean the preset 'torch_npu'?"), "{e}");
        // A real name before valid settings stays a name.
        let s = parse_all(&given(&["max_split_size_mb=max_split_size_mb:128"])).unwrap();
        assert_eq!(s[0].label, "max_split_size_mb");
    }

    #[test]
    fn file_parts_are_plain() {
        assert_eq!(
            file_part("expandable_segments:True"),
            "expandable_segments_True"
        );
        assert_eq!(file_part("conf 4"), "conf_4");
        assert_eq!(file_part("a/../b"), "a_.._b");
    }
}
