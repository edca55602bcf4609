//! The shared rate-limit windows: counts added by several stores at once (as several api
//! processes would) sum exactly, each addition reads back a total that includes it, and old
//! windows are pruned.

use crate::support::{race, with_store};

#[tokio::test]
async fn concurrent_additions_to_one_window_sum_exactly_and_each_reads_back_its_own() {
    with_store(|ctx| async move {
        let rounds = 20;
        let totals = race(&ctx.url, 6, move |store, i| async move {
            let mut seen = Vec::new();
            for _ in 0..rounds {
                let rows = vec![("SendMessage:web".to_string(), 1_200, 1 + i as i64), ("GetApp:web".to_string(), 1_200, 0)];
                let back = store.add_rate_counts(&rows).await.expect("add");
                assert_eq!(back.len(), 2, "one total per row");
                assert_eq!(back[0].0, "SendMessage:web");
                seen.push(back[0].2);
            }
            seen
        })
        .await;
        // Contender i adds i + 1 per round: 20 × (1 + … + 6) in all.
        let expected: i64 = rounds * (1..=6).sum::<i64>();
        let last = ctx.store.add_rate_counts(&[("SendMessage:web".to_string(), 1_200, 0)]).await.expect("read");
        assert_eq!(last[0].2, expected, "no addition lost");
        for (i, seen) in totals.iter().enumerate() {
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "contender {i} saw its totals grow: {seen:?}");
            assert!(seen.iter().all(|t| *t > i as i64 && *t <= expected), "{seen:?}");
        }
        let zero = ctx.store.add_rate_counts(&[("GetApp:web".to_string(), 1_200, 0)]).await.expect("read");
        assert_eq!(zero[0].2, 0, "adding nothing reads the total without changing it");

        ctx.store.add_rate_counts(&[("SendMessage:web".to_string(), 1_260, 3)]).await.expect("next window");
        assert_eq!(ctx.store.prune_rate_counts(1_260).await.expect("prune"), 2, "the two rows of the older window");
        let kept = ctx.store.add_rate_counts(&[("SendMessage:web".to_string(), 1_260, 0)]).await.expect("read");
        assert_eq!(kept[0].2, 3, "the newer window is kept");
    })
    .await;
}
