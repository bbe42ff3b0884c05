//! The checked-in `include/npualloc.h` must equal what cbindgen generates now.
//! Regenerate with `NPUALLOC_UPDATE_HEADER=1 cargo test -p npualloc-ffi --test header`.

use std::path::PathBuf;

#[test]
fn header_is_up_to_date() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = crate_dir.join("../include/npualloc.h");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generation")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    if std::env::var_os("NPUALLOC_UPDATE_HEADER").is_some() {
        std::fs::write(&header, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/npualloc.h is stale: run NPUALLOC_UPDATE_HEADER=1 cargo test -p npualloc-ffi --test header"
    );
}
