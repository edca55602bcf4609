//! The lineage of a 1,000-node fork tree: `GET /channels/{type}/{id}/lineage` asked from one
//! of its deepest forks (the walk up to the root and the whole tree down), p50 and p95 over
//! 50 calls after 5 warm-up calls; goal p50 ≤ 30 ms on both engines.
//!
//! The tree is built through the API as a client would: a root with one message, forked ten
//! times; each fork gets a message of its own and is forked ten times, level after level,
//! until the tree holds [`NODES`] channels (1 + 10 + 100 + 889). Every fork copies a few
//! messages only, so each completes in its request and no backfill runs while measuring.

use crate::server::Api;
use crate::{goal, ms, percentile, Report};
use anyhow::{ensure, Result};
use serde_json::json;
use std::time::Duration;

/// Channels in the measured tree.
pub const NODES: usize = 1_000;
/// Forks of each channel that has forks.
const FAN_OUT: usize = 10;
/// Calls measured, after the warm-up calls.
const CALLS: usize = 50;
const WARM_UP: usize = 5;

/// Builds the tree (prefix `prefix`) and reports the lineage's p50 and p95.
pub async fn lineage_of_1000_nodes(api: &Api, prefix: &str, report: &mut Report) -> Result<()> {
    let root = format!("{prefix}-root");
    let owner = crate::seed::HUMANS[0];
    api.post(&format!("/channels/agent/{root}/query"), &json!({"data": {"created_by_id": owner, "members": [owner]}})).await?;
    let started = std::time::Instant::now();
    let mut level = vec![root.clone()];
    let mut created = 1;
    let mut deepest = root.clone();
    'levels: while created < NODES {
        let mut next = Vec::with_capacity(level.len() * FAN_OUT);
        for parent in &level {
            let point = format!("{parent}-point");
            api.post(
                &format!("/channels/agent/{parent}/message"),
                &json!({"message": {"id": point, "text": "fork here", "user_id": owner}}),
            )
            .await?;
            for i in 0..FAN_OUT {
                let child = format!("{parent}-{i}");
                let (resp, _) = api.fork(parent, &point, &child).await?;
                ensure!(resp["fork"]["status"] == "completed", "the fork into {child} should complete in its request: {}", resp["fork"]);
                deepest = child.clone();
                next.push(child);
                created += 1;
                if created == NODES {
                    break 'levels;
                }
            }
        }
        level = next;
    }
    let built = started.elapsed();
    let path = format!("/channels/agent/{deepest}/lineage");
    let mut sample: Vec<Duration> = Vec::with_capacity(CALLS);
    for i in 0..WARM_UP + CALLS {
        let (tree, took) = api.call(reqwest::Method::GET, &path, None).await?;
        let nodes = tree["nodes"].as_array().map(Vec::len).unwrap_or(0);
        ensure!(
            nodes == NODES && tree["truncated_tree"] == false,
            "the lineage holds {nodes} nodes, not {NODES}: truncated {}",
            tree["truncated_tree"]
        );
        ensure!(tree["root_cid"] == json!(format!("agent:{root}")), "the lineage's root is {}", tree["root_cid"]);
        if i >= WARM_UP {
            sample.push(took);
        }
    }
    let p50 = percentile(&sample, 50.0);
    report.add(format!(
        "lineage of {NODES} nodes (asked from a depth-3 fork; tree built through the API in {:.1} s): p50 {} p95 {} (n={}; goal p50 ≤ 30 ms: {})",
        built.as_secs_f64(),
        ms(p50),
        ms(percentile(&sample, 95.0)),
        sample.len(),
        goal(p50 <= Duration::from_millis(30))
    ));
    Ok(())
}
