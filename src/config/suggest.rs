//! "Did you mean": the known word closest to a mistyped one.
//!
//! Closeness is the Levenshtein distance (edits of one character: insert, delete,
//! replace; `strsim`). A word is suggested when it is at most [`max_distance`] edits
//! away, so a typo or a dropped suffix is caught and an unrelated word is not; of
//! several at the same distance the first listed wins.

/// Most edits for a word of `len` characters: 2, or a quarter of the word when longer.
pub fn max_distance(len: usize) -> usize {
    (len / 4).max(2)
}

/// The candidate closest to `word`, if close enough (never `word` itself).
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = max_distance(word.chars().count());
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `"; did you mean 'x'?"` for the closest candidate, or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(word, candidates)
        .map(|c| format!("; did you mean '{c}'?"))
        .unwrap_or_default()
}

/// Why `item` of a settings string, which has no `:`, is not `key:value`, with what
/// was probably meant: `key=value` written for `key:value`, or a key without its value.
pub fn not_key_value(item: &str, keys: &[&str]) -> String {
    let known = |k: &str| {
        keys.contains(&k)
            .then(|| k.to_string())
            .or_else(|| closest(k, keys.iter().copied()).map(str::to_string))
    };
    if let Some((key, value)) = item.split_once('=') {
        if let Some(k) = known(key) {
            return format!("'{item}' is not key:value; did you mean '{k}:{value}'?");
        }
    } else if keys.contains(&item) {
        return format!(
            "'{item}' is not key:value: the key '{item}' needs a value ('{item}:VALUE')"
        );
    }
    format!("'{item}' is not key:value")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 4] = [
        "max_split_size_mb",
        "expandable_segments",
        "garbage_collection_threshold",
        "hot_cache",
    ];

    #[test]
    fn suggests_typos_and_dropped_suffixes() {
        for (typo, want) in [
            ("max_split_size_md", "max_split_size_mb"),
            ("max_split_size", "max_split_size_mb"),
            ("expandable_segment", "expandable_segments"),
            ("Expandable_Segments", "expandable_segments"),
            ("garbage_colection_treshold", "garbage_collection_threshold"),
            ("hotcache", "hot_cache"),
        ] {
            assert_eq!(closest(typo, KEYS), Some(want), "{typo}");
        }
    }

    #[test]
    fn key_value_mistakes_say_what_was_meant() {
        assert_eq!(
            not_key_value("max_split_size_mb=128", &KEYS),
            "'max_split_size_mb=128' is not key:value; did you mean 'max_split_size_mb:128'?"
        );
        assert_eq!(
            not_key_value("max_split_size_md=128", &KEYS),
            "'max_split_size_md=128' is not key:value; did you mean 'max_split_size_mb:128'?"
        );
        assert!(not_key_value("hot_cache", &KEYS).contains("needs a value ('hot_cache:VALUE')"));
        assert_eq!(not_key_value("foo=1", &KEYS), "'foo=1' is not key:value");
        assert_eq!(not_key_value("128", &KEYS), "'128' is not key:value");
    }

    #[test]
    fn leaves_unrelated_words_and_exact_ones_alone() {
        for word in ["foo", "x", "", "expandable", "max_split_size_mb"] {
            assert_eq!(closest(word, KEYS), None, "{word}");
        }
        assert_eq!(did_you_mean("foo", KEYS), "");
        assert_eq!(
            did_you_mean("hot_cach", KEYS),
            "; did you mean 'hot_cache'?"
        );
    }
}
