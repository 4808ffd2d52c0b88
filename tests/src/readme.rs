//! The repository README's shell blocks, read the way a user reads them: the ```` ```sh ````
//! blocks of one section, in order, each with the title of the paragraph that leads to it and
//! its line in README.md. A test that runs them verbatim keeps a walkthrough from drifting away
//! from what works (`tests/kubelet_walkthrough.rs`).

use std::path::PathBuf;

/// One ```` ```sh ```` block of a README section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellBlock {
    /// The bold lead of the paragraph before the block (`**1. containerd**` gives `1.
    /// containerd`), empty when that paragraph has none.
    pub title: String,
    /// The block's text, exactly as in the README (every line ends with `\n`).
    pub text: String,
    /// The README line of the block's first line (1-based).
    pub first_line: usize,
}

impl ShellBlock {
    /// How a failure message names the block: its title and its README lines.
    pub fn describe(&self) -> String {
        let last = self.first_line + self.text.lines().count().saturating_sub(1);
        let title = if self.title.is_empty() {
            "(untitled)"
        } else {
            &self.title
        };
        format!("README.md:{}-{last} {title:?}", self.first_line)
    }
}

/// `README.md` at the workspace root.
pub fn path() -> PathBuf {
    crate::envtest::repo_root().join("README.md")
}

/// The ```` ```sh ```` blocks of the README section whose heading line is `heading` (e.g.
/// `## Run it on a node`), up to the next heading of level 2 or 3: a subsection is a
/// walkthrough of its own.
///
/// # Panics
/// When the README cannot be read, has no such heading, or leaves a block unclosed.
pub fn shell_blocks(heading: &str) -> Vec<ShellBlock> {
    let path = path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    shell_blocks_of(&text, heading)
}

/// [`shell_blocks`] of a README's text.
///
/// # Panics
/// When there is no such heading or a block is left unclosed.
pub fn shell_blocks_of(text: &str, heading: &str) -> Vec<ShellBlock> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|line| *line == heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?} heading"));
    let mut blocks = Vec::new();
    let mut lead = String::new();
    let mut paragraph_starts = true;
    let mut index = start + 1;
    while index < lines.len() {
        let line = lines[index];
        if line.starts_with("## ") || line.starts_with("### ") {
            break;
        }
        if let Some(fence) = line.strip_prefix("```") {
            let first_line = index + 2;
            let close = lines[index + 1..]
                .iter()
                .position(|l| l.starts_with("```"))
                .unwrap_or_else(|| panic!("README.md:{}: unclosed ``` block", index + 1));
            if fence == "sh" {
                let body = &lines[index + 1..index + 1 + close];
                blocks.push(ShellBlock {
                    title: std::mem::take(&mut lead),
                    text: body.iter().map(|l| format!("{l}\n")).collect(),
                    first_line,
                });
            }
            index += close + 2;
            paragraph_starts = true;
            continue;
        }
        if line.trim().is_empty() {
            paragraph_starts = true;
        } else if paragraph_starts {
            lead = bold_lead(line);
            paragraph_starts = false;
        }
        index += 1;
    }
    blocks
}

/// The text between a line's leading `**` and the next `**`, without a trailing `.` or `:`.
fn bold_lead(line: &str) -> String {
    line.strip_prefix("**")
        .and_then(|rest| rest.split_once("**"))
        .map(|(bold, _)| bold.trim_end_matches(['.', ':']).to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "# x\n\n## Run\n\nIntro\ntext.\n\n```sh\na=1\necho $a\n```\n\n\
        **1. First** step:\n\n```toml\nk = 1\n```\n\n```sh\nb\n```\n\n**It heals.** Yes.\n\n\
        ```sh\nc\n```\n\n### Three nodes\n\n```sh\nd\n```\n\n## Next\n\n```sh\ne\n```\n";

    #[test]
    fn the_section_blocks_come_with_their_titles_and_lines_up_to_a_subsection() {
        let blocks = shell_blocks_of(README, "## Run");
        let titles: Vec<&str> = blocks.iter().map(|b| b.title.as_str()).collect();
        assert_eq!(titles, ["", "1. First", "It heals"]);
        assert_eq!(blocks[0].text, "a=1\necho $a\n");
        assert_eq!(blocks[0].first_line, 9);
        assert_eq!(README.lines().nth(blocks[2].first_line - 1), Some("c"));
        assert_eq!(blocks[2].describe(), "README.md:26-26 \"It heals\"");
    }
}
