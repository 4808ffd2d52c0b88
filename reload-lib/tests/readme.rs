//! The README's "reload-lib in ten lines" block is `examples/minimal.rs` (which CI compiles and
//! lints): this keeps the two from drifting apart.

use std::path::Path;

const SECTION: &str = "## reload-lib in ten lines";

/// The first ```rust block after the section heading.
fn readme_block(readme: &str) -> &str {
    let section = &readme[readme
        .find(SECTION)
        .unwrap_or_else(|| panic!("README.md has no {SECTION:?} section"))..];
    let start = section
        .find("```rust\n")
        .expect("the section has a ```rust block")
        + "```rust\n".len();
    let len = section[start..]
        .find("```\n")
        .expect("the ```rust block is closed");
    &section[start..start + len]
}

/// The example without its `//!` header and the blank line after it.
fn example_code(example: &str) -> &str {
    let header: usize = example
        .lines()
        .take_while(|line| line.starts_with("//!") || line.is_empty())
        .map(|line| line.len() + 1)
        .sum();
    &example[header..]
}

#[test]
fn the_readme_server_is_the_minimal_example_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).expect("read README.md");
    let example =
        std::fs::read_to_string(root.join("examples/minimal.rs")).expect("read minimal.rs");
    let (block, code) = (readme_block(&readme), example_code(&example));
    assert!(
        block == code,
        "README.md's {SECTION:?} block differs from reload-lib/examples/minimal.rs; \
         copy the example (without its //! header) into the README.\n--- README\n{block}\n--- example\n{code}"
    );
}
