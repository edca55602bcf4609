//! Dead-lettered webhook deliveries: recorded with their body, listed newest first, looked up
//! by id, replaced when dead-lettered again, removed after a replay; failed forks counted.

use crate::support::with_store;
use offshoot_core::jobs::DeadLetter;
use offshoot_store::DeadLetterRecord;

fn letter(id: &str, attempts: i64, created_at: i64) -> DeadLetterRecord {
    DeadLetterRecord {
        letter: DeadLetter {
            id: id.into(),
            url: "http://127.0.0.1:9/hook".into(),
            event_type: "message.new".into(),
            event_seq: 7,
            attempts,
            last_error: "HTTP 503 Service Unavailable".into(),
            first_attempt_at: 1,
            created_at,
        },
        body: format!("{{\"type\":\"message.new\",\"id\":\"{id}\"}}"),
    }
}

#[tokio::test]
async fn dead_letters_are_kept_with_their_body_listed_newest_first_replaced_and_removed() {
    with_store(|ctx| async move {
        let s = ctx.store;
        assert!(s.dead_letters(10, 0).await.expect("list").is_empty());
        s.dead_letter(&letter("a", 3, 0)).await.expect("record a");
        s.dead_letter(&letter("b", 1, 0)).await.expect("record b");
        let all = s.dead_letters(10, 0).await.expect("list");
        assert_eq!(all.iter().map(|d| d.letter.id.as_str()).collect::<Vec<_>>(), ["b", "a"], "newest first");
        assert_eq!(all[1].body, letter("a", 3, 0).body, "the body is kept as sent");
        assert_eq!(all[1].letter.attempts, 3);
        assert_eq!(s.dead_letters(1, 1).await.expect("page").len(), 1, "limit and offset apply");
        assert_eq!(s.count_dead_letters().await.expect("count"), 2);

        // Dead-lettered again after a replay: one record, the newer attempts.
        s.dead_letter(&letter("a", 5, 0)).await.expect("record a again");
        let a = s.dead_letters_by_id(&["a".into(), "nope".into()]).await.expect("by id");
        assert_eq!(a.len(), 1, "unknown ids are left out");
        assert_eq!(a[0].letter.attempts, 5);
        assert_eq!(s.count_dead_letters().await.expect("count"), 2);

        assert_eq!(s.delete_dead_letters(&["a".into(), "nope".into()]).await.expect("delete"), 1);
        assert_eq!(s.dead_letters(10, 0).await.expect("list").len(), 1);
        assert_eq!(s.count_failed_forks().await.expect("failed forks"), 0);
    })
    .await;
}
