//! Drawing a lineage (`GET /channels/{type}/{id}/lineage`) as a tree in the terminal: one line
//! per channel under its parent, the status coloured, copied/total, truncation and deletion
//! marked, and the channel asked about highlighted.

use anstyle::{AnsiColor, Style};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

const ASKED: Style = Style::new().bold().underline();
const DIM: Style = Style::new().dimmed();

fn status_style(status: &str) -> Style {
    let colour = match status {
        "completed" => AnsiColor::Green,
        "backfilling" => AnsiColor::Yellow,
        "failed" => AnsiColor::Red,
        _ => AnsiColor::White,
    };
    Style::new().fg_color(Some(colour.into())).bold()
}

/// `text` in `style`, or as it is without colour.
fn paint(text: &str, style: Style, colour: bool) -> String {
    if colour {
        format!("{style}{text}{style:#}")
    } else {
        text.to_string()
    }
}

/// One node's line, without the tree's branches.
fn label(node: &Value, asked: &str, colour: bool) -> String {
    let cid = node["cid"].as_str().unwrap_or("?");
    let mut parts = Vec::new();
    let is_asked = cid == asked;
    parts.push(paint(cid, if is_asked { ASKED } else { Style::new() }, colour));
    let fork = &node["fork"];
    let readable = node["readable"].as_bool().unwrap_or(false);
    if readable {
        if let Some(name) = node["name"].as_str() {
            parts.push(format!("{name:?}"));
        }
    }
    match fork["status"].as_str() {
        Some(status) => {
            let mut s = paint(status, status_style(status), colour);
            if let Some(copied) = fork["copied_message_count"].as_i64() {
                let total = fork["total_message_count"].as_i64().map_or("?".to_string(), |t| t.to_string());
                s.push_str(&format!(" {copied}/{total}"));
            }
            parts.push(s);
        }
        None => parts.push(paint("root", DIM, colour)),
    }
    if fork["truncated"].as_bool() == Some(true) {
        parts.push(paint("truncated", status_style("backfilling"), colour));
    }
    if let Some(reason) = fork["failed_reason"].as_str() {
        parts.push(paint(&format!("({reason})"), status_style("failed"), colour));
    }
    if node["deleted"].as_bool() == Some(true) {
        parts.push(paint("deleted", status_style("failed"), colour));
    }
    if let Some(text) = fork["fork_point_text"].as_str() {
        let short: String = text.chars().take(40).collect();
        let more = if text.chars().count() > 40 { "…" } else { "" };
        parts.push(paint(&format!("at {:?}", format!("{short}{more}")), DIM, colour));
    }
    if !readable {
        parts.push(paint("(not readable)", DIM, colour));
    }
    if is_asked {
        parts.push(paint("◀", ASKED, colour));
    }
    parts.join("  ")
}

/// The tree of `lineage`, one line per node, children under their parent in the answer's
/// order (oldest first), `asked` highlighted; a last line says when the tree was cut.
pub fn draw(lineage: &Value, asked: &str, colour: bool) -> String {
    let nodes: Vec<&Value> = lineage["nodes"].as_array().map(|n| n.iter().collect()).unwrap_or_default();
    let mut children: HashMap<&str, Vec<&Value>> = HashMap::new();
    for n in &nodes {
        if let Some(p) = n["parent_cid"].as_str() {
            children.entry(p).or_default().push(n);
        }
    }
    let mut out = String::new();
    // Roots: nodes without a parent in the answer (the root, and nothing else unless cut).
    let present: std::collections::HashSet<&str> = nodes.iter().filter_map(|n| n["cid"].as_str()).collect();
    for root in nodes.iter().filter(|n| n["parent_cid"].as_str().is_none_or(|p| !present.contains(p))) {
        let _ = writeln!(out, "{}", label(root, asked, colour));
        branch(&mut out, root, &children, "", asked, colour);
    }
    if lineage["truncated_tree"].as_bool() == Some(true) {
        let _ = writeln!(out, "{}", paint(&format!("… the tree has more than {} nodes; deeper ones not shown", nodes.len()), DIM, colour));
    }
    out
}

fn branch(out: &mut String, node: &Value, children: &HashMap<&str, Vec<&Value>>, prefix: &str, asked: &str, colour: bool) {
    let Some(kids) = node["cid"].as_str().and_then(|c| children.get(c)) else { return };
    for (i, kid) in kids.iter().enumerate() {
        let last = i + 1 == kids.len();
        let _ = writeln!(out, "{prefix}{}{}", if last { "└── " } else { "├── " }, label(kid, asked, colour));
        let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
        branch(out, kid, children, &deeper, asked, colour);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fork(status: &str, copied: i64, total: i64) -> Value {
        json!({"status": status, "copied_message_count": copied, "total_message_count": total, "truncated": false, "fork_point_text": "hi"})
    }

    #[test]
    fn a_tree_draws_children_under_their_parents_and_marks_the_asked_node() {
        let lineage = json!({"truncated_tree": false, "nodes": [
            {"cid": "agent:r", "parent_cid": null, "depth": 0, "readable": true, "name": "root", "fork": null, "deleted": false},
            {"cid": "agent:a", "parent_cid": "agent:r", "depth": 1, "readable": true, "fork": fork("completed", 3, 3), "deleted": false},
            {"cid": "agent:b", "parent_cid": "agent:r", "depth": 1, "readable": false, "fork": {"status": "backfilling"}},
            {"cid": "agent:c", "parent_cid": "agent:a", "depth": 2, "readable": true, "fork": fork("failed", 1, 9), "deleted": true},
        ]});
        let drawn = draw(&lineage, "agent:a", false);
        assert_eq!(
            drawn,
            "agent:r  \"root\"  root\n\
             ├── agent:a  completed 3/3  at \"hi\"  ◀\n\
             │   └── agent:c  failed 1/9  deleted  at \"hi\"\n\
             └── agent:b  backfilling  (not readable)\n"
        );
        let coloured = draw(&lineage, "agent:a", true);
        assert!(coloured.contains("\u{1b}["), "colour uses ANSI escapes");
        assert!(!drawn.contains('\u{1b}'), "no colour, no escapes");
    }

    #[test]
    fn a_cut_tree_says_so() {
        let lineage =
            json!({"truncated_tree": true, "nodes": [{"cid": "agent:r", "parent_cid": null, "depth": 0, "readable": true, "fork": null}]});
        assert!(draw(&lineage, "agent:x", false).ends_with("… the tree has more than 1 nodes; deeper ones not shown\n"));
    }
}
